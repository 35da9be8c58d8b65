// The rule for warning about environment variables: both sides of it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "config/config.hpp"
#include "config/env_check.hpp"

using namespace qsw;

namespace {
const std::vector<std::string> kKeys = {"sweeper", "sweeper_min_sleep_ms", "kv_expire_batch", "stmt_timeout_ms",
                                        "conninfo", "log_stderr"};
std::string all(const std::vector<std::string> &v) {
    std::string o;
    for (const auto &s : v) o += s + "\n";
    return o;
}
}  // namespace

TEST(EnvCheck, KnobVariablesAndOtherComponentsArePassedOver) {
    const auto w = unknown_env_warnings({"QUEEN_SWEEPER", "QUEEN_SWEEPER_MIN_SLEEP_MS", "QUEEN_KV_EXPIRE_BATCH",
                                         "QUEEN_CONNINFO", "QUEEN_EPHEMERAL_DIR", "QUEEN_EPHEMERAL_MAX_SLEEP_MS",
                                         "QUEEN_TEST_CONNINFO", "QUEEN_SWEEPER_LIBRARY", "QUEEN_SWEEPER_LIB_DIR",
                                         "QUEEN_SWEEPER_BUILD_DIR", "PATH", "HOME", "QUEENIE",
                                         "QUEEN_DATABASE_URL", "QUEEN_PUSH_BATCH_SIZE"},
                                        kKeys);
    EXPECT_TRUE(w.empty()) << all(w);
}

TEST(EnvCheck, AnyUnknownNameOfThePluginsPrefixIsReported) {
    const auto w = unknown_env_warnings({"QUEEN_SWEEPER_MIN_SLEEP", "QUEEN_SWEEPER_BOGUS_THING"}, kKeys);
    ASSERT_EQ(w.size(), 2u) << all(w);
    EXPECT_NE(w[0].find("QUEEN_SWEEPER_BOGUS_THING"), std::string::npos);
    EXPECT_NE(w[1].find("QUEEN_SWEEPER_MIN_SLEEP "), std::string::npos);
    EXPECT_NE(w[1].find("did you mean QUEEN_SWEEPER_MIN_SLEEP_MS?"), std::string::npos) << w[1];
}

TEST(EnvCheck, OtherQueenNamesOnlyWhenTwoEditsFromAKnob) {
    const auto w = unknown_env_warnings({"QUEEN_KV_EXPIRE_BATCHH", "QUEEN_STMT_TIMEOUT_M", "QUEEN_KV_EXPIRE_BA",
                                         "QUEEN_LOG_STDER"},
                                        kKeys);
    ASSERT_EQ(w.size(), 3u) << all(w);  // _BA is three edits away: the host's own business
    EXPECT_NE(all(w).find("QUEEN_KV_EXPIRE_BATCHH is not a sweeper setting"), std::string::npos);
    EXPECT_NE(all(w).find("did you mean QUEEN_STMT_TIMEOUT_MS?"), std::string::npos);
    EXPECT_NE(all(w).find("did you mean QUEEN_LOG_STDERR?"), std::string::npos);
}

TEST(EnvCheck, ParseConfigCollectsTheWarningsOnlyWhenTheEnvironmentCounts) {
    setenv("QUEEN_SWEEPER_MAX_SLEEP", "5", 1);
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{}", c, err)) << err;
    EXPECT_NE(all(c.warnings).find("QUEEN_SWEEPER_MAX_SLEEP "), std::string::npos) << all(c.warnings);
    ASSERT_TRUE(parse_config("{\"read_env\": false}", c, err)) << err;
    EXPECT_TRUE(c.warnings.empty()) << all(c.warnings);
    unsetenv("QUEEN_SWEEPER_MAX_SLEEP");
}

TEST(EnvCheck, LogStderrIsAKnobDefaultingOn) {
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false}", c, err)) << err;
    EXPECT_TRUE(c.log_stderr);
    ASSERT_TRUE(parse_config("{\"read_env\": false, \"log_stderr\": false}", c, err)) << err;
    EXPECT_FALSE(c.log_stderr);
}
