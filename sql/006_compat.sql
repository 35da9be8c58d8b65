-- 006_compat.sql: what release 1.0.0 shipped and the current schema has replaced, kept
-- callable as one-statement wrappers of the current bodies until the next major release
-- (sql/README.md, "Versions"). Nothing else lives here, and nothing here has a body of its
-- own: each function is one SQL statement over the current function of its operation, with
-- 1.0.0's arguments and answer shape as closely as that body allows (each header says where
-- it differs). tests/sql/test_versions.py holds the file to that.
--
-- Callers: brokers of 1.0.0 during a rolling upgrade (tests/upgrade runs one against this
-- schema while timers fire). Removed at 2.0.0.
--
-- Idempotent and lock-free on re-apply, like 001 (see its header). Needs 002, 003 and 005
-- (005 is optional: its wrapper is created without a check of its body, and a call without
-- 005 fails with 42883, class 42, which a sweeper reads as "phase off").

CREATE SCHEMA IF NOT EXISTS queen;

-- The apply mutex (see 001); repeated so this file also stands alone under `psql -f`.
CREATE TABLE IF NOT EXISTS queen.schema_apply (
    id          int PRIMARY KEY CHECK (id = 1),
    applied_at  timestamptz NOT NULL,
    apply_count bigint NOT NULL DEFAULT 1
);
INSERT INTO queen.schema_apply AS s (id, applied_at)
VALUES (1, clock_timestamp())
ON CONFLICT (id) DO UPDATE SET applied_at = s.applied_at;

-- queen.log_timers_due_v1(shards int2[], now timestamptz, cap int) -> jsonb
--   {"now", "nowMs", "nextInMs", "due", "dueCapped", "lateMs", "fireEnabled",
--    "maintenance", "scheduleEnabled"}
-- log_timers_due_v2 from the index's head (no floor), with no horizon, without the keys
-- 1.0.0 did not answer. Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_due_v1(p_shards int2[], p_now timestamptz, p_cap int)
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT queen.log_timers_due_v2(p_shards, p_now, p_cap, NULL, NULL)
           - 'floor' - 'floorMs' - 'beyond' - 'held' - 'turnTimeouts'
$fn$;

-- queen.log_timers_claim_v1(shards int2[], now, lease_ms int, max_rows int, per_tenant int)
--   -> the table of log_timers_claim_v4 without floor_ms and row_tid
-- log_timers_claim_v4 from the index's head, without a byte budget, a skip list or named
-- tenants, each row with a fresh token of its own. Differs from 1.0.0: the pool is
-- max_rows (1.0.0: 2 * max_rows when per_tenant is below max_rows), so per_tenant shares
-- the oldest max_rows due rows. Locks: those of log_timers_claim_v4.
CREATE OR REPLACE FUNCTION queen.log_timers_claim_v1(
    p_shards int2[], p_now timestamptz, p_lease_ms int, p_max_rows int, p_per_tenant int)
RETURNS TABLE (tenant_id uuid, queue text, timer_key text, partition text, txn text,
               message_id uuid, payload bytea, payload_zstd boolean, encrypted boolean,
               producer_sub text, claim_token uuid, deliver_at_ms bigint, late_ms bigint,
               attempts int)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT c.tenant_id, c.queue, c.timer_key, c.partition, c.txn, c.message_id, c.payload,
           c.payload_zstd, c.encrypted, c.producer_sub, c.claim_token, c.deliver_at_ms,
           c.late_ms, c.attempts
      FROM queen.log_timers_claim_v4(p_shards, p_now, p_lease_ms, p_max_rows, p_per_tenant,
                                     NULL, NULL, NULL, NULL, NULL, NULL, NULL) AS c
$fn$;

