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
-- Internal helpers shared by the push and the fire
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

-- queen.log_append_v1(queue_id, partition_id, count, hashes, blob, now) -> (base_offset, end_offset)
-- Appends one segment to a partition whose row the CALLER ALREADY HOLDS FOR UPDATE (or is
-- about to: the UPDATE below takes it), and records its transaction hashes in the segment's
-- log_txns row and in the queue's dedup index (refreshing an older entry for the same hash).
-- Locks: the log_partitions row (UPDATE), then new rows of log_segments, log_txns and
-- log_txn_index (index rows of the same queue and hash conflict only with a concurrent
-- writer of the same transaction id).
CREATE OR REPLACE FUNCTION queen.log_append_v1(
    p_queue_id bigint, p_partition_id bigint, p_count int, p_hashes bytea, p_blob bytea,
    p_now timestamptz, OUT base_offset bigint, OUT end_offset bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
AS $fn$
BEGIN
    UPDATE queen.log_partitions p
       SET last_offset = p.last_offset + p_count
     WHERE p.id = p_partition_id
    RETURNING p.last_offset INTO end_offset;
    IF end_offset IS NULL THEN
        RAISE EXCEPTION 'log_append_v1: partition % does not exist', p_partition_id
            USING ERRCODE = '22023';
    END IF;
    base_offset := end_offset - p_count + 1;

    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, count, created_at, blob)
    VALUES (p_partition_id, base_offset, end_offset, p_count, p_now, p_blob);

    INSERT INTO queen.log_txns (partition_id, base_offset, hashes)
    VALUES (p_partition_id, base_offset, p_hashes);

    -- A hash repeated inside one segment is indexed once, at its last frame.
    INSERT INTO queen.log_txn_index AS i (queue_id, hash, partition_id, log_offset, created_at)
    SELECT DISTINCT ON (h.hash) p_queue_id, h.hash, p_partition_id, base_offset + h.k, p_now
      FROM (SELECT k, substring(p_hashes FROM 16 * k + 1 FOR 16) AS hash
              FROM generate_series(0, p_count - 1) AS k) h
     ORDER BY h.hash, h.k DESC
    ON CONFLICT (queue_id, hash) DO UPDATE
        SET partition_id = excluded.partition_id,
            log_offset   = excluded.log_offset,
            created_at   = excluded.created_at;
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
-- Locks, in order: queues (provisioning insert only), log_partitions (provisioning insert,
-- then the partition row FOR UPDATE), then new rows of log_segments / log_txns /
-- log_txn_index.
CREATE OR REPLACE FUNCTION queen.log_push_v1(
    p_tenant uuid, p_queue text, p_partition text, p_count int, p_hashes bytea,
    p_blob bytea, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
AS $fn$
DECLARE
    v_prov   record;
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
    PERFORM 1 FROM queen.log_partitions p WHERE p.id = v_prov.partition_id FOR UPDATE;
    v_seg := queen.log_append_v1(v_prov.queue_id, v_prov.partition_id, p_count, p_hashes, p_blob, p_now);

    RETURN jsonb_build_object(
        'baseOffset', v_seg.base_offset,
        'endOffset', v_seg.end_offset,
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
