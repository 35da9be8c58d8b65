-- 003_fire.sql: the fire (queen.log_timers_fire_v2): claimed
-- timers appended to the log as segments, with the per-queue dedup window applied, and
-- their rows deleted or released.
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

-- ---------------------------------------------------------------------------------------
-- Internal helpers of the fire (SECURITY INVOKER, granted to nobody: called only from
-- queen.log_timers_fire_v2, whose owner they run as)
-- ---------------------------------------------------------------------------------------

-- The ten-argument form of earlier builds is dropped once (a call with ten arguments would
-- otherwise be ambiguous between it and the one below, whose eleventh has a default).
DO $drop$
BEGIN
    IF to_regprocedure('queen.log_timers_fire_check_v1(uuid[], text[], text[], integer[], bytea[], bytea[], '
                       'text[], integer[], uuid[], timestamp with time zone)') IS NOT NULL THEN
        DROP FUNCTION queen.log_timers_fire_check_v1(uuid[], text[], text[], integer[], bytea[], bytea[],
                                                     text[], integer[], uuid[], timestamptz);
    END IF;
END
$drop$;
-- Schema 34 gave the fire and the helpers that write its answer a last argument, p_compact
-- (with a default): their forms without it are dropped (a call without it would otherwise
-- be ambiguous). Nothing but this file calls them; the apply runs under its mutex.
DROP FUNCTION IF EXISTS queen.log_timers_fire_answer_v1(int[], int[], bigint[], bigint[], bigint[], int[]);
DROP FUNCTION IF EXISTS queen.log_timers_fire_settle_v1(uuid[], text[], int[], text[], int[], timestamptz,
    boolean[], int[], bigint[], bigint[], bigint[], int[], int[]);
DROP FUNCTION IF EXISTS queen.log_timers_fire_fast_v2(uuid[], text[], text[], int[], bytea[], bytea[], text[],
    int[], uuid[], timestamptz, boolean, tid[]);
DROP FUNCTION IF EXISTS queen.log_timers_fire_v2(uuid[], text[], text[], int[], bytea[], bytea[], text[], int[],
    uuid[], timestamptz, boolean, tid[]);
-- Schema 36: the fire finds and locks its partitions in one lookup (log_timers_fire_take_v1);
-- its helper that only found them is gone.
DROP FUNCTION IF EXISTS queen.log_timers_fire_ids_v2(uuid[], text[], text[], boolean[], boolean);
-- Schema 37: the fire takes its partitions at the addresses its caller hands back (hints,
-- the answer's partitionTids): the take, the fast way and the fire gain an argument, and
-- their forms without it are dropped.
DROP FUNCTION IF EXISTS queen.log_timers_fire_take_v1(uuid[], text[], text[], boolean[], boolean);
DROP FUNCTION IF EXISTS queen.log_timers_fire_fast_v2(uuid[], text[], text[], int[], bytea[], bytea[], text[],
    int[], uuid[], timestamptz, boolean, tid[], boolean);
DROP FUNCTION IF EXISTS queen.log_timers_fire_v2(uuid[], text[], text[], int[], bytea[], bytea[], text[], int[],
    uuid[], timestamptz, boolean, tid[], boolean);

-- queen.log_timers_fire_check_v1(<the fire's first ten arguments>, full boolean default true)
--   -> void
-- Raises 22023 (message naming the array and the element) for every argument the fire
-- refuses, as listed in its header, in this order: null now; segment arrays, then timer
-- arrays, of different lengths; timers without segments; per segment in array order: a
-- null element, an empty queue or partition, seg_counts[i] < 1, seg_hashes[i] not
-- 16 * seg_counts[i] bytes, a hash repeated in the segment (its first two frames named);
-- then the first timer with timer_seg outside 1..n or a null key or token; the first
-- segment whose timer count differs from seg_counts[i]; the first timer named twice (same
-- tenant, queue and key). Returns when everything is well formed.
-- full false: the two findings that need a sort or a hash of every frame (a hash repeated
-- in a segment, a timer named twice) are not looked for while everything else is well
-- formed; when anything else is wrong, all of them are, so the error raised is the one
-- full gives. For the fire's fast way, which cannot go wrong on either: a timer named twice
-- deletes its row once and the count comes up short, a hash repeated in a segment gives
-- the optimistic append fewer index rows than frames; both undo the fast way, and the
-- general way starts with the full check (measured in tests/bench/README.md, third pass:
-- the two are most of the check's cost). Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_fire_check_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_seg_hashes bytea[], p_seg_blobs bytea[], p_timer_keys text[], p_timer_seg int[],
    p_timer_tokens uuid[], p_now timestamptz, p_full boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_nseg      int := coalesce(cardinality(p_seg_tenants), 0);
    v_nt        int := coalesce(cardinality(p_timer_keys), 0);
    v_i         int;
    v_bad       record;
    v_badseg    int;            -- first segment failing a per-segment check
    v_badtimer  int[];          -- first invalid timer: (j, timer_seg[j])
    v_badcount  int[];          -- first segment whose timer count is wrong: (i, count)
    v_twice     int[];          -- first timer named twice: (j, its first mention)
    v_full      boolean := p_full IS DISTINCT FROM false;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_fire_v2: now must not be null' USING ERRCODE = '22023';
    END IF;

    -- The arrays must line up.
    IF coalesce(cardinality(p_seg_queues), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_partitions), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_counts), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_hashes), 0) <> v_nseg
       OR coalesce(cardinality(p_seg_blobs), 0) <> v_nseg THEN
        RAISE EXCEPTION 'log_timers_fire_v2: segment arrays must line up: seg_tenants %, seg_queues %, seg_partitions %, seg_counts %, seg_hashes %, seg_blobs % elements',
            v_nseg, coalesce(cardinality(p_seg_queues), 0), coalesce(cardinality(p_seg_partitions), 0),
            coalesce(cardinality(p_seg_counts), 0), coalesce(cardinality(p_seg_hashes), 0),
            coalesce(cardinality(p_seg_blobs), 0) USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_timer_seg), 0) <> v_nt
       OR coalesce(cardinality(p_timer_tokens), 0) <> v_nt THEN
        RAISE EXCEPTION 'log_timers_fire_v2: timer arrays must line up: timer_keys %, timer_seg %, timer_tokens % elements',
            v_nt, coalesce(cardinality(p_timer_seg), 0), coalesce(cardinality(p_timer_tokens), 0)
            USING ERRCODE = '22023';
    END IF;
    IF v_nseg = 0 THEN
        IF v_nt > 0 THEN
            RAISE EXCEPTION 'log_timers_fire_v2: timer_seg names segments but seg_counts is empty'
                USING ERRCODE = '22023';
        END IF;
        RETURN;
    END IF;

    -- Every finding at once, in one statement that cannot raise; reported below in their
    -- turn. The first segment failing any per-segment check: one with a null element, an
    -- empty name, a count below 1 or hashes of the wrong length, or (among well-formed
    -- ones, with v_full) repeating a hash. Without v_full and with a finding, once more
    -- with v_full (the loop), so that the first error is the one full raises.
    LOOP
    SELECT (SELECT min(r.i)
              FROM (SELECT s.i
                      FROM unnest(p_seg_tenants, p_seg_queues, p_seg_partitions, p_seg_counts,
                                  p_seg_hashes, p_seg_blobs) WITH ORDINALITY AS s(t, q, p, n, h, b, i)
                     WHERE s.t IS NULL OR s.q IS NULL OR s.p IS NULL OR s.n IS NULL OR s.h IS NULL
                        OR s.b IS NULL OR s.q = '' OR s.p = '' OR s.n < 1
                        OR octet_length(s.h) <> 16::bigint * s.n
                    UNION ALL
                    SELECT g.i
                      FROM generate_series(1, CASE WHEN v_full THEN v_nseg ELSE 0 END) AS g(i)
                     CROSS JOIN LATERAL generate_series(0,
                            CASE WHEN p_seg_counts[g.i] >= 1 AND p_seg_hashes[g.i] IS NOT NULL
                                      AND octet_length(p_seg_hashes[g.i]) = 16::bigint * p_seg_counts[g.i]
                                 THEN p_seg_counts[g.i] - 1 ELSE -1 END) AS k
                     GROUP BY g.i, substring(p_seg_hashes[g.i] FROM 16 * k + 1 FOR 16)
                    HAVING count(*) > 1) r),
           (SELECT ARRAY[u.j::int, u.s]
              FROM unnest(p_timer_keys, p_timer_seg, p_timer_tokens) WITH ORDINALITY AS u(k, s, tok, j)
             WHERE u.s IS NULL OR u.s < 1 OR u.s > v_nseg OR u.k IS NULL OR u.tok IS NULL
             ORDER BY u.j
             LIMIT 1),
           (SELECT ARRAY[c.i, c.n::int]
              FROM (SELECT g.i, coalesce(t.n, 0) AS n
                      FROM generate_series(1, v_nseg) AS g(i)
                      LEFT JOIN (SELECT s, count(*) AS n FROM unnest(p_timer_seg) AS s GROUP BY s) t
                        ON t.s = g.i) c
             WHERE c.n <> p_seg_counts[c.i]
             ORDER BY c.i
             LIMIT 1),
           (SELECT ARRAY[d.j::int, d.first_j::int]
              FROM (SELECT u.j,
                           first_value(u.j) OVER (PARTITION BY p_seg_tenants[u.s], p_seg_queues[u.s], u.k ORDER BY u.j) AS first_j
                      FROM unnest(p_timer_keys, p_timer_seg) WITH ORDINALITY AS u(k, s, j)
                     WHERE v_full) d
             WHERE d.j <> d.first_j
             ORDER BY d.j
             LIMIT 1)
      INTO v_badseg, v_badtimer, v_badcount, v_twice;
    EXIT WHEN v_full OR (v_badseg IS NULL AND v_badtimer IS NULL AND v_badcount IS NULL);
    v_full := true;
    END LOOP;

    -- That segment's checks, in order (the segments before it passed them all).
    IF v_badseg IS NOT NULL THEN
        v_i := v_badseg;
        IF p_seg_tenants[v_i] IS NULL OR p_seg_queues[v_i] IS NULL OR p_seg_partitions[v_i] IS NULL
           OR p_seg_counts[v_i] IS NULL OR p_seg_hashes[v_i] IS NULL OR p_seg_blobs[v_i] IS NULL THEN
            RAISE EXCEPTION 'log_timers_fire_v2: segment % has a null element in seg_tenants, seg_queues, seg_partitions, seg_counts, seg_hashes or seg_blobs',
                v_i USING ERRCODE = '22023';
        END IF;
        IF p_seg_queues[v_i] = '' OR p_seg_partitions[v_i] = '' THEN
            RAISE EXCEPTION 'log_timers_fire_v2: seg_queues[%] and seg_partitions[%] must not be empty',
                v_i, v_i USING ERRCODE = '22023';
        END IF;
        IF p_seg_counts[v_i] < 1 THEN
            RAISE EXCEPTION 'log_timers_fire_v2: seg_counts[%] = % (must be at least 1)',
                v_i, p_seg_counts[v_i] USING ERRCODE = '22023';
        END IF;
        IF octet_length(p_seg_hashes[v_i]) <> 16 * p_seg_counts[v_i] THEN
            RAISE EXCEPTION 'log_timers_fire_v2: seg_hashes[%] is % bytes, expected 16 * seg_counts[%] = %',
                v_i, octet_length(p_seg_hashes[v_i]), v_i, 16 * p_seg_counts[v_i]
                USING ERRCODE = '22023';
        END IF;
        SELECT min(h.k) AS a, max(h.k) AS b INTO v_bad
          FROM (SELECT k, substring(p_seg_hashes[v_i] FROM 16 * k + 1 FOR 16) AS hash,
                       count(*) OVER (PARTITION BY substring(p_seg_hashes[v_i] FROM 16 * k + 1 FOR 16)) AS n
                  FROM generate_series(0, p_seg_counts[v_i] - 1) AS k) h
         WHERE h.n > 1
         GROUP BY h.hash
         LIMIT 1;
        RAISE EXCEPTION 'log_timers_fire_v2: seg_hashes[%] repeats one transaction hash at frames % and %; timers sharing a txn go in different segments',
            v_i, v_bad.a, v_bad.b USING ERRCODE = '22023';
    END IF;

    IF v_badtimer IS NOT NULL THEN
        RAISE EXCEPTION 'log_timers_fire_v2: timer % is invalid: timer_seg[%] = % (must be 1..%), and timer_keys/timer_tokens must not be null',
            v_badtimer[1], v_badtimer[1], v_badtimer[2], v_nseg USING ERRCODE = '22023';
    END IF;
    IF v_badcount IS NOT NULL THEN
        RAISE EXCEPTION 'log_timers_fire_v2: timer_seg gives segment % % timers but seg_counts[%] = %',
            v_badcount[1], v_badcount[2], v_badcount[1], p_seg_counts[v_badcount[1]] USING ERRCODE = '22023';
    END IF;
    IF v_twice IS NOT NULL THEN
        RAISE EXCEPTION 'log_timers_fire_v2: timer_keys[%] names the same timer as timer_keys[%]',
            v_twice[1], v_twice[2] USING ERRCODE = '22023';
    END IF;