-- queen.log_timers_fire_v1(<the first eleven arguments of log_timers_fire_v2>) -> jsonb
-- log_timers_fire_v2 without addresses (every row found by key), with 1.0.0's promise that
-- a fire with wait true never answers "busy": log_timers_fire_v2 answers busy also for a
-- segment whose rows are all still the caller's but some are locked by another transaction
-- (another broker's claim passing over them), even with wait true. A 1.0.0 broker answers
-- busy by firing again at once with wait true, so each such answer is given to it as what
-- 1.0.0 answered there: {"status": "stale", "held": 0} (counted in "stale", "busy" 0). The
-- rows are untouched and still claimed; the 1.0.0 broker hands them back token-matched (or
-- their lease lapses), and a later claim fires them. With wait false, busy is answered as
-- 1.0.0 did. Schema 18, a queue or partition someone else holds: 1.0.0 provisioned with no
-- deadline, so a host transaction that created the queue (or deleted it) and stayed open
-- held a 1.0.0 fire, and every timer of its call, as long. Decided: never an unbounded
-- wait, and still never busy with wait true. log_timers_fire_v2 waits for the name at most
-- the session's lock_timeout, and never more than 500 ms (500 ms when it is 0, as a 1.0.0
-- broker calls it), then answers that name's segments busy, which this wrapper answers
-- {"status": "stale", "held": 0} like any other busy segment: the other segments of the
-- call are fired, and the 1.0.0 broker hands the held name's rows back (or they lapse with
-- their lease) and a later claim fires them once the name is free. "provisionBusy" (how
-- many segments that was) is passed through. Locks: as log_timers_fire_v2.
CREATE OR REPLACE FUNCTION queen.log_timers_fire_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_seg_hashes bytea[], p_seg_blobs bytea[], p_timer_keys text[], p_timer_seg int[],
    p_timer_tokens uuid[], p_now timestamptz, p_wait boolean DEFAULT true)
RETURNS jsonb
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT CASE
           WHEN p_wait IS NOT TRUE
                OR NOT jsonb_path_exists(a, '$.segments[*] ? (@.status == "busy")') THEN a
           ELSE a || jsonb_build_object(
                'segments', (SELECT jsonb_agg(CASE WHEN e.s ->> 'status' = 'busy'
                                                   THEN '{"status": "stale", "held": 0}'::jsonb
                                                   ELSE e.s END ORDER BY e.o)
                               FROM jsonb_array_elements(a -> 'segments') WITH ORDINALITY AS e(s, o)),
                'stale', coalesce((a ->> 'stale')::int, 0)
                         + jsonb_array_length(jsonb_path_query_array(a, '$.segments[*] ? (@.status == "busy")')),
                'busy', 0)
           END
      FROM queen.log_timers_fire_v2(p_seg_tenants, p_seg_queues, p_seg_partitions, p_seg_counts,
               p_seg_hashes, p_seg_blobs, p_timer_keys, p_timer_seg, p_timer_tokens, p_now,
               p_wait, NULL) AS a
$fn$;

-- queen.log_timers_fail_v1(<the arguments of log_timers_fail_v2>) -> jsonb
--   {"released": n, "exhausted": [{"tenant", "queue", "key", "attempts"}, ...]}
-- log_timers_fail_v2 without "moved". Differs from 1.0.0: what it exhausts is already in
-- queen.log_dlq when it returns (1.0.0 left the move to a later log_timers_dlq_v1, which
-- then finds the rows gone and moves nothing: every exhausted timer is dead-lettered once).
-- Locks: those of log_timers_fail_v2.
CREATE OR REPLACE FUNCTION queen.log_timers_fail_v1(
    p_tenants uuid[], p_queues text[], p_keys text[], p_tokens uuid[], p_error text,
    p_class text, p_now timestamptz, p_backoff_min_ms int, p_backoff_max_ms int,
    p_transient_backoff_ms int, p_max_attempts int)
RETURNS jsonb
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT queen.log_timers_fail_v2(p_tenants, p_queues, p_keys, p_tokens, p_error, p_class,
               p_now, p_backoff_min_ms, p_backoff_max_ms, p_transient_backoff_ms, p_max_attempts)
           - 'moved'
$fn$;

-- queen.log_timers_release_v1(tenants uuid[], queues text[], keys text[], tokens uuid[]) -> int
-- log_timers_release_v2 without a now: claimed_until is nulled, as in 1.0.0, and the
-- trigger log_timers_not_behind (002) puts a due row at the transaction's now(), in front
-- of every sweeper's floor. Locks: those of log_timers_release_v2.
CREATE OR REPLACE FUNCTION queen.log_timers_release_v1(
    p_tenants uuid[], p_queues text[], p_keys text[], p_tokens uuid[])
RETURNS int
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT queen.log_timers_release_v2(p_tenants, p_queues, p_keys, p_tokens, NULL)
$fn$;

-- 005 is optional: the wrapper below is created without checking that its callee exists.
SET check_function_bodies = off;

-- queen.kv_usage_step_v1(shards int2[], now timestamptz, max_tenants int) -> jsonb
-- kv_usage_step_v2 without its gate (a pass on every call, as in 1.0.0), without "skipped".
-- Locks: those of kv_usage_step_v2 without the gate's row.
CREATE OR REPLACE FUNCTION queen.kv_usage_step_v1(p_shards int2[], p_now timestamptz, p_max_tenants int)
RETURNS jsonb
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT queen.kv_usage_step_v2(p_shards, p_now, p_max_tenants, NULL) - 'skipped'
$fn$;
RESET check_function_bodies;
