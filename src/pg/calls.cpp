// Typed calls (see calls.hpp).
#include "pg/calls.hpp"

#include <algorithm>
#include <string>

#include "base/json_get.hpp"
#include "codec/codec.hpp"
#include "pg/classify.hpp"
#include "pg/sql_args.hpp"
#include "pg/statements.hpp"

namespace qsw {

// ---- The probe ----------------------------------------------------------------------------------

namespace {
QueryParam optional_i64(const std::optional<int64_t> &v) { return v ? text_param(std::to_string(*v)) : null_param(); }
QueryParam i64(int64_t v) { return text_param(std::to_string(v)); }
QueryParam texts(const std::vector<std::string> &v) { return text_param(pg_text_array(v)); }
nlohmann::json parse_object(std::string_view text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return j.is_object() ? j : nlohmann::json();
}
}  // namespace

Query probe_query(const ProbeArgs &a) {
    Query q;
    q.sql = sql::kProbe;
    q.params = {text_param(shards_param(a.shards)), i64(a.due_cap), optional_i64(a.floor_ms),
                optional_i64(a.horizon_ms)};
    return q;
}

ProbeAnswer read_probe_answer(std::string_view text) {
    ProbeAnswer a;
    const nlohmann::json j = parse_object(text);
    if (!j.is_object()) {
        a.unreadable = "not a JSON object";
        return a;
    }
    const auto next = j.find("nextInMs");
    if (next != j.end() && !next->is_null()) {
        a.next_in_ms = json_find_int(j, "nextInMs");
        if (!a.next_in_ms) {
            a.unreadable = "nextInMs is not an integer";
            return a;
        }
    }
    a.beyond = json_get(j, "beyond", false);
    a.due = json_get<int64_t>(j, "due", 0);
    a.due_capped = json_get(j, "dueCapped", false);
    a.held = json_get<int64_t>(j, "held", 0);
    a.late_ms = json_get<int64_t>(j, "lateMs", 0);
    a.now_ms = json_find_int(j, "nowMs");
    a.floor_ms = json_find_int(j, "floorMs");
    if (const auto turns = json_find_int(j, "turnTimeouts")) a.turn_timeouts = std::max<int64_t>(*turns, 0);
    a.fire_enabled = json_get(j, "fireEnabled", true);
    a.maintenance = json_get(j, "maintenance", false);
    a.readable = true;
    return a;
}

// ---- The KV prune's step and the usage rollup's step ----------------------------------------------

Query kv_expire_query(const KvExpireArgs &a) {
    Query q;
    q.sql = sql::kKvExpireStep;
    q.params = {text_param(shards_param(a.shards)), i64(a.rows)};
    return q;
}

KvExpireAnswer read_kv_expire_answer(std::string_view text) {
    KvExpireAnswer a;
    const nlohmann::json j = parse_object(text);
    if (!j.is_object()) return a;
    a.deleted = json_get<int64_t>(j, "deleted", 0);
    a.done = json_get(j, "done", true);
    a.unpruned = json_get<int64_t>(j, "unpruned", 0);
    a.unpruned_capped = json_get(j, "unprunedCapped", false);
    a.lag_ms = json_get<int64_t>(j, "lagMs", 0);
    const auto next = j.find("nextExpiryMs");
    a.ttl_ahead = next != j.end() && next->is_number();
    a.readable = true;
    return a;
}

Query ring_tidy_query(int64_t max_entries) {
    Query q;
    q.sql = sql::kRingTidy;
    q.params = {i64(max_entries)};
    return q;
}

RingTidyAnswer read_ring_tidy_answer(std::string_view text) {
    RingTidyAnswer a;
    const nlohmann::json j = parse_object(text);
    if (!j.is_object() || !j.contains("tenants")) return a;
    a.looked = std::max<int64_t>(json_get<int64_t>(j, "looked", 0), 0);
    a.removed = std::max<int64_t>(json_get<int64_t>(j, "removed", 0), 0);
    a.tenants = std::max<int64_t>(json_get<int64_t>(j, "tenants", 0), 0);
    a.readable = true;
    return a;
}

Query kv_usage_query(const KvUsageArgs &a) {
    Query q;
    q.sql = sql::kKvUsageStep;
    q.params = {text_param(shards_param(a.shards)), i64(a.max_tenants), i64(a.every_ms)};
    return q;
}

KvUsageAnswer read_kv_usage_answer(std::string_view text) {
    KvUsageAnswer a;
    const nlohmann::json j = parse_object(text);
    if (!j.is_object()) return a;
    a.readable = true;
    const auto sk = j.find("skipped");
    if (sk != j.end() && sk->is_string()) {
        a.skipped = true;
        a.age_ms = *sk == "recent" ? json_get<int64_t>(j, "ageMs", 0) : -1;
        return a;
    }
    a.max_quota_ratio = json_get(j, "maxQuotaRatio", 0.0);
    a.sampled = json_get(j, "sampled", false);
    const auto tenants = j.find("tenants");
    if (tenants != j.end()) a.tenants = *tenants;
    return a;
}

// ---- A failure, and the hand-backs -------------------------------------------------------------

Query fail_query(const FailArgs &a) {
    Query q;
    q.sql = sql::kFail;
    q.params = {texts(a.tenants), texts(a.queues), texts(a.keys), texts(a.tokens), text_param(a.error),
                text_param(a.error_class), i64(a.backoff_min_ms), i64(a.backoff_max_ms), i64(a.transient_backoff_ms),
                i64(a.max_attempts)};
    return q;
}

FailAnswer read_fail_answer(const PgResult &r) {
    FailAnswer a;
    if (!r.ok || r.rows() != 1) return a;
    const nlohmann::json j = parse_object(r.get(0, 0));
    if (!j.is_object()) return a;
    a.released = json_get<int64_t>(j, "released", 0);
    a.exhausted = json_get<int64_t>(j, "exhausted", 0);
    a.moved = json_get<int64_t>(j, "moved", 0);
    a.readable = true;
    return a;
}

Query release_query(const ReleaseArgs &a) {
    Query q;
    q.sql = sql::kRelease;
    q.params = {texts(a.tenants), texts(a.queues), texts(a.keys), texts(a.tokens)};
    return q;
}

Query release_claims_query(const ReleaseClaimsArgs &a) {
    Query q;
    q.sql = sql::kReleaseClaims;
    q.params = {texts(a.claim_ids), i64(a.lease_from_unix_ms), i64(a.lease_to_unix_ms), optional_i64(a.floor_unix_ms)};
    return q;
}

std::optional<int64_t> read_released(const PgResult &r) {
    int64_t n = 0;
    if (!r.ok || r.rows() != 1 || !parse_i64(r.get(0, 0), n)) return std::nullopt;
    return n;
}

// ---- The in-doubt check, and which server answers ------------------------------------------------

Query in_doubt_query(const InDoubtArgs &a) {
    Query q;
    q.sql = sql::kInDoubt;
    q.params = {text_param(pg_int_array(a.segments)), texts(a.tenants), texts(a.queues),
                binary_param(pg_bytea_array_binary(a.hashes), kByteaArrayOid), text_param(pg_int_array(a.key_segments)),
                texts(a.keys)};
    return q;
}

std::vector<InDoubtRow> read_in_doubt_rows(const PgResult &r) {
    using C = sql::InDoubtCol;
    std::vector<InDoubtRow> rows;
    if (!r.ok) return rows;
    rows.resize(static_cast<size_t>(std::max(r.rows(), 0)));
    for (int i = 0; i < r.rows(); ++i) {
        InDoubtRow &row = rows[static_cast<size_t>(i)];
        const auto col = [](C c) { return static_cast<int>(c); };
        row.readable = parse_i64(r.get(i, col(C::seg)), row.seg) && parse_i64(r.get(i, col(C::present)), row.present) &&
                       parse_i64(r.get(i, col(C::unlocked)), row.unlocked) &&
                       (r.is_null(i, col(C::base_offset)) || parse_i64(r.get(i, col(C::base_offset)), row.base));
    }
    return rows;
}

Query identify_query() {
    Query q;
    q.sql = sql::kIdentifyServer;
    return q;
}

IdentifyAnswer read_identify_answer(const PgResult &r) {
    using C = sql::IdentifyCol;
    IdentifyAnswer a;
    if (!r.ok || r.rows() != 1) return a;
    a.server = r.get(0, static_cast<int>(C::server));
    a.in_recovery = r.get(0, static_cast<int>(C::in_recovery)) == "t";
    a.identity = r.get(0, static_cast<int>(C::identity));
    a.readable = true;
    return a;
}

// ---- The claim and the fire ------------------------------------------------------------------------

Query claim_query(const ClaimArgs &a) {
    Query q;
    q.sql = sql::kClaim;
    q.params = {text_param(shards_param(a.shards)), i64(a.lease_ms), i64(a.max_rows), i64(a.rows_per_tenant),
                i64(a.max_bytes), text_param(a.claim_id), texts(a.skip_tenants), texts(a.skip_queues),
                texts(a.skip_partitions), optional_i64(a.floor_ms),
                // Under a backlog, no tenant of our own: the claim names them from the ring.
                a.backlog ? text_param("{}") : null_param()};
    q.binary_result = true;  // the payload as it is: a hex answer would double it
    return q;
}

namespace {

// A binary integer column (network order), checked for its width.
template <class T> bool read_be(const PgResult &r, int row, sql::ClaimCol c, T &out) {
    const int col = static_cast<int>(c);
    if (r.is_null(row, col) || PQgetlength(r.res.get(), row, col) != static_cast<int>(sizeof(T))) return false;
    const auto *p = reinterpret_cast<const unsigned char *>(PQgetvalue(r.res.get(), row, col));
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v = (v << 8) | p[i];
    out = static_cast<T>(v);
    return true;
}
bool read_bool(const PgResult &r, int row, sql::ClaimCol c, bool &out) {
    const int col = static_cast<int>(c);
    if (r.is_null(row, col) || PQgetlength(r.res.get(), row, col) != 1) return false;
    out = PQgetvalue(r.res.get(), row, col)[0] != 0;
    return true;
}
std::string text_of(const PgResult &r, int row, sql::ClaimCol c) { return r.get(row, static_cast<int>(c)); }

}  // namespace

ClaimAnswer read_claim_answer(const PgResult &r, uint64_t claimed_at_mono) {
    using C = sql::ClaimCol;
    ClaimAnswer a;
    const int got = r.ok ? r.rows() : 0;
    if (got > 0 && PQnfields(r.res.get()) <= static_cast<int>(C::row_tid)) {
        a.undecodable = "columns";  // fewer columns than the claim answers: nothing to read by name
        return a;
    }
    a.rows.resize(static_cast<size_t>(got));
    for (int i = 0; i < got; ++i) {
        ClaimedTimer &t = a.rows[static_cast<size_t>(i)];
        t.tenant = text_of(r, i, C::tenant);
        t.queue = text_of(r, i, C::queue);
        t.timer_key = text_of(r, i, C::timer_key);
        t.claim_token = text_of(r, i, C::claim_token);
        t.partition = text_of(r, i, C::partition);
        t.txn = text_of(r, i, C::txn);
        t.payload = text_of(r, i, C::payload);
        a.bytes += static_cast<int64_t>(t.payload.size());
        if (!r.is_null(i, static_cast<int>(C::producer_sub))) t.producer_sub = text_of(r, i, C::producer_sub);
        int64_t late = 0;
        int32_t attempts = 0;
        const char *bad = nullptr;
        if (!parse_uuid(text_of(r, i, C::message_id), t.message_id)) bad = "message_id";
        else if (!read_be(r, i, C::deliver_at_ms, t.deliver_at_ms)) bad = "deliver_at_ms";
        else if (!read_be(r, i, C::late_ms, late)) bad = "late_ms";
        else if (!read_be(r, i, C::attempts, attempts)) bad = "attempts";
        else if (!read_bool(r, i, C::payload_zstd, t.payload_zstd)) bad = "payload_zstd";
        else if (!read_bool(r, i, C::encrypted, t.encrypted)) bad = "encrypted";
        if (bad && a.undecodable.empty()) a.undecodable = bad;
        t.late_ms = late - static_cast<int64_t>(claimed_at_mono);
        t.attempts = attempts;
        // A hint, so anything unreadable is simply no address (the fire then goes by key).
        if (!r.is_null(i, static_cast<int>(C::row_tid))) {
            std::string tid = text_of(r, i, C::row_tid);
            if (is_tid_text(tid)) t.row_tid = std::move(tid);
        }
    }
    int64_t floor = 0;
    if (got > 0 && !r.is_null(0, static_cast<int>(C::floor_ms)) && read_be(r, 0, C::floor_ms, floor)) a.floor_ms = floor;
    return a;
}

Query head_walk_query(const HeadWalkArgs &a) {
    Query q;
    q.sql = sql::kFloorHeadWalk;
    q.params = {optional_i64(a.from_ms), i64(a.until_ms)};
    return q;
}

HeadWalkAnswer read_head_walk_answer(const PgResult &r) {
    using C = sql::FloorHeadWalkCol;
    HeadWalkAnswer a;
    if (!r.ok || r.rows() != 1 || PQnfields(r.res.get()) <= static_cast<int>(C::dead_tuples)) return a;
    int64_t v = 0;
    const int bc = static_cast<int>(C::behind_ms), dc = static_cast<int>(C::dead_tuples);
    if (!r.is_null(0, bc)) {
        if (!parse_i64(r.get(0, bc), v)) return a;
        a.behind_ms = v;
    }
    if (!r.is_null(0, dc)) {
        if (!parse_i64(r.get(0, dc), v)) return a;
        a.dead_tuples = v;
    }
    a.readable = true;
    return a;
}

Query fire_query(FireArgs &&a) {
    Query q;
    q.sql = sql::kFire;
    q.params = {text_param(std::move(a.seg_tenants)), text_param(std::move(a.seg_queues)),
                text_param(std::move(a.seg_partitions)), text_param(pg_int_array(a.counts)),
                binary_param(pg_bytea_array_binary(a.hashes), kByteaArrayOid),
                binary_param(pg_bytea_array_binary(a.blobs), kByteaArrayOid), text_param(std::move(a.keys)),
                text_param(pg_int_array(a.key_segments)), text_param(std::move(a.tokens)),
                text_param(a.wait ? "true" : "false"), a.tids ? text_param(std::move(*a.tids)) : null_param(),
                a.seg_partition_tids ? text_param(std::move(*a.seg_partition_tids)) : null_param()};
    return q;
}

// ---- The schema version ----------------------------------------------------------------------------

Query schema_version_query() {
    Query q;
    q.sql = sql::kReadSchemaVersion;
    q.answer_sqlstates.assign(kSchemaAbsentSqlstates.begin(), kSchemaAbsentSqlstates.end());
    return q;
}

SchemaVersionAnswer read_schema_version(PgResult r) {
    SchemaVersionAnswer v;
    if (r.ok && r.rows() == 1 && !r.is_null(0, 0)) {
        int64_t n = 0;
        if (parse_i64(r.get(0, 0), n)) {
            v.ok = true;
            v.version = n;
        } else {
            v.error.origin = Origin::internal;
            v.error.message = "queen.schema_version_v1() answered a value that is not an integer";
        }
    } else if (r.ok || is_schema_absent(r)) {
        // No function, no schema, no table, or nothing recorded: the database predates
        // versioning or has no schema at all.
        v.ok = true;
        v.absent = true;
    } else {
        v.error = std::move(r);
    }
    return v;
}

}  // namespace qsw
