-- 004_kv.sql: queen.kv, the one definition of existence (kv_live_v1), quotas, usage, and
-- the put / get / delete helpers.
--
-- Idempotent and lock-free on re-apply, like 001 (see its header). The prune and the
-- usage rollup live in 005, which a broker can run without: an unpruned row is already
-- invisible to every read here, so nothing served changes, only the table's size.
--
-- Broker-wide lock order: kv, then log_timers, then advisory locks, then queues, then
-- log_partitions. Functions here lock queen.kv rows only, and no advisory lock.

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

CREATE SEQUENCE IF NOT EXISTS queen.kv_version_seq;

-- Storage settings of queen.kv.
--   fillfactor = 100 (was 70 by analogy with queen.log_partitions): measured (2026-11-30)
--     (tests/soak/README.md). Symptom looked for: HOT updates of a put over an existing
--     key. A put with a ttl rewrites expires_at, a column of kv_shard_expires_idx, so it is
--     never HOT (0.0 in the soak); only a forever-over-forever put could be. The soak at
--     ~500 timers/s (KV at half that) for 150 s: 70 -> 7.8 MB, 100 -> 5.7 MB for ~13% fewer
--     puts (~16% smaller per put). 70 does not win: 100.
--   autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
--   autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_insert_threshold = 1000,
--   autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000,
--   autovacuum_vacuum_cost_delay = 1:
--     not measured (2026-11-29): by analogy with queen.log_partitions. The prune deletes
--     continuously, and the usage rollup decides whether to sample from reltuples, which
--     only ANALYZE keeps honest.
--     Measured 2026-11-30 (tests/soak/README.md; the soak of 002's block, KV puts and reads
--     at half the timer rate with expiries of 1 s to 2 min). Symptom looked for: autovacuum
--     workers held by this table against the default autovacuum_max_workers = 3. Observed:
--     one pass per autovacuum_naptime (60 s), 5.3k dead tuples before it at 93 puts/s, 14k
--     at 260/s, 25k at 490/s; a worker on this table 0.007, 0.010 and 0.014 of the time on
--     average, never two at once. The two tables together held under 0.05 of a worker on
--     average and one at a peak: they do not crowd the log's own vacuums at these rates.
--   vacuum_truncate = off: not measured (2026-11-29): by analogy with queen.log_partitions.
--     Truncating the heap's tail takes an ACCESS EXCLUSIVE lock that would stall every
--     read and write of the table; the price is that the heap never gives pages back, so
--     a peak is permanent, which is why kv_expire_step_v1 reports expired-but-present rows
--     on every pass.
CREATE TABLE IF NOT EXISTS queen.kv (
    tenant_id  uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000001',
    namespace  text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      jsonb NOT NULL,
    version    bigint NOT NULL DEFAULT nextval('queen.kv_version_seq'),
    expires_at timestamptz,                 -- NULL = forever
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- 64 shards, fixed forever, as on queen.log_timers.
    shard      smallint GENERATED ALWAYS AS ((hashtextextended(key, 0) & 63)::smallint) STORED,
    PRIMARY KEY (tenant_id, namespace, key)
) WITH (
    fillfactor = 100,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 1,
    vacuum_truncate = off
);
-- A table created while the setting was 70 is moved to 100 once; the check keeps every
-- later apply lock-free (ALTER TABLE ... SET takes SHARE UPDATE EXCLUSIVE). Pages already
-- written keep their free space until rewritten.
DO $apply$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c
                WHERE c.oid = 'queen.kv'::regclass AND 'fillfactor=70' = ANY (c.reloptions)) THEN
        ALTER TABLE queen.kv SET (fillfactor = 100);
    END IF;
END
$apply$;

-- The one partial index; its only reader is the sweeper's prune.
DO $apply$
BEGIN
    IF to_regclass('queen.kv_shard_expires_idx') IS NULL THEN
        CREATE INDEX kv_shard_expires_idx ON queen.kv (shard, expires_at)
            WHERE expires_at IS NOT NULL;
    END IF;
END
$apply$;

