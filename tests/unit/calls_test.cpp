// Both ends of the typed calls (pg/calls.hpp): each statement's arguments land in the
// parameter its text expects, and each answer decodes without throwing, whatever it holds.
#include <gtest/gtest.h>

#include <libpq-fe.h>

#include <cstring>
#include <limits>
#include <optional>

#include "pg/calls.hpp"
#include "pg/sql_args.hpp"
#include "pg/statements.hpp"

using namespace qsw;

namespace {
// A result as the server would send it: text columns, nullopt a NULL.
PgResult result(int columns, const std::vector<std::vector<std::optional<std::string>>> &rows) {
    PGresult *res = PQmakeEmptyPGresult(nullptr, PGRES_TUPLES_OK);
    std::vector<PGresAttDesc> attrs(static_cast<size_t>(columns));
    std::vector<std::string> names;
    for (int c = 0; c < columns; ++c) names.push_back("c" + std::to_string(c));
    for (int c = 0; c < columns; ++c) {
        std::memset(&attrs[static_cast<size_t>(c)], 0, sizeof(PGresAttDesc));
        attrs[static_cast<size_t>(c)].name = names[static_cast<size_t>(c)].data();
        attrs[static_cast<size_t>(c)].typid = 25;  // text
        attrs[static_cast<size_t>(c)].typlen = -1;
        attrs[static_cast<size_t>(c)].atttypmod = -1;
    }
    EXPECT_TRUE(PQsetResultAttrs(res, columns, attrs.data()));
    for (size_t r = 0; r < rows.size(); ++r)
        for (int c = 0; c < columns; ++c) {
            const auto &v = rows[r][static_cast<size_t>(c)];
            std::string copy = v.value_or("");
            EXPECT_TRUE(PQsetvalue(res, static_cast<int>(r), c, v ? copy.data() : nullptr,
                                   v ? static_cast<int>(copy.size()) : -1));
        }
    PgResult out;
    out.ok = true;
    out.res.reset(res, PQclear);
    return out;
}
PgResult one(const std::string &v) { return result(1, {{v}}); }
const std::string &param(const Query &q, size_t i) { return q.params.at(i).value; }
}  // namespace

TEST(Calls, TheProbeSendsItsArgumentsInTheTextsOrder) {
    const Query q = probe_query(ProbeArgs{{3, 1}, 500, 1700000000123, std::nullopt});
    EXPECT_EQ(q.sql, sql::kProbe);
    ASSERT_EQ(q.params.size(), 4u);
    EXPECT_EQ(param(q, 0), "{3,1}");
    EXPECT_EQ(param(q, 1), "500");
    EXPECT_EQ(param(q, 2), "1700000000123");
    EXPECT_TRUE(q.params[3].is_null);
    const Query all = probe_query(ProbeArgs{{}, 1, std::nullopt, 250});
    EXPECT_TRUE(all.params[2].is_null);
    EXPECT_EQ(param(all, 3), "250");
}

TEST(Calls, AProbeAnswerThatIsNotAnObjectOrHasANextThatIsNotAnIntegerIsUnreadable) {
    for (const char *text : {"", "nope", "[]", "null", "3", R"({"nextInMs": "5"})", R"({"nextInMs": 1.5})",
                             R"({"nextInMs": 99999999999999999999})"}) {
        const ProbeAnswer a = read_probe_answer(text);
        EXPECT_FALSE(a.readable) << text;
        EXPECT_FALSE(a.unreadable.empty()) << text;
    }
}