END
$fn$;

-- queen.log_timers_fire_hold_v1(seg_tenants uuid[], seg_queues text[], seg_partitions text[],
--     seg_counts int[], timer_keys text[], timer_seg int[], timer_tokens uuid[],
--     now timestamptz) -> (held boolean[], held_n int[], live boolean[])
-- queen.log_timers_ours_v1(row_token, row_claimed_until, row_partition, token, partition,
--     now) -> boolean
-- THE check of a claimed row, the one place the fire writes it: the row carries the
-- caller's claim token, its claim is live (claimed_until > now) and it is in the
-- segment's partition. Every statement of the fire that holds or deletes a timer row
-- applies it to the row it writes, so each one is right by itself (a row changed
-- under it, re-read by the executor after an update chain, is judged again here; the
-- statement does not depend on the server re-checking a TID). No host write keeps a claim
-- token (schedule, reschedule and cancel null it), so a row that passes is the very
-- version the claim took. No SET search_path, like epoch_ms_v1 (002): it must stay
-- inlinable (a SET clause stops the planner from inlining, and the key lookups around it
-- must stay index scans), so its operators are named with their schema instead.
-- Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_ours_v1(
    p_row_token uuid, p_row_claimed_until timestamptz, p_row_partition text,
    p_token uuid, p_partition text, p_now timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT p_row_token OPERATOR(pg_catalog.=) p_token
       AND p_row_claimed_until OPERATOR(pg_catalog.>) p_now
       AND p_row_partition OPERATOR(pg_catalog.=) p_partition
$fn$;

-- Holds what is the caller's, all segments in one statement: locks each named row (tenant
-- and queue of its segment) FOR UPDATE SKIP LOCKED if its claim_token is the given one,
-- its claim is live (claimed_until > now) and its partition is the segment's. held[j]:
-- timer j is locked and verified; held_n[i]: how many of segment i's timers are; live[i]:
-- all of them are (held_n[i] = seg_counts[i]). Arguments as checked by
-- log_timers_fire_check_v1.
-- Locks: rows of queen.log_timers, FOR UPDATE SKIP LOCKED (never waits).
CREATE OR REPLACE FUNCTION queen.log_timers_fire_hold_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_timer_keys text[], p_timer_seg int[], p_timer_tokens uuid[], p_now timestamptz,
    OUT held boolean[], OUT held_n int[], OUT live boolean[])
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    WITH h AS MATERIALIZED (
        SELECT u.j, u.s, (x.ok IS NOT NULL) AS held
          FROM unnest(p_timer_keys, p_timer_seg, p_timer_tokens) WITH ORDINALITY AS u(k, s, tok, j)
          LEFT JOIN LATERAL (
                SELECT true AS ok
                  FROM queen.log_timers t
                 WHERE t.tenant_id = p_seg_tenants[u.s]
                   AND t.queue = p_seg_queues[u.s]
                   AND t.timer_key = u.k
                   AND queen.log_timers_ours_v1(t.claim_token, t.claimed_until, t.partition,
                                                u.tok, p_seg_partitions[u.s], p_now)
                   FOR UPDATE SKIP LOCKED) x ON true)
    SELECT (SELECT array_agg(h.held ORDER BY h.j) FROM h),
           (SELECT array_agg(coalesce(c.n, 0) ORDER BY g.i)
              FROM generate_series(1, coalesce(cardinality(p_seg_tenants), 0)) AS g(i)
              LEFT JOIN (SELECT h.s, count(*)::int AS n FROM h WHERE h.held GROUP BY h.s) c
                ON c.s = g.i),
           (SELECT array_agg(coalesce(c.n, 0) = p_seg_counts[g.i] ORDER BY g.i)
              FROM generate_series(1, coalesce(cardinality(p_seg_tenants), 0)) AS g(i)
              LEFT JOIN (SELECT h.s, count(*)::int AS n FROM h WHERE h.held GROUP BY h.s) c
                ON c.s = g.i)
      INTO held, held_n, live;
