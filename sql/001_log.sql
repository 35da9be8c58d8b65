-- 001_log.sql: the log subset the sweeper writes into, the operator switches, and the
-- plain push and read functions brokers and tests use.
--
-- Applied as one multi-statement string by the plugin (files concatenated in numeric
-- order, one implicit transaction) and also appliable with `psql -f`. Every statement is
-- idempotent, and re-applying on a populated, running database takes no lock on any
-- broker table:
--   * CREATE TABLE / SEQUENCE IF NOT EXISTS only look the name up;
--   * indexes are created inside a catalog check, because CREATE INDEX IF NOT EXISTS
--     takes a SHARE lock on its table before it notices the index exists, and that lock
--     (held to the end of the apply) would stall every writer and could close a cycle
--     with a broker transaction that follows the broker-wide lock order;
--   * storage settings live in CREATE TABLE ... WITH, so a re-apply never ALTERs.
--
-- Concurrent application. Two processes applying at the same moment are serialised by
-- the row upsert on queen.schema_apply below (a row lock on a table no broker
-- transaction touches, so it cannot be an edge of the broker's wait-for graph, and it
-- consumes no advisory number). Only the very first apply on an empty database can still
-- race, on CREATE SCHEMA / CREATE TABLE of schema_apply itself (23505 or 42P07); the
-- plugin retries the whole apply once on those, and on the retry everything exists.

CREATE SCHEMA IF NOT EXISTS queen;

CREATE TABLE IF NOT EXISTS queen.schema_apply (
    id          int PRIMARY KEY CHECK (id = 1),
    applied_at  timestamptz NOT NULL,
    apply_count bigint NOT NULL DEFAULT 1
);

-- The apply mutex: a second concurrent apply waits here until the first commits, then
-- finds every object in place. Harmless under `psql -f` (autocommit: released at once).
-- apply_count counts applications of this file; the later files take the same row lock
-- without counting.
INSERT INTO queen.schema_apply AS s (id, applied_at)
VALUES (1, clock_timestamp())
ON CONFLICT (id) DO UPDATE
    SET applied_at = excluded.applied_at, apply_count = s.apply_count + 1;

-- ---------------------------------------------------------------------------------------
-- Queues and partitions
-- ---------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS queen.queues (
    id              bigserial PRIMARY KEY,
    tenant_id       uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000001',
    name            text COLLATE "C" NOT NULL,
    -- A transaction id already in this queue's log less than this long ago makes a fired
    -- segment that carries it a duplicate (queen.log_timers_fire_v1).
    dedup_window_ms bigint NOT NULL DEFAULT 3600000 CHECK (dedup_window_ms >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

-- Storage settings of queen.log_partitions.
--   fillfactor = 70: not measured (2026-11-29) in this project. Symptom addressed: every
--   push rewrites the partition row (last_offset), and a rewrite stays a HOT update only
--   while the page has free space. The reference broker sets 70 on this table under its
--   own dated block; its observed numbers are not restated here because we have not
--   reproduced them. To be replaced by our own measurement after the first soak.
CREATE TABLE IF NOT EXISTS queen.log_partitions (
    id          bigserial PRIMARY KEY,
    queue_id    bigint NOT NULL REFERENCES queen.queues (id),
    name        text COLLATE "C" NOT NULL,
    -- The offset allocator: the next segment gets base_offset = last_offset + 1.
    last_offset bigint NOT NULL DEFAULT -1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
) WITH (fillfactor = 70);

-- ---------------------------------------------------------------------------------------
-- Segments, their transaction hashes, and the per-queue dedup index
-- ---------------------------------------------------------------------------------------

-- No foreign key to log_partitions: every writer already holds the partition row FOR
-- UPDATE, so a key check would only lock it again on every insert.
CREATE TABLE IF NOT EXISTS queen.log_segments (
    partition_id bigint NOT NULL,
    base_offset  bigint NOT NULL,
    end_offset   bigint NOT NULL,
    count        int NOT NULL CHECK (count > 0),
    created_at   timestamptz NOT NULL,
    blob         bytea NOT NULL,
    PRIMARY KEY (partition_id, base_offset),
    CHECK (end_offset = base_offset + count - 1)
);

-- hashes: the xxh3-128 of each frame's transaction id, 16 bytes big-endian, frame order.
CREATE TABLE IF NOT EXISTS queen.log_txns (
    partition_id bigint NOT NULL,
    base_offset  bigint NOT NULL,
    hashes       bytea NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
);

-- Storage of log_segments.blob and log_txns.hashes: SET STORAGE EXTERNAL (out of line when
-- the row is over the toast threshold, never compressed by the server), set once behind a
-- catalog check. SET STORAGE measured (2026-12-01) (tests/bench/README.md, third pass): a blob is always zstd
-- already (every writer compresses its segment as a whole) and hashes are xxh3 output, so
-- pglz never wins on either; its attempts on every segment of a fire were 4.4% of the
-- machine's samples while one sweeper drained 300,000 timers (perf, pglz_compress under
-- toast_compress_datum). SET STORAGE takes an ACCESS EXCLUSIVE lock on the table for a
-- catalog update (no rewrite; rows written before keep their form): once, on the first
-- apply of schema version 7; every later apply finds the setting and stays lock-free.
DO $apply$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = 'queen.log_segments'::regclass AND attname = 'blob' AND attstorage <> 'e') THEN
        ALTER TABLE queen.log_segments ALTER COLUMN blob SET STORAGE EXTERNAL;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = 'queen.log_txns'::regclass AND attname = 'hashes' AND attstorage <> 'e') THEN
        ALTER TABLE queen.log_txns ALTER COLUMN hashes SET STORAGE EXTERNAL;
    END IF;