-- Per-tenant limits; a NULL limit is no limit.
CREATE TABLE IF NOT EXISTS queen.kv_quota (
    tenant_id  uuid PRIMARY KEY,
    max_rows   bigint CHECK (max_rows IS NULL OR max_rows > 0),
    max_bytes  bigint CHECK (max_bytes IS NULL OR max_bytes > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Written by kv_usage_step_v1 (005); computed_at never moves backwards.
CREATE TABLE IF NOT EXISTS queen.kv_usage (
    tenant_id    uuid PRIMARY KEY,
    kv_rows      bigint NOT NULL DEFAULT 0,
    kv_bytes     bigint NOT NULL DEFAULT 0,
    timer_rows   bigint NOT NULL DEFAULT 0,
    timer_bytes  bigint NOT NULL DEFAULT 0,
    oldest_timer timestamptz,
    sampled      boolean NOT NULL DEFAULT false,
    computed_at  timestamptz NOT NULL
);

-- queen.kv_live_v1(expires_at, now) -> bool
-- The one definition of existence: true when expires_at is null or later than now. A row
-- whose expiry equals now is dead, to readers and to the prune alike. Locks: none.
-- No SET search_path, like epoch_ms_v1 (002): it must stay inlinable (the usage rollup
-- evaluates it per kv row), so its one operator is named with its schema instead.
CREATE OR REPLACE FUNCTION queen.kv_live_v1(p_expires_at timestamptz, p_now timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT p_expires_at IS NULL OR p_expires_at OPERATOR(pg_catalog.>) p_now
$fn$;

-- queen.kv_check_name_v1(what, name): raises 22023 unless name is a valid namespace or
-- key: non-empty, at most 256 bytes, no control characters. Locks: none.
CREATE OR REPLACE FUNCTION queen.kv_check_name_v1(p_what text, p_name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    IF p_name IS NULL OR p_name = '' THEN
        RAISE EXCEPTION 'kv: % must not be empty', p_what USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_name) > 256 THEN
        RAISE EXCEPTION 'kv: % is % bytes, at most 256', p_what, octet_length(p_name)
            USING ERRCODE = '22023';
    END IF;
    IF p_name ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'kv: % must not contain control characters', p_what USING ERRCODE = '22023';
    END IF;
END
$fn$;

-- queen.kv_put_v1(tenant uuid, namespace text, key text, value jsonb, ttl_ms bigint,
--                 forever bool, now timestamptz) -> jsonb
--   {"version": bigint, "expiresAt": timestamptz | null, "expiresAtMs": bigint | null}
-- Writes the key with a fresh version. Exactly one of ttl_ms (> 0: expires at now + ttl)
-- and forever = true must be given. Over a dead (expired, unpruned) row the write is a new
-- key: created_at restarts.
-- Refused with 22023: invalid namespace or key (empty, over 256 bytes, control
-- characters), a null value, a value over 1 MiB as JSON text, neither or both of ttl_ms
-- and forever, ttl_ms < 1 or over 100 years, now outside [1970, 10000) (check_now_v1).
-- Locks: the queen.kv row (insert or update).
CREATE OR REPLACE FUNCTION queen.kv_put_v1(
    p_tenant uuid, p_namespace text, p_key text, p_value jsonb, p_ttl_ms bigint,
    p_forever boolean, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_forever boolean := coalesce(p_forever, false);
    v_expires timestamptz;
    v_version bigint;
BEGIN
    IF p_tenant IS NULL OR p_now IS NULL THEN
        RAISE EXCEPTION 'kv_put_v1: tenant and now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('kv_put_v1', p_now);
    PERFORM queen.kv_check_name_v1('namespace', p_namespace);
    PERFORM queen.kv_check_name_v1('key', p_key);
    IF p_value IS NULL THEN
        RAISE EXCEPTION 'kv_put_v1: value must not be null (a JSON null is a value: ''null''::jsonb)'
            USING ERRCODE = '22023';
    END IF;
    -- The stored size first: it is known without printing the value, and no jsonb value
    -- prints to less than a sixteenth of its stored size, so a huge value is refused at once.
    IF pg_column_size(p_value) > 16 * 1048576 THEN
        RAISE EXCEPTION 'kv_put_v1: value is % bytes stored, over the 1 MiB limit (1048576 bytes as JSON text)',
            pg_column_size(p_value) USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_value::text) > 1048576 THEN
        RAISE EXCEPTION 'kv_put_v1: value is % bytes as JSON, over the 1 MiB limit', octet_length(p_value::text)
            USING ERRCODE = '22023';
    END IF;
    IF (p_ttl_ms IS NULL) = (NOT v_forever) THEN
        RAISE EXCEPTION 'kv_put_v1: a write names exactly one of ttl_ms and forever (got %)',
            CASE WHEN v_forever THEN 'both' ELSE 'neither' END USING ERRCODE = '22023';
    END IF;
    IF p_ttl_ms IS NOT NULL AND p_ttl_ms < 1 THEN
        RAISE EXCEPTION 'kv_put_v1: ttl_ms must be at least 1 (got %)', p_ttl_ms USING ERRCODE = '22023';
    END IF;
    -- now + ttl must stay a timestamp: past about 2^62 ms the interval arithmetic overflows
    -- (22008). A hundred years is far beyond any cache; forever = true says "no expiry".
    IF p_ttl_ms > 100::bigint * 365 * 24 * 3600 * 1000 THEN
        RAISE EXCEPTION 'kv_put_v1: ttl_ms is %, over the limit of % (100 years; use forever)',
            p_ttl_ms, 100::bigint * 365 * 24 * 3600 * 1000 USING ERRCODE = '22023';
    END IF;
    v_expires := CASE WHEN v_forever THEN NULL ELSE p_now + p_ttl_ms * interval '1 millisecond' END;

    INSERT INTO queen.kv AS k (tenant_id, namespace, key, value, version, expires_at, created_at, updated_at)
    VALUES (p_tenant, p_namespace, p_key, p_value, nextval('queen.kv_version_seq'), v_expires, p_now, p_now)
    ON CONFLICT (tenant_id, namespace, key) DO UPDATE
       SET value = excluded.value,
           version = excluded.version,
           expires_at = excluded.expires_at,
           updated_at = excluded.updated_at,
           created_at = CASE WHEN queen.kv_live_v1(k.expires_at, p_now) THEN k.created_at
                             ELSE excluded.created_at END
    RETURNING k.version INTO v_version;

    RETURN jsonb_build_object('version', v_version, 'expiresAt', v_expires,
                              'expiresAtMs', queen.epoch_ms_v1(v_expires));
END
$fn$;

-- queen.kv_get_v1(tenant uuid, namespace text, key text, now timestamptz) -> jsonb
--   {"value", "version", "expiresAt", "expiresAtMs", "createdAt", "updatedAt"} or SQL null
-- SQL null when the key is absent OR dead (kv_live_v1): a read never returns an expired
-- row, pruned or not. Refused with 22023: invalid namespace or key. Locks: none.
CREATE OR REPLACE FUNCTION queen.kv_get_v1(
    p_tenant uuid, p_namespace text, p_key text, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_result jsonb;
BEGIN
    IF p_tenant IS NULL OR p_now IS NULL THEN
        RAISE EXCEPTION 'kv_get_v1: tenant and now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('kv_get_v1', p_now);
    PERFORM queen.kv_check_name_v1('namespace', p_namespace);
    PERFORM queen.kv_check_name_v1('key', p_key);
    SELECT jsonb_build_object('value', k.value, 'version', k.version,
                              'expiresAt', k.expires_at, 'expiresAtMs', queen.epoch_ms_v1(k.expires_at),
                              'createdAt', k.created_at, 'updatedAt', k.updated_at)
      INTO v_result
      FROM queen.kv k
     WHERE k.tenant_id = p_tenant AND k.namespace = p_namespace AND k.key = p_key
       AND queen.kv_live_v1(k.expires_at, p_now);
    RETURN v_result;
END
$fn$;

-- queen.kv_delete_v1(tenant uuid, namespace text, key text, now timestamptz) -> bool
-- Deletes the key; true when a live row was deleted, false when it was absent or already
-- dead (a dead row is deleted all the same). Refused with 22023: invalid namespace or key.
-- Locks: the queen.kv row.
CREATE OR REPLACE FUNCTION queen.kv_delete_v1(
    p_tenant uuid, p_namespace text, p_key text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_live boolean;
BEGIN
    IF p_tenant IS NULL OR p_now IS NULL THEN
        RAISE EXCEPTION 'kv_delete_v1: tenant and now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('kv_delete_v1', p_now);
    PERFORM queen.kv_check_name_v1('namespace', p_namespace);
    PERFORM queen.kv_check_name_v1('key', p_key);
    DELETE FROM queen.kv AS k
     WHERE k.tenant_id = p_tenant AND k.namespace = p_namespace AND k.key = p_key
    RETURNING queen.kv_live_v1(k.expires_at, p_now) INTO v_live;
    RETURN coalesce(v_live, false);
END
$fn$;