TEST(Calls, AnEmptyProbeAnswerReadsAsItsDefaults) {
    const ProbeAnswer a = read_probe_answer("{}");
    ASSERT_TRUE(a.readable);
    EXPECT_FALSE(a.next_in_ms);
    EXPECT_FALSE(a.beyond);
    EXPECT_EQ(a.due, 0);
    EXPECT_FALSE(a.now_ms);
    EXPECT_FALSE(a.floor_ms);
    EXPECT_FALSE(a.turn_timeouts);
    EXPECT_TRUE(a.fire_enabled);  // absent: enabled
    EXPECT_FALSE(a.maintenance);
    const ProbeAnswer n = read_probe_answer(R"({"nextInMs": null, "nowMs": "1", "floorMs": 2.5, "due": "9",
                                                "turnTimeouts": "4", "fireEnabled": 0})");
    ASSERT_TRUE(n.readable);
    EXPECT_FALSE(n.next_in_ms);
    EXPECT_FALSE(n.now_ms);
    EXPECT_FALSE(n.floor_ms);
    EXPECT_EQ(n.due, 0);
    EXPECT_FALSE(n.turn_timeouts);
    EXPECT_TRUE(n.fire_enabled);
}

TEST(Calls, AFullProbeAnswer) {
    const ProbeAnswer a = read_probe_answer(R"({"nextInMs": -40, "beyond": false, "due": 1200, "dueCapped": true,
        "held": 3, "lateMs": 950, "nowMs": 1733450000123, "floorMs": 1733449995000,
        "turnTimeouts": 12,
        "fireEnabled": false, "maintenance": true})");
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.next_in_ms, -40);
    EXPECT_EQ(a.due, 1200);
    EXPECT_TRUE(a.due_capped);
    EXPECT_EQ(a.held, 3);
    EXPECT_EQ(a.late_ms, 950);
    EXPECT_EQ(a.now_ms, 1733450000123);
    EXPECT_EQ(a.floor_ms, 1733449995000);
    EXPECT_EQ(a.turn_timeouts, 12);
    EXPECT_EQ(read_probe_answer(R"({"turnTimeouts": -3})").turn_timeouts, 0);  // never below zero
    EXPECT_FALSE(a.fire_enabled);
    EXPECT_TRUE(a.maintenance);
}

TEST(Calls, TheRingTidy) {
    const Query q = ring_tidy_query(256);
    EXPECT_EQ(q.sql, sql::kRingTidy);
    ASSERT_EQ(q.params.size(), 1u);
    EXPECT_EQ(param(q, 0), "256");
    EXPECT_FALSE(read_ring_tidy_answer("").readable);
    EXPECT_FALSE(read_ring_tidy_answer("[1]").readable);
    EXPECT_FALSE(read_ring_tidy_answer(R"({"removed": 3})").readable);  // no "tenants": not its answer
    const RingTidyAnswer a = read_ring_tidy_answer(R"({"looked": 256, "removed": 7, "tenants": 1200})");
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.looked, 256);
    EXPECT_EQ(a.removed, 7);
    EXPECT_EQ(a.tenants, 1200);
    // nonsense counts read as 0, never negative
    const RingTidyAnswer b = read_ring_tidy_answer(R"({"looked": -1, "removed": "x", "tenants": -5})");
    ASSERT_TRUE(b.readable);
    EXPECT_EQ(b.looked, 0);
    EXPECT_EQ(b.removed, 0);
    EXPECT_EQ(b.tenants, 0);
}

TEST(Calls, TheKvPruneStep) {
    const Query q = kv_expire_query(KvExpireArgs{{0, 63}, 1000});
    EXPECT_EQ(q.sql, sql::kKvExpireStep);
    ASSERT_EQ(q.params.size(), 2u);
    EXPECT_EQ(param(q, 0), "{0,63}");
    EXPECT_EQ(param(q, 1), "1000");
    EXPECT_FALSE(read_kv_expire_answer("").readable);
    EXPECT_FALSE(read_kv_expire_answer("[1]").readable);
    const KvExpireAnswer d = read_kv_expire_answer("{}");
    ASSERT_TRUE(d.readable);
    EXPECT_TRUE(d.done);  // absent: done
    EXPECT_FALSE(d.ttl_ahead);
    const KvExpireAnswer a = read_kv_expire_answer(
        R"({"deleted": 500, "done": false, "unpruned": 12000, "unprunedCapped": true, "lagMs": 61000,
            "nextExpiryMs": 1733450000000.5})");
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.deleted, 500);
    EXPECT_FALSE(a.done);
    EXPECT_EQ(a.unpruned, 12000);
    EXPECT_TRUE(a.unpruned_capped);
    EXPECT_EQ(a.lag_ms, 61000);
    EXPECT_TRUE(a.ttl_ahead);  // any number
    EXPECT_FALSE(read_kv_expire_answer(R"({"nextExpiryMs": null})").ttl_ahead);
    EXPECT_EQ(read_kv_expire_answer(R"({"deleted": 18446744073709551615})").deleted, 0);
}