END
$apply$;

-- One row per (queue, transaction hash): where that transaction last landed. Dedup is per
-- queue because a transaction identifies a message across the queue's partitions. A row
-- older than the queue's dedup_window_ms no longer counts, and is overwritten when the same
-- transaction is written again; pruning old rows belongs to retention, not to this file.
CREATE TABLE IF NOT EXISTS queen.log_txn_index (
    queue_id     bigint NOT NULL,
    hash         bytea NOT NULL CHECK (octet_length(hash) = 16),
    partition_id bigint NOT NULL,
    log_offset   bigint NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (queue_id, hash)
);

-- ---------------------------------------------------------------------------------------
-- Dead letters
-- ---------------------------------------------------------------------------------------

-- Exhausted timers land here with consumer_group '__timer__' and log_offset -1.
CREATE TABLE IF NOT EXISTS queen.log_dlq (
    id             bigserial PRIMARY KEY,
    tenant_id      uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000001',
    queue          text COLLATE "C" NOT NULL,
    partition      text COLLATE "C" NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    log_offset     bigint NOT NULL,
    payload        jsonb,
    error          text,
    message_id     uuid,
    txn            text,
    timer_key      text COLLATE "C",
    attempts       int,
    created_at     timestamptz NOT NULL DEFAULT now()
);

DO $apply$
BEGIN
    IF to_regclass('queen.log_dlq_tenant_queue_idx') IS NULL THEN
        CREATE INDEX log_dlq_tenant_queue_idx
            ON queen.log_dlq (tenant_id, queue, consumer_group, created_at);
    END IF;
END
$apply$;

-- ---------------------------------------------------------------------------------------
-- Operator switches
-- ---------------------------------------------------------------------------------------

