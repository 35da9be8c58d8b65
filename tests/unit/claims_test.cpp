// HeldClaims: the claims a sweeper holds, keyed by (tenant, queue, timer key).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "sweeper/claims.hpp"

namespace qsw {
namespace {

ClaimedTimer row(std::string tenant, std::string queue, std::string key, std::string token) {
    ClaimedTimer t;
    t.tenant = std::move(tenant);
    t.queue = std::move(queue);
    t.timer_key = std::move(key);
    t.claim_token = std::move(token);
    return t;
}

using Entry = std::tuple<std::string, std::string, std::string, std::string>;

std::set<Entry> entries(const HeldClaims &h) {
    std::set<Entry> out;
    h.for_each([&](std::string_view a, std::string_view b, std::string_view c, std::string_view tok) {
        EXPECT_TRUE(out.emplace(std::string(a), std::string(b), std::string(c), std::string(tok)).second);
    });
    return out;
}

TEST(HeldClaims, TriplesThatConcatenateAlikeAreDistinct) {
    HeldClaims h;
    // Without a separator these three would all be "abc".
    h.hold(row("ab", "c", "", "t1"));
    h.hold(row("a", "bc", "", "t2"));
    h.hold(row("a", "b", "c", "t3"));
    h.hold(row("", "", "", "t4"));  // empty names are names too
    EXPECT_EQ(h.size(), 4u);
    EXPECT_EQ(entries(h), (std::set<Entry>{{"ab", "c", "", "t1"}, {"a", "bc", "", "t2"}, {"a", "b", "c", "t3"},
                                           {"", "", "", "t4"}}));
    EXPECT_TRUE(h.holds(row("a", "bc", "", "other token")));  // held is by name, not by token
    EXPECT_FALSE(h.holds(row("a", "b", "", "t3")));
    h.forget("a", "bc", "");
    EXPECT_FALSE(h.holds(row("a", "bc", "", "t2")));
    EXPECT_TRUE(h.holds(row("ab", "c", "", "t1")));
    EXPECT_EQ(h.size(), 3u);
}

TEST(HeldClaims, ARowClaimedAgainKeepsItsNewestToken) {
    HeldClaims h;
    h.hold(row("t", "q", "k", "old"));
    h.hold(row("t", "q", "k", "new"));
    EXPECT_EQ(h.size(), 1u);
    EXPECT_EQ(entries(h), (std::set<Entry>{{"t", "q", "k", "new"}}));
}

TEST(HeldClaims, ForgettingWhatIsNotHeldChangesNothing) {
    HeldClaims h;
    h.forget("t", "q", "k");
    EXPECT_TRUE(h.empty());
    h.hold(row("t", "q", "k", "tok"));
    h.forget(row("t", "q", "k2", "tok"));
    h.forget("t", "q2", "k");
    EXPECT_EQ(h.size(), 1u);
    h.forget(row("t", "q", "k", "any"));
    EXPECT_TRUE(h.empty());
    EXPECT_TRUE(entries(h).empty());
}

TEST(HeldClaims, ManyRowsWithLongNamesComeBackWhole) {
    HeldClaims h;
    const std::string long_name(300, 'x');  // past every small-string buffer
    for (int i = 0; i < 5000; ++i) h.hold(row(long_name, "queue-" + std::to_string(i % 7), "key-" + std::to_string(i), "tok-" + std::to_string(i)));
    EXPECT_EQ(h.size(), 5000u);
    size_t seen = 0;
    h.for_each([&](std::string_view tenant, std::string_view queue, std::string_view key, std::string_view tok) {
        ++seen;
        EXPECT_EQ(tenant, long_name);
        const std::string i(key.substr(4));
        EXPECT_EQ(queue, "queue-" + std::to_string(std::stoi(i) % 7));
        EXPECT_EQ(tok, "tok-" + i);
    });
    EXPECT_EQ(seen, 5000u);
    for (int i = 0; i < 5000; i += 2) h.forget(long_name, "queue-" + std::to_string(i % 7), "key-" + std::to_string(i));
    EXPECT_EQ(h.size(), 2500u);
    h.clear();
    EXPECT_TRUE(h.empty());
}

}  // namespace
}  // namespace qsw
