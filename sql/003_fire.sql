-- 003_fire.sql: the fire (queen.log_timers_fire_v1): claimed timers appended to the log as
-- segments, with the per-queue dedup window applied, and their rows deleted or released.
--
-- Idempotent and lock-free on re-apply, like 001 (see its header). Needs 001 (the log
-- tables, provisioning and the append) and 002 (queen.log_timers). Takes the caller's
-- `now` and never reads the clock.

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

-- The ten-argument form of earlier builds is dropped once (a call with ten arguments
-- would otherwise be ambiguous between it and this one).
DO $drop$
BEGIN
    IF to_regprocedure('queen.log_timers_fire_v1(uuid[], text[], text[], integer[], bytea[], bytea[], '
                       'text[], integer[], uuid[], timestamp with time zone)') IS NOT NULL THEN
        DROP FUNCTION queen.log_timers_fire_v1(uuid[], text[], text[], integer[], bytea[], bytea[],
                                               text[], integer[], uuid[], timestamptz);
    END IF;
END
$drop$;

-- queen.log_timers_fire_v1(seg_tenants uuid[], seg_queues text[], seg_partitions text[],
--     seg_counts int[], seg_hashes bytea[], seg_blobs bytea[], timer_keys text[],
--     timer_seg int[], timer_tokens uuid[], now timestamptz, wait boolean default true) -> jsonb
--   {"segments": [ {"status": "fired", "partitionId", "baseOffset", "endOffset", "count"}
--                | {"status": "stale", "held": n}
--                | {"status": "duplicate", "duplicates": n, "released": n}
--                | {"status": "busy", "count": n} (only with p_wait false) ],   (array order)
--    "fired": rows, "stale": segments, "duplicate": rows, "released": rows, "busy": rows}
-- One transaction (the caller's statement). The timers of segment i are the entries with
-- timer_seg = i, IN FRAME ORDER (the k-th of them is frame k, hashed at bytes 16k..16k+15
-- of seg_hashes[i]); tenant and queue of a timer are its segment's.
-- Refused with 22023 naming the array: segment arrays of different lengths, timer arrays
-- of different lengths, a null element, seg_counts[i] < 1, seg_hashes[i] not
-- 16 * seg_counts[i] bytes, timer_seg[j] outside 1..n, a segment whose timer count differs
-- from seg_counts[i], one timer named twice, a transaction hash repeated inside one
-- segment (timers sharing a txn go in different segments).
-- Then: locks the named rows FOR UPDATE SKIP LOCKED and holds those whose claim_token
-- matches, whose claim is live (claimed_until > now) and whose partition is the segment's;
-- a segment is live only if it holds ALL its rows, else it is "stale" and its held rows
-- are released in this call (token and claimed_until nulled: due again, no attempt spent).
-- Live segments are processed as if one by one in array order; the work is done by
-- statements over all segments at once, and a call whose append loses a dedup index row
-- to a concurrent writer (or that repeats a hash in a queue whose window is 0) undoes that
-- append and does its live segments one by one. Dedup: a segment with any hash already in
-- its queue's dedup index within dedup_window_ms (including index rows written earlier in
-- this same call) is "duplicate": its timers whose txn is already in the log are deleted
-- (they were delivered), the others released so the next cycle re-packs them. Otherwise
-- the segment is appended (offsets from last_offset + 1, log_segments, log_txns, dedup
-- index rows) and its timers deleted. A concurrent writer of the same transaction id into
-- the same queue is caught by the dedup index upsert itself (it waits for that writer's
-- outcome), and the segment is then answered "duplicate" with its allocation undone.
-- Locks, in order: rows of queen.log_timers (FOR UPDATE SKIP LOCKED, never waits); then
-- queues and log_partitions only to provision missing ones (inserts, in (tenant, queue,
-- partition) order); then the live segments' log_partitions rows FOR UPDATE in ascending
-- id order (the only waits); then log_txn_index rows of the pushed hashes (a wait only on a
-- concurrent writer of the same transaction id), then new log_segments/log_txns rows.
-- p_wait (default true) decides how the partitions are taken. true: FOR UPDATE, the
-- fire's only waits. false: FOR UPDATE SKIP LOCKED, and a live segment whose partition is
-- held by someone else (another broker's fire, a push) answers {"status": "busy"}: its
-- rows stay claimed and held by the caller, who fires them in a later call. Two brokers
-- firing batches that span the same partitions then each deliver the partitions nobody
-- holds instead of queueing behind each other; the caller's second call waits, so a
-- partition that is never free still gets its timers.
CREATE OR REPLACE FUNCTION queen.log_timers_fire_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_seg_hashes bytea[], p_seg_blobs bytea[], p_timer_keys text[], p_timer_seg int[],
    p_timer_tokens uuid[], p_now timestamptz, p_wait boolean DEFAULT true)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