TEST(Calls, TheUsageRollupStep) {
    const Query q = kv_usage_query(KvUsageArgs{{5}, 64, 60000});
    EXPECT_EQ(q.sql, sql::kKvUsageStep);
    ASSERT_EQ(q.params.size(), 3u);
    EXPECT_EQ(param(q, 1), "64");
    EXPECT_EQ(param(q, 2), "60000");
    EXPECT_FALSE(read_kv_usage_answer("x").readable);
    EXPECT_FALSE(read_kv_usage_answer("[]").readable);
    const KvUsageAnswer recent = read_kv_usage_answer(R"({"skipped": "recent", "ageMs": 1200})");
    ASSERT_TRUE(recent.readable);
    EXPECT_TRUE(recent.skipped);
    EXPECT_EQ(recent.age_ms, 1200);
    const KvUsageAnswer locked = read_kv_usage_answer(R"({"skipped": "locked", "ageMs": 1200})");
    EXPECT_TRUE(locked.skipped);
    EXPECT_EQ(locked.age_ms, -1);
    EXPECT_FALSE(read_kv_usage_answer(R"({"skipped": true})").skipped);  // not a string: ran
    const KvUsageAnswer ran = read_kv_usage_answer(
        R"({"maxQuotaRatio": 0.75, "sampled": true, "tenants": [{"tenant": "t", "bytes": 10}]})");
    ASSERT_TRUE(ran.readable);
    EXPECT_FALSE(ran.skipped);
    EXPECT_DOUBLE_EQ(ran.max_quota_ratio, 0.75);
    EXPECT_TRUE(ran.sampled);
    ASSERT_TRUE(ran.tenants.is_array());
    EXPECT_EQ(ran.tenants.size(), 1u);
    EXPECT_TRUE(read_kv_usage_answer("{}").tenants.is_array());
}

TEST(Calls, TheFailCall) {
    FailArgs f;
    f.tenants = {"t"};
    f.queues = {"q"};
    f.keys = {"k"};
    f.tokens = {"tok"};
    f.error = "boom";
    f.error_class = "permanent";
    f.backoff_min_ms = 1;
    f.backoff_max_ms = 2;
    f.transient_backoff_ms = 3;
    f.max_attempts = 4;
    const Query q = fail_query(f);
    EXPECT_EQ(q.sql, sql::kFail);
    ASSERT_EQ(q.params.size(), 10u);
    EXPECT_EQ(param(q, 2), "{\"k\"}");
    EXPECT_EQ(param(q, 4), "boom");
    EXPECT_EQ(param(q, 5), "permanent");
    EXPECT_EQ(param(q, 6), "1");
    EXPECT_EQ(param(q, 9), "4");
    EXPECT_FALSE(read_fail_answer(PgResult{}).readable);
    EXPECT_FALSE(read_fail_answer(one("nope")).readable);
    EXPECT_FALSE(read_fail_answer(one("[]")).readable);
    EXPECT_FALSE(read_fail_answer(result(1, {})).readable);  // no row
    const FailAnswer a = read_fail_answer(one(R"({"released": 3, "exhausted": 2, "moved": 2})"));
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.released, 3);
    EXPECT_EQ(a.exhausted, 2);
    EXPECT_EQ(a.moved, 2);
    const FailAnswer w = read_fail_answer(one(R"({"released": "3", "moved": null})"));
    ASSERT_TRUE(w.readable);
    EXPECT_EQ(w.released, 0);
    EXPECT_EQ(w.moved, 0);
}