END
$fn$;

-- queen.log_timers_fire_blocked_v1(seg_tenants uuid[], seg_queues text[], seg_partitions text[],
--     seg_counts int[], timer_keys text[], timer_seg int[], timer_tokens uuid[], now timestamptz,
--     held boolean[], held_n int[]) -> boolean[]
-- Per segment, after log_timers_fire_hold_v1: true when the hold missed
-- some of its rows (held_n[i] < seg_counts[i]) and every row it missed is still ours by a
-- plain read (log_timers_ours_v1 under this statement's snapshot): another transaction
-- holds a lock on a row that is still the caller's. That is mostly another broker's claim
-- passing over it: a row claimed (and committed) after that claim's snapshot was taken is
-- locked by its FOR UPDATE before the recheck finds it in flight and passes it, and the
-- lock stays until that claim commits, a few milliseconds. Such a segment is answered
-- busy (its rows untouched, still claimed, fired by a later call) instead of stale (its
-- held rows released, the others handed back, all claimed and fired again). A row that
-- is not ours (another token, a lapsed lease, gone) still makes its segment stale.
-- Locks: none (plain reads).
CREATE OR REPLACE FUNCTION queen.log_timers_fire_blocked_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_timer_keys text[], p_timer_seg int[], p_timer_tokens uuid[], p_now timestamptz,
    p_held boolean[], p_held_n int[])
RETURNS boolean[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT array_agg(p_held_n[g.i] < p_seg_counts[g.i] AND coalesce(m.ours, false) ORDER BY g.i)
      FROM generate_series(1, coalesce(cardinality(p_seg_tenants), 0)) AS g(i)
      LEFT JOIN (
            SELECT u.s, bool_and(x.ok IS NOT NULL) AS ours
              FROM unnest(p_timer_keys, p_timer_seg, p_timer_tokens, p_held) AS u(k, s, tok, h)
              LEFT JOIN LATERAL (
                    SELECT true AS ok
                      FROM queen.log_timers t
                     WHERE t.tenant_id = p_seg_tenants[u.s]
                       AND t.queue = p_seg_queues[u.s]
                       AND t.timer_key = u.k
                       AND queen.log_timers_ours_v1(t.claim_token, t.claimed_until, t.partition,
                                                    u.tok, p_seg_partitions[u.s], p_now)) x ON true
             WHERE NOT u.h
             GROUP BY u.s) m ON m.s = g.i
$fn$;

-- queen.log_timers_fire_take_v1(seg_tenants uuid[], seg_queues text[], seg_partitions text[],
--     live boolean[], wait boolean, hints tid[])
--   -> (queue_ids bigint[], partition_ids bigint[], windows bigint[], prov_busy int,
--       last_offsets bigint[], partition_tids tid[])
-- The fire's partitions, found and taken (schema 36: before, ids and locks were two
-- lookups, log_timers_fire_ids_v2 then log_partitions_lock_v1, and the append a third).
-- Per live segment i (null for the others): its queue's id and dedup_window_ms, its
-- partition's id, and, when this call holds the partition row FOR UPDATE, that row's
-- last_offset and its address (ctid), which the append (log_append_dedup_v1) updates by
-- address instead of looking the row up a third time (partition_tids[i] means nothing
-- where last_offsets[i] is null: such a segment is not appended).
-- Why one lookup: every fire rewrites its partitions' rows (last_offset), and under a
-- snapshot held anywhere in the database no version of them can be pruned, so each lookup
-- of a partition by key walks every version written since (1.1 ms a lookup after 100,000
-- rewrites of one row, 0.004 ms at its address: tests/bench/versions; docs/operations.md,
-- "Long transactions"). One statement finds the queues and the existing partitions by name,
-- with each partition row's address; a partition whose hints[i] (schema 37: the address
-- its row had after the caller's last fire of it, log_append_dedup_v1's new_tids; null
-- or none: unknown) holds its current row, found by a TID scan and checked by queue and
-- name, is not looked up by key at all: a caller that fires a partition again before
-- anyone else writes it walks no version of its row. Then, with wait false (the sweeper's
-- first call), the rows are locked at those addresses (FOR UPDATE SKIP LOCKED, ascending id, a TID
-- scan: no index walked); a row not taken there (someone else holds it, or it was
-- rewritten since it was read) is tried once more by id, SKIP LOCKED: held, its id is
-- known and its last_offset null (its segments busy). With wait true (or null)
-- every row is locked by id, FOR UPDATE in ascending id order in one statement
-- (queen.log_partitions_lock_v2, which returns the address too), so that two fires that
-- wait never wait on each other in two orders.
-- Only the missing queues and partitions are provisioned (queen.log_provision_try_v1), in
-- (tenant, queue, partition) order so that two concurrent provisioners take the new rows
-- in the same order. Provisioning never waits long (schema 18): with wait false at most
-- 1 ms on each lock, with wait true (or null) at most the session's lock_timeout, and
-- never more than 500 ms (below the default deadlock_timeout, and far inside any lease;
-- also when lock_timeout is 0). A name whose provisioning met a lock held that long (a
-- host transaction that created the queue or the partition, or deletes or renames the
-- queue, and is still open) keeps all its ids null, like a segment that is not live: the
-- fire answers the segment busy, its rows untouched and still claimed, exactly as for a
-- partition someone else holds. prov_busy counts those segments. A partition provisioned
-- here (or by a concurrent provisioner that committed first) is locked SKIP LOCKED
-- whatever wait says: the only unbounded wait of this call is the one ordered statement.
-- Locks, in order: the existing partitions' log_partitions rows FOR UPDATE (SKIP LOCKED
-- with wait false), ascending id within each statement; then queues and log_partitions,
-- only the inserted rows (or a bounded wait on a concurrent inserter of the same name, or
-- on a transaction that deletes or changes the key of the queue row), in (tenant, queue,
-- partition) order; then the provisioned partitions' rows FOR UPDATE SKIP LOCKED,
-- ascending id.
CREATE OR REPLACE FUNCTION queen.log_timers_fire_take_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_live boolean[],
    p_wait boolean, p_hints tid[],
    OUT queue_ids bigint[], OUT partition_ids bigint[], OUT windows bigint[], OUT prov_busy int,
    OUT last_offsets bigint[], OUT partition_tids tid[])
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_indexscan = on SET enable_bitmapscan = on
AS $fn$
DECLARE
    v_nseg    int := coalesce(cardinality(p_seg_tenants), 0);
    v_i       int;
    v_prov    record;
    v_wait_ms int;          -- the bound on each provisioning wait, read once when needed
    v_lt      int;
    v_lock    bigint[];     -- ids to lock by id (wait true: all; false: those not taken by address)
    v_new     bigint[];     -- the partitions provisioned here, to lock
    v_hpid    bigint[];     -- per segment, the partition row at its hint: id, queue id, address
    v_hqid    bigint[];
    v_htid    tid[];
