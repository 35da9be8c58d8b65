-- 005_kv_maintenance.sql: the KV prune step and the usage rollup step, and nothing else.
--
-- In their own file because a broker boots and answers correctly without them: reads
-- already hide dead rows (kv_live_v1), so a missing prune costs table size only, and a
-- missing rollup costs gauge precision only. The sweeper treats a class-42 error from
-- either (function absent) as "this phase is off" and keeps serving.
--
-- Idempotent and lock-free on re-apply, like 001 (see its header). Needs 002 and 004.

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

-- queen.kv_expire_step_v1(shards int2[], now timestamptz, max_rows int) -> jsonb
--   {"deleted": n, "done": bool, "unpruned": n, "unprunedCapped": bool, "lagMs": n,
--    "nextExpiryMs": n | null, "nowMs": n, "now": timestamptz}
-- Deletes up to max_rows (null = 1000) dead rows (expires_at <= now), visiting shards in
-- the array's order (null = 0..63), each oldest expiry first through the partial index,
-- taking them FOR UPDATE SKIP LOCKED and re-checking expiry in the DELETE itself, so a row
-- rewritten with a later expiry is spared. done = this pass could not fill its budget.
-- Then, on EVERY pass, including one that deletes nothing: unpruned = dead rows still
-- present in those shards, counted up to 8 * max_rows (unprunedCapped when more exist),
-- and lagMs = now - the oldest expiry among them (0 when none). An unpruned table is a
-- failure that looks like health; these two numbers are its alarm. nextExpiryMs
-- = the nearest expiry still ahead of now in those shards, in ms from now, or
-- null when no key there has one: a table of live keys with a ttl is work to come, and the
-- sweeper keeps the prune's cadence for it instead of backing off as if the table were empty.
-- Locks: rows of queen.kv, FOR UPDATE SKIP LOCKED (never waits), then deletes them.
CREATE OR REPLACE FUNCTION queen.kv_expire_step_v1(p_shards int2[], p_now timestamptz, p_max_rows int)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_budget  int := greatest(coalesce(p_max_rows, 1000), 0);
    v_cap     bigint;
    v_shards  int2[];
    v_shard   int2;
    v_deleted bigint := 0;
    v_n       bigint;
    v_unpr    bigint;
    v_oldest  timestamptz;
    v_next    timestamptz;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'kv_expire_step_v1: now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('kv_expire_step_v1', p_now);
    -- Keep the caller's order, drop repeats and out-of-range values.
    SELECT array_agg(d.s ORDER BY d.ord) INTO v_shards
      FROM (SELECT DISTINCT ON (u.s) u.s, u.ord
              FROM unnest(coalesce(p_shards, queen.all_shards_v1())) WITH ORDINALITY AS u(s, ord)
             WHERE u.s BETWEEN 0 AND 63
             ORDER BY u.s, u.ord) d;
    v_shards := coalesce(v_shards, '{}');
    v_cap := 8::bigint * v_budget;

    FOREACH v_shard IN ARRAY v_shards LOOP
        EXIT WHEN v_deleted >= v_budget;
        WITH doomed AS (
            SELECT k.tenant_id, k.namespace, k.key
              FROM queen.kv k
             WHERE k.shard = v_shard
               AND k.expires_at IS NOT NULL
               AND k.expires_at <= p_now
             ORDER BY k.expires_at
             LIMIT v_budget - v_deleted
               FOR UPDATE SKIP LOCKED
        )
        DELETE FROM queen.kv AS k
         USING doomed d
         WHERE k.tenant_id = d.tenant_id AND k.namespace = d.namespace AND k.key = d.key
           AND NOT queen.kv_live_v1(k.expires_at, p_now);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_deleted := v_deleted + v_n;
    END LOOP;

    SELECT count(*) INTO v_unpr
      FROM (SELECT 1
              FROM unnest(v_shards) AS s(shard)
              CROSS JOIN LATERAL (
                    SELECT 1
                      FROM queen.kv k
                     WHERE k.shard = s.shard AND k.expires_at IS NOT NULL AND k.expires_at <= p_now
                     LIMIT v_cap + 1) x
             LIMIT v_cap + 1) y;

    SELECT min(h.expires_at) INTO v_oldest
      FROM unnest(v_shards) AS s(shard)
      CROSS JOIN LATERAL (
            SELECT k.expires_at
              FROM queen.kv k
             WHERE k.shard = s.shard AND k.expires_at IS NOT NULL AND k.expires_at <= p_now
             ORDER BY k.expires_at
             LIMIT 1) h;

    -- One probe per shard of the partial index, like the oldest expiry above.
    SELECT min(h.expires_at) INTO v_next
      FROM unnest(v_shards) AS s(shard)
      CROSS JOIN LATERAL (
            SELECT k.expires_at
              FROM queen.kv k
             WHERE k.shard = s.shard AND k.expires_at IS NOT NULL AND k.expires_at > p_now
             ORDER BY k.expires_at
             LIMIT 1) h;

    RETURN jsonb_build_object(
        'deleted', v_deleted,
        'done', v_deleted < v_budget,
        'unpruned', least(v_unpr, v_cap),
        'unprunedCapped', v_unpr > v_cap,
        'lagMs', CASE WHEN v_oldest IS NULL THEN 0
                      ELSE greatest(0, floor(extract(epoch FROM (p_now - v_oldest)) * 1000))::bigint END,
        'nextExpiryMs', CASE WHEN v_next IS NULL THEN NULL
                             ELSE ceil(extract(epoch FROM (v_next - p_now)) * 1000)::bigint END,
        'nowMs', queen.epoch_ms_v1(p_now),
        'now', p_now);