TEST(Calls, TheHandBacks) {
    const Query q = release_query(ReleaseArgs{{"t"}, {"q"}, {"k1"}, {"tok"}});
    EXPECT_EQ(q.sql, sql::kRelease);
    ASSERT_EQ(q.params.size(), 4u);
    EXPECT_EQ(param(q, 2), "{\"k1\"}");
    const Query c = release_claims_query(ReleaseClaimsArgs{{"id"}, 10, 20, std::nullopt});
    EXPECT_EQ(c.sql, sql::kReleaseClaims);
    ASSERT_EQ(c.params.size(), 4u);
    EXPECT_EQ(param(c, 1), "10");
    EXPECT_EQ(param(c, 2), "20");
    EXPECT_TRUE(c.params[3].is_null);  // no floor: from the index head
    EXPECT_EQ(param(release_claims_query(ReleaseClaimsArgs{{"id"}, 10, 20, 5}), 3), "5");
    EXPECT_EQ(read_released(one("7")), 7);
    EXPECT_EQ(read_released(one("0")), 0);
    EXPECT_FALSE(read_released(one("")));
    EXPECT_FALSE(read_released(one("7x")));
    EXPECT_FALSE(read_released(one("99999999999999999999")));
    EXPECT_FALSE(read_released(result(1, {})));
    EXPECT_FALSE(read_released(result(1, {{"1"}, {"2"}})));
    EXPECT_FALSE(read_released(PgResult{}));
}

TEST(Calls, TheInDoubtCheck) {
    InDoubtArgs a;
    a.segments = {0, 1};
    a.tenants = {"t", "t"};
    a.queues = {"q", "r"};
    a.hashes = {"ab", "cd"};
    a.key_segments = {0, 0, 1};
    a.keys = {"k1", "k2", "k3"};
    const Query q = in_doubt_query(a);
    EXPECT_EQ(q.sql, sql::kInDoubt);
    ASSERT_EQ(q.params.size(), 6u);
    EXPECT_EQ(param(q, 0), "{0,1}");
    EXPECT_TRUE(q.params[3].binary);
    EXPECT_EQ(param(q, 4), "{0,0,1}");
    EXPECT_TRUE(read_in_doubt_rows(PgResult{}).empty());
    const auto rows = read_in_doubt_rows(result(4, {{"0", "0", "0", "41"},
                                                    {"1", "2", "1", std::nullopt},
                                                    {"x", "2", "1", std::nullopt},
                                                    {"2", "1", "1", "no"},
                                                    {"3", std::nullopt, "1", std::nullopt}}));
    ASSERT_EQ(rows.size(), 5u);
    EXPECT_TRUE(rows[0].readable);
    EXPECT_EQ(rows[0].base, 41);
    EXPECT_TRUE(rows[1].readable);
    EXPECT_EQ(rows[1].seg, 1);
    EXPECT_EQ(rows[1].present, 2);
    EXPECT_EQ(rows[1].unlocked, 1);
    EXPECT_EQ(rows[1].base, -1);
    EXPECT_FALSE(rows[2].readable);
    EXPECT_FALSE(rows[3].readable);
    EXPECT_FALSE(rows[4].readable);
}

TEST(Calls, WhichServerAnswers) {
    EXPECT_FALSE(read_identify_answer(PgResult{}).readable);
    EXPECT_FALSE(read_identify_answer(result(3, {})).readable);
    const IdentifyAnswer a = read_identify_answer(result(3, {{"10.0.0.5:5432", "f", "7301/00000003"}}));
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.server, "10.0.0.5:5432");
    EXPECT_FALSE(a.in_recovery);
    EXPECT_EQ(a.identity, "7301/00000003");
    EXPECT_TRUE(read_identify_answer(result(3, {{"local:5432", "t", ""}})).in_recovery);
}