BEGIN
    prov_busy := 0;
    IF p_hints IS NOT NULL THEN
        -- The rows at the hinted addresses, one TID scan (no index or bitmap scan: the
        -- function's SET puts both back on at its end), each kept for its segment only if
        -- it is that partition's row (name here, queue below).
        PERFORM pg_catalog.set_config('enable_indexscan', 'off', true), pg_catalog.set_config('enable_bitmapscan', 'off', true);
        SELECT array_agg(h.id ORDER BY g.i), array_agg(h.queue_id ORDER BY g.i), array_agg(h.tid ORDER BY g.i)
          INTO v_hpid, v_hqid, v_htid
          FROM generate_series(1, v_nseg) AS g(i)
          LEFT JOIN (SELECT lp.id, lp.queue_id, lp.name, lp.ctid AS tid FROM queen.log_partitions lp
                      WHERE lp.ctid = ANY (p_hints)) h
            ON p_live[g.i] AND h.tid = p_hints[g.i] AND h.name = p_seg_partitions[g.i];
        PERFORM pg_catalog.set_config('enable_indexscan', 'on', true), pg_catalog.set_config('enable_bitmapscan', 'on', true);
    END IF;
    -- The queues by name, each hinted partition kept where its row is this queue's.
    SELECT array_agg(x.qid ORDER BY g.i), array_agg(x.win ORDER BY g.i),
           array_agg(CASE WHEN v_hqid[g.i] = x.qid THEN v_hpid[g.i] END ORDER BY g.i),
           array_agg(CASE WHEN v_hqid[g.i] = x.qid THEN v_htid[g.i] END ORDER BY g.i)
      INTO queue_ids, windows, partition_ids, partition_tids
      FROM generate_series(1, v_nseg) AS g(i)
      LEFT JOIN LATERAL (
            SELECT q.id AS qid, q.dedup_window_ms AS win
              FROM queen.queues q
             WHERE p_live[g.i]
               AND q.tenant_id = p_seg_tenants[g.i] AND q.name = p_seg_queues[g.i]) x ON true;
    -- The other partitions by key (each lookup behind its gate, OFFSET 0: only those).
    IF EXISTS (SELECT 1 FROM generate_series(1, v_nseg) AS g(i)
                WHERE queue_ids[g.i] IS NOT NULL AND partition_ids[g.i] IS NULL) THEN
        SELECT array_agg(coalesce(partition_ids[g.i], y.pid) ORDER BY g.i),
               array_agg(coalesce(partition_tids[g.i], y.tid) ORDER BY g.i)
          INTO partition_ids, partition_tids
          FROM generate_series(1, v_nseg) AS g(i)
          LEFT JOIN LATERAL (
                SELECT p.id AS pid, p.ctid AS tid
                  FROM queen.log_partitions p
                 WHERE queue_ids[g.i] IS NOT NULL AND partition_ids[g.i] IS NULL
                   AND p.queue_id = queue_ids[g.i] AND p.name = p_seg_partitions[g.i]
                OFFSET 0) y ON true;
    END IF;

    IF p_wait IS DISTINCT FROM false THEN
        v_lock := partition_ids;
    ELSE
        -- At the addresses: one TID scan of them all (in block order, each once), FOR
        -- UPDATE SKIP LOCKED in ascending id order, and each row taken matched to its
        -- segments by id and address both. A row rewritten since the lookup is not the
        -- current version at its address: not taken, tried by id below; so is a partition
        -- whose old address now holds another partition's row (a pruned version's slot
        -- reused), that row then taken and unused. The only way in is the addresses (no
        -- index or bitmap scan: the function's SET puts both back on at its end).
        PERFORM pg_catalog.set_config('enable_indexscan', 'off', true), pg_catalog.set_config('enable_bitmapscan', 'off', true);
        WITH l AS MATERIALIZED (
            SELECT lp.id, lp.last_offset, lp.ctid AS tid
              FROM queen.log_partitions lp
             WHERE lp.ctid = ANY (partition_tids)
             ORDER BY lp.id
               FOR UPDATE SKIP LOCKED)
        SELECT array_agg(l.last_offset ORDER BY g.i), array_agg(l.tid ORDER BY g.i)
          INTO last_offsets, partition_tids
          FROM generate_series(1, v_nseg) AS g(i)
          LEFT JOIN l ON l.id = partition_ids[g.i] AND l.tid = partition_tids[g.i];
        PERFORM pg_catalog.set_config('enable_indexscan', 'on', true), pg_catalog.set_config('enable_bitmapscan', 'on', true);
        v_lock := ARRAY(SELECT partition_ids[g.i] FROM generate_series(1, v_nseg) AS g(i)
                         WHERE partition_ids[g.i] IS NOT NULL AND last_offsets[g.i] IS NULL);
    END IF;
    IF cardinality(v_lock) > 0 THEN
        SELECT array_agg(coalesce(l.last_offset, last_offsets[g.i]) ORDER BY g.i),
               array_agg(coalesce(l.tid, partition_tids[g.i]) ORDER BY g.i)
          INTO last_offsets, partition_tids
          FROM generate_series(1, v_nseg) AS g(i)
          LEFT JOIN queen.log_partitions_lock_v2(v_lock, p_wait) AS l ON l.id = partition_ids[g.i];
    END IF;

    FOR v_i IN
        SELECT g.i FROM generate_series(1, v_nseg) AS g(i)
         WHERE p_live[g.i] AND partition_ids[g.i] IS NULL
         ORDER BY p_seg_tenants[g.i], p_seg_queues[g.i] COLLATE "C", p_seg_partitions[g.i] COLLATE "C", g.i
    LOOP
        IF v_wait_ms IS NULL THEN
            v_wait_ms := 1;
            IF p_wait IS DISTINCT FROM false THEN
                SELECT s.setting::int INTO v_lt FROM pg_catalog.pg_settings s WHERE s.name = 'lock_timeout';
                v_wait_ms := CASE WHEN coalesce(v_lt, 0) > 0 THEN least(v_lt, 500) ELSE 500 END;
            END IF;
        END IF;
        v_prov := queen.log_provision_try_v1(p_seg_tenants[v_i], p_seg_queues[v_i], p_seg_partitions[v_i],
                                             v_wait_ms);
        IF v_prov.partition_id IS NULL THEN
            -- Held by someone else: its ids stay null (busy), the queue's too, so that no
            -- half-known segment is ever appended.
            queue_ids[v_i] := NULL;
            windows[v_i] := NULL;
            prov_busy := prov_busy + 1;
            CONTINUE;
        END IF;
        queue_ids[v_i] := v_prov.queue_id;
        partition_ids[v_i] := v_prov.partition_id;
        windows[v_i] := v_prov.dedup_window_ms;
        v_new := v_new || v_prov.partition_id;
    END LOOP;

    IF v_new IS NOT NULL THEN
        -- Only a provisioned segment's id is among them (a name is looked up once, above).
        SELECT array_agg(coalesce(l.last_offset, last_offsets[g.i]) ORDER BY g.i),
               array_agg(coalesce(l.tid, partition_tids[g.i]) ORDER BY g.i)
          INTO last_offsets, partition_tids
          FROM generate_series(1, v_nseg) AS g(i)
          LEFT JOIN queen.log_partitions_lock_v2(v_new, false) AS l ON l.id = partition_ids[g.i];
    END IF;
END
$fn$;

-- queen.log_timers_fire_answer_v1(seg_counts int[], held_n int[], partition_ids bigint[],
--     last_offsets bigint[], base_offsets bigint[], dup_seg int[], compact boolean) -> jsonb
-- The fire's answer (its header, below) from what the fire found, per segment i: stale when
-- held_n[i] < seg_counts[i]; else busy when last_offsets[i] is null; else fired when
-- base_offsets[i] is set; else duplicate, with dup_seg naming its frames already in the log.
-- compact: the compact form of the header (a letter per segment and a number per fired
-- one) instead of an object per segment. Writes nothing. Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_fire_answer_v1(
    p_seg_counts int[], p_held_n int[], p_partition_ids bigint[], p_last_offsets bigint[],
    p_base_offsets bigint[], p_dup_seg int[], p_compact boolean DEFAULT false, OUT answer jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    -- Per segment: its state (stale, busy, fired, dup) and its frames already in the log
    -- (counted once, joined by segment: not a scan of dup_seg per segment).
    -- The answer is written as JSON text and read as jsonb once, at the end: jsonb_agg of a
    -- jsonb_build_object per segment rebuilt the array as it went and again in the object
    -- around it, 10 ms for 1,600 segments; this way 6.5 ms (in the fire: 7.5 -> 4.5 ms for
    -- 1,430; tests/bench/results/2026-12-07-per-segment.md). Every value is a number (no
    -- quoting needed); a null one is written null, so no segment's text is ever null and
    -- string_agg never drops one (the array stays aligned with the call's segments).
    -- Compact: a letter per segment and, per kind, one number (or two) per segment of that
    -- kind in segment order: 1.2 ms for 2,000 fired segments against 14 ms (the same data).
    -- Each form's aggregates are filtered by p_compact (a CASE around them would still
    -- compute both: aggregates are evaluated before the expression that reads them).
    WITH d AS (
        SELECT d.s, count(*)::int AS n FROM unnest(p_dup_seg) AS d(s) GROUP BY d.s
    ), s AS MATERIALIZED (
        SELECT g.i, CASE WHEN p_held_n[g.i] <> p_seg_counts[g.i] THEN 'stale'
                         WHEN p_last_offsets[g.i] IS NULL THEN 'busy'
                         WHEN p_base_offsets[g.i] IS NOT NULL THEN 'fired'
                         ELSE 'dup' END AS st,
               coalesce(d.n, 0) AS dn
          FROM generate_series(1, coalesce(cardinality(p_seg_counts), 0)) AS g(i)
          LEFT JOIN d ON d.s = g.i)
    SELECT (CASE WHEN p_compact THEN
               '{"statuses": "' || coalesce(string_agg(CASE s.st WHEN 'stale' THEN 's' WHEN 'busy' THEN 'b'
                                                           WHEN 'fired' THEN 'f' ELSE 'd' END, '' ORDER BY s.i)
                                                FILTER (WHERE p_compact), '')
            || '", "baseOffsets": [' || coalesce(string_agg(coalesce(p_base_offsets[s.i]::text, 'null'), ', '
                                                           ORDER BY s.i) FILTER (WHERE p_compact AND s.st = 'fired'), '')
            || '], "staleHeld": [' || coalesce(string_agg(coalesce(p_held_n[s.i]::text, 'null'), ', '
                                                         ORDER BY s.i) FILTER (WHERE p_compact AND s.st = 'stale'), '')
            || '], "dupDuplicates": [' || coalesce(string_agg(s.dn::text, ', ' ORDER BY s.i)
                                                   FILTER (WHERE p_compact AND s.st = 'dup'), '')
            || '], "dupReleased": [' || coalesce(string_agg(coalesce((p_seg_counts[s.i] - s.dn)::text, 'null'), ', '
                                                           ORDER BY s.i) FILTER (WHERE p_compact AND s.st = 'dup'), '')
            || ']'
          ELSE '{"segments": [' || coalesce(string_agg(CASE s.st
                   WHEN 'stale' THEN '{"status": "stale", "held": '
                        || coalesce(p_held_n[s.i]::text, 'null') || '}'
                   WHEN 'busy' THEN '{"status": "busy", "count": '
                        || coalesce(p_seg_counts[s.i]::text, 'null') || '}'
                   WHEN 'fired' THEN '{"status": "fired", "partitionId": '
                        || coalesce(p_partition_ids[s.i]::text, 'null')
                        || ', "baseOffset": ' || coalesce(p_base_offsets[s.i]::text, 'null')
                        || ', "endOffset": '
                        || coalesce((p_base_offsets[s.i] + p_seg_counts[s.i] - 1)::text, 'null')
                        || ', "count": ' || coalesce(p_seg_counts[s.i]::text, 'null') || '}'
                   ELSE '{"status": "duplicate", "duplicates": ' || s.dn
                        || ', "released": ' || coalesce((p_seg_counts[s.i] - s.dn)::text, 'null')
                        || '}' END, ', ' ORDER BY s.i) FILTER (WHERE NOT p_compact), '')
            || ']' END
            || ', "fired": ' || coalesce(sum(p_seg_counts[s.i]) FILTER (WHERE s.st = 'fired'), 0)
            || ', "stale": ' || count(*) FILTER (WHERE s.st = 'stale')
            || ', "duplicate": ' || coalesce(sum(s.dn) FILTER (WHERE s.st = 'dup'), 0)
            || ', "released": ' || coalesce(sum(CASE s.st WHEN 'stale' THEN p_held_n[s.i]
                                                          WHEN 'dup' THEN p_seg_counts[s.i] - s.dn END), 0)
            || ', "busy": ' || coalesce(sum(p_seg_counts[s.i]) FILTER (WHERE s.st = 'busy'), 0)
            || '}')::jsonb
      INTO answer
      FROM s;
END
$fn$;

-- queen.log_timers_fire_settle_v1(seg_tenants uuid[], seg_queues text[], seg_counts int[],
--     timer_keys text[], timer_seg int[], now timestamptz, held boolean[], held_n int[],
--     partition_ids bigint[], last_offsets bigint[], base_offsets bigint[], dup_seg int[],
--     dup_frame int[], compact boolean) -> jsonb
-- The end of a fire: the timer rows it holds are settled and its answer (the fire's header;
-- compact: its compact form) built. Per segment i: stale when held_n[i] < seg_counts[i] (its held rows released:
-- claim_token and claimed_until nulled); else busy when last_offsets[i] is null (its
-- partition was not locked: rows untouched, still claimed); else fired when base_offsets[i]
-- is set (rows deleted); else duplicate: the rows of its frames in (dup_seg, dup_frame)
-- deleted (delivered), the others released. One DELETE and one UPDATE per (tenant, queue).
-- Locks: none new (every row it writes is held by log_timers_fire_hold_v1).
CREATE OR REPLACE FUNCTION queen.log_timers_fire_settle_v1(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_counts int[], p_timer_keys text[],
    p_timer_seg int[], p_now timestamptz, p_held boolean[], p_held_n int[],
    p_partition_ids bigint[], p_last_offsets bigint[], p_base_offsets bigint[],
    p_dup_seg int[], p_dup_frame int[], p_compact boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_tq     record;
    v_answer jsonb;
BEGIN
    v_answer := queen.log_timers_fire_answer_v1(p_seg_counts, p_held_n, p_partition_ids,
        p_last_offsets, p_base_offsets, p_dup_seg, p_compact);

    -- The timer rows, per (tenant, queue): delivered ones deleted (appended segments,
    -- frames of duplicate segments already in the log), the rest of duplicate segments
    -- and the held rows of stale segments released (token and claimed_until nulled).
    FOR v_tq IN
        SELECT p_seg_tenants[a.s] AS tn, p_seg_queues[a.s] AS q,
               array_agg(a.k) FILTER (WHERE a.act = 'd') AS dk,
               array_agg(a.k) FILTER (WHERE a.act = 'r') AS rk
          FROM (SELECT t.s, t.k,
                       CASE WHEN p_held_n[t.s] <> p_seg_counts[t.s] THEN CASE WHEN p_held[t.j] THEN 'r' END
                            WHEN p_last_offsets[t.s] IS NULL THEN NULL
                            WHEN p_base_offsets[t.s] IS NOT NULL THEN 'd'
                            WHEN EXISTS (SELECT 1 FROM unnest(p_dup_seg, p_dup_frame) AS d(s, f)
                                          WHERE d.s = t.s AND d.f = t.f) THEN 'd'
                            ELSE 'r' END AS act
                  FROM (SELECT u.k, u.s, u.j, row_number() OVER (PARTITION BY u.s ORDER BY u.j) - 1 AS f
                          FROM unnest(p_timer_keys, p_timer_seg) WITH ORDINALITY AS u(k, s, j)) t) a
         WHERE a.act IS NOT NULL
         GROUP BY p_seg_tenants[a.s], p_seg_queues[a.s]
    LOOP
        IF v_tq.dk IS NOT NULL THEN
            DELETE FROM queen.log_timers AS t
             WHERE t.tenant_id = v_tq.tn AND t.queue = v_tq.q AND t.timer_key = ANY (v_tq.dk);
        END IF;
        IF v_tq.rk IS NOT NULL THEN
            UPDATE queen.log_timers AS t
               SET claim_token = NULL, claimed_until = queen.log_timers_not_before_v1(t.deliver_at, p_now),
                   updated_at = p_now
             WHERE t.tenant_id = v_tq.tn AND t.queue = v_tq.q AND t.timer_key = ANY (v_tq.rk);
        END IF;
    END LOOP;
    RETURN v_answer;
END
$fn$;

-- queen.log_timers_fire_fast_v2(<the fire's arguments>) -> jsonb (compact: its compact form), or null
-- The fire as it goes when nothing is in the way, in one subtransaction: the segments'
-- queues and partitions (provisioned when missing), their partition rows locked as
-- log_timers_fire_v2 takes them (p_wait), the named rows deleted outright (claim_token,
-- claimed_until > now and partition verified by log_timers_ours_v1), found by the
-- addresses of p_timer_tids when every timer has one (the claim's row_tid; each row found
-- at its address is also checked to be the timer named for it: tenant, queue, key), else
-- each by its primary key and deleted by its address with the check applied again to the
-- row deleted; then the append with the dedup window, optimistically (log_append_dedup_v1
-- without its check first: a duplicate is found by the append itself and undoes this way).
-- It answers when every segment it takes was fired (its partition locked, every named row
-- deleted, no duplicate) and the rest are busy: with p_wait false, the segments of a
-- partition someone else holds are answered busy, their rows untouched (not read, not
-- locked, still claimed; a stale row among them is found by the caller's next call, which
-- waits a little for the partition). Every segment busy takes nothing at all. Anything
-- else (a row missing, moved from its address or not ours, a duplicate, a row someone
-- else holds) undoes the subtransaction, locks and all, and answers null: the caller then
-- takes the general way (hold, append, settle), which sorts out busy, stale and duplicate
-- segments. The general way locks every row (one WAL record each) before deleting it
-- (another); this way writes one per row, and never touches a busy segment's rows.
-- Arguments: the segments' names and counts as its caller checked them (one element each,
-- none null or empty, counts at least 1); the rest checked here by log_timers_fire_check_v1
-- (without its two dearest findings, above) once the partitions are taken, unless every
-- one is held by someone else (then nothing is taken: the all-busy answer).
-- Locks, in order: the partitions' log_partitions rows FOR UPDATE (SKIP LOCKED with p_wait
-- false) in ascending id order, then queues and log_partitions only to provision (each wait
-- bounded: a name someone holds leaves its segments busy), all as log_timers_fire_take_v1;
-- the named rows of queen.log_timers, by DELETE under a lock_timeout of
-- 1 ms (a DELETE cannot skip a locked row: a row someone else holds, a cancel or another
-- broker's claim passing over it, ends the fast way within a millisecond, and the general
-- way skips that row as it always has); then log_txn_index, log_segments and log_txns as
-- the append takes them.
CREATE OR REPLACE FUNCTION queen.log_timers_fire_fast_v2(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_seg_hashes bytea[], p_seg_blobs bytea[], p_timer_keys text[], p_timer_seg int[],
    p_timer_tokens uuid[], p_now timestamptz, p_wait boolean, p_timer_tids tid[], p_compact boolean DEFAULT false,
    p_seg_partition_tids tid[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_nseg    int := coalesce(cardinality(p_seg_tenants), 0);
    v_all     boolean[] := array_fill(true, ARRAY[coalesce(cardinality(p_seg_tenants), 0)]);
    v_ids     record;
    v_last    bigint[];
    v_app     record;
    v_deleted bigint;
    v_want    bigint := coalesce(cardinality(p_timer_keys), 0);  -- the rows of the segments fired
    v_tids    tid[] := p_timer_tids;
    v_lt      text := current_setting('lock_timeout');
    v_nl      text := current_setting('enable_nestloop');
    v_is      text := current_setting('enable_indexscan');
    v_bs      text := current_setting('enable_bitmapscan');
    -- Every timer with an address (none null, as many as the keys): found by address.
    v_by_tid  boolean := p_timer_tids IS NOT NULL
                         AND coalesce(cardinality(p_timer_tids), 0) = coalesce(cardinality(p_timer_keys), 0)
                         AND array_position(p_timer_tids, NULL) IS NULL;
BEGIN
    BEGIN
        v_ids := queen.log_timers_fire_take_v1(p_seg_tenants, p_seg_queues, p_seg_partitions, v_all, p_wait,
                                               p_seg_partition_tids);
        v_last := v_ids.last_offsets;
        -- Every partition held by someone else (p_wait false): answered all busy here,
        -- nothing taken (the rows stay claimed for the caller's next call, which waits a
        -- little), before the check of the timers: with four brokers on one partition,
        -- nearly half the fire calls were such answers (tests/bench/README.md, eleventh pass).
        IF NOT EXISTS (SELECT 1 FROM unnest(v_last) AS l(o) WHERE l.o IS NOT NULL) THEN
            RETURN queen.log_timers_fire_answer_v1(p_seg_counts, p_seg_counts,
                v_ids.partition_ids, v_last, NULL, '{}', p_compact)
                || jsonb_build_object('provisionBusy', v_ids.prov_busy);
        END IF;
        -- The refusals (log_timers_fire_check_v1 without the two this way finds by itself),
        -- now that something can be fired: a malformed call is refused here, its
        -- provisioning and partition locks undone with it.
        PERFORM queen.log_timers_fire_check_v1(p_seg_tenants, p_seg_queues, p_seg_partitions,
            p_seg_counts, p_seg_hashes, p_seg_blobs, p_timer_keys, p_timer_seg, p_timer_tokens, p_now,
            false);
        IF array_position(v_last, NULL) IS NOT NULL THEN
            -- Some held: the segments of the partitions we took are
            -- fired this way, the others answered busy with their rows untouched (not
            -- read, not locked, still claimed), as the general way answers them but
            -- without its lock on every row. Before, any held partition sent the whole
            -- call the general way: with four brokers on the same partitions, most fires
            -- (tests/bench/README.md, seventh pass).
            -- (v_tids is read only by address, where every timer has one.)
            SELECT count(*), array_agg(u.tid)
              INTO v_want, v_tids
              FROM unnest(p_timer_seg, p_timer_tids) AS u(s, tid)
             WHERE v_last[u.s] IS NOT NULL;
        END IF;

        -- The rows, deleted under a 1 ms lock_timeout (a DELETE cannot skip a locked row).
        PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
        IF v_by_tid THEN
            -- By address (the claim's row_tid): one TID scan of every address at once, in
            -- block order, and each row found there judged against what the caller names
            -- for it (tenant, queue and key of its segment, and log_timers_ours_v1). A row
            -- no longer at its address is not found, and the count below comes up short.
            -- A hash join of the rows found to the caller's arrays (enable_nestloop off:
            -- a nested loop would scan every address once per timer, or the arrays once
            -- per row): about 3x cheaper than a descent of the primary key per timer
            -- (tests/bench/README.md, fourth pass). The same check on the row the DELETE
            -- writes as below: a row changed since is judged as it is now.
            -- The addresses are the only way in (index and bitmap scans off, as the caller
            -- has sequential scans): with statistics that make an index look small, a
            -- generic plan could otherwise read a whole index of queen.log_timers and filter
            -- it by address, which under a held snapshot is millions of entries per fire.
            PERFORM pg_catalog.set_config('enable_nestloop', 'off', true);
            PERFORM pg_catalog.set_config('enable_indexscan', 'off', true);
            PERFORM pg_catalog.set_config('enable_bitmapscan', 'off', true);
            WITH f AS MATERIALIZED (
                SELECT u.tid, u.k, u.tok, p_seg_tenants[u.s] AS tn, p_seg_queues[u.s] AS q,
                       p_seg_partitions[u.s] AS part
                  FROM unnest(p_timer_tids, p_timer_keys, p_timer_seg, p_timer_tokens) AS u(tid, k, s, tok)
                 WHERE v_last[u.s] IS NOT NULL
            ), d AS (
                DELETE FROM queen.log_timers AS t
                 USING f
                 WHERE t.ctid = ANY (v_tids)
                   AND t.ctid = f.tid
                   AND t.tenant_id = f.tn AND t.queue = f.q AND t.timer_key = f.k
                   AND queen.log_timers_ours_v1(t.claim_token, t.claimed_until, t.partition,
                                                f.tok, f.part, p_now)
                RETURNING 1)
            SELECT count(*) INTO v_deleted FROM d;
            PERFORM pg_catalog.set_config('enable_nestloop', v_nl, true);
            PERFORM pg_catalog.set_config('enable_indexscan', v_is, true);
            PERFORM pg_catalog.set_config('enable_bitmapscan', v_bs, true);
        ELSE
            -- Found by key under this statement's snapshot, deleted by address, and the claim
            -- checked again on the row the DELETE writes: a row changed since (a reschedule
            -- after a lapsed lease, another claim, a cancel) is re-read by the DELETE and judged
            -- by log_timers_ours_v1 as it is now, so it is not deleted and the count below comes
            -- up short. The statement is right by itself, on any minor version and any plan.
            WITH f AS MATERIALIZED (
                SELECT x.tid, u.tok, p_seg_partitions[u.s] AS part
                  FROM unnest(p_timer_keys, p_timer_seg, p_timer_tokens) AS u(k, s, tok)
                 CROSS JOIN LATERAL (
                       SELECT t2.ctid AS tid
                         FROM queen.log_timers t2
                        WHERE t2.tenant_id = p_seg_tenants[u.s]
                          AND t2.queue = p_seg_queues[u.s]
                          AND t2.timer_key = u.k
                          AND queen.log_timers_ours_v1(t2.claim_token, t2.claimed_until, t2.partition,
                                                       u.tok, p_seg_partitions[u.s], p_now)
                        LIMIT 1) x
                 WHERE v_last[u.s] IS NOT NULL
            ), d AS (
                DELETE FROM queen.log_timers AS t
                 USING f
                 WHERE t.ctid = f.tid
                   AND queen.log_timers_ours_v1(t.claim_token, t.claimed_until, t.partition, f.tok, f.part, p_now)
                RETURNING 1)
            SELECT count(*) INTO v_deleted FROM d;
        END IF;
        PERFORM pg_catalog.set_config('lock_timeout', v_lt, true);
        IF v_deleted <> v_want THEN
            RAISE EXCEPTION 'stale' USING ERRCODE = 'QSF01';
        END IF;

        -- Optimistic: no check first; a duplicate raises QSF01 and undoes this way. The
        -- append skips the segments of partitions someone else holds (no last_offset).
        v_app := queen.log_append_dedup_v1(v_ids.queue_ids, v_ids.partition_ids, v_last,
            p_seg_counts, p_seg_hashes, p_seg_blobs, v_ids.windows, true, p_now, true, v_ids.partition_tids);
        IF EXISTS (SELECT 1 FROM generate_series(1, v_nseg) AS g(i)
                    WHERE v_last[g.i] IS NOT NULL AND v_app.base_offsets[g.i] IS NULL) THEN
            RAISE EXCEPTION 'duplicate' USING ERRCODE = 'QSF01';
        END IF;
        RETURN queen.log_timers_fire_answer_v1(p_seg_counts, p_seg_counts, v_ids.partition_ids,
            v_last, v_app.base_offsets, '{}', p_compact)
            || jsonb_build_object('provisionBusy', v_ids.prov_busy)
            || CASE WHEN p_seg_partition_tids IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('partitionTids', to_jsonb(v_app.new_tids::text[])) END;
    EXCEPTION WHEN SQLSTATE 'QSF01' OR lock_not_available THEN
        -- Undone (the lock_timeout set above with it).
        RETURN NULL;
    END;
END
$fn$;

-- queen.log_timers_fire_v2(seg_tenants uuid[], seg_queues text[], seg_partitions text[],
--     seg_counts int[], seg_hashes bytea[], seg_blobs bytea[], timer_keys text[],
--     timer_seg int[], timer_tokens uuid[], now timestamptz, wait boolean default true,
--     timer_tids tid[] default null, compact boolean default false,
--     seg_partition_tids tid[] default null) -> jsonb
-- timer_tids: each
-- timer's address as its claim returned it (log_timers_claim_v4's row_tid), aligned with
-- timer_keys, or null. Only a hint: with an address for every timer the fast way finds the
-- rows by a TID scan instead of a descent of the primary key per timer, and judges every
-- row it finds there as it would one found by key; a row moved from its address (or any
-- null, or a count that differs) makes the fire go by key, exactly as without addresses.
-- seg_partition_tids (schema 37): per segment, where its partition's row was after the
-- caller's last fire of it (null: not known), or null. Also a hint: a partition whose row
-- is still there (nobody has written it since) is taken at that address and not looked up
-- by key, which under a held snapshot walks every version of the row since (docs/
-- operations.md, "Long transactions"); any other is looked up by key. Given (even all
-- null), the answer carries "partitionTids": per segment, the address of its partition's
-- row after this call's write, as text ("(block,offset)"), null for a segment not
-- appended (and the whole array null when the append went one segment at a time); absent
-- from an answer where nothing was taken (every partition held by someone else).
--   {"segments": [ {"status": "fired", "partitionId", "baseOffset", "endOffset", "count"}
--                | {"status": "stale", "held": n}
--                | {"status": "duplicate", "duplicates": n, "released": n}
--                | {"status": "busy", "count": n} ],   (array order)
--    "fired": rows, "stale": segments, "duplicate": rows, "released": rows, "busy": rows,
--    "provisionBusy": segments}
-- compact (schema 34; what the sweeper asks for): the same answer without an object per
-- segment. "segments" is replaced by "statuses", one letter per segment in array order (f
-- fired, s stale, d duplicate, b busy), and one array per kind, an element per segment of
-- that kind in order: "baseOffsets" (fired; the end offset is base + count - 1, the
-- partition the caller named), "staleHeld" (stale: held), "dupDuplicates" and
-- "dupReleased" (duplicate: duplicates, released). The totals are the same. At a segment
-- per timer the full form was ~90 bytes of JSON per segment, built, read and written
-- again by the server and read by the caller: 14 ms for 2,000 segments against 1.2.
-- busy: the segment's partition someone else holds (p_wait false), some of its rows,
-- still ours, another transaction has locked, or (schema 18) its queue or partition could
-- not be provisioned because another transaction holds the name (below): its rows are
-- untouched and still claimed, for a later call. provisionBusy counts the segments busy
-- for that last reason ("busy" is absent from the answer of an empty call).
-- One transaction (the caller's statement). The timers of segment i are the entries with
-- timer_seg = i, IN FRAME ORDER (the k-th of them is frame k, hashed at bytes 16k..16k+15
-- of seg_hashes[i]); tenant and queue of a timer are its segment's.
-- Refused with 22023 naming the array: segment arrays of different lengths, timer arrays
-- of different lengths, a null element, seg_counts[i] < 1, seg_hashes[i] not
-- 16 * seg_counts[i] bytes, timer_seg[j] outside 1..n, a segment whose timer count differs
-- from seg_counts[i], one timer named twice, a transaction hash repeated inside one
-- segment (timers sharing a txn go in different segments). With p_wait false and every
-- segment's partition held by someone else, a call whose segment names and counts are
-- well formed is answered all busy before its timers are checked:
-- nothing is taken or written, and the call that can fire them refuses what is wrong.
-- Then: locks the named rows FOR UPDATE SKIP LOCKED and holds those whose claim_token
-- matches, whose claim is live (claimed_until > now) and whose partition is the segment's;
-- a segment is live only if it holds ALL its rows, else it is "stale" and its held rows
-- are released in this call (token and claimed_until nulled: due again, no attempt spent).
-- Live segments are processed as if one by one in array order; the work is done by
-- statements over all segments at once (the append shared with log_push_v1,
-- log_append_dedup_v1 in 001), and a call whose append loses a dedup index row to a
-- concurrent writer undoes that append and does its live segments one by one. Dedup: a
-- segment with any hash already in its queue's dedup index within dedup_window_ms
-- (including index rows written earlier in this same call) is "duplicate": its timers
-- whose txn is already in the log are deleted (they were delivered), the others released
-- so the next cycle re-packs them. Otherwise the segment is appended (offsets from
-- last_offset + 1, log_segments, log_txns, dedup index rows) and its timers deleted. A
-- concurrent writer of the same transaction id into the same queue is caught by the dedup
-- index upsert itself (it waits for that writer's outcome), and the segment is then
-- answered "duplicate", nothing allocated for it.
-- The steps are internal helpers. First the segments' names and counts (what the fast way
-- reads before its check; anything wrong, and log_timers_fire_check_v1 refuses it at once).
-- Then the fast way, log_timers_fire_fast_v2: when every segment's partition is held by
-- someone else (p_wait false) it answers all of them busy, nothing taken and no timer
-- checked (stale rows among them are found by the next call); otherwise
-- log_timers_fire_check_v1 (the refusals; without the two the fast way finds by itself,
-- which the general way then looks for first), and when every segment can be fired (its
-- partition taken, every row ours, no duplicate) it is, in one subtransaction that deletes
-- each row outright; anything else undoes it (measured in tests/bench/README.md: one write
-- per timer row instead of two, 8-10% on one sweeper). Then, only when the fast way stood
-- aside, the
-- general way: log_timers_fire_hold_v1 (the rows), log_timers_fire_take_v1 (ids, the
-- partitions' locks, provisioning), log_append_dedup_v1 (001),
-- log_timers_fire_settle_v1 (the rows deleted or released, the answer).
-- Locks of the fast way: provisioning, then the partitions as below (the only waits), then
-- the rows by DELETE with a 1 ms lock_timeout (a row someone holds ends the fast way, and
-- the general way skips that row). Locks of the general way, in order:
-- rows of queen.log_timers (FOR UPDATE SKIP LOCKED, never waits); then the live
-- segments' existing log_partitions rows FOR UPDATE in ascending id order (the only
-- waits); then queues and log_partitions only to provision missing ones (inserts, in
-- (tenant, queue, partition) order, each wait bounded, the new rows SKIP LOCKED); then
-- log_txn_index rows of the pushed hashes (a wait only on a concurrent writer of the same
-- transaction id), then new log_segments/log_txns rows.
-- p_wait (default true) decides how the partitions are taken. true: FOR UPDATE, the
-- fire's only waits. false: FOR UPDATE SKIP LOCKED, and a live segment whose partition is
-- held by someone else (another broker's fire, a push) answers {"status": "busy"}: its
-- rows stay claimed and held by the caller, who fires them in a later call. Two brokers
-- firing batches that span the same partitions then each deliver the partitions nobody
-- holds instead of queueing behind each other; the caller's second call waits, so a
-- partition that is never free still gets its timers.
-- Provisioning (schema 18) never waits long, whatever p_wait: a missing queue or partition
-- is created by log_provision_try_v1 (001) under a lock_timeout of 1 ms with p_wait false,
-- and with p_wait true of the session's lock_timeout, at most 500 ms (500 ms when it is
-- 0). A host transaction that created the same queue or partition and is still open, or
-- deletes or renames the queue, holds the name: the segments of that name answer busy, as
-- for a partition someone holds (their rows untouched, still claimed, the other segments
-- of the call fired), and the caller tries them again later. Before, the fire waited for
-- that transaction with no deadline, and with it every tenant of its claim.
-- SET enable_seqscan = off: every table this call touches is reached through an index, and
-- must stay so whatever the statistics say. A plan made while a table looked empty (a
-- fresh install, a TRUNCATE before autoanalyze) is cached for the session; with a
-- sequential scan in it, each call scans everything fired since (measured in
-- tests/bench/README.md: a dedup probe at 1,024 ms per call, one sweeper at 885/s).
CREATE OR REPLACE FUNCTION queen.log_timers_fire_v2(
    p_seg_tenants uuid[], p_seg_queues text[], p_seg_partitions text[], p_seg_counts int[],
    p_seg_hashes bytea[], p_seg_blobs bytea[], p_timer_keys text[], p_timer_seg int[],
    p_timer_tokens uuid[], p_now timestamptz, p_wait boolean DEFAULT true,
    p_timer_tids tid[] DEFAULT NULL, p_compact boolean DEFAULT false, p_seg_partition_tids tid[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off
-- Its set-based statements run over array parameters whose sizes the planner cannot see
-- (generate_series counts as 1,000 rows per segment): estimates that cross jit_above_cost
-- and a JIT compile of ~350 ms for statements that run in under a millisecond.
SET jit = off
-- The same estimates make every generic plan look dearer than a custom one, so plpgsql
-- planned most statements of a fire afresh on every call (0.2-0.5 ms each, about 1.5 ms a
-- call, measured 2026-11-30): generic plans, made once per session, for the fire and the
-- helpers it calls. Every statement that reads a table does so through its primary key
-- (= ANY, or LATERAL ... LIMIT 1 per element), which a generic plan keeps.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    v_nseg   int := coalesce(cardinality(p_seg_tenants), 0);
    v_hold   record;        -- held (per timer), held_n and live (per segment)
    v_ids    record;        -- queue_ids, partition_ids, windows (live segments)
    v_last   bigint[];      -- per segment: its partition's last_offset, null unless locked
    v_app    record;        -- base_offsets, dup_seg, dup_frame
    v_fast   jsonb;         -- the answer of the fast way, null when it stood aside
    v_blocked boolean[];    -- per segment: rows all still ours, some locked by another transaction
    v_held_n int[];         -- held_n, a blocked segment counted in full (busy, not stale)
BEGIN
    -- What the fast way reads before its check: the segments' names and
    -- counts, one element each, none null or empty, each count at least 1. Anything else,
    -- or no segment at all, goes to the check at once, which refuses it (or, with no
    -- segment, the timers named without one).
    IF v_nseg = 0 OR EXISTS (
           SELECT 1
             FROM unnest(p_seg_tenants, p_seg_queues, p_seg_partitions, p_seg_counts) AS s(t, q, p, n)
            WHERE s.t IS NULL OR s.q IS NULL OR s.p IS NULL OR s.n IS NULL
               OR s.q = '' OR s.p = '' OR s.n < 1) THEN
        PERFORM queen.log_timers_fire_check_v1(p_seg_tenants, p_seg_queues, p_seg_partitions,
            p_seg_counts, p_seg_hashes, p_seg_blobs, p_timer_keys, p_timer_seg, p_timer_tokens, p_now,
            false);
    END IF;
    IF v_nseg = 0 THEN
        RETURN CASE WHEN p_compact
                    THEN jsonb_build_object('statuses', '', 'baseOffsets', '[]'::jsonb, 'staleHeld', '[]'::jsonb,
                                            'dupDuplicates', '[]'::jsonb, 'dupReleased', '[]'::jsonb)
                    ELSE jsonb_build_object('segments', '[]'::jsonb) END
               || jsonb_build_object('fired', 0, 'stale', 0, 'duplicate', 0, 'released', 0, 'provisionBusy', 0);
    END IF;

    -- Nothing in the way (the common case): one subtransaction, one write per timer row.
    v_fast := queen.log_timers_fire_fast_v2(p_seg_tenants, p_seg_queues, p_seg_partitions,
        p_seg_counts, p_seg_hashes, p_seg_blobs, p_timer_keys, p_timer_seg, p_timer_tokens,
        p_now, p_wait, p_timer_tids, p_compact, p_seg_partition_tids);
    IF v_fast IS NOT NULL THEN
        RETURN v_fast;
    END IF;

    -- The general way: every refusal first, then hold what is ours; a segment missing any
    -- row is stale.
    PERFORM queen.log_timers_fire_check_v1(p_seg_tenants, p_seg_queues, p_seg_partitions,
        p_seg_counts, p_seg_hashes, p_seg_blobs, p_timer_keys, p_timer_seg, p_timer_tokens, p_now,
        true);
    v_hold := queen.log_timers_fire_hold_v1(p_seg_tenants, p_seg_queues, p_seg_partitions,
        p_seg_counts, p_timer_keys, p_timer_seg, p_timer_tokens, p_now);
    v_held_n := v_hold.held_n;
    IF array_position(v_hold.live, false) IS NOT NULL THEN
        -- A segment whose missed rows are all still ours (locked by someone else, mostly
        -- another broker's claim passing over them) is busy, not stale: counted as held
        -- in full for the answer and the settle, not live, so untouched and still claimed.
        v_blocked := queen.log_timers_fire_blocked_v1(p_seg_tenants, p_seg_queues,
            p_seg_partitions, p_seg_counts, p_timer_keys, p_timer_seg, p_timer_tokens, p_now,
            v_hold.held, v_hold.held_n);
        v_held_n := ARRAY(SELECT CASE WHEN v_blocked[g.i] THEN p_seg_counts[g.i] ELSE v_hold.held_n[g.i] END
                            FROM generate_series(1, v_nseg) AS g(i) ORDER BY g.i);
    END IF;

    -- The live segments' queues and partitions (provisioned when missing), then their
    -- partition rows FOR UPDATE in ascending id order: the fire's only waits (none with
    -- p_wait false, where a partition someone else holds leaves its segments busy).
    v_ids := queen.log_timers_fire_take_v1(p_seg_tenants, p_seg_queues, p_seg_partitions, v_hold.live,
        p_wait, p_seg_partition_tids);
    v_last := v_ids.last_offsets;

    -- Dedup and append, as if one by one in array order (skips segments without v_last).
    v_app := queen.log_append_dedup_v1(v_ids.queue_ids, v_ids.partition_ids, v_last,
        p_seg_counts, p_seg_hashes, p_seg_blobs, v_ids.windows, true, p_now, false, v_ids.partition_tids);

    RETURN queen.log_timers_fire_settle_v1(p_seg_tenants, p_seg_queues, p_seg_counts,
        p_timer_keys, p_timer_seg, p_now, v_hold.held, v_held_n, v_ids.partition_ids,
        v_last, v_app.base_offsets, v_app.dup_seg, v_app.dup_frame, p_compact)
        || jsonb_build_object('provisionBusy', v_ids.prov_busy)
        || CASE WHEN p_seg_partition_tids IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('partitionTids', to_jsonb(v_app.new_tids::text[])) END;
END
$fn$;
