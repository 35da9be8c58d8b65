// Issue 8 in pure functions: a decompression bomb never inflates past the payload limit and
// a claim never inflates past its budget; decoders reject what they cannot read instead of
// throwing; the pinned settings name everything the plugin depends on, as SET LOCAL.
#include <gtest/gtest.h>
#include <zstd.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "codec/packer.hpp"
#include "pg/pg_conn.hpp"
#include "pg/sql_args.hpp"
#include "sweeper/sweeper.hpp"

namespace {

std::string zstd_of(const std::string &plain, bool with_size = true) {
    if (with_size) {
        std::string out(ZSTD_compressBound(plain.size()), '\0');
        out.resize(ZSTD_compress(out.data(), out.size(), plain.data(), plain.size(), 3));
        return out;
    }
    // Streamed: the frame header carries no content size.
    ZSTD_CCtx *c = ZSTD_createCCtx();
    std::string out(ZSTD_compressBound(plain.size()) + 64, '\0');
    ZSTD_inBuffer in{plain.data(), plain.size(), 0};
    ZSTD_outBuffer o{out.data(), out.size(), 0};
    ZSTD_compressStream2(c, &o, &in, ZSTD_e_end);
    ZSTD_freeCCtx(c);
    out.resize(o.pos);
    return out;
}

qsw::ClaimedTimer zrow(int i, std::string compressed) {
    qsw::ClaimedTimer t;
    t.tenant = "00000000-0000-0000-0000-000000000001";
    t.queue = "q";
    t.partition = "p";
    t.timer_key = "k" + std::to_string(i);
    t.txn = "t" + std::to_string(i);
    t.message_id[0] = static_cast<uint8_t>(i);
    t.payload = std::move(compressed);
    t.payload_zstd = true;
    t.claim_token = "11111111-1111-1111-1111-111111111111";
    return t;
}

}  // namespace

TEST(Bomb, APayloadInflatingPastTheLimitIsRefusedOnItsOwn) {
    const std::string bomb_plain(size_t{300} << 20, 'a');  // 300 MiB of 'a' compresses to ~10 KiB
    for (bool sized : {true, false}) {
        std::vector<qsw::ClaimedTimer> rows = {zrow(0, zstd_of("fine")), zrow(1, zstd_of(bomb_plain, sized)),
                                               zrow(2, zstd_of("also fine"))};
        ASSERT_LT(rows[1].payload.size(), size_t{1} << 20);
        qsw::PackResult r = qsw::pack_timers(rows, 8 << 20);
        ASSERT_EQ(r.rejected.size(), 1u) << "sized=" << sized;
        EXPECT_EQ(r.rejected[0].first, 1u);
        EXPECT_NE(r.rejected[0].second.find("payload limit"), std::string::npos) << r.rejected[0].second;
        size_t packed = 0;
        for (auto &b : r.batches)
            for (auto &s : b.segments) packed += s.rows.size();
        EXPECT_EQ(packed, 2u);
        EXPECT_TRUE(r.deferred.empty());
    }
}

TEST(Bomb, EachRejectedRowCarriesItsOwnReason) {
    std::vector<qsw::ClaimedTimer> rows = {zrow(0, "not zstd at all"), zrow(1, zstd_of(std::string(3 << 20, 'b')))};
    rows.push_back(zrow(2, zstd_of("ok")));
    qsw::PackResult r = qsw::pack_timers(rows, 8 << 20);
    ASSERT_EQ(r.rejected.size(), 2u);
    EXPECT_NE(r.rejected[0].second, r.rejected[1].second);
}

TEST(Bomb, AClaimNeverInflatesPastItsBudgetAndAlwaysMakesProgress) {
    // 40 payloads of 900 KiB each (legitimate, under the limit): 35 MiB if inflated at once.
    std::vector<qsw::ClaimedTimer> rows;
    for (int i = 0; i < 40; ++i) rows.push_back(zrow(i, zstd_of(std::string(900 << 10, static_cast<char>('a' + i % 26)))));
    const size_t budget = size_t{4} << 20;
    qsw::PackResult r = qsw::pack_timers(rows, 8 << 20, budget);
    size_t packed = 0;
    for (auto &b : r.batches)
        for (auto &s : b.segments) packed += s.rows.size();
    EXPECT_TRUE(r.rejected.empty());
    EXPECT_GE(packed, 1u);                  // progress: at least the first row
    EXPECT_LE(packed * (900 << 10), budget + (1 << 20));
    EXPECT_EQ(packed + r.deferred.size(), rows.size());  // nothing lost: the rest is deferred
    EXPECT_EQ(r.deferred.front(), packed);  // claim order: the oldest go first
    // Budgets by cap: clamped into [4, 64] MiB.
    EXPECT_EQ(qsw::inflate_budget(1024), size_t{4} << 20);
    EXPECT_EQ(qsw::inflate_budget(size_t{8} << 20), size_t{16} << 20);
    EXPECT_EQ(qsw::inflate_budget(size_t{1} << 30), size_t{64} << 20);
}

