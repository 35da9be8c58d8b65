// Typed calls of the statements in pg/statements.hpp: for a statement, its arguments in a
// struct, the Query built from them in one place, and its answer decoded into a struct by
// one pure decoder that never throws (base/json_get.hpp is the one JSON policy). Call sites
// neither index a positional parameter nor spell an answer's key.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "codec/packer.hpp"
#include "pg/fire_answer.hpp"
#include "pg/pg_conn.hpp"

namespace qsw {

// ---- The claim (sql::kClaim) ---------------------------------------------------------------------

struct ClaimArgs {
    std::vector<int16_t> shards;
    int64_t lease_ms = 0, max_rows = 0, rows_per_tenant = 0, max_bytes = 0;
    std::string claim_id;  // every claimed row's claim_token
    // The (tenant, queue, partition) triples to leave alone (partitions someone else holds).
    std::vector<std::string> skip_tenants, skip_queues, skip_partitions;
    std::optional<int64_t> floor_ms;   // none: the index head
    bool backlog = false;              // under a backlog: the claim names tenants from the ring
};
Query claim_query(const ClaimArgs &a);  // with a binary result (the payload as it is)

// The claim's answer (sql::ClaimCol, binary). Every value is checked: one that does not read
// back as written must never become an empty payload fired without a word. A row whose
// names (tenant, queue, key, token) were read is in `rows` whatever else of it failed, so it
// can be handed back; `undecodable` names the first column that did not decode (the claim
// then goes back whole). A row's late_ms is its lateness at the claim less `claimed_at_mono`
// (the loop clock when the answer came), so lateness later is late_ms + now, one clock.
struct ClaimAnswer {
    std::vector<ClaimedTimer> rows;
    int64_t bytes = 0;                  // payload bytes the rows carry
    std::string undecodable;            // empty: every column read
    std::optional<int64_t> floor_ms;    // the floor the next call starts from (the same on every row)
};
ClaimAnswer read_claim_answer(const PgResult &r, uint64_t claimed_at_mono);

// ---- The fire (sql::kFire) --------------------------------------------------------------

// The segment arrays hold one element per segment, the key arrays one per key in frame
// order. The text arrays come as literals (TextArrayLiteral, pg/sql_args.hpp) written
// straight from the claimed rows, with no copy per row.
struct FireArgs {
    std::string seg_tenants, seg_queues, seg_partitions;  // text[] literals
    std::vector<int64_t> counts;                          // frames per segment
    std::vector<std::string_view> hashes, blobs;          // per segment (sent as binary bytea[])
    std::string keys, tokens;                             // text[] literals: each key, its claim token
    std::vector<int64_t> key_segments;                    // each key's segment, 1-based
    bool wait = false;                                    // wait on partitions
    std::optional<std::string> tids;  // tid[] literal of each key's address (none: any unknown)
    // tid[] literal, per segment: where its partition's row was after our last fire of it
    // (NULL elements: unknown; none: the answer then carries no addresses). Schema 37.
    std::optional<std::string> seg_partition_tids;
};
Query fire_query(FireArgs &&a);

// Its answer: FireAnswer, read by parse_fire_answer (pg/fire_answer.hpp).

// ---- The walk from the index head (sql::kFloorHeadWalk) -----------------------------------

struct HeadWalkArgs {
    std::optional<int64_t> from_ms;  // the slice's start, Unix ms (none: the index's head)
    int64_t until_ms = 0;            // its end, not included: the floor at most, Unix ms
};
Query head_walk_query(const HeadWalkArgs &a);

// Unreadable: not one row, or a column that is neither null nor an integer.
struct HeadWalkAnswer {
    bool readable = false;
    std::optional<int64_t> behind_ms;  // the earliest due instant in the slice (none: none)
    int64_t dead_tuples = -1;          // n_dead_tup of queen.log_timers (-1: unknown)
};
HeadWalkAnswer read_head_walk_answer(const PgResult &r);

// ---- The probe (sql::kProbe) ----------------------------------------------------------------

struct ProbeArgs {
    std::vector<int16_t> shards;         // empty: all
    int64_t due_cap = 0;                 // the capped count of due rows
    std::optional<int64_t> floor_ms;     // the floor, Unix ms (none: the index head)
    std::optional<int64_t> horizon_ms;   // the horizon of the search for the next row (none: none)
};
Query probe_query(const ProbeArgs &a);

// Unreadable: not JSON, not an object, or a "nextInMs" that is neither null nor an integer.
struct ProbeAnswer {
    bool readable = false;
    std::string unreadable;
    std::optional<int64_t> next_in_ms;  // "nextInMs": the nearest due instant, ms from now (none: none found)
    bool beyond = false;                // "beyond": none within the horizon, but some beyond it
    int64_t due = 0;                    // "due": the capped count of due rows
    bool due_capped = false;            // "dueCapped"
    int64_t held = 0;                   // "held": rows behind the floor held by someone
    int64_t late_ms = 0;                // "lateMs": the oldest due row's lateness
    std::optional<int64_t> now_ms;      // "nowMs": the server's now(), Unix ms
    std::optional<int64_t> floor_ms;    // "floorMs": the floor the next call starts from
    std::optional<int64_t> turn_timeouts;  // "turnTimeouts": the fleet's claim-turn timeouts (>= 0)
    bool fire_enabled = true;           // "fireEnabled"
    bool maintenance = false;           // "maintenance"
};
ProbeAnswer read_probe_answer(std::string_view text);

// ---- The KV prune's step (sql::kKvExpireStep) ------------------------------------------------

struct KvExpireArgs {
    std::vector<int16_t> shards;
    int64_t rows = 0;
};
Query kv_expire_query(const KvExpireArgs &a);

// Unreadable: not JSON or not an object.
struct KvExpireAnswer {
    bool readable = false;
    int64_t deleted = 0;           // "deleted"
    bool done = true;              // "done": nothing more expired within the step's reach
    int64_t unpruned = 0;          // "unpruned": expired rows still present
    bool unpruned_capped = false;  // "unprunedCapped"
    int64_t lag_ms = 0;            // "lagMs"
    bool ttl_ahead = false;        // "nextExpiryMs" is a number: keys with a ttl still ahead
};
KvExpireAnswer read_kv_expire_answer(std::string_view text);

// ---- The tenants' ring's tidy (sql::kRingTidy) ---------------------------------------------

Query ring_tidy_query(int64_t max_entries);

// Unreadable: not JSON, not an object, or without "tenants".
struct RingTidyAnswer {
    bool readable = false;
    int64_t looked = 0;   // "looked": entries looked at
    int64_t removed = 0;  // "removed": tenants without timers removed
    int64_t tenants = 0;  // "tenants": entries left
};
RingTidyAnswer read_ring_tidy_answer(std::string_view text);

// ---- The usage rollup's step (sql::kKvUsageStep) ----------------------------------------------

struct KvUsageArgs {
    std::vector<int16_t> shards;
    int64_t max_tenants = 0;
    int64_t every_ms = 0;
};
Query kv_usage_query(const KvUsageArgs &a);

// Unreadable: not JSON or not an object.
struct KvUsageAnswer {
    bool readable = false;
    bool skipped = false;          // "skipped" is a string: another rollup ran recently, or holds the lock
    int64_t age_ms = -1;           // skipped "recent": "ageMs" (else -1)
    double max_quota_ratio = 0.0;  // "maxQuotaRatio"
    bool sampled = false;          // "sampled"
    nlohmann::json tenants = nlohmann::json::array();  // "tenants" as answered (absent: [])
};
KvUsageAnswer read_kv_usage_answer(std::string_view text);

// ---- A failure (sql::kFail) --------------------------------------------------------------------

struct FailArgs {
    std::vector<std::string> tenants, queues, keys, tokens;  // one per row
    std::string error, error_class;
    int64_t backoff_min_ms = 0, backoff_max_ms = 0, transient_backoff_ms = 0, max_attempts = 0;
};
Query fail_query(const FailArgs &a);

// Unreadable: no single row, not JSON, or not an object.
struct FailAnswer {
    bool readable = false;
    int64_t released = 0;   // "released"
    int64_t exhausted = 0;  // "exhausted"
    int64_t moved = 0;      // "moved": to the DLQ
};
FailAnswer read_fail_answer(const PgResult &r);

// ---- Hand-backs (sql::kRelease, sql::kReleaseClaims) -------------------------------------------

struct ReleaseArgs {
    std::vector<std::string> tenants, queues, keys, tokens;  // one per row, token-matched
};
Query release_query(const ReleaseArgs &a);

struct ReleaseClaimsArgs {
    std::vector<std::string> claim_ids;
    int64_t lease_from_unix_ms = 0, lease_to_unix_ms = 0;  // the window their lease ends in
    std::optional<int64_t> floor_unix_ms;  // the floor the claims were sent with (none: the index head)
};
Query release_claims_query(const ReleaseClaimsArgs &a);

// Either hand-back's answer: the number of rows released (none: no single readable row).
std::optional<int64_t> read_released(const PgResult &r);

// ---- The in-doubt check (sql::kInDoubt) --------------------------------------------------------

struct InDoubtArgs {
    std::vector<int64_t> segments;             // each segment's number
    std::vector<std::string> tenants, queues;  // per segment
    std::vector<std::string_view> hashes;      // per segment: its txn hashes
    std::vector<int64_t> key_segments;         // per key: its segment's number
    std::vector<std::string> keys;             // the timer keys to look for
};
Query in_doubt_query(const InDoubtArgs &a);

// One row of the check. readable: seg, present and unlocked are integers and base_offset
// is null or an integer.
struct InDoubtRow {
    bool readable = false;
    int64_t seg = -1;
    int64_t present = 0;   // the segment's keys still in the table
    int64_t unlocked = 0;  // of those, the ones nobody holds a lock on
    int64_t base = -1;     // the offset the log has the segment at (null: -1, not there)
};
std::vector<InDoubtRow> read_in_doubt_rows(const PgResult &r);

// ---- Which server answers (sql::kIdentifyServer) -------------------------------------------------

Query identify_query();  // no parameter

// Unreadable: no single row.
struct IdentifyAnswer {
    bool readable = false;
    std::string server;    // host:port as the server reports it
    bool in_recovery = false;
    std::string identity;  // "<system identifier>/<timeline>" (empty where the role may not read them)
};
IdentifyAnswer read_identify_answer(const PgResult &r);

// ---- The schema version (sql::kReadSchemaVersion) -------------------------------------------------

// No parameter. The SQLSTATEs of a schema not there yet (kSchemaAbsentSqlstates) are an
// answer, not a failed call: a healthy first start counts no failed call.
Query schema_version_query();

struct SchemaVersionAnswer {
    bool ok = false;       // the call answered
    bool absent = false;   // no queen.schema_version_v1(), no schema, or nothing recorded
    int64_t version = -1;
    PgResult error;        // when !ok: the failure, or an answer that is not an integer
};
SchemaVersionAnswer read_schema_version(PgResult r);

}  // namespace qsw