TEST(Calls, TheClaimSendsItsArgumentsInTheTextsOrderWithABinaryAnswer) {
    ClaimArgs a;
    a.shards = {7};
    a.lease_ms = 30000;
    a.max_rows = 200;
    a.rows_per_tenant = 10;
    a.max_bytes = 8 << 20;
    a.claim_id = "c1";
    a.skip_tenants = {"t"};
    a.skip_queues = {"q"};
    a.skip_partitions = {"p"};
    const Query q = claim_query(a);
    EXPECT_EQ(q.sql, sql::kClaim);
    EXPECT_TRUE(q.binary_result);
    ASSERT_EQ(q.params.size(), 11u);
    EXPECT_EQ(param(q, 0), "{7}");
    EXPECT_EQ(param(q, 1), "30000");
    EXPECT_EQ(param(q, 2), "200");
    EXPECT_EQ(param(q, 3), "10");
    EXPECT_EQ(param(q, 4), std::to_string(8 << 20));
    EXPECT_EQ(param(q, 5), "c1");
    EXPECT_EQ(param(q, 6), "{\"t\"}");
    EXPECT_EQ(param(q, 7), "{\"q\"}");
    EXPECT_EQ(param(q, 8), "{\"p\"}");
    EXPECT_TRUE(q.params[9].is_null);  // no floor: the index head
    EXPECT_TRUE(q.params[10].is_null);  // no backlog: the claim names no tenant
    a.backlog = true;
    EXPECT_EQ(param(claim_query(a), 10), "{}");  // a backlog: tenants from the ring
    a.floor_ms = 5;
    EXPECT_EQ(param(claim_query(a), 9), "5");
}

