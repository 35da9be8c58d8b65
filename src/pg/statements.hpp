// Every statement the library sends, defined once, by name: its text, its parameters in
// order and, for a row set, its columns (River's named queries are the model). A caller
// names the statement and fills its parameters; nothing outside this file writes SQL text
// for the sweeper's calls (the embedded schema apply aside: pg/schema.hpp).
//
// Every statement takes the server's now() (one instant per call) and pins its argument
// types with casts, so that a plan never depends on how libpq sends a parameter.
#pragma once

namespace qsw::sql {

// The probe. $1 int2[] shards (null: all), $2 int due cap, $3 double precision the floor,
// Unix ms (null: the index head), $4 int the horizon of the search for the next row, ms
// (null: none). One row, one column: the jsonb answer of queen.log_timers_due_v2 as text.
inline constexpr const char *kProbe =
    "SELECT queen.log_timers_due_v2($1::int2[], now(), $2::int, to_timestamp($3::double precision / 1000), "
    "$4::int)::text";

// The claim. $1 int2[] shards, $2 int lease_ms, $3 int max rows, $4 int rows per tenant,
// $5 bigint payload byte budget, $6 uuid the claim id (every claimed row's token),
// $7 uuid[] / $8 text[] / $9 text[] the (tenant, queue, partition) triples to leave alone
// (partitions someone else holds), $10 double precision the floor, Unix ms (null: the
// index head), $11 uuid[] the tenants to take a share of by their own index (the probe's
// "tenants"). Binary result (the payload as it is, not in hex); the uuids and the row's
// address come as text so that every column but the integers reads as its bytes. row_tid:
// the address of the row version the claim wrote, "(block,offset)", which the fire passes
// back so that it finds the row without a descent of the primary key (a hint only: the fire
// checks what it finds there, and goes by key when the row has moved).
inline constexpr const char *kClaim =
    "SELECT tenant_id::text, queue, timer_key, partition, txn, message_id::text, payload, payload_zstd, "
    "encrypted, producer_sub, claim_token::text, deliver_at_ms, late_ms, attempts, floor_ms, row_tid::text "
    "FROM queen.log_timers_claim_v4($1::int2[], now(), $2::int, $3::int, $4::int, $5::bigint, $6::uuid, "
    "$7::uuid[], $8::text[], $9::text[], to_timestamp($10::double precision / 1000), $11::uuid[])";
enum class ClaimCol {
    tenant, queue, timer_key, partition, txn, message_id, payload, payload_zstd, encrypted, producer_sub,
    claim_token, deliver_at_ms, late_ms, attempts, floor_ms, row_tid,
};

// The fire. $1 uuid[] segment tenants, $2 text[] queues, $3 text[] partitions, $4 int[]
// frame counts, $5 bytea[] (binary) txn hashes, $6 bytea[] (binary) blobs, $7 text[] timer
// keys in frame order, $8 int[] each key's segment (1-based), $9 uuid[] each key's token,
// $10 boolean wait on partitions, $11 tid[] each key's address as its claim gave it (null
// when any is unknown: every row is then found by key), $12 tid[] each segment's partition
// row's address after our last fire of it (null elements: unknown; schema 37). One row: the
// jsonb answer as text, in its compact form (a letter per segment, a number per fired one;
// schema 34), with "partitionTids", each segment's partition row's address now.
inline constexpr const char *kFire =
    "SELECT queen.log_timers_fire_v2($1::uuid[], $2::text[], $3::text[], $4::int[], $5, $6, "
    "$7::text[], $8::int[], $9::uuid[], now(), $10::boolean, $11::tid[], true, $12::tid[])::text";

// A failure, and the move of what it exhausts to the DLQ, in one call. $1 uuid[] tenants,
// $2 text[] queues, $3 text[] keys, $4 uuid[] tokens, $5 text error, $6 text class,
// $7 int backoff min, $8 int backoff max, $9 int transient backoff, $10 int max attempts.
// One row: {"released", "exhausted", "moved"} as text.
inline constexpr const char *kFail =
    "SELECT queen.log_timers_fail_v2($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5, $6, now(), "
    "$7::int, $8::int, $9::int, $10::int)::text";

// A hand-back, token-matched. $1 uuid[] tenants, $2 text[] queues, $3 text[] keys,
// $4 uuid[] tokens. One row: the number released.
inline constexpr const char *kRelease =
    "SELECT queen.log_timers_release_v2($1::uuid[], $2::text[], $3::text[], $4::uuid[], now())";

// The hand-back of claims whose answer was lost, by claim id. $1 uuid[] claim ids,
// $2 / $3 double precision: the window their lease ends in, Unix ms. One row: released.
inline constexpr const char *kReleaseClaims =
    "SELECT queen.log_timers_release_claims_v2($1::uuid[], to_timestamp($2::double precision / 1000), "
    "to_timestamp($3::double precision / 1000), now(), to_timestamp($4::double precision / 1000))";

// The check of fires whose answer was lost. $1 int[] segment numbers, $2 uuid[] tenants,
// $3 text[] queues, $4 bytea[] (binary) hashes, $5 int[] each key's segment, $6 text[] keys.
inline constexpr const char *kInDoubt =
    "SELECT seg, present, unlocked, base_offset FROM queen.log_timers_in_doubt_v1("
    "$1::int[], $2::uuid[], $3::text[], $4::bytea[], $5::int[], $6::text[])";
enum class InDoubtCol { seg, present, unlocked, base_offset };

// One slice of the walk from the index head for rows behind the floor. $1 double precision
// the slice's start, Unix ms (null: the index's head), $2 double precision its end (the
// floor at most), Unix ms. One row: the earliest due_at in the slice (Unix ms, or null), and
// n_dead_tup of queen.log_timers (or null: statistics off).
inline constexpr const char *kFloorHeadWalk =
    "SELECT queen.log_timers_below_floor_v1(to_timestamp($1::double precision / 1000), "
    "to_timestamp($2::double precision / 1000)), "
    "(SELECT s.n_dead_tup FROM pg_catalog.pg_stat_user_tables s "
    "WHERE s.schemaname = 'queen' AND s.relname = 'log_timers')";
enum class FloorHeadWalkCol { behind_ms, dead_tuples };

// Which server answers: host:port as the server reports it (also behind a bouncer),
// whether it is a standby, and what it is: its system identifier and, on a primary, the
// timeline it writes ("<system identifier>/<timeline>", "<system identifier>/recovery" on
// a standby, empty where the role may not read them). An address can outlive its server (a
// floating IP, a VIP, a Unix socket, a standby promoted and moved to the old primary's
// port): a restore or a promotion changes the identity, never a restart. Each function is
// guarded by the role's right to run it, so an operator's REVOKE costs the identity only.
inline constexpr const char *kIdentifyServer =
    "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || "
    "coalesce(inet_server_port()::text, current_setting('port')), pg_is_in_recovery(), "
    "coalesce(CASE WHEN has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE') "
    "THEN (SELECT s.system_identifier::text FROM pg_catalog.pg_control_system() s) END || '/' || "
    "CASE WHEN pg_is_in_recovery() THEN 'recovery' "
    "WHEN has_function_privilege('pg_catalog.pg_walfile_name(pg_catalog.pg_lsn)', 'EXECUTE') "
    "AND has_function_privilege('pg_catalog.pg_current_wal_lsn()', 'EXECUTE') "
    "THEN substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END, '')";
enum class IdentifyCol { server, in_recovery, identity };

// The schema version this database records. One row: int, or null.
inline constexpr const char *kReadSchemaVersion = "SELECT queen.schema_version_v1()";

// The KV prune's step. $1 int2[] shards (null: all), $2 int rows. One row: the jsonb answer
// of queen.kv_expire_step_v1 as text.
inline constexpr const char *kKvExpireStep = "SELECT queen.kv_expire_step_v1($1::int2[], now(), $2::int)::text";

// The tenants' ring's tidy. $1 int entries looked at. One row: the jsonb answer of
// queen.log_timers_tenants_tidy_v1 as text.
inline constexpr const char *kRingTidy = "SELECT queen.log_timers_tenants_tidy_v1($1::int)::text";

// The usage rollup's step. $1 int2[] shards, $2 int tenants. One row: jsonb as text.
inline constexpr const char *kKvUsageStep = "SELECT queen.kv_usage_step_v2($1::int2[], now(), $2::int, $3::int)::text";

}  // namespace qsw::sql