TEST(Decode, ParseI64AcceptsExactlyPostgresIntegers) {
    int64_t v = 0;
    EXPECT_TRUE(qsw::parse_i64("0", v) && v == 0);
    EXPECT_TRUE(qsw::parse_i64("-42", v) && v == -42);
    EXPECT_TRUE(qsw::parse_i64("9223372036854775807", v) && v == INT64_MAX);
    EXPECT_TRUE(qsw::parse_i64("-9223372036854775808", v) && v == INT64_MIN);
    for (const char *bad : {"", "-", "9223372036854775808", "-9223372036854775809", "1.5", "1e3", " 1", "1 ",
                            "0x10", "+1", "99999999999999999999999"})
        EXPECT_FALSE(qsw::parse_i64(bad, v)) << bad;
}

TEST(Decode, TidTextAcceptsExactlyPostgresAddresses) {
    // Both ends of both fields.
    for (const char *good : {"(0,1)", "(0,65535)", "(4294967295,1)", "(12,3)"})
        EXPECT_TRUE(qsw::is_tid_text(good)) << good;
    for (const char *bad : {"", "()", "(,)", "(0,0)", "(0,65536)", "(4294967296,1)", "(-1,1)", "(1,-1)",
                            "0,1", "(0,1", "0,1)", "(0;1)", "(0,1,2)", "( 0,1)", "(0,1 )", "(+1,1)",
                            "(00000000000,1)", "(1,2)x", "x(1,2)"})
        EXPECT_FALSE(qsw::is_tid_text(bad)) << bad;
}

TEST(Encode, TextArrayLiteralQuotesEveryElementAndEscapesOnlyQuoteAndBackslash) {
    EXPECT_EQ(qsw::pg_text_array({}), "{}");
    EXPECT_EQ(qsw::pg_text_array({""}), "{\"\"}");  // an empty name is an element, not NULL
    EXPECT_EQ(qsw::pg_text_array({"NULL", "a,b", "{x}", " s "}), "{\"NULL\",\"a,b\",\"{x}\",\" s \"}");
    // Escapes at both ends of an element, doubled, and alone.
    EXPECT_EQ(qsw::pg_text_array({"\"", "\\", "\"a\\", "a\"\"b\\\\"}),
              "{\"\\\"\",\"\\\\\",\"\\\"a\\\\\",\"a\\\"\\\"b\\\\\\\\\"}");
    // The builder writes the same literal as the vector form.
    const std::vector<std::string> items = {"t\"1", "", "q\\", "plain", std::string(100, '"')};
    qsw::TextArrayLiteral a;
    for (const auto &i : items) a.add(i);
    EXPECT_EQ(std::move(a).finish(), qsw::pg_text_array(items));
    qsw::TextArrayLiteral none;
    EXPECT_EQ(std::move(none).finish(), "{}");
}

TEST(Decode, ByteaEscapeOutputIsRefusedNotEmptied) {
    std::string out = "sentinel";
    EXPECT_FALSE(qsw::pg_bytea_from_text("abc\\000", out));  // bytea_output = escape
    EXPECT_TRUE(qsw::pg_bytea_from_text("\\x00ff", out));
    EXPECT_EQ(out, std::string("\0\xff", 2));
}

TEST(Pin, EverySettingThePluginDependsOnIsPinnedLocally) {
    const std::string sql = qsw::pinned_settings_sql(30000, 150000);
    for (const char *name : {"search_path", "bytea_output", "DateStyle", "IntervalStyle", "TimeZone",
                             "extra_float_digits", "standard_conforming_strings", "lock_timeout",
                             "idle_in_transaction_session_timeout", "statement_timeout",
                             "client_connection_check_interval", "jit", "max_parallel_workers_per_gather"})
        EXPECT_NE(sql.find(std::string("'") + name + "'"), std::string::npos) << name;
    EXPECT_NE(sql.find("'31000', true"), std::string::npos);  // the server-side second line
    EXPECT_NE(sql.find("'jit', 'off', true"), std::string::npos);
    EXPECT_NE(sql.find("'max_parallel_workers_per_gather', '0', true"), std::string::npos);
    EXPECT_EQ(sql.find(", false)"), std::string::npos);        // never a session-level SET
    // PostgreSQL 13 has no client_connection_check_interval: not asked for there.
    EXPECT_EQ(qsw::pinned_settings_sql(30000, 130000).find("client_connection_check_interval"), std::string::npos);
    EXPECT_NE(std::string(qsw::kPinnedBegin).find("READ COMMITTED"), std::string::npos);
    EXPECT_NE(std::string(qsw::kPinnedBegin).find("READ WRITE"), std::string::npos);
}

TEST(Wake, SaturatingSubtractionNeverWraps) {
    EXPECT_EQ(qsw::sat_sub(INT64_MIN, 1), INT64_MIN);
    EXPECT_EQ(qsw::sat_sub(INT64_MAX, -1), INT64_MAX);
    EXPECT_EQ(qsw::sat_sub(0, INT64_MIN), INT64_MAX);
    EXPECT_EQ(qsw::sat_sub(10, 3), 7);
}