-- Known keys: 'timers_fire_enabled', 'timers_schedule_enabled' (absent row = on),
-- 'maintenance_mode' (absent row = off; when true the fire is suspended, nothing lost).
CREATE TABLE IF NOT EXISTS queen.system_state (
    key        text COLLATE "C" PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- queen.switch_enabled_v1(key, default) -> bool
-- The value of a boolean switch: a JSON boolean, or a JSON string among
-- true/1/yes/on/false/0/no/off (any case); an absent row or any other value is p_default,
-- so a malformed row can never silently turn a feature off.
-- Locks: none (plain read of queen.system_state).
CREATE OR REPLACE FUNCTION queen.switch_enabled_v1(p_key text, p_default boolean)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT coalesce(
        (SELECT CASE
                    WHEN jsonb_typeof(s.value) = 'boolean' THEN (s.value #>> '{}')::boolean
                    WHEN jsonb_typeof(s.value) = 'string'
                         AND lower(s.value #>> '{}') IN ('true', '1', 'yes', 'on') THEN true
                    WHEN jsonb_typeof(s.value) = 'string'
                         AND lower(s.value #>> '{}') IN ('false', '0', 'no', 'off') THEN false
                END
           FROM queen.system_state s
          WHERE s.key = p_key),
        p_default)
$fn$;

-- ---------------------------------------------------------------------------------------
-- Internal helpers shared by the push and the fire (003): checks, provisioning, the
-- partition locks and the one append to the log
-- ---------------------------------------------------------------------------------------

-- queen.check_now_v1(fn, now): raises 22023, message naming fn and the accepted range,
-- unless now is a finite instant in [1970-01-01, 10000-01-01) UTC. Every function that
-- takes the caller's `now` calls it first: an infinite now used to fail deep inside with
-- 0A000 (epoch milliseconds of infinity), and an instant near the end of the timestamp
-- range overflows (22008) once a delay or a TTL is added. Locks: none.
CREATE OR REPLACE FUNCTION queen.check_now_v1(p_fn text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION '%: now must not be null', p_fn USING ERRCODE = '22023';
    END IF;
    IF NOT (p_now >= timestamptz '1970-01-01 00:00:00+00' AND p_now < timestamptz '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION '%: now is %, outside the accepted range [1970-01-01, 10000-01-01) UTC',
            p_fn, p_now USING ERRCODE = '22023';
    END IF;
END
$fn$;

-- queen.check_bytes_v1(fn, what, value, limit, why): raises 22023 when value is longer than
-- limit bytes, with a message naming fn, the field (what), its size, the limit and why the
-- limit exists. Checks the length only, so it costs nothing on a huge value. Locks: none.
CREATE OR REPLACE FUNCTION queen.check_bytes_v1(p_fn text, p_what text, p_value text, p_limit int, p_why text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    IF p_value IS NOT NULL AND octet_length(p_value) > p_limit THEN
        RAISE EXCEPTION '%: %: % bytes, over the %-byte limit (%)',
            p_fn, p_what, octet_length(p_value), p_limit, p_why USING ERRCODE = '22023';
    END IF;
    RETURN p_value;
END
$fn$;

-- queen.log_provision_v1(tenant, queue, partition) -> (queue_id, partition_id, dedup_window_ms)
-- Creates the queue and the partition when missing and returns their ids.
-- Locks, in order: queues (the inserted row, or a wait on a concurrent inserter of the same
-- name), then log_partitions (same; the partition insert also takes FOR KEY SHARE on its
-- queue row). Never locks an existing partition row.
CREATE OR REPLACE FUNCTION queen.log_provision_v1(
    p_tenant uuid, p_queue text, p_partition text,
    OUT queue_id bigint, OUT partition_id bigint, OUT dedup_window_ms bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
#variable_conflict use_column
BEGIN
    SELECT q.id, q.dedup_window_ms INTO queue_id, dedup_window_ms
      FROM queen.queues q
     WHERE q.tenant_id = p_tenant AND q.name = p_queue;
    IF queue_id IS NULL THEN
        INSERT INTO queen.queues AS q (tenant_id, name)
        VALUES (p_tenant, p_queue)
        ON CONFLICT (tenant_id, name) DO NOTHING;
        SELECT q.id, q.dedup_window_ms INTO queue_id, dedup_window_ms
          FROM queen.queues q
         WHERE q.tenant_id = p_tenant AND q.name = p_queue;
    END IF;

    SELECT p.id INTO partition_id
      FROM queen.log_partitions p
     WHERE p.queue_id = log_provision_v1.queue_id AND p.name = p_partition;
    IF partition_id IS NULL THEN
        INSERT INTO queen.log_partitions AS p (queue_id, name)
        VALUES (log_provision_v1.queue_id, p_partition)
        ON CONFLICT (queue_id, name) DO NOTHING;
        SELECT p.id INTO partition_id
          FROM queen.log_partitions p
         WHERE p.queue_id = log_provision_v1.queue_id AND p.name = p_partition;
    END IF;
END
$fn$;

-- queen.log_provision_try_v1(tenant, queue, partition, lock_wait_ms int)
--   -> (queue_id, partition_id, dedup_window_ms), all three null when it met a lock
-- log_provision_v1 in a subtransaction under a lock_timeout of lock_wait_ms (at least 1 ms;
-- null: 1 ms). Provisioning waits only on another transaction's hold on the same name: an
-- open transaction that inserted the same queue or partition (a host creating the queue
-- with log_provision_v1), or that deletes or renames the queue row a new partition's key
-- check must share. When such a wait reaches lock_wait_ms the subtransaction is undone
-- (the lock_timeout with it) and the answer is all null, so its caller treats the name as
-- held, as it treats a partition row someone holds (the fire, 003: its segment answers
-- busy, rows untouched and still claimed). Schema 18: the fire used to call
-- log_provision_v1 with no deadline, and one host transaction holding a queue row stalled
-- every tenant's fires as long as it stayed open.
-- Locks: those of log_provision_v1, each wait at most lock_wait_ms.
CREATE OR REPLACE FUNCTION queen.log_provision_try_v1(
    p_tenant uuid, p_queue text, p_partition text, p_lock_wait_ms int,
    OUT queue_id bigint, OUT partition_id bigint, OUT dedup_window_ms bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_lt   text := pg_catalog.current_setting('lock_timeout');
    v_prov record;
BEGIN
    BEGIN
        PERFORM pg_catalog.set_config('lock_timeout',
            greatest(coalesce(p_lock_wait_ms, 1), 1)::text || 'ms', true);
        v_prov := queen.log_provision_v1(p_tenant, p_queue, p_partition);
        PERFORM pg_catalog.set_config('lock_timeout', v_lt, true);
        queue_id := v_prov.queue_id;
        partition_id := v_prov.partition_id;
        dedup_window_ms := v_prov.dedup_window_ms;
    EXCEPTION WHEN lock_not_available THEN
        -- Undone, the lock_timeout set above with it: the name is someone else's for now.
        queue_id := NULL;
        partition_id := NULL;
        dedup_window_ms := NULL;
    END;
END
$fn$;

-- Schema 36: the partitions' lock returns each row's address with it (log_partitions_lock_v2);
-- the form that returned only the offsets is gone (nothing outside this schema calls it).
DROP FUNCTION IF EXISTS queen.log_partitions_lock_v1(bigint[], boolean);

-- queen.log_partitions_lock_v2(partition_ids bigint[], wait boolean)
--   -> table (id bigint, last_offset bigint, tid tid)
-- Takes the named log_partitions rows FOR UPDATE in ascending id order, in one statement,
-- and returns a row for each row taken: its id, its last_offset read under that lock and
-- its address (ctid), which the append (log_append_dedup_v1) writes at. An id named twice
-- is taken once; a null id, an id that does not exist or (wait false) a row someone else
-- holds returns nothing. wait true (or null): FOR UPDATE, which waits; false: FOR UPDATE
-- SKIP LOCKED, which never waits. Every writer of the log takes its partitions here (the
-- fire's first call at their addresses, log_timers_fire_take_v1), then appends with
-- log_append_dedup_v1 under these locks.
-- Locks: the log_partitions rows, FOR UPDATE (or FOR UPDATE SKIP LOCKED), ascending id.
CREATE OR REPLACE FUNCTION queen.log_partitions_lock_v2(p_partition_ids bigint[], p_wait boolean)
RETURNS TABLE (id bigint, last_offset bigint, tid tid)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    -- The ids are an index condition (the scan drops nulls and repeats); the ORDER BY puts
    -- the row locks in ascending id order (LockRows runs above the sort).
    IF p_wait IS DISTINCT FROM false THEN
        RETURN QUERY
            SELECT lp.id, lp.last_offset, lp.ctid
              FROM queen.log_partitions lp
             WHERE lp.id = ANY (p_partition_ids)
             ORDER BY lp.id
               FOR UPDATE;
    ELSE
        RETURN QUERY
            SELECT lp.id, lp.last_offset, lp.ctid
              FROM queen.log_partitions lp
             WHERE lp.id = ANY (p_partition_ids)
             ORDER BY lp.id
               FOR UPDATE SKIP LOCKED;
    END IF;
END
$fn$;

-- The guard against a 1.0.0 broker's apply (sql/README.md, "Versions"). A 1.0.0 broker with
-- apply_schema on applies its own embedded files at every start (1.0.0 has no version
-- check), which would put 1.0.0's bodies back under the names 006_compat.sql wraps, and no
-- current broker would put them back (it finds this version recorded). Those files create
-- queen.log_append_v1, 1.0.0's single-segment append, returning (base_offset, end_offset).
-- The function below has the same arguments and another result type, so that CREATE OR
-- REPLACE fails (42P13) and the whole 1.0.0 apply with it (one implicit transaction): the
-- 1.0.0 broker logs "schema apply failed" and runs on this schema through the wrappers.
-- 1.0.0's own append, where an upgraded database still has it, is dropped first.
DO $drop$
BEGIN
    IF (SELECT p.prorettype FROM pg_catalog.pg_proc p
         WHERE p.oid = pg_catalog.to_regprocedure('queen.log_append_v1(bigint, bigint, integer, bytea, bytea, '
                                                  'timestamp with time zone)')) <> 'int'::regtype THEN
        DROP FUNCTION queen.log_append_v1(bigint, bigint, integer, bytea, bytea, timestamptz);
    END IF;
END
$drop$;

-- queen.log_append_v1(queue_id bigint, partition_id bigint, count int, hashes bytea,
--                     blob bytea, now timestamptz) -> int: the guard above; returns null and
-- does nothing (nothing calls it; granted to nobody). Locks: none.
CREATE OR REPLACE FUNCTION queen.log_append_v1(
    p_queue_id bigint, p_partition_id bigint, p_count int, p_hashes bytea, p_blob bytea,
    p_now timestamptz)
RETURNS int
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT NULL::int
$fn$;

-- queen.log_dedup_check_v1(queue_ids bigint[], last_offsets bigint[], counts int[],
--     hashes bytea[], windows bigint[], now timestamptz)
--   -> (append boolean[], dup_seg int[], dup_frame int[])
-- The dedup check of log_append_dedup_v1 (same arguments; see there), as if the segments
-- were looked at one by one in array order: append[i] is false for a skipped segment
-- (last_offsets[i] null) and for a duplicate, a segment with any hash that has a row in
-- its queue's dedup index created within windows[i] ms of now, or that an earlier
-- segment of this call that is appended carries when windows[i] > 0 (its index rows will
-- say now). The frames of the duplicates that are in the log are listed pairwise in
-- (dup_seg, dup_frame) as (segment, 0-based frame), ascending. One statement; the rows it
-- reads are not locked (the append's upsert catches a concurrent writer).
-- Locks: none.
CREATE OR REPLACE FUNCTION queen.log_dedup_check_v1(
    p_queue_ids bigint[], p_last_offsets bigint[], p_counts int[], p_hashes bytea[],
    p_windows bigint[], p_now timestamptz,
    OUT append boolean[], OUT dup_seg int[], OUT dup_frame int[])
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $fn$
DECLARE
    v_n     int := coalesce(cardinality(p_last_offsets), 0);
    v_hit_s int[];          -- frames whose hash is in the index within the window
    v_hit_k int[];
    v_pr_s  int[];          -- frame (segment, frame) repeating a hash of an earlier
    v_pr_k  int[];          --   segment e of the same queue (window > 0)
    v_pr_e  int[];
BEGIN
    -- One primary-key probe per frame (LATERAL ... LIMIT 1): a plain join here gets a
    -- cached generic plan that hashes the whole index table, and the fire then slows down
    -- in proportion to everything ever fired into the queue.
    WITH f AS MATERIALIZED (
        SELECT g.i, k.k, p_queue_ids[g.i] AS qid, p_windows[g.i] AS win,
               substring(p_hashes[g.i] FROM 16 * k.k + 1 FOR 16) AS hash
          FROM generate_series(1, v_n) AS g(i)
         CROSS JOIN LATERAL generate_series(0, p_counts[g.i] - 1) AS k(k)
         WHERE p_last_offsets[g.i] IS NOT NULL),
    hit AS MATERIALIZED (
        SELECT f.i, f.k
          FROM f
         CROSS JOIN LATERAL (SELECT 1
                               FROM queen.log_txn_index x
                              WHERE x.queue_id = f.qid
                                AND x.hash = f.hash
                                AND x.created_at > p_now - f.win * interval '1 millisecond'
                              LIMIT 1) AS y),
    pr AS MATERIALIZED (
        SELECT b.i, b.k, a.i AS e
          FROM f a
          JOIN f b ON b.qid = a.qid AND b.hash = a.hash AND b.i > a.i
         WHERE a.win > 0)
    SELECT ARRAY(SELECT p_last_offsets[g.i] IS NOT NULL FROM generate_series(1, v_n) AS g(i) ORDER BY g.i),
           (SELECT array_agg(hit.i) FROM hit), (SELECT array_agg(hit.k) FROM hit),
           (SELECT array_agg(pr.i ORDER BY pr.i, pr.e) FROM pr),
           (SELECT array_agg(pr.k ORDER BY pr.i, pr.e) FROM pr),
           (SELECT array_agg(pr.e ORDER BY pr.i, pr.e) FROM pr)
      INTO append, v_hit_s, v_hit_k, v_pr_s, v_pr_k, v_pr_e;
    FOR v_x IN 1 .. coalesce(cardinality(v_hit_s), 0) LOOP
        append[v_hit_s[v_x]] := false;
    END LOOP;
    -- In array order: a frame repeating a hash of an earlier segment that is appended is
    -- in the log by the time its own segment is looked at.
    FOR v_x IN 1 .. coalesce(cardinality(v_pr_s), 0) LOOP
        IF append[v_pr_e[v_x]] THEN
            append[v_pr_s[v_x]] := false;
        ELSE
            v_pr_s[v_x] := NULL;        -- not a frame in the log
        END IF;
    END LOOP;
    IF v_hit_s IS NOT NULL OR v_pr_s IS NOT NULL THEN
        SELECT array_agg(d.s ORDER BY d.s, d.k), array_agg(d.k ORDER BY d.s, d.k)
          INTO dup_seg, dup_frame
          FROM (SELECT h.s, h.k FROM unnest(v_hit_s, v_hit_k) AS h(s, k)
                UNION
                SELECT r.s, r.k FROM unnest(v_pr_s, v_pr_k) AS r(s, k) WHERE r.s IS NOT NULL) d;
    END IF;
    dup_seg := coalesce(dup_seg, '{}');
    dup_frame := coalesce(dup_frame, '{}');
END
$fn$;

-- The nine- and ten-argument forms of earlier builds are dropped once (a call with fewer
-- arguments would otherwise be ambiguous between them and the one below, whose tenth and
-- eleventh have defaults).
DO $drop$
BEGIN
    IF to_regprocedure('queen.log_append_dedup_v1(bigint[], bigint[], bigint[], integer[], bytea[], '
                       'bytea[], bigint[], boolean, timestamp with time zone)') IS NOT NULL THEN
        DROP FUNCTION queen.log_append_dedup_v1(bigint[], bigint[], bigint[], integer[], bytea[],
                                                bytea[], bigint[], boolean, timestamptz);
    END IF;
    -- Schema 37 added the result new_tids: a form without it is dropped (a function's
    -- result type cannot be replaced).
    IF to_regprocedure('queen.log_append_dedup_v1(bigint[], bigint[], bigint[], integer[], bytea[], '
                       'bytea[], bigint[], boolean, timestamp with time zone, boolean, tid[])') IS NOT NULL
       AND pg_get_function_result(to_regprocedure('queen.log_append_dedup_v1(bigint[], bigint[], bigint[], '
               'integer[], bytea[], bytea[], bigint[], boolean, timestamp with time zone, boolean, tid[])'))
           NOT LIKE '%new_tids%' THEN
        DROP FUNCTION queen.log_append_dedup_v1(bigint[], bigint[], bigint[], integer[], bytea[],
                                                bytea[], bigint[], boolean, timestamptz, boolean, tid[]);
    END IF;
    -- Schema 36 added an eleventh (partition_tids, with a default): the ten-argument form goes.
    IF to_regprocedure('queen.log_append_dedup_v1(bigint[], bigint[], bigint[], integer[], bytea[], '
                       'bytea[], bigint[], boolean, timestamp with time zone, boolean)') IS NOT NULL THEN
        DROP FUNCTION queen.log_append_dedup_v1(bigint[], bigint[], bigint[], integer[], bytea[],
                                                bytea[], bigint[], boolean, timestamptz, boolean);
    END IF;
END
$drop$;

-- queen.log_append_dedup_v1(queue_ids bigint[], partition_ids bigint[], last_offsets bigint[],
--     counts int[], hashes bytea[], blobs bytea[], windows bigint[], dedup boolean,
--     now timestamptz, optimistic boolean default false, partition_tids tid[] default null)
--   -> (base_offsets bigint[], dup_seg int[], dup_frame int[], new_tids tid[])
-- THE append to the log: every writer calls it (log_push_v1 with one segment, the fire
-- with all its segments). Segment i goes to partition partition_ids[i] of queue
-- queue_ids[i]; last_offsets[i] is that partition's last_offset as read under the CALLER'S
-- FOR UPDATE lock on it (log_partitions_lock_v2; the same value for every segment of one
-- partition), or null: segment i is skipped (not looked at, not appended). counts[i] >= 1
-- frames whose transaction hashes are hashes[i] (16 bytes each, frame order) and whose
-- encoded segment is blobs[i]; the caller has checked all of it.
-- The segments are processed as if one by one in array order:
--   dedup false (a push): every segment is appended; windows is not read (may be null).
--   dedup true (the fire; the check is log_dedup_check_v1): a segment with any hash
--     already in its queue's dedup index within windows[i] ms of now (rows written for an
--     earlier segment of this call included: they carry now, so they count only in a
--     window > 0) is a duplicate and is not appended; its frames already in the log are
--     listed pairwise in (dup_seg, dup_frame) as (segment, 0-based frame), ascending.
-- An appended segment takes the offsets after last_offset (segments of one partition
-- consecutive, in array order), a log_segments and a log_txns row, and one dedup index row
-- per hash (a hash repeated in a segment, or in appended segments of one queue, is indexed
-- once, at its last frame) that replaces the older row of that hash: always without dedup,
-- only a row outside the window with it. base_offsets[i] is its first offset (null when
-- skipped or duplicate). With dedup, an index row inside the window that the check did not
-- see belongs to a concurrent writer of the same transaction id that has committed since
-- (the upsert waited for its outcome) and is left alone: then nothing is allocated, the
-- index rows this call took are deleted again, and the segments are done one at a time
-- (this function on each); one that loses that way alone is a duplicate whose frames in
-- the log are those whose rows it did not get.
-- optimistic (default false; only with dedup): the check is not run first. The statement
-- that appends takes every index row or none of the allocations, as above, and succeeds
-- only if no segment is a duplicate: no hash of it has a row within the window (the
-- upsert's own condition) and no hash repeats across the call's segments of one queue
-- (counted in the statement; a window of 0 included, to keep the test simple). Otherwise
-- it raises SQLSTATE QSF01 ("duplicate") with the index rows it took still written: the
-- caller calls it only inside a subtransaction it undoes on QSF01 (the fire's fast way),
-- and then takes the checked way. Saves the check's probe of the dedup index per frame
-- when nothing is a duplicate, the common case (measured in tests/bench/README.md, third
-- pass).
-- partition_tids (default null): per segment, the address (ctid) of its partition's row as
-- the caller locked it (log_timers_fire_take_v1 returns them): the allocators are then
-- updated by address, not looked up by id a second time; under a snapshot held elsewhere a
-- lookup by id walks every version of the row written since, an address goes straight to
-- the one locked (schema 36). Null: looked up by id here, one probe per segment. An address
-- that does not hold the locked row (a caller's mistake: the row is locked, so nobody else
-- moved it) raises XX000, and nothing of the call is kept.
-- new_tids (schema 37): per segment appended, the address its partition's row has after
-- this call's write (the version this call wrote), null for the others and for every
-- segment of a call done one at a time: the fire answers them, and its caller hands them
-- back on its next fire of the partition, which then takes the row at that address
-- (log_timers_fire_take_v1) instead of looking it up by key.
-- Locks, in order: log_txn_index rows of the appended hashes, ascending (queue, hash) (a
-- wait only on a concurrent writer of the same transaction id); then the partition rows
-- the caller holds; then new rows of log_segments and log_txns.
-- SET jit = off: generate_series over array elements counts as 1,000 rows per segment:
-- estimates that would cross jit_above_cost, and make a generic plan look dearer than
-- planning each call afresh (see the fire, 003). SET enable_seqscan = off: every table
-- reached through an index (its callers, the push and the fire, set it too): the generic
-- plan's estimates never make a scan of log_partitions look cheaper. SET enable_indexscan
-- and enable_bitmapscan = on: the statement that appends turns both off for itself (its
-- one read of a table, log_partitions, is at the addresses: a TID scan, not a merge join
-- over a whole index), and the function's end puts the caller's back.
CREATE OR REPLACE FUNCTION queen.log_append_dedup_v1(
    p_queue_ids bigint[], p_partition_ids bigint[], p_last_offsets bigint[], p_counts int[],
    p_hashes bytea[], p_blobs bytea[], p_windows bigint[], p_dedup boolean, p_now timestamptz,
    p_optimistic boolean DEFAULT false, p_partition_tids tid[] DEFAULT NULL,
    OUT base_offsets bigint[], OUT dup_seg int[], OUT dup_frame int[], OUT new_tids tid[])
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET max_parallel_workers_per_gather = 0
SET jit = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off SET enable_indexscan = on SET enable_bitmapscan = on
AS $fn$
DECLARE
    v_n     int := coalesce(cardinality(p_partition_ids), 0);
    v_app   boolean[];      -- per segment: to be appended
    v_chk   record;         -- log_dedup_check_v1
    v_ok    boolean;
    v_won_q bigint[];       -- index rows the upsert took
    v_won_h bytea[];
    v_tq    record;
    v_last  bigint[];
    v_one   record;
    v_opt   boolean := p_dedup AND coalesce(p_optimistic, false);
    v_tids  tid[] := p_partition_tids;
    v_moved boolean;
BEGIN
    IF p_dedup AND NOT v_opt THEN
        v_chk := queen.log_dedup_check_v1(p_queue_ids, p_last_offsets, p_counts, p_hashes,
                                          p_windows, p_now);
        v_app := v_chk.append;
        dup_seg := v_chk.dup_seg;
        dup_frame := v_chk.dup_frame;
    ELSE
        v_app := ARRAY(SELECT p_last_offsets[g.i] IS NOT NULL FROM generate_series(1, v_n) AS g(i) ORDER BY g.i);
    END IF;
    dup_seg := coalesce(dup_seg, '{}');
    dup_frame := coalesce(dup_frame, '{}');
    base_offsets := array_fill(NULL::bigint, ARRAY[v_n]);
    IF NOT (true = ANY (v_app)) THEN
        RETURN;
    END IF;
    v_tids := coalesce(v_tids, ARRAY(SELECT lp.ctid FROM generate_series(1, v_n) AS g(i) LEFT JOIN queen.log_partitions lp
                                       ON lp.id = p_partition_ids[g.i] AND v_app[g.i] ORDER BY g.i));

    -- Offsets, the dedup index rows, and, only if every index row was taken, the partition
    -- allocators (their new addresses returned), the segments and their hashes: one
    -- statement; the upsert first (the other writes wait on "ok"). No index or bitmap
    -- scan in it (put back on at the function's end): log_partitions at addresses.
    PERFORM pg_catalog.set_config('enable_indexscan', 'off', true), pg_catalog.set_config('enable_bitmapscan', 'off', true);
    WITH a AS MATERIALIZED (
        SELECT g.i, p_partition_ids[g.i] AS pid, p_last_offsets[g.i] - p_counts[g.i] + 1
               + sum(p_counts[g.i]) OVER (PARTITION BY p_partition_ids[g.i] ORDER BY g.i) AS base
          FROM generate_series(1, v_n) AS g(i)
         WHERE v_app[g.i]),
    f AS MATERIALIZED (
        SELECT DISTINCT ON (p_queue_ids[a.i], h.hash) p_queue_ids[a.i] AS qid, h.hash, a.pid,
               a.base + h.k AS off
          FROM a
         CROSS JOIN LATERAL (SELECT k.k, substring(p_hashes[a.i] FROM 16 * k.k + 1 FOR 16) AS hash
                               FROM generate_series(0, p_counts[a.i] - 1) AS k(k)) h
         ORDER BY p_queue_ids[a.i], h.hash, a.i DESC, h.k DESC),
    ins AS (
        INSERT INTO queen.log_txn_index AS ix (queue_id, hash, partition_id, log_offset, created_at)
        SELECT f.qid, f.hash, f.pid, f.off, p_now FROM f ORDER BY f.qid, f.hash
        ON CONFLICT (queue_id, hash) DO UPDATE
            SET partition_id = excluded.partition_id,
                log_offset = excluded.log_offset,
                created_at = excluded.created_at
          WHERE NOT p_dedup
             OR ix.created_at <= p_now - p_windows[array_position(p_queue_ids, ix.queue_id)] * interval '1 millisecond'
        RETURNING ix.queue_id, ix.hash),
    ok AS MATERIALIZED (
        -- Optimistic: no hash repeated across segments either (f holds one row per hash).
        SELECT (SELECT count(*) FROM ins) = (SELECT count(*) FROM f)
               AND (NOT v_opt OR (SELECT count(*) FROM f) = (SELECT sum(p_counts[a.i]) FROM a)) AS ok),
    -- Each partition's new last offset, at its row's address (a TID scan; not by
    -- array_position in an array of the ids, linear: 1,800 partitions cost 16 ms so).
    m AS MATERIALIZED (
        SELECT a.pid, max(a.base + p_counts[a.i] - 1) AS last, (array_agg(v_tids[a.i]))[1] AS tid
          FROM a GROUP BY a.pid),
    lp AS (
        UPDATE queen.log_partitions lp
           SET last_offset = m.last
          FROM m
         WHERE lp.ctid = m.tid AND lp.id = m.pid AND (SELECT ok.ok FROM ok)
        RETURNING lp.id AS pid, lp.ctid AS tid),
    seg AS (
        INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, count, created_at, blob)
        SELECT a.pid, a.base, a.base + p_counts[a.i] - 1, p_counts[a.i], p_now, p_blobs[a.i]
          FROM a
         WHERE (SELECT ok.ok FROM ok)
        RETURNING 1),
    txn AS (
        INSERT INTO queen.log_txns (partition_id, base_offset, hashes)
        SELECT a.pid, a.base, p_hashes[a.i]
          FROM a
         WHERE (SELECT ok.ok FROM ok)
        RETURNING 1)
    SELECT (SELECT ok.ok FROM ok),
           ARRAY(SELECT a.base FROM generate_series(1, v_n) AS g(i) LEFT JOIN a ON a.i = g.i ORDER BY g.i),
           (SELECT array_agg(ins.queue_id) FROM ins), (SELECT array_agg(ins.hash) FROM ins),
           (SELECT ok.ok FROM ok) AND (SELECT count(*) FROM lp) <> (SELECT count(*) FROM m),
           ARRAY(SELECT lp.tid FROM generate_series(1, v_n) AS g(i) LEFT JOIN a ON a.i = g.i
                   LEFT JOIN lp ON lp.pid = a.pid ORDER BY g.i)
      INTO v_ok, base_offsets, v_won_q, v_won_h, v_moved, new_tids;
    PERFORM pg_catalog.set_config('enable_indexscan', 'on', true), pg_catalog.set_config('enable_bitmapscan', 'on', true);
    IF v_moved THEN
        RAISE EXCEPTION 'log_append_dedup_v1: a partition row is not at the address given for it' USING ERRCODE = 'XX000';
    END IF;
    IF v_ok THEN
        RETURN;
    END IF;
    IF v_opt THEN
        RAISE EXCEPTION 'log_append_dedup_v1: a duplicate, found optimistically' USING ERRCODE = 'QSF01';
    END IF;

    -- Lost a race with a concurrent writer of the same transaction: the index rows go back.
    new_tids := NULL;  -- nothing was allocated; one segment at a time below, no addresses
    FOR v_tq IN SELECT w.q, array_agg(w.h) AS hs FROM unnest(v_won_q, v_won_h) AS w(q, h) GROUP BY w.q LOOP
        DELETE FROM queen.log_txn_index AS ix WHERE ix.queue_id = v_tq.q AND ix.hash = ANY (v_tq.hs);
    END LOOP;
    base_offsets := array_fill(NULL::bigint, ARRAY[v_n]);
    IF v_n = 1 THEN
        SELECT ARRAY[]::int[] || array_agg(1), ARRAY[]::int[] || array_agg(k.k ORDER BY k.k)
          INTO dup_seg, dup_frame
          FROM generate_series(0, p_counts[1] - 1) AS k(k)
         WHERE NOT substring(p_hashes[1] FROM 16 * k.k + 1 FOR 16) = ANY (coalesce(v_won_h, '{}'));
        RETURN;
    END IF;
    dup_seg := '{}';
    dup_frame := '{}';
    v_last := p_last_offsets;
    FOR v_x IN 1 .. v_n LOOP
        CONTINUE WHEN v_last[v_x] IS NULL;
        v_one := queen.log_append_dedup_v1(ARRAY[p_queue_ids[v_x]], ARRAY[p_partition_ids[v_x]],
            ARRAY[v_last[v_x]], ARRAY[p_counts[v_x]], ARRAY[p_hashes[v_x]], ARRAY[p_blobs[v_x]],
            ARRAY[p_windows[v_x]], p_dedup, p_now);
        base_offsets[v_x] := v_one.base_offsets[1];
        dup_seg := dup_seg || array_fill(v_x, ARRAY[cardinality(v_one.dup_frame)]);
        dup_frame := dup_frame || v_one.dup_frame;
        IF v_one.base_offsets[1] IS NOT NULL THEN
            FOR v_i IN v_x + 1 .. v_n LOOP
                IF p_partition_ids[v_i] = p_partition_ids[v_x] THEN
                    v_last[v_i] := v_last[v_i] + p_counts[v_x];
                END IF;
            END LOOP;
        END IF;
    END LOOP;
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- Push and read
-- ---------------------------------------------------------------------------------------

-- queen.log_push_v1(tenant, queue, partition, count, hashes, blob, now) -> jsonb
--   {"baseOffset", "endOffset", "partitionId", "queueId"}
-- A plain push, used by brokers and by tests. It does NOT apply the dedup window (a plain
-- push is the producer's own write and is always appended); it does record the segment's
-- hashes in the dedup index, so a timer fired later with one of these transaction ids is a
-- duplicate. Provisions the queue and partition when missing.
-- Refused with 22023: null arguments, now outside [1970, 10000) (check_now_v1), empty
-- names, queue or partition over 512 bytes, count < 1, hashes not 16 * count bytes.
-- Appended by log_append_dedup_v1 without the dedup window: offsets from last_offset + 1,
-- one log_segments and one log_txns row, and a dedup index row per hash that replaces any
-- older row of that hash (a hash repeated in the segment is indexed once, at its last
-- frame).
-- Locks, in order: queues (provisioning insert only), log_partitions (provisioning insert,
-- then the partition row FOR UPDATE, log_partitions_lock_v2), then log_txn_index rows of
-- the segment's hashes (a wait only on a concurrent writer of the same transaction id),
-- then new rows of log_segments and log_txns.
-- SET enable_seqscan = off: every table this call touches is reached through an index, and
-- must stay so whatever the statistics say. A plan made while a table looked empty (a
-- fresh install, a TRUNCATE before autoanalyze) is cached for the session; with a
-- sequential scan in it, each call scans everything fired since (measured in
-- tests/bench/README.md: a dedup probe at 1,024 ms per call, one sweeper at 885/s).
CREATE OR REPLACE FUNCTION queen.log_push_v1(
    p_tenant uuid, p_queue text, p_partition text, p_count int, p_hashes bytea,
    p_blob bytea, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off
AS $fn$
DECLARE
    v_prov   record;
    v_last   bigint[];
    v_tid    tid[];
    v_seg    record;
BEGIN
    IF p_tenant IS NULL OR p_queue IS NULL OR p_partition IS NULL OR p_count IS NULL
       OR p_hashes IS NULL OR p_blob IS NULL OR p_now IS NULL THEN
        RAISE EXCEPTION 'log_push_v1: no argument may be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('log_push_v1', p_now);
    IF p_queue = '' OR p_partition = '' THEN
        RAISE EXCEPTION 'log_push_v1: queue and partition must not be empty' USING ERRCODE = '22023';
    END IF;
    -- The same name limits as log_timers_apply_v1 (002): both land in the same unique indexes.
    PERFORM queen.check_bytes_v1('log_push_v1', 'queue', p_queue, 512, 'names are index keys');
    PERFORM queen.check_bytes_v1('log_push_v1', 'partition', p_partition, 512, 'names are index keys');
    IF p_count < 1 THEN
        RAISE EXCEPTION 'log_push_v1: count must be at least 1 (got %)', p_count USING ERRCODE = '22023';
    END IF;
    -- In bigint: 16 * count overflows int for a count past 134 million (22003 otherwise).
    IF octet_length(p_hashes) <> 16::bigint * p_count THEN
        RAISE EXCEPTION 'log_push_v1: hashes must be 16 * count = % bytes (got %)',
            16::bigint * p_count, octet_length(p_hashes) USING ERRCODE = '22023';
    END IF;

    v_prov := queen.log_provision_v1(p_tenant, p_queue, p_partition);
    SELECT ARRAY[l.last_offset], ARRAY[l.tid] INTO v_last, v_tid
      FROM queen.log_partitions_lock_v2(ARRAY[v_prov.partition_id], true) AS l;
    IF v_last[1] IS NULL THEN
        RAISE EXCEPTION 'log_push_v1: partition % does not exist', v_prov.partition_id
            USING ERRCODE = '22023';
    END IF;
    v_seg := queen.log_append_dedup_v1(ARRAY[v_prov.queue_id], ARRAY[v_prov.partition_id], v_last,
        ARRAY[p_count], ARRAY[p_hashes], ARRAY[p_blob], NULL, false, p_now, false, v_tid);

    RETURN jsonb_build_object(
        'baseOffset', v_seg.base_offsets[1],
        'endOffset', v_seg.base_offsets[1] + p_count - 1,
        'partitionId', v_prov.partition_id,
        'queueId', v_prov.queue_id);
END
$fn$;

-- queen.log_read_v1(tenant, queue, partition, from_offset, max_segments) -> table
-- Segments of one partition whose end_offset >= from_offset, ascending, at most
-- max_segments (null or < 1: no limit). Empty when the queue or partition does not exist.
-- Locks: none.
CREATE OR REPLACE FUNCTION queen.log_read_v1(
    p_tenant uuid, p_queue text, p_partition text, p_from_offset bigint, p_max_segments int)
RETURNS TABLE (base_offset bigint, end_offset bigint, count int, hashes bytea, blob bytea,
               created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT s.base_offset, s.end_offset, s.count, t.hashes, s.blob, s.created_at
      FROM queen.queues q
      JOIN queen.log_partitions p ON p.queue_id = q.id AND p.name = p_partition
      JOIN queen.log_segments s ON s.partition_id = p.id
      LEFT JOIN queen.log_txns t ON t.partition_id = s.partition_id AND t.base_offset = s.base_offset
     WHERE q.tenant_id = p_tenant AND q.name = p_queue
       AND s.end_offset >= coalesce(p_from_offset, 0)
       -- Start the primary-key range at the segment holding from_offset, not at offset 0.
       AND s.base_offset >= coalesce((SELECT max(s2.base_offset)
                                        FROM queen.log_segments s2
                                       WHERE s2.partition_id = p.id
                                         AND s2.base_offset <= coalesce(p_from_offset, 0)),
                                     coalesce(p_from_offset, 0))
     ORDER BY s.base_offset
     LIMIT CASE WHEN p_max_segments IS NULL OR p_max_segments < 1 THEN NULL ELSE p_max_segments END
$fn$;