-- Its set-based statements run over array parameters whose sizes the planner cannot see
-- (generate_series counts as 1,000 rows per segment): estimates that cross jit_above_cost
-- and a JIT compile of ~350 ms for statements that run in under a millisecond.
SET jit = off
AS $fn$
DECLARE
    v_nseg      int := coalesce(cardinality(p_seg_tenants), 0);
    v_nt        int := coalesce(cardinality(p_timer_keys), 0);
    v_i         int;
    v_j         int;
    v_x         int;
    v_bad       record;
    v_badseg    int;            -- first segment repeating a hash (validation)
    v_perm      int[];          -- timer indices sorted by (segment, array position)
    v_start     int[];          -- per segment: first position of its timers in v_perm
    v_keys      text[];
    v_heldmask  boolean[];      -- per timer: locked and verified by this call
    v_heldn     int[];          -- per segment: rows held
    v_state     text[];         -- per segment: stale | busy | fire | dup | slow
    v_qid       bigint[];
    v_pid       bigint[];
    v_win       bigint[];
    v_prov      record;
    v_tq        record;
    v_lk_ids    bigint[];       -- partitions locked, ascending
    v_lk_last   bigint[];       -- their last_offset when locked
    v_push      int[];          -- live segments whose partition is ours, array order
    v_fire      int[];          -- segments appended by the set-based path
    v_fire_n    int;            -- their frames
    v_hit_s     int[];          -- frames already in the log: segment, timer index
    v_hit_j     int[];
    v_pr_s      int[];          -- frame (segment, timer index) repeating a hash of an
    v_pr_j      int[];          --   earlier pushed segment of the same queue: that segment
    v_pr_e      int[];
    v_rep0      boolean;        -- a hash repeated in this call in a queue with window 0
    v_dupmask   boolean[];      -- per timer: its frame is already in the log
    v_dupk      int[];          -- per segment: frames already in the log
    v_base      bigint[];
    v_np_ids    bigint[];       -- partitions appended to, and their new last_offset
    v_np_last   bigint[];
    v_won_n     int;
    v_won_q     bigint[];
    v_won_h     bytea[];
    v_slow      boolean := false;
    v_dup_k     int[];
    v_won       bytea[];
    v_end       bigint;
    v_results   jsonb[];
    v_fired     int := 0;
    v_stale     int := 0;
    v_dupn      int := 0;
    v_released  int := 0;
    v_busyn     int := 0;
    v_n         int;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_fire_v1: now must not be null' USING ERRCODE = '22023';
    END IF;

    -- The arrays must line up.
    IF coalesce(cardinality(p_seg_queues), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_partitions), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_counts), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_hashes), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_blobs), 0) <> v_nseg THEN
        RAISE EXCEPTION 'log_timers_fire_v1: segment arrays must line up: seg_tenants %, seg_queues %, seg_partitions %, seg_counts %, seg_hashes %, seg_blobs % elements',
            v_nseg, coalesce(cardinality(p_seg_queues), 0), coalesce(cardinality(p_seg_partitions), 0),
            coalesce(cardinality(p_seg_counts), 0), coalesce(cardinality(p_seg_hashes), 0),
            coalesce(cardinality(p_seg_blobs), 0) USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_timer_seg), 0) <> v_nt
       OR coalesce(cardinality(p_timer_tokens), 0) <> v_nt THEN
        RAISE EXCEPTION 'log_timers_fire_v1: timer arrays must line up: timer_keys %, timer_seg %, timer_tokens % elements',
            v_nt, coalesce(cardinality(p_timer_seg), 0), coalesce(cardinality(p_timer_tokens), 0)
            USING ERRCODE = '22023';
    END IF;
    IF v_nseg = 0 THEN
        IF v_nt > 0 THEN
            RAISE EXCEPTION 'log_timers_fire_v1: timer_seg names segments but seg_counts is empty'
                USING ERRCODE = '22023';
        END IF;
        RETURN jsonb_build_object('segments', '[]'::jsonb, 'fired', 0, 'stale', 0,
                                  'duplicate', 0, 'released', 0);
    END IF;

    -- The first segment repeating a hash, found for all segments at once (only segments
    -- whose count and hashes are well formed are looked at); the loop below reports it
    -- in its turn, after that segment's earlier checks.
    SELECT min(r.i) INTO v_badseg
      FROM (SELECT g.i
              FROM generate_series(1, v_nseg) AS g(i)
             CROSS JOIN LATERAL generate_series(0,
                    CASE WHEN p_seg_counts[g.i] >= 1 AND p_seg_hashes[g.i] IS NOT NULL
                              AND octet_length(p_seg_hashes[g.i]) = 16::bigint * p_seg_counts[g.i]
                         THEN p_seg_counts[g.i] - 1 ELSE -1 END) AS k
             GROUP BY g.i, substring(p_seg_hashes[g.i] FROM 16 * k + 1 FOR 16)
            HAVING count(*) > 1) r;

    FOR v_i IN 1 .. v_nseg LOOP
        IF p_seg_tenants[v_i] IS NULL OR p_seg_queues[v_i] IS NULL OR p_seg_partitions[v_i] IS NULL
           OR p_seg_counts[v_i] IS NULL OR p_seg_hashes[v_i] IS NULL OR p_seg_blobs[v_i] IS NULL THEN
            RAISE EXCEPTION 'log_timers_fire_v1: segment % has a null element in seg_tenants, seg_queues, seg_partitions, seg_counts, seg_hashes or seg_blobs',
                v_i USING ERRCODE = '22023';
        END IF;
        IF p_seg_queues[v_i] = '' OR p_seg_partitions[v_i] = '' THEN
            RAISE EXCEPTION 'log_timers_fire_v1: seg_queues[%] and seg_partitions[%] must not be empty',
                v_i, v_i USING ERRCODE = '22023';
        END IF;
        IF p_seg_counts[v_i] < 1 THEN
            RAISE EXCEPTION 'log_timers_fire_v1: seg_counts[%] = % (must be at least 1)',
                v_i, p_seg_counts[v_i] USING ERRCODE = '22023';
        END IF;
        IF octet_length(p_seg_hashes[v_i]) <> 16 * p_seg_counts[v_i] THEN
            RAISE EXCEPTION 'log_timers_fire_v1: seg_hashes[%] is % bytes, expected 16 * seg_counts[%] = %',
                v_i, octet_length(p_seg_hashes[v_i]), v_i, 16 * p_seg_counts[v_i]
                USING ERRCODE = '22023';
        END IF;
        IF v_i = v_badseg THEN
            SELECT min(h.k) AS a, max(h.k) AS b INTO v_bad
              FROM (SELECT k, substring(p_seg_hashes[v_i] FROM 16 * k + 1 FOR 16) AS hash,
                           count(*) OVER (PARTITION BY substring(p_seg_hashes[v_i] FROM 16 * k + 1 FOR 16)) AS n
                      FROM generate_series(0, p_seg_counts[v_i] - 1) AS k) h
             WHERE h.n > 1
             GROUP BY h.hash
             LIMIT 1;
            RAISE EXCEPTION 'log_timers_fire_v1: seg_hashes[%] repeats one transaction hash at frames % and %; timers sharing a txn go in different segments',
                v_i, v_bad.a, v_bad.b USING ERRCODE = '22023';
        END IF;
    END LOOP;

    SELECT u.j, u.s INTO v_bad
      FROM unnest(p_timer_keys, p_timer_seg, p_timer_tokens) WITH ORDINALITY AS u(k, s, tok, j)
     WHERE u.s IS NULL OR u.s < 1 OR u.s > v_nseg OR u.k IS NULL OR u.tok IS NULL
     ORDER BY u.j
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'log_timers_fire_v1: timer % is invalid: timer_seg[%] = % (must be 1..%), and timer_keys/timer_tokens must not be null',
            v_bad.j, v_bad.j, v_bad.s, v_nseg USING ERRCODE = '22023';
    END IF;

    SELECT c.i, c.n INTO v_bad
      FROM (SELECT g.i, coalesce(t.n, 0) AS n
              FROM generate_series(1, v_nseg) AS g(i)
              LEFT JOIN (SELECT s, count(*) AS n FROM unnest(p_timer_seg) AS s GROUP BY s) t
                ON t.s = g.i) c
     WHERE c.n <> p_seg_counts[c.i]
     ORDER BY c.i
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'log_timers_fire_v1: timer_seg gives segment % % timers but seg_counts[%] = %',
            v_bad.i, v_bad.n, v_bad.i, p_seg_counts[v_bad.i] USING ERRCODE = '22023';
    END IF;

    SELECT d.j, d.first_j INTO v_bad
      FROM (SELECT u.j,
                   first_value(u.j) OVER (PARTITION BY p_seg_tenants[u.s], p_seg_queues[u.s], u.k ORDER BY u.j) AS first_j
              FROM unnest(p_timer_keys, p_timer_seg) WITH ORDINALITY AS u(k, s, j)) d
     WHERE d.j <> d.first_j
     ORDER BY d.j
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'log_timers_fire_v1: timer_keys[%] names the same timer as timer_keys[%]',
            v_bad.j, v_bad.first_j USING ERRCODE = '22023';
    END IF;

    -- Timers grouped by segment, frame order kept.
    SELECT array_agg(u.j::int ORDER BY u.s, u.j) INTO v_perm
      FROM unnest(p_timer_seg) WITH ORDINALITY AS u(s, j);
    v_start := array_fill(1, ARRAY[v_nseg]);
    FOR v_i IN 2 .. v_nseg LOOP
        v_start[v_i] := v_start[v_i - 1] + p_seg_counts[v_i - 1];
    END LOOP;

    v_results := array_fill(NULL::jsonb, ARRAY[v_nseg]);
    v_state := array_fill(NULL::text, ARRAY[v_nseg]);
    v_base := array_fill(NULL::bigint, ARRAY[v_nseg]);
    v_dupk := array_fill(0, ARRAY[v_nseg]);

    -- Hold what is ours: every named row, all segments in one statement. A segment
    -- missing any row is stale; its held rows are released with the final writes below
    -- (they are ours until commit either way).
    WITH h AS MATERIALIZED (
        SELECT u.j, u.s, (x.ok IS NOT NULL) AS held
          FROM unnest(p_timer_keys, p_timer_seg, p_timer_tokens) WITH ORDINALITY AS u(k, s, tok, j)
          LEFT JOIN LATERAL (
                SELECT true AS ok
                  FROM queen.log_timers t
                 WHERE t.tenant_id = p_seg_tenants[u.s]
                   AND t.queue = p_seg_queues[u.s]
                   AND t.timer_key = u.k
                   AND t.claim_token = u.tok
                   AND t.claimed_until > p_now
                   AND t.partition = p_seg_partitions[u.s]
                   FOR UPDATE SKIP LOCKED) x ON true)
    SELECT (SELECT array_agg(h.held ORDER BY h.j) FROM h),
           (SELECT array_agg(coalesce(c.n, 0) ORDER BY g.i)
              FROM generate_series(1, v_nseg) AS g(i)
              LEFT JOIN (SELECT h.s, count(*)::int AS n FROM h WHERE h.held GROUP BY h.s) c
                ON c.s = g.i)
      INTO v_heldmask, v_heldn;

    FOR v_i IN 1 .. v_nseg LOOP
        IF v_heldn[v_i] <> p_seg_counts[v_i] THEN
            v_state[v_i] := 'stale';
            v_results[v_i] := jsonb_build_object('status', 'stale', 'held', v_heldn[v_i]);
            v_stale := v_stale + 1;
            v_released := v_released + v_heldn[v_i];
        END IF;
    END LOOP;

    -- Queue and partition ids of the live segments, looked up at once; only the missing
    -- ones are provisioned, in (tenant, queue, partition) order so two concurrent
    -- provisioners take the new rows in the same order.
    SELECT array_agg(x.qid ORDER BY g.i), array_agg(x.pid ORDER BY g.i), array_agg(x.win ORDER BY g.i)
      INTO v_qid, v_pid, v_win
      FROM generate_series(1, v_nseg) AS g(i)
      LEFT JOIN LATERAL (
            SELECT q.id AS qid, p.id AS pid, q.dedup_window_ms AS win
              FROM queen.queues q
              LEFT JOIN queen.log_partitions p
                ON p.queue_id = q.id AND p.name = p_seg_partitions[g.i]
             WHERE v_state[g.i] IS NULL
               AND q.tenant_id = p_seg_tenants[g.i] AND q.name = p_seg_queues[g.i]) x ON true;

    FOR v_i IN
        SELECT g.i FROM generate_series(1, v_nseg) AS g(i)
         WHERE v_state[g.i] IS NULL AND v_pid[g.i] IS NULL
         ORDER BY p_seg_tenants[g.i], p_seg_queues[g.i] COLLATE "C", p_seg_partitions[g.i] COLLATE "C", g.i
    LOOP
        v_prov := queen.log_provision_v1(p_seg_tenants[v_i], p_seg_queues[v_i], p_seg_partitions[v_i]);
        v_qid[v_i] := v_prov.queue_id;
        v_pid[v_i] := v_prov.partition_id;
        v_win[v_i] := v_prov.dedup_window_ms;
    END LOOP;

    -- Lock the live segments' partitions in ascending id order (the fire's only waits),
    -- in one statement, reading the offset allocators we now hold.
    IF p_wait IS DISTINCT FROM false THEN
        SELECT array_agg(l.id ORDER BY l.id), array_agg(l.last_offset ORDER BY l.id)
          INTO v_lk_ids, v_lk_last
          FROM (SELECT lp.id, lp.last_offset
                  FROM queen.log_partitions lp
                 WHERE lp.id = ANY (ARRAY(SELECT DISTINCT p FROM unnest(v_pid) AS p
                                           WHERE p IS NOT NULL ORDER BY p))
                 ORDER BY lp.id
                   FOR UPDATE) l;
    ELSE
        SELECT array_agg(l.id ORDER BY l.id), array_agg(l.last_offset ORDER BY l.id)
          INTO v_lk_ids, v_lk_last
          FROM (SELECT lp.id, lp.last_offset
                  FROM queen.log_partitions lp
                 WHERE lp.id = ANY (ARRAY(SELECT DISTINCT p FROM unnest(v_pid) AS p
                                           WHERE p IS NOT NULL ORDER BY p))
                 ORDER BY lp.id
                   FOR UPDATE SKIP LOCKED) l;
    END IF;
    v_lk_ids := coalesce(v_lk_ids, '{}');
    v_lk_last := coalesce(v_lk_last, '{}');

    -- Live segments whose partition someone else holds are busy: their rows stay claimed
    -- and held for the caller's next call.
    SELECT array_agg(g.i ORDER BY g.i) INTO v_push
      FROM generate_series(1, v_nseg) AS g(i)
     WHERE v_state[g.i] IS NULL AND v_pid[g.i] = ANY (v_lk_ids);
    v_push := coalesce(v_push, '{}');
    FOR v_i IN 1 .. v_nseg LOOP
        IF v_state[v_i] IS NULL AND NOT v_pid[v_i] = ANY (v_lk_ids) THEN
            v_state[v_i] := 'busy';
            v_results[v_i] := jsonb_build_object('status', 'busy', 'count', p_seg_counts[v_i]);
            v_busyn := v_busyn + p_seg_counts[v_i];
        END IF;
    END LOOP;

    IF cardinality(v_push) > 0 THEN
        -- Dedup, all frames of all pushed segments in one statement. One primary-key
        -- probe per frame (LATERAL ... LIMIT 1): a plain join here gets a cached generic
        -- plan that hashes the whole index table, and the fire then slows down in
        -- proportion to everything ever fired into the queue. Also: the frames whose hash
        -- an earlier pushed segment of the same queue carries (that segment's index rows,
        -- written at now, count inside a window > 0 if it is appended), and whether a
        -- hash repeats in a queue with a zero window (left to the per-segment path).
        WITH f AS MATERIALIZED (
            SELECT g.i, v_perm[v_start[g.i] + k.k] AS j, v_qid[g.i] AS qid, v_win[g.i] AS win,
                   substring(p_seg_hashes[g.i] FROM 16 * k.k + 1 FOR 16) AS hash
              FROM unnest(v_push) AS g(i)
             CROSS JOIN LATERAL generate_series(0, p_seg_counts[g.i] - 1) AS k(k)),
        hit AS MATERIALIZED (
            SELECT f.i, f.j
              FROM f
             CROSS JOIN LATERAL (SELECT 1
                                   FROM queen.log_txn_index x
                                  WHERE x.queue_id = f.qid
                                    AND x.hash = f.hash
                                    AND x.created_at > p_now - f.win * interval '1 millisecond'
                                  LIMIT 1) AS y),
        pr AS MATERIALIZED (
            SELECT b.i, b.j, a.i AS e, a.win
              FROM f a
              JOIN f b ON b.qid = a.qid AND b.hash = a.hash AND b.i > a.i)
        SELECT (SELECT array_agg(hit.i) FROM hit), (SELECT array_agg(hit.j) FROM hit),
               (SELECT array_agg(pr.i ORDER BY pr.i, pr.e) FROM pr WHERE pr.win > 0),
               (SELECT array_agg(pr.j ORDER BY pr.i, pr.e) FROM pr WHERE pr.win > 0),
               (SELECT array_agg(pr.e ORDER BY pr.i, pr.e) FROM pr WHERE pr.win > 0),
               EXISTS (SELECT 1 FROM pr WHERE pr.win = 0)
          INTO v_hit_s, v_hit_j, v_pr_s, v_pr_j, v_pr_e, v_rep0;
        v_slow := v_rep0;
    END IF;

    IF cardinality(v_push) > 0 AND NOT v_slow THEN
        v_dupmask := array_fill(false, ARRAY[greatest(v_nt, 1)]);
        FOREACH v_i IN ARRAY v_push LOOP
            v_state[v_i] := 'fire';
        END LOOP;
        FOR v_x IN 1 .. coalesce(cardinality(v_hit_s), 0) LOOP
            v_state[v_hit_s[v_x]] := 'dup';
            v_dupmask[v_hit_j[v_x]] := true;
            v_dupk[v_hit_s[v_x]] := v_dupk[v_hit_s[v_x]] + 1;
        END LOOP;
        -- In array order: a frame repeating the hash of an earlier segment that is
        -- appended is in the log by the time its own segment is looked at.
        FOR v_x IN 1 .. coalesce(cardinality(v_pr_s), 0) LOOP
            IF v_state[v_pr_e[v_x]] = 'fire' THEN
                v_state[v_pr_s[v_x]] := 'dup';
                IF NOT v_dupmask[v_pr_j[v_x]] THEN
                    v_dupmask[v_pr_j[v_x]] := true;
                    v_dupk[v_pr_s[v_x]] := v_dupk[v_pr_s[v_x]] + 1;
                END IF;
            END IF;
        END LOOP;

        -- Offsets: the segments of one partition get consecutive ranges in array order.
        WITH a AS (
            SELECT g.i, v_pid[g.i] AS pid, l.last_offset
                   + sum(p_seg_counts[g.i]) OVER (PARTITION BY v_pid[g.i] ORDER BY g.i) AS e
              FROM unnest(v_push) AS g(i)
              JOIN unnest(v_lk_ids, v_lk_last) AS l(id, last_offset) ON l.id = v_pid[g.i]
             WHERE v_state[g.i] = 'fire')
        SELECT (SELECT array_agg(a.i ORDER BY a.i) FROM a),
               (SELECT sum(p_seg_counts[a.i])::int FROM a),
               (SELECT array_agg(a.e - p_seg_counts[a.i] + 1 ORDER BY a.i) FROM a),
               (SELECT array_agg(m.pid ORDER BY m.pid) FROM (SELECT a.pid, max(a.e) AS e FROM a GROUP BY a.pid) m),
               (SELECT array_agg(m.e ORDER BY m.pid) FROM (SELECT a.pid, max(a.e) AS e FROM a GROUP BY a.pid) m)
          INTO v_fire, v_fire_n, v_base, v_np_ids, v_np_last;
        v_fire := coalesce(v_fire, '{}');

        IF cardinality(v_fire) > 0 THEN
            -- v_base is indexed by position in v_fire here; spread it per segment.
            v_base := ARRAY(SELECT b.base FROM generate_series(1, v_nseg) AS g(i)
                              LEFT JOIN unnest(v_fire, v_base) AS b(i, base) ON b.i = g.i
                             ORDER BY g.i);
            -- The dedup index rows of every appended frame. An index row that is inside
            -- the window and was not visible above belongs to a concurrent writer that
            -- has committed since: the upsert waited for it and leaves it alone.
            WITH ins AS (
                INSERT INTO queen.log_txn_index AS ix (queue_id, hash, partition_id, log_offset, created_at)
                SELECT v_qid[g.i], substring(p_seg_hashes[g.i] FROM 16 * k.k + 1 FOR 16),
                       v_pid[g.i], v_base[g.i] + k.k, p_now
                  FROM unnest(v_fire) AS g(i)
                 CROSS JOIN LATERAL generate_series(0, p_seg_counts[g.i] - 1) AS k(k)
                 ORDER BY 1, 2
                ON CONFLICT (queue_id, hash) DO UPDATE
                    SET partition_id = excluded.partition_id,
                        log_offset = excluded.log_offset,
                        created_at = excluded.created_at
                  WHERE ix.created_at <= p_now - v_win[array_position(v_qid, ix.queue_id)] * interval '1 millisecond'
                RETURNING ix.queue_id, ix.hash
            )
            SELECT count(*)::int, array_agg(ins.queue_id), array_agg(ins.hash)
              INTO v_won_n, v_won_q, v_won_h
              FROM ins;

            IF v_won_n = v_fire_n THEN
                UPDATE queen.log_partitions lp
                   SET last_offset = v_np_last[array_position(v_np_ids, lp.id)]
                 WHERE lp.id = ANY (v_np_ids);
                INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, count, created_at, blob)
                SELECT v_pid[g.i], v_base[g.i], v_base[g.i] + p_seg_counts[g.i] - 1, p_seg_counts[g.i],
                       p_now, p_seg_blobs[g.i]
                  FROM unnest(v_fire) AS g(i);
                INSERT INTO queen.log_txns (partition_id, base_offset, hashes)
                SELECT v_pid[g.i], v_base[g.i], p_seg_hashes[g.i]
                  FROM unnest(v_fire) AS g(i);
            ELSE
                -- Lost a race with a concurrent writer of the same transaction: undo
                -- what the upsert took (nothing was allocated yet) and do the pushed
                -- segments one by one below.
                FOR v_tq IN
                    SELECT w.q, array_agg(w.h) AS hs
                      FROM unnest(v_won_q, v_won_h) AS w(q, h)
                     GROUP BY w.q
                LOOP
                    DELETE FROM queen.log_txn_index AS ix
                     WHERE ix.queue_id = v_tq.q AND ix.hash = ANY (v_tq.hs);
                END LOOP;
                v_slow := true;
            END IF;
        END IF;

        IF NOT v_slow THEN
            FOREACH v_i IN ARRAY v_push LOOP
                IF v_state[v_i] = 'fire' THEN
                    v_results[v_i] := jsonb_build_object('status', 'fired', 'partitionId', v_pid[v_i],
                        'baseOffset', v_base[v_i], 'endOffset', v_base[v_i] + p_seg_counts[v_i] - 1,
                        'count', p_seg_counts[v_i]);
                    v_fired := v_fired + p_seg_counts[v_i];
                ELSE
                    v_results[v_i] := jsonb_build_object('status', 'duplicate',
                        'duplicates', v_dupk[v_i], 'released', p_seg_counts[v_i] - v_dupk[v_i]);
                    v_dupn := v_dupn + v_dupk[v_i];
                    v_released := v_released + p_seg_counts[v_i] - v_dupk[v_i];
                END IF;
            END LOOP;
        END IF;
    END IF;

    IF v_slow THEN
        -- Segment by segment, in array order, so a later segment sees an earlier one's
        -- dedup index rows (and a lost race undoes only its own segment).
        FOREACH v_i IN ARRAY v_push LOOP
            v_state[v_i] := 'slow';
            SELECT array_agg(p_timer_keys[v_perm[x]] ORDER BY x)
              INTO v_keys
              FROM generate_series(v_start[v_i], v_start[v_i] + p_seg_counts[v_i] - 1) AS x;

            SELECT array_agg(h.k ORDER BY h.k) INTO v_dup_k
              FROM generate_series(0, p_seg_counts[v_i] - 1) AS h(k)
             CROSS JOIN LATERAL (SELECT 1
                                   FROM queen.log_txn_index x
                                  WHERE x.queue_id = v_qid[v_i]
                                    AND x.hash = substring(p_seg_hashes[v_i] FROM 16 * h.k + 1 FOR 16)
                                    AND x.created_at > p_now - v_win[v_i] * interval '1 millisecond'
                                  LIMIT 1) AS y;

            IF v_dup_k IS NULL THEN
                UPDATE queen.log_partitions lp
                   SET last_offset = lp.last_offset + p_seg_counts[v_i]
                 WHERE lp.id = v_pid[v_i]
                RETURNING lp.last_offset INTO v_end;
                v_base[v_i] := v_end - p_seg_counts[v_i] + 1;

                WITH ins AS (
                    INSERT INTO queen.log_txn_index AS ix (queue_id, hash, partition_id, log_offset, created_at)
                    SELECT v_qid[v_i], substring(p_seg_hashes[v_i] FROM 16 * h.k + 1 FOR 16),
                           v_pid[v_i], v_base[v_i] + h.k, p_now
                      FROM generate_series(0, p_seg_counts[v_i] - 1) AS h(k)
                     ORDER BY 2
                    ON CONFLICT (queue_id, hash) DO UPDATE
                        SET partition_id = excluded.partition_id,
                            log_offset = excluded.log_offset,
                            created_at = excluded.created_at
                      WHERE ix.created_at <= p_now - v_win[v_i] * interval '1 millisecond'
                    RETURNING ix.hash
                )
                SELECT array_agg(ins.hash) INTO v_won FROM ins;

                IF coalesce(cardinality(v_won), 0) = p_seg_counts[v_i] THEN
                    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, count, created_at, blob)
                    VALUES (v_pid[v_i], v_base[v_i], v_end, p_seg_counts[v_i], p_now, p_seg_blobs[v_i]);
                    INSERT INTO queen.log_txns (partition_id, base_offset, hashes)
                    VALUES (v_pid[v_i], v_base[v_i], p_seg_hashes[v_i]);
                    DELETE FROM queen.log_timers AS t
                     WHERE t.tenant_id = p_seg_tenants[v_i] AND t.queue = p_seg_queues[v_i]
                       AND t.timer_key = ANY (v_keys);
                    v_results[v_i] := jsonb_build_object('status', 'fired', 'partitionId', v_pid[v_i],
                        'baseOffset', v_base[v_i], 'endOffset', v_end, 'count', p_seg_counts[v_i]);
                    v_fired := v_fired + p_seg_counts[v_i];
                    CONTINUE;
                END IF;

                -- Lost the race: undo this segment's index rows and its allocation (the
                -- partition row is ours, so nobody allocated in between).
                DELETE FROM queen.log_txn_index AS ix
                 WHERE ix.queue_id = v_qid[v_i] AND ix.hash = ANY (coalesce(v_won, '{}'));
                UPDATE queen.log_partitions lp
                   SET last_offset = lp.last_offset - p_seg_counts[v_i]
                 WHERE lp.id = v_pid[v_i];
                SELECT array_agg(h.k ORDER BY h.k) INTO v_dup_k
                  FROM generate_series(0, p_seg_counts[v_i] - 1) AS h(k)
                 WHERE NOT substring(p_seg_hashes[v_i] FROM 16 * h.k + 1 FOR 16) = ANY (coalesce(v_won, '{}'));
            END IF;

            -- Duplicate: delivered frames' timers go, the others are released for a re-pack.
            DELETE FROM queen.log_timers AS t
             WHERE t.tenant_id = p_seg_tenants[v_i] AND t.queue = p_seg_queues[v_i]
               AND t.timer_key = ANY (ARRAY(SELECT v_keys[k + 1] FROM unnest(v_dup_k) AS k));
            GET DIAGNOSTICS v_n = ROW_COUNT;
            UPDATE queen.log_timers AS t
               SET claim_token = NULL, claimed_until = NULL, updated_at = p_now
             WHERE t.tenant_id = p_seg_tenants[v_i] AND t.queue = p_seg_queues[v_i]
               AND t.timer_key = ANY (v_keys)
               AND NOT t.timer_key = ANY (ARRAY(SELECT v_keys[k + 1] FROM unnest(v_dup_k) AS k));
            GET DIAGNOSTICS v_j = ROW_COUNT;
            v_results[v_i] := jsonb_build_object('status', 'duplicate', 'duplicates', v_n, 'released', v_j);
            v_dupn := v_dupn + v_n;
            v_released := v_released + v_j;
        END LOOP;
    END IF;

    -- The timer rows, per (tenant, queue): delivered ones deleted (appended segments,
    -- frames of duplicate segments already in the log), the rest of duplicate segments
    -- and the held rows of stale segments released (token and claimed_until nulled).
    FOR v_tq IN
        SELECT a.tn, a.q,
               array_agg(a.k) FILTER (WHERE a.act = 'd') AS dk,
               array_agg(a.k) FILTER (WHERE a.act = 'r') AS rk
          FROM (SELECT p_seg_tenants[u.s] AS tn, p_seg_queues[u.s] AS q, u.k,
                       CASE v_state[u.s]
                            WHEN 'fire' THEN 'd'
                            WHEN 'dup' THEN CASE WHEN v_dupmask[u.j] THEN 'd' ELSE 'r' END
                            WHEN 'stale' THEN CASE WHEN v_heldmask[u.j] THEN 'r' END
                       END AS act
                  FROM unnest(p_timer_keys, p_timer_seg) WITH ORDINALITY AS u(k, s, j)) a
         WHERE a.act IS NOT NULL
         GROUP BY a.tn, a.q
    LOOP
        IF v_tq.dk IS NOT NULL THEN
            DELETE FROM queen.log_timers AS t
             WHERE t.tenant_id = v_tq.tn AND t.queue = v_tq.q AND t.timer_key = ANY (v_tq.dk);
        END IF;
        IF v_tq.rk IS NOT NULL THEN
            UPDATE queen.log_timers AS t
               SET claim_token = NULL, claimed_until = NULL, updated_at = p_now
             WHERE t.tenant_id = v_tq.tn AND t.queue = v_tq.q AND t.timer_key = ANY (v_tq.rk);
        END IF;
    END LOOP;

    RETURN jsonb_build_object('segments', to_jsonb(v_results), 'fired', v_fired,
                              'stale', v_stale, 'duplicate', v_dupn, 'released', v_released,
                              'busy', v_busyn);
END
$fn$;