namespace {
// One claimed row as the claim answers it (binary columns in network order).
std::string be(uint64_t v, int bytes) {
    std::string out(static_cast<size_t>(bytes), '\0');
    for (int i = bytes - 1; i >= 0; --i, v >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
    return out;
}
std::vector<std::optional<std::string>> claim_row(const std::string &key) {
    using C = sql::ClaimCol;
    std::vector<std::optional<std::string>> r(static_cast<size_t>(C::row_tid) + 1);
    auto at = [&](C c) -> std::optional<std::string> & { return r[static_cast<size_t>(c)]; };
    at(C::tenant) = "00000000-0000-0000-0000-0000000000a1";
    at(C::queue) = "q";
    at(C::timer_key) = key;
    at(C::partition) = "p";
    at(C::txn) = "txn-" + key;
    at(C::message_id) = "11111111-2222-3333-4444-555555555555";
    at(C::payload) = std::string("pay\0load", 8);
    at(C::payload_zstd) = std::string(1, '\0');
    at(C::encrypted) = std::string(1, '\1');
    at(C::producer_sub) = std::nullopt;
    at(C::claim_token) = "22222222-0000-0000-0000-000000000000";
    at(C::deliver_at_ms) = be(1700000000123ULL, 8);
    at(C::late_ms) = be(250, 8);
    at(C::attempts) = be(3, 4);
    at(C::floor_ms) = be(1700000000000ULL, 8);
    at(C::row_tid) = "(12,3)";
    return r;
}
constexpr int kClaimCols = static_cast<int>(sql::ClaimCol::row_tid) + 1;
}  // namespace

TEST(Calls, AClaimAnswerReadsEveryColumnOfEveryRow) {
    const ClaimAnswer a = read_claim_answer(result(kClaimCols, {claim_row("k1"), claim_row("k2")}), 100);
    EXPECT_EQ(a.undecodable, "");
    ASSERT_EQ(a.rows.size(), 2u);
    const ClaimedTimer &t = a.rows[1];
    EXPECT_EQ(t.timer_key, "k2");
    EXPECT_EQ(t.claim_token, "22222222-0000-0000-0000-000000000000");
    EXPECT_EQ(t.payload, std::string("pay\0load", 8));  // binary, whole
    EXPECT_FALSE(t.payload_zstd);
    EXPECT_TRUE(t.encrypted);
    EXPECT_FALSE(t.producer_sub.has_value());
    EXPECT_EQ(t.deliver_at_ms, 1700000000123LL);
    EXPECT_EQ(t.late_ms, 250 - 100);  // lateness at the claim less the loop clock then
    EXPECT_EQ(t.attempts, 3);
    EXPECT_EQ(t.message_id[0], 0x11);
    EXPECT_EQ(t.row_tid, "(12,3)");
    EXPECT_EQ(a.bytes, 16);
    EXPECT_EQ(a.floor_ms, 1700000000000LL);
    // No row: nothing, no floor.
    const ClaimAnswer none = read_claim_answer(result(kClaimCols, {}), 0);
    EXPECT_TRUE(none.rows.empty());
    EXPECT_FALSE(none.floor_ms.has_value());
    EXPECT_EQ(none.undecodable, "");
    EXPECT_TRUE(read_claim_answer(PgResult{}, 0).rows.empty());  // a failed call: nothing read
}

TEST(Calls, AClaimColumnThatDoesNotReadBackNamesItselfAndKeepsTheRowsNames) {
    using C = sql::ClaimCol;
    struct Case {
        C col;
        std::optional<std::string> value;
        const char *want;
    };
    const Case cases[] = {
        {C::message_id, std::string("not-a-uuid"), "message_id"},
        {C::deliver_at_ms, be(5, 4), "deliver_at_ms"},  // four bytes where eight are
        {C::late_ms, std::nullopt, "late_ms"},
        {C::attempts, be(3, 8), "attempts"},
        {C::payload_zstd, std::string("tt"), "payload_zstd"},
        {C::encrypted, std::nullopt, "encrypted"},
    };
    for (const Case &c : cases) {
        auto bad = claim_row("k2");
        bad[static_cast<size_t>(c.col)] = c.value;
        const ClaimAnswer a = read_claim_answer(result(kClaimCols, {claim_row("k1"), bad}), 0);
        EXPECT_EQ(a.undecodable, c.want);
        ASSERT_EQ(a.rows.size(), 2u) << c.want;  // named, to be handed back token-matched
        EXPECT_EQ(a.rows[1].timer_key, "k2");
        EXPECT_EQ(a.rows[1].claim_token, "22222222-0000-0000-0000-000000000000");
    }
    // An unreadable address is no address (a hint), not an undecodable claim.
    auto odd = claim_row("k1");
    odd[static_cast<size_t>(C::row_tid)] = "12,3";
    const ClaimAnswer a = read_claim_answer(result(kClaimCols, {odd}), 0);
    EXPECT_EQ(a.undecodable, "");
    EXPECT_EQ(a.rows[0].row_tid, "");
    // An answer with fewer columns than the claim's: nothing read by name, the claim goes back by id.
    const ClaimAnswer narrow = read_claim_answer(result(3, {{"a", "b", "c"}}), 0);
    EXPECT_EQ(narrow.undecodable, "columns");
    EXPECT_TRUE(narrow.rows.empty());
}

TEST(Calls, TheWalkFromTheHead) {
    const Query q = head_walk_query(HeadWalkArgs{1000, 1234});
    EXPECT_EQ(q.sql, sql::kFloorHeadWalk);
    ASSERT_EQ(q.params.size(), 2u);
    EXPECT_EQ(param(q, 0), "1000");
    EXPECT_EQ(param(q, 1), "1234");
    const Query head = head_walk_query(HeadWalkArgs{std::nullopt, 1234});  // from the index's head
    ASSERT_EQ(head.params.size(), 2u);
    EXPECT_TRUE(head.params[0].is_null);
    EXPECT_EQ(param(head, 1), "1234");
    HeadWalkAnswer a = read_head_walk_answer(result(2, {{"99", "7"}}));
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.behind_ms, 99);
    EXPECT_EQ(a.dead_tuples, 7);
    a = read_head_walk_answer(result(2, {{std::nullopt, std::nullopt}}));
    ASSERT_TRUE(a.readable);
    EXPECT_FALSE(a.behind_ms.has_value());
    EXPECT_EQ(a.dead_tuples, -1);
    EXPECT_FALSE(read_head_walk_answer(result(2, {{"x", "7"}})).readable);
    EXPECT_FALSE(read_head_walk_answer(result(2, {{"1", "7.5"}})).readable);
    EXPECT_FALSE(read_head_walk_answer(result(2, {})).readable);
    EXPECT_FALSE(read_head_walk_answer(result(1, {{"1"}})).readable);
    EXPECT_FALSE(read_head_walk_answer(PgResult{}).readable);
}

