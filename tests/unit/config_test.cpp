#include <gtest/gtest.h>
#include <stdlib.h>

#include "config/config.hpp"

using namespace qsw;

namespace {
std::string refuse(const char *json) {
    Config c;
    std::string err;
    EXPECT_FALSE(parse_config(json, c, err)) << json;
    return err;
}
struct EnvGuard {
    std::string name;
    EnvGuard(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
    ~EnvGuard() { unsetenv(name.c_str()); }
};
}  // namespace

TEST(Config, DefaultsMatchTheDesignDocument) {
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false}", c, err)) << err;
    EXPECT_TRUE(c.sweeper);
    EXPECT_EQ(c.sweeper_min_sleep_ms, 5);
    EXPECT_EQ(c.sweeper_max_sleep_ms, 1000);
    EXPECT_EQ(c.sweeper_idle_max_sleep_ms, 30000);
    EXPECT_EQ(c.sweeper_idle_after_cycles, 5);
    EXPECT_EQ(c.sweeper_empty_claim_min_ms, 25);
    EXPECT_EQ(c.sweeper_empty_claim_max_ms, 200);
    EXPECT_EQ(c.sweeper_lease_ms, 30000);
    EXPECT_EQ(c.sweeper_claim_batch, 200);
    EXPECT_EQ(c.sweeper_cycle_max_rows, 5000);
    EXPECT_EQ(c.sweeper_due_cap, 2000);
    EXPECT_EQ(c.sweeper_max_fire_bytes, 8 * 1024 * 1024);
    EXPECT_EQ(c.sweeper_max_attempts, 5);
    EXPECT_EQ(c.sweeper_parallelism, 1);
    EXPECT_TRUE(c.sweeper_isolate_on_permanent);
    EXPECT_EQ(c.sweeper_fire_rate_per_tenant, 50);
    EXPECT_EQ(c.sweeper_backoff_min_ms, 1000);
    EXPECT_EQ(c.sweeper_backoff_max_ms, 60000);
    EXPECT_EQ(c.sweeper_transient_backoff_ms, 1000);
    EXPECT_EQ(c.kv_expire_every_ms, 1000);
    EXPECT_EQ(c.kv_expire_batch, 1000);
    EXPECT_EQ(c.kv_usage_every_ms, 300000);
    EXPECT_EQ(c.stmt_timeout_ms, 30000);
    EXPECT_FALSE(c.broker_id.empty());
}

TEST(Config, NullAndEmptyMeanDefaults) {
    Config c;
    std::string err;
    EXPECT_TRUE(parse_config(nullptr, c, err)) << err;
    EXPECT_TRUE(parse_config("  ", c, err)) << err;
}

TEST(Config, InvalidJsonIsRefused) {
    EXPECT_NE(refuse("{not json").find("invalid JSON"), std::string::npos);
    EXPECT_NE(refuse("[1,2]").find("expected a JSON object"), std::string::npos);
}

TEST(Config, UnknownKeyIsNamed) {
    EXPECT_NE(refuse("{\"sweeper_min_sleep\": 5}").find("'sweeper_min_sleep': unknown key"), std::string::npos);
    // There is no shard-count knob, and there must never be one.
    EXPECT_NE(refuse("{\"sweeper_shards\": 64}").find("'sweeper_shards'"), std::string::npos);
}

TEST(Config, WrongTypeIsNamed) {
    auto e = refuse("{\"sweeper_max_sleep_ms\": \"fast\"}");
    EXPECT_NE(e.find("'sweeper_max_sleep_ms'"), std::string::npos);
    EXPECT_NE(e.find("expected an integer"), std::string::npos);
    EXPECT_NE(refuse("{\"conninfo\": 5}").find("'conninfo': expected a string"), std::string::npos);
    EXPECT_NE(refuse("{\"sweeper_claim_batch\": 1.5}").find("'sweeper_claim_batch'"), std::string::npos);
}