END
$fn$;

-- queen.kv_usage_pass_v1(now timestamptz, max_tenants int) -> jsonb: one pass of the usage
-- rollup, the step kv_usage_step_v2 runs behind its gate. An internal helper (SECURITY
-- INVOKER, granted to nobody).
--   {"tenants": [{"tenant", "kvRows", "kvBytes", "timerRows", "timerBytes",
--                 "oldestTimerMs", "rowsRatio", "bytesRatio", "stored"}],
--    "maxQuotaRatio": n, "sampled": bool, "nowMs": n}
-- Per tenant: live kv rows and bytes (pg_column_size(value) + pg_column_size(key)), timer
-- rows, bytes (pg_column_size(payload) + pg_column_size(timer_key)) and oldest deliver_at.
-- Above 1M rows in a table it samples that table and marks the result sampled: each by
-- TABLESAMPLE SYSTEM, the share of pages that holds ~200k rows, scaled up by the inverse
-- share (a fresh choice of pages on every pass). The rows are those a full pass would read:
-- the larger of pg_class.reltuples (-1, never analysed, counts as none) and the live plus
-- dead tuples the statistics count (pg_stat_get_live_tuples + pg_stat_get_dead_tuples). The
-- session setting queen.kv_usage_sample_above overrides the threshold.
-- Under a held snapshot (schema version 32): ANALYZE counts the live rows only, a few
-- hundred in a stream, while the fired rows the snapshot keeps are still read by a scan.
-- Measured 2026-12-06 (tests/bench/load --phases held-row, 3,000 timers/s, a snapshot held
-- 30 minutes, schema 31): the pass read the whole of queen.log_timers every 5 minutes, 0.27
-- s at 5 minutes and 1.4 s at 15 (8.5M dead tuples), in the cycle: each pass held the
-- drain, and the stream's p99 in those minutes was 1.2-1.6 s.
-- Every shard is read: a filter by shard still read every page (no index leads with
-- shard), so 10 million timers due next week made every pass a scan of the table and, at
-- the sweeper's first cycle, halved the drain of the due ones (tests/bench/load --phases
-- future, 2026-12-01: 23,019/s without the filter, 11,479/s with).
-- Measured 2026-11-30 (tests/soak/README.md, `tests/soak/measure rollup`; 2 cores shared
-- with six other engineers' builds and tests, load 19-22). Symptom: a full pass reads every
-- page of queen.kv, since rows that never expire are in no index but the key, so its cost
-- grows with the table and it holds a maintenance connection for all of it. Observed per
-- pass, full / sampled: 1M rows 1410 / 328 ms, 5M rows 5716 / 271 ms, 10M rows
-- 17934 / 400 ms (the sampled pass stays flat; a full one would meet the 30 s statement
-- timeout near 17M rows at this load). At 1M a full pass is ~1.4 s every 300 s (every 30 s
-- above the quota watermark: ~5% of a connection); at 5M it is 5.7 s. Threshold: 1M rows.
-- Tenants covered: those with kv rows, timers, a quota
-- or an earlier usage row (so a tenant that emptied falls to zero), at most max_tenants
-- (null = 1000) of them, highest quota ratio first, then most rows.
-- Ratios: kv_rows / max_rows and kv_bytes / max_bytes from queen.kv_quota (0 when no
-- limit); maxQuotaRatio is the highest over all tenants computed (0 when no quota).
-- kv_usage is upserted with computed_at = now and never moves backwards: a row already
-- computed at a later instant is left alone ("stored": false).
-- Locks: no row locks on kv or log_timers (plain reads); kv_usage rows (upsert) in
-- tenant_id order.
CREATE OR REPLACE FUNCTION queen.kv_usage_pass_v1(p_now timestamptz, p_max_tenants int)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    -- Measured 2026-11-30: see the dated block above this function.
    c_sample_above constant double precision := 1000000;
    -- Rows a sampled pass of queen.kv reads, about: the page share TABLESAMPLE takes.
    c_sample_rows  constant double precision := 200000;
    v_above        double precision := coalesce(
                       nullif(current_setting('queen.kv_usage_sample_above', true), '')::double precision,
                       c_sample_above);
    v_max_tenants  int := greatest(coalesce(p_max_tenants, 1000), 1);
    v_kv_rows      double precision;
    v_kv_pct       double precision := 100;
    v_kv_scale     numeric := 1;
    v_kv_sampled   boolean;
    v_t_rows       double precision;
    v_t_pct        double precision := 100;
    v_t_sampled    boolean;
    v_scale        numeric := 1;
    v_result       jsonb;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'kv_usage_step_v2: now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('kv_usage_step_v2', p_now);

    -- The rows a full pass would read: the live ones ANALYZE counts, or the live and dead
    -- ones the statistics count when more (see "Under a held snapshot" above).
    SELECT greatest(coalesce(c.reltuples, 0), 0,
                    coalesce(pg_catalog.pg_stat_get_live_tuples(c.oid), 0)
                    + coalesce(pg_catalog.pg_stat_get_dead_tuples(c.oid), 0)) INTO v_kv_rows
      FROM pg_class c WHERE c.oid = 'queen.kv'::regclass;
    v_kv_sampled := v_kv_rows > v_above;
    IF v_kv_sampled THEN
        -- Block sampling reads only the pages it picks: the one way to bound the heap
        -- read on queen.kv, whose rows that never expire are in no index but the key.
        v_kv_pct := least(100, greatest(0.01, 100 * c_sample_rows / v_kv_rows));
        v_kv_scale := (100 / v_kv_pct)::numeric;
    END IF;
    SELECT greatest(coalesce(c.reltuples, 0), 0,
                    coalesce(pg_catalog.pg_stat_get_live_tuples(c.oid), 0)
                    + coalesce(pg_catalog.pg_stat_get_dead_tuples(c.oid), 0)) INTO v_t_rows
      FROM pg_class c WHERE c.oid = 'queen.log_timers'::regclass;
    v_t_sampled := v_t_rows > v_above;
    IF v_t_sampled THEN
        v_t_pct := least(100, greatest(0.01, 100 * c_sample_rows / v_t_rows));
        v_scale := (100 / v_t_pct)::numeric;
    END IF;

    WITH kvu AS (
        -- Exactly one branch runs: the other's constant-false filter skips its scan.
        SELECT k.tenant_id, count(*) AS n,
               sum(pg_column_size(k.value) + pg_column_size(k.key)) AS b
          FROM queen.kv k
         WHERE NOT v_kv_sampled AND queen.kv_live_v1(k.expires_at, p_now)
         GROUP BY k.tenant_id
        UNION ALL
        SELECT k.tenant_id, count(*) AS n,
               sum(pg_column_size(k.value) + pg_column_size(k.key)) AS b
          FROM queen.kv k TABLESAMPLE SYSTEM (v_kv_pct)
         WHERE v_kv_sampled AND queen.kv_live_v1(k.expires_at, p_now)
         GROUP BY k.tenant_id
    ), tu AS (
        -- As kvu: exactly one branch reads the table.
        SELECT t.tenant_id, count(*) AS n,
               sum(pg_column_size(t.payload) + pg_column_size(t.timer_key)) AS b,
               min(t.deliver_at) AS oldest
          FROM queen.log_timers t
         WHERE NOT v_t_sampled
         GROUP BY t.tenant_id
        UNION ALL
        SELECT t.tenant_id, count(*) AS n,
               sum(pg_column_size(t.payload) + pg_column_size(t.timer_key)) AS b,
               min(t.deliver_at) AS oldest
          FROM queen.log_timers t TABLESAMPLE SYSTEM (v_t_pct)
         WHERE v_t_sampled
         GROUP BY t.tenant_id
    ), tenants AS (
        SELECT kvu.tenant_id FROM kvu
        UNION SELECT tu.tenant_id FROM tu
        UNION SELECT q.tenant_id FROM queen.kv_quota q
        UNION SELECT u.tenant_id FROM queen.kv_usage u
    ), calc AS (
        SELECT c.*,
               CASE WHEN q.max_rows > 0 THEN round(c.kv_rows::numeric / q.max_rows, 6)
                    ELSE 0 END AS rows_ratio,
               CASE WHEN q.max_bytes > 0 THEN round(c.kv_bytes::numeric / q.max_bytes, 6)
                    ELSE 0 END AS bytes_ratio
          FROM (SELECT tn.tenant_id,
                       round(coalesce(kvu.n, 0) * v_kv_scale)::bigint AS kv_rows,
                       round(coalesce(kvu.b, 0) * v_kv_scale)::bigint AS kv_bytes,
                       CASE WHEN v_t_sampled THEN round(coalesce(tu.n, 0) * v_scale)
                            ELSE coalesce(tu.n, 0) END::bigint AS timer_rows,
                       CASE WHEN v_t_sampled THEN round(coalesce(tu.b, 0) * v_scale)
                            ELSE coalesce(tu.b, 0) END::bigint AS timer_bytes,
                       tu.oldest AS oldest_timer
                  FROM tenants tn
                  LEFT JOIN kvu ON kvu.tenant_id = tn.tenant_id
                  LEFT JOIN tu ON tu.tenant_id = tn.tenant_id) c
          LEFT JOIN queen.kv_quota q ON q.tenant_id = c.tenant_id
    ), chosen AS (
        SELECT *
          FROM calc
         ORDER BY greatest(calc.rows_ratio, calc.bytes_ratio) DESC,
                  calc.kv_rows + calc.timer_rows DESC, calc.tenant_id
         LIMIT v_max_tenants
    ), stored AS (
        INSERT INTO queen.kv_usage AS u (tenant_id, kv_rows, kv_bytes, timer_rows, timer_bytes,
                                         oldest_timer, sampled, computed_at)
        SELECT ch.tenant_id, ch.kv_rows, ch.kv_bytes, ch.timer_rows, ch.timer_bytes,
               ch.oldest_timer, v_kv_sampled OR v_t_sampled, p_now
          FROM chosen ch
         ORDER BY ch.tenant_id
        ON CONFLICT (tenant_id) DO UPDATE
           SET kv_rows = excluded.kv_rows, kv_bytes = excluded.kv_bytes,
               timer_rows = excluded.timer_rows, timer_bytes = excluded.timer_bytes,
               oldest_timer = excluded.oldest_timer, sampled = excluded.sampled,
               computed_at = excluded.computed_at
         WHERE u.computed_at <= excluded.computed_at
        RETURNING u.tenant_id
    )
    SELECT jsonb_build_object(
               'tenants', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                        'tenant', ch.tenant_id,
                                        'kvRows', ch.kv_rows, 'kvBytes', ch.kv_bytes,
                                        'timerRows', ch.timer_rows, 'timerBytes', ch.timer_bytes,
                                        'oldestTimerMs', queen.epoch_ms_v1(ch.oldest_timer),
                                        'rowsRatio', ch.rows_ratio, 'bytesRatio', ch.bytes_ratio,
                                        'stored', EXISTS (SELECT 1 FROM stored s WHERE s.tenant_id = ch.tenant_id))
                                        ORDER BY greatest(ch.rows_ratio, ch.bytes_ratio) DESC,
                                                 ch.kv_rows + ch.timer_rows DESC, ch.tenant_id)
                                      FROM chosen ch), '[]'::jsonb),
               'maxQuotaRatio', coalesce((SELECT max(greatest(c.rows_ratio, c.bytes_ratio)) FROM calc c), 0),
               'sampled', v_kv_sampled OR v_t_sampled,
               'nowMs', queen.epoch_ms_v1(p_now))
      INTO v_result;
    RETURN v_result;