TEST(Calls, TheFireSendsItsArgumentsInTheTextsOrder) {
    FireArgs a;
    a.seg_tenants = "{\"t\"}";
    a.seg_queues = "{\"q\"}";
    a.seg_partitions = "{\"p\"}";
    a.counts = {2};
    a.hashes = {"h"};
    a.blobs = {"b"};
    a.keys = "{\"k1\",\"k2\"}";
    a.tokens = "{\"x\",\"y\"}";
    a.key_segments = {1, 1};
    a.wait = true;
    const Query q = fire_query(FireArgs(a));
    EXPECT_EQ(q.sql, sql::kFire);
    ASSERT_EQ(q.params.size(), 12u);
    EXPECT_EQ(param(q, 0), "{\"t\"}");
    EXPECT_EQ(param(q, 2), "{\"p\"}");
    EXPECT_EQ(param(q, 3), "{2}");
    EXPECT_TRUE(q.params[4].binary);
    EXPECT_TRUE(q.params[5].binary);
    EXPECT_EQ(param(q, 6), "{\"k1\",\"k2\"}");
    EXPECT_EQ(param(q, 7), "{1,1}");
    EXPECT_EQ(param(q, 8), "{\"x\",\"y\"}");
    EXPECT_EQ(param(q, 9), "true");
    EXPECT_TRUE(q.params[10].is_null);  // an address unknown: every row by key
    EXPECT_TRUE(q.params[11].is_null);  // no partition addresses: none answered either
    a.wait = false;
    a.tids = "{\"(0,1)\",\"(0,2)\"}";
    a.seg_partition_tids = "{NULL}";
    const Query w = fire_query(std::move(a));
    EXPECT_EQ(param(w, 9), "false");
    EXPECT_EQ(param(w, 10), "{\"(0,1)\",\"(0,2)\"}");
    EXPECT_EQ(param(w, 11), "{NULL}");
}

TEST(Calls, ATextArrayLiteralWritesANullElementUnquoted) {
    TextArrayLiteral a;
    a.add("(0,1)");
    a.add_null();
    a.add("NULL");  // the string, quoted: not a null
    EXPECT_EQ(std::move(a).finish(), "{\"(0,1)\",NULL,\"NULL\"}");
    TextArrayLiteral b;
    b.add_null();
    EXPECT_EQ(std::move(b).finish(), "{NULL}");
}

TEST(Calls, WhichServerAndWhichSchemaVersionTakeNoParameter) {
    const Query id = identify_query();
    EXPECT_EQ(id.sql, sql::kIdentifyServer);
    EXPECT_TRUE(id.params.empty());
    const Query v = schema_version_query();
    EXPECT_EQ(v.sql, sql::kReadSchemaVersion);
    EXPECT_TRUE(v.params.empty());
    EXPECT_EQ(v.answer_sqlstates, (std::vector<std::string>{"42883", "3F000", "42P01"}));
}

TEST(Calls, TheSchemaVersionAnswer) {
    SchemaVersionAnswer a = read_schema_version(one("20"));
    EXPECT_TRUE(a.ok);
    EXPECT_FALSE(a.absent);
    EXPECT_EQ(a.version, 20);
    a = read_schema_version(result(1, {{std::nullopt}}));  // nothing recorded
    EXPECT_TRUE(a.ok);
    EXPECT_TRUE(a.absent);
    a = read_schema_version(result(1, {}));
    EXPECT_TRUE(a.ok);
    EXPECT_TRUE(a.absent);
    a = read_schema_version(one("twenty"));
    EXPECT_FALSE(a.ok);
    EXPECT_EQ(a.error.origin, Origin::internal);
    EXPECT_FALSE(read_schema_version(one("99999999999999999999")).ok);
    PgResult missing;
    missing.sqlstate = "42883";  // no such function: no schema yet, an answer
    a = read_schema_version(missing);
    EXPECT_TRUE(a.ok);
    EXPECT_TRUE(a.absent);
    PgResult down;
    down.origin = Origin::transport;
    down.message = "connection lost";
    a = read_schema_version(down);
    EXPECT_FALSE(a.ok);
    EXPECT_EQ(a.error.message, "connection lost");
}