TEST(Config, OutOfRangeIsNamedWithTheRange) {
    auto e = refuse("{\"sweeper_parallelism\": 9}");
    EXPECT_NE(e.find("'sweeper_parallelism': 9 is out of range [1, 8]"), std::string::npos) << e;
    EXPECT_NE(refuse("{\"sweeper_parallelism\": 0}").find("out of range"), std::string::npos);
    EXPECT_NE(refuse("{\"pool_size\": -1}").find("'pool_size'"), std::string::npos);
}

TEST(Config, MalformedBooleanIsNamed) {
    auto e = refuse("{\"sweeper\": \"maybe\"}");
    EXPECT_NE(e.find("'sweeper': expected a boolean"), std::string::npos) << e;
    EXPECT_NE(refuse("{\"apply_schema\": 2}").find("'apply_schema'"), std::string::npos);
}

TEST(Config, BooleanSpellings) {
    Config c;
    std::string err;
    for (auto t : {"true", "1", "yes", "on", "TRUE", "On"}) {
        std::string j = std::string("{\"sweeper\": \"") + t + "\"}";
        ASSERT_TRUE(parse_config(j.c_str(), c, err)) << err;
        EXPECT_TRUE(c.sweeper) << t;
    }
    for (auto t : {"false", "0", "no", "off"}) {
        std::string j = std::string("{\"sweeper\": \"") + t + "\"}";
        ASSERT_TRUE(parse_config(j.c_str(), c, err)) << err;
        EXPECT_FALSE(c.sweeper) << t;
    }
}

TEST(Config, EnvironmentBetweenJsonAndDefaults) {
    EnvGuard g("QUEEN_SWEEPER_MAX_SLEEP_MS", "2500");
    EnvGuard h("QUEEN_KV_EXPIRE_BATCH", "77");
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"kv_expire_batch\": 5}", c, err)) << err;
    EXPECT_EQ(c.sweeper_max_sleep_ms, 2500);  // env over default
    EXPECT_EQ(c.kv_expire_batch, 5);          // JSON over env
    ASSERT_TRUE(parse_config("{\"read_env\": false}", c, err)) << err;
    EXPECT_EQ(c.sweeper_max_sleep_ms, 1000);  // env ignored
}

TEST(Config, BadEnvironmentValueNamesTheVariable) {
    EnvGuard g("QUEEN_SWEEPER", "perhaps");
    auto e = refuse("{}");
    EXPECT_NE(e.find("environment QUEEN_SWEEPER"), std::string::npos) << e;
    EnvGuard h("QUEEN_SWEEPER_LEASE_MS", "12x");
    Config c;
    std::string err;
    EXPECT_FALSE(parse_config("{\"sweeper\": true}", c, err));
    EXPECT_NE(err.find("environment QUEEN_SWEEPER_LEASE_MS"), std::string::npos) << err;
}

TEST(Config, LogLevelAndBackoffOrderAreChecked) {
    EXPECT_NE(refuse("{\"log_level\": \"loud\"}").find("'log_level'"), std::string::npos);
    EXPECT_NE(refuse("{\"sweeper_backoff_min_ms\": 5000, \"sweeper_backoff_max_ms\": 10}").find("sweeper_backoff_min_ms"),
              std::string::npos);
}

TEST(Config, PasswordNeverShows) {
    EXPECT_EQ(mask_conninfo("host=x password=secret user=y"), "host=x password=***** user=y");
    EXPECT_EQ(mask_conninfo("host=x password = 'se cret' user=y"), "host=x password = ***** user=y");
    EXPECT_EQ(mask_conninfo("postgresql://u:secret@h/db"), "postgresql://u:*****@h/db");
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"conninfo\": \"host=x password=hunter2\", \"read_env\": false}", c, err));
    EXPECT_EQ(c.to_json().dump().find("hunter2"), std::string::npos);
}