END
$fn$;

-- The rollup's fleet gate: when the last pass ran, whoever ran it.
-- One row, id 1. kv_usage_step_v2 holds it (FOR UPDATE SKIP LOCKED) for the length of a
-- pass, so two brokers never run the same pass at once.
CREATE TABLE IF NOT EXISTS queen.kv_usage_gate (
    id      int PRIMARY KEY CHECK (id = 1),
    last_at timestamptz
);
INSERT INTO queen.kv_usage_gate (id, last_at) VALUES (1, NULL) ON CONFLICT (id) DO NOTHING;

-- queen.kv_usage_step_v2(shards int2[], now timestamptz, max_tenants int, every_ms int) -> jsonb
--   the answer of kv_usage_pass_v1 (above), with "skipped": null, when the pass ran; else
--   {"skipped": "recent", "ageMs": n, "nowMs": n}: a pass ran less than every_ms before now
--   (ageMs ago), by this broker or another; or {"skipped": "running", "nowMs": n}: another
--   broker's pass holds the gate right now.
-- The usage rollup reads every page of queen.kv and queen.log_timers (sampled above 1M
-- rows), and its figures are the database's, not a broker's: one pass per interval serves
-- every broker (a gate per broker had N brokers read both tables N times per interval:
-- four sweepers ran it four times in a 2 s drain of tests/bench/fire; 120 ms each on a
-- 60,000-row table, 1.4 s on a 1M-row queen.kv).
-- shards: not read (every pass covers every shard). every_ms null or < 1: no gate, a pass now. The pass is kv_usage_pass_v1, in the
-- caller's transaction; the gate row's last_at is set to now
-- after it. A now earlier than last_at (a clock behind another broker's) counts as age 0.
-- Locks: queen.kv_usage_gate's row FOR UPDATE SKIP LOCKED (never waits; held to the end
-- of the caller's transaction; inserted first if it is missing, a wait only on a concurrent
-- inserter of it), then as kv_usage_pass_v1.
CREATE OR REPLACE FUNCTION queen.kv_usage_step_v2(p_shards int2[], p_now timestamptz, p_max_tenants int,
                                                  p_every_ms int)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_last   timestamptz;
    v_held   boolean;
    v_age_ms bigint;
    v_result jsonb;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'kv_usage_step_v2: now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('kv_usage_step_v2', p_now);
    IF p_every_ms IS NOT NULL AND p_every_ms >= 1 THEN
        -- The row back if it went (a TRUNCATE): writes nothing while it is there.
        INSERT INTO queen.kv_usage_gate (id, last_at) VALUES (1, NULL) ON CONFLICT (id) DO NOTHING;
        SELECT true, g.last_at INTO v_held, v_last
          FROM queen.kv_usage_gate g
         WHERE g.id = 1
           FOR UPDATE SKIP LOCKED;
        IF v_held IS NULL THEN  -- another broker's pass holds it
            RETURN jsonb_build_object('skipped', 'running', 'nowMs', queen.epoch_ms_v1(p_now));
        ELSIF v_last IS NOT NULL THEN
            v_age_ms := greatest(0, floor(extract(epoch FROM (p_now - v_last)) * 1000))::bigint;
            IF v_age_ms < p_every_ms THEN
                RETURN jsonb_build_object('skipped', 'recent', 'ageMs', v_age_ms,
                                          'nowMs', queen.epoch_ms_v1(p_now));
            END IF;
        END IF;
    END IF;
    v_result := queen.kv_usage_pass_v1(p_now, p_max_tenants);
    UPDATE queen.kv_usage_gate g SET last_at = greatest(p_now, coalesce(g.last_at, p_now)) WHERE g.id = 1;
    RETURN v_result || jsonb_build_object('skipped', NULL);
END
$fn$;
