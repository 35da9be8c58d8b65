-- 002_timers.sql: queen.log_timers and every timer function but the fire (apply, due, claim,
-- fail, dlq, release, peek, list); the fire is in 003_fire.sql.
--
-- Idempotent and lock-free on re-apply, like 001 (see its header). Every function takes
-- the caller's `now`; none reads the clock itself, so one cycle sees one instant.
--
-- A row is "in somebody's hands" only while claim_token is set AND claimed_until > now.
-- A failed fire nulls the token and pushes claimed_until out (backoff): such a row is in
-- nobody's hands, so it can be cancelled or rescheduled, and it becomes due again when its
-- visible_at (the later of deliver_at and claimed_until) passes.
--
-- Where a row waits (schema version 9): due_at, the instant the walks of the probe and the
-- claim find it at. For a row in nobody's hands it is visible_at; a claim leaves it where it
-- was (claim_due keeps it), so that the claim's UPDATE changes no indexed column and stays
-- on its page (heap-only, HOT), and the walks pass the rows in flight by reading their lease
-- in the heap. See "The due index" below.
--
-- Broker-wide lock order: kv, then log_timers, then advisory locks, then queues, then
-- log_partitions. No function here takes an advisory lock, and every lock on log_timers
-- rows taken by the sweeper's functions (claim, fire, fail, dlq, release) is taken with
-- SKIP LOCKED, so the sweeper never waits on a timer row.

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

-- Functions of builds between 1.0.0 and 1.1.0 that no release shipped, dropped (sql/README.md,
-- "Versions"): a call with their signatures fails with 42883. Nothing in this schema calls them.
DROP FUNCTION IF EXISTS queen.log_timers_claim_v2(int2[], timestamptz, int, int, int, bigint, uuid);
DROP FUNCTION IF EXISTS queen.log_timers_claim_v2(int2[], timestamptz, int, int, int, bigint, uuid,
                                                  uuid[], text[], text[]);
DROP FUNCTION IF EXISTS queen.log_timers_claim_v3(int2[], timestamptz, int, int, int, bigint, uuid,
                                                  uuid[], text[], text[], timestamptz, uuid[]);
DROP FUNCTION IF EXISTS queen.log_timers_release_claims_v1(uuid[], timestamptz, timestamptz);
-- Until schema version 22, log_timers_release_claims_v2 had no floor (a walk from the head);
-- until 23, log_timers_tenant_ring_v1 no cap on the tenants it names.
DROP FUNCTION IF EXISTS queen.log_timers_tenant_ring_v1(timestamptz, timestamptz, boolean);
DROP FUNCTION IF EXISTS queen.log_timers_release_claims_v2(uuid[], timestamptz, timestamptz, timestamptz);
-- Until schema version 38, log_timers_below_floor_v1 walked from the head in one call.
DROP FUNCTION IF EXISTS queen.log_timers_below_floor_v1(timestamptz);

-- ---------------------------------------------------------------------------------------
-- The table
-- ---------------------------------------------------------------------------------------

-- Storage settings of queen.log_timers.
--   fillfactor = 50 (schema version 9; was 100, and 70 before that): measured (2026-12-02)
--     (tests/bench/README.md, "Sixth pass"). The claim rewrites every row of a page at once
--     (timers written together come due together), and an UPDATE is heap-only (HOT: no
--     new index entry, no dead one left behind) only when the new version fits on the same
--     page and no indexed column changes. Since version 9 the claim changes no indexed
--     column (due_at, below), so half of every page is kept for the claim's versions: the
--     claim of 2,000 rows took 30-33 ms at 100 with an indexed visible_at, 12 ms heap-only
--     at 50.
--   The history of 100 (still true of versions 3-8): measured (2026-11-30)
--     (tests/soak/README.md). Symptom looked for: HOT updates of the claim, the one update
--     every timer gets, which free space on the page would keep on it. Observed: 0 HOT of
--     100000 claims at 70 and at 100 (`tests/soak/measure drain --fillfactor N`), and 0.0 in
--     every soak interval, because the claim sets claimed_until and so the generated,
--     indexed visible_at: no claim can ever be HOT. Drain of 100k due timers, table and
--     indexes after: 70 -> 49.0 MB, 100 -> 39.3 MB (20% smaller). Throughput: side by side
--     in one run 70 -> 1025/s, 100 -> 1155/s; one after the other 70 -> 1032 and 1353/s,
--     100 -> 705 and 1092/s: within this loaded machine's noise, no consistent winner.
--     Soak at ~500 timers/s for 150 s: 70 -> 0.36 MB per 1k timers, 100 -> 0.27 MB.
--     70 does not win (no HOT to buy, 20-25% more pages): 100.
--   autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
--   autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_insert_threshold = 1000,
--   autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000,
--   autovacuum_vacuum_cost_delay = 1:
--     not measured (2026-11-29): by analogy with queen.log_partitions. Every timer is
--     inserted, updated at least once (the claim) and deleted (the fire), so the table is
--     all churn; the defaults (20% dead before a vacuum) would let dead index entries pile
--     up under the visible_at index the probe and the claim walk on every cycle.
--     Measured 2026-11-30 (tests/soak/README.md; `tests/soak/soak --duration 150 --rate R
--     --sweepers 2 --delay-max 60`, R = 200, 600, 1200; 2 cores shared with other builds,
--     load 19-27; autovacuum at PostgreSQL's defaults). Symptom looked for: an autovacuum
--     worker on this table in pg_stat_activity and a step in fire lateness while it runs.
--     These thresholds are crossed within seconds at any of those rates, so the table is
--     vacuumed once per autovacuum_naptime (60 s) and holds a minute of churn in between:
--     21.6k dead tuples at 188 timers/s, 56k at 501/s, 112k at 849/s (the rates the driver
--     reached). At 188/s the pass was never caught by a 0.5 s poll and lateness stayed flat
--     (p50/p99 78/212 ms in its interval); at 501/s the interval holding the pass showed
--     198/704 ms against ~95/250 around it; at 849/s one interval stalled (p50 4.4 s).
--     Number: about 500 timers/s on this rig before this autovacuum enters the profile.
--     Workers held in steady state (polled twice a second): on this table 0.017 on average
--     at 501/s and 0.024 at 849/s, never more than one at once, against the default
--     autovacuum_max_workers = 3 (queen.kv: see 004).
--   vacuum_truncate = off: not measured (2026-11-29): by analogy with queen.log_partitions.
--     Truncating the heap's tail takes an ACCESS EXCLUSIVE lock, which would stall the
--     claim and the fire behind a vacuum; a burst's peak size is kept instead.
CREATE TABLE IF NOT EXISTS queen.log_timers (
    tenant_id     uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000001',
    queue         text COLLATE "C" NOT NULL,
    timer_key     text COLLATE "C" NOT NULL,
    partition     text COLLATE "C" NOT NULL DEFAULT 'Default',
    deliver_at    timestamptz NOT NULL,
    txn           text NOT NULL,
    message_id    uuid NOT NULL,
    payload       bytea NOT NULL,
    payload_zstd  boolean NOT NULL DEFAULT false,
    encrypted     boolean NOT NULL DEFAULT false,
    producer_sub  text,
    attempts      int NOT NULL DEFAULT 0,
    last_error    text,
    claimed_until timestamptz,
    claim_token   uuid,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- 64 shards, fixed forever: there is no shard-count knob and there must never be one.
    -- Shards spread contention; every broker scans every shard.
    shard         smallint GENERATED ALWAYS AS ((hashtextextended(timer_key, 0) & 63)::smallint) STORED,
    visible_at    timestamptz GENERATED ALWAYS AS
                      (greatest(deliver_at, coalesce(claimed_until, deliver_at))) STORED,
    -- Schema version 9 (see "The due index" below): claim_due is written by a claim only
    -- (the row's due_at when it was claimed); due_at is where the row waits in the walks.
    claim_due     timestamptz,
    due_at        timestamptz GENERATED ALWAYS AS
                      (CASE WHEN claim_token IS NOT NULL AND claim_due IS NOT NULL THEN claim_due
                            ELSE greatest(deliver_at, coalesce(claimed_until, deliver_at)) END) STORED,
    PRIMARY KEY (tenant_id, queue, timer_key)
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 1,
    vacuum_truncate = off
);
-- The upgrade to schema version 9, once, behind catalog checks (every later apply stays
-- lock-free): fillfactor 50 (ALTER TABLE ... SET takes SHARE UPDATE EXCLUSIVE), then
-- claim_due and due_at added in one ALTER TABLE. A stored generated column is computed for
-- every row, so that ALTER TABLE REWRITES queen.log_timers under an ACCESS EXCLUSIVE lock:
-- schedules, claims and fires wait for it (README "Upgrades and compatibility" gives its
-- measured cost and how to plan it). The rewrite also lays every existing row out at the
-- new fillfactor.
-- Rows claimed before the upgrade (claim_due null) wait at visible_at, their lease's end,
-- as they did.
DO $apply$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class c
                    WHERE c.oid = 'queen.log_timers'::regclass AND 'fillfactor=50' = ANY (c.reloptions)) THEN
        ALTER TABLE queen.log_timers SET (fillfactor = 50);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = 'queen.log_timers'::regclass AND a.attname = 'due_at'
                      AND NOT a.attisdropped) THEN
        ALTER TABLE queen.log_timers
            ADD COLUMN claim_due timestamptz,
            -- The expression of due_at in CREATE TABLE above, word for word.
            ADD COLUMN due_at timestamptz GENERATED ALWAYS AS
                (CASE WHEN claim_token IS NOT NULL AND claim_due IS NOT NULL THEN claim_due
                      ELSE greatest(deliver_at, coalesce(claimed_until, deliver_at)) END) STORED;
    END IF;
END
$apply$;

-- The due index (schema version 9): (due_at), and (tenant_id, due_at) for a tenant's own
-- walk; no other secondary index. due_at is visible_at for a row in nobody's hands, and
-- for a row in flight the due_at it had when it was claimed (claim_due): a claim changes
-- no indexed column, so its UPDATE is heap-only when the page has room (fillfactor 50), and
-- leaves no index entry behind, neither a new one nor, once the row is fired, a second dead
-- one. What the walks pay instead: the rows in flight stay at the head of the due index
-- (a claim takes the oldest), and every walk passes them by reading their lease in the
-- heap (NOT (claim_token IS NOT NULL AND claimed_until > now)): a bounded number, the rows
-- the brokers hold at once. A row whose lease lapsed waits where it was claimed, in front of
-- the rows due after it: oldest first. The probe's next instant is the earliest of the first
-- row in nobody's hands and the earliest lease end of the rows in flight in front of it
-- (log_timers_due_v2).
-- Replaced (versions 3-8): (visible_at), which the claim moved every row in (a new entry
-- per claim, a non-HOT UPDATE on another page: 15 us per row, the largest cost of a fired
-- timer, tests/bench/README.md "Fifth pass"), and (tenant_id, visible_at) WHERE claim_token
-- IS NULL (a predicate on a column the claim changes is an indexed column too). Built once,
-- behind catalog checks (SHARE lock: writers wait for the build; on a large table build
-- them beforehand with CREATE INDEX CONCURRENTLY under these names, README "Upgrades and
-- compatibility"),
-- then the old ones are dropped (ACCESS EXCLUSIVE, brief).
DO $apply$
BEGIN
    IF to_regclass('queen.log_timers_due_idx') IS NULL THEN
        CREATE INDEX log_timers_due_idx ON queen.log_timers (due_at);
    END IF;
    IF to_regclass('queen.log_timers_tenant_due_at_idx') IS NULL THEN
        CREATE INDEX log_timers_tenant_due_at_idx ON queen.log_timers (tenant_id, due_at);
    END IF;
    IF to_regclass('queen.log_timers_visible_idx') IS NOT NULL THEN
        DROP INDEX queen.log_timers_visible_idx;
    END IF;
    IF to_regclass('queen.log_timers_tenant_due_idx') IS NOT NULL THEN
        DROP INDEX queen.log_timers_tenant_due_idx;
    END IF;
    IF to_regclass('queen.log_timers_shard_visible_idx') IS NOT NULL THEN
        DROP INDEX queen.log_timers_shard_visible_idx;
    END IF;
END
$apply$;

-- The claim turn (schema version 13): one row that every claim locks FOR UPDATE before
-- its walk and keeps until its transaction ends, waiting for it under a 50 ms
-- lock_timeout (log_timers_claim_v4, "The turn"). Only locked, never updated: a row
-- version per claim would pile up while a snapshot elsewhere holds the horizon, and every
-- claim would read them all. Deleted by hand, claims walk without it (as before version 13)
-- and start the tenants' ring at a random place until the next schema apply puts it back.
CREATE TABLE IF NOT EXISTS queen.log_timers_claim_turn (
    id smallint PRIMARY KEY CHECK (id = 1)
);
INSERT INTO queen.log_timers_claim_turn (id) VALUES (1) ON CONFLICT (id) DO NOTHING;
-- Schema versions 21-26 kept the ring's place in a column of that row (tenant_after), updated
-- by every claim that walked the ring. Dropped once, behind a catalog check (ACCESS
-- EXCLUSIVE on the one-row table, brief; every later apply reads the catalog only).
DO $apply$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = 'queen.log_timers_claim_turn'::regclass AND a.attname = 'tenant_after'
                  AND NOT a.attisdropped) THEN
        ALTER TABLE queen.log_timers_claim_turn DROP COLUMN tenant_after;
    END IF;
END
$apply$;
-- The fleet's place in the tenants' ring (log_timers_tenant_ring_v1): the uuid of the last
-- tenant a claim holding the turn looked at, as its high and low 64 bits. Sequences, so that
-- moving the place writes no row version (setval is not transactional: a claim that rolls
-- back leaves the place moved, which costs nothing); only a claim holding the turn sets or
-- reads them, so the two halves always belong together. Not yet called: no place.
CREATE SEQUENCE IF NOT EXISTS queen.log_timers_ring_place_hi
    MINVALUE -9223372036854775808 MAXVALUE 9223372036854775807 START 0;
CREATE SEQUENCE IF NOT EXISTS queen.log_timers_ring_place_lo
    MINVALUE -9223372036854775808 MAXVALUE 9223372036854775807 START 0;
-- The claims that did not have the turn within its wait, for the whole fleet since the
-- schema was created: a sequence, so counting takes no lock and survives the failed try's
-- rollback (log_timers_take_turn_v1; the probe answers it as "turnTimeouts").
CREATE SEQUENCE IF NOT EXISTS queen.log_timers_turn_timeouts;

-- The tenants' ring (schema version 27): every tenant with pending timers, one row each, in
-- uuid order (its primary key): the ring the claims walk under a backlog
-- (log_timers_tenant_ring_v1). Before, the ring found the next tenant in queen.log_timers
-- itself, and with a snapshot held elsewhere that descent passed every fired row of the
-- tenant since (362 ms a claim at 3,000 timers/s). Here nothing churns: a tenant is entered
-- by the commit that writes its first pending timer (log_timers_at_commit_v1, once per
-- transaction and tenant, INSERT ... ON CONFLICT DO NOTHING, no lock taken on an existing
-- row) or by a rename that moves timers to it (log_timers_queue_gone_v1), and removed by the
-- tidy (log_timers_tenants_tidy_v1, off the drain's path) once it has none. A tenant missing
-- from the ring (a row written by hand with triggers off, or the narrow race the tidy's
-- header describes) loses its share only: its rows are reached oldest first as before the
-- ring, and its next commit enters it again.
CREATE TABLE IF NOT EXISTS queen.log_timers_tenants (
    tenant_id uuid PRIMARY KEY
);
-- Filled while it is empty (once, when it is new: every later apply reads one row of it):
-- the distinct tenants of queen.log_timers, one descent of its primary key each. A
-- transaction that commits during this apply with an older body of the commit's trigger is
-- not entered: its tenant's next commit enters it.
DO $apply$
BEGIN
    IF EXISTS (SELECT 1 FROM queen.log_timers_tenants) THEN
        RETURN;
    END IF;
    INSERT INTO queen.log_timers_tenants (tenant_id)
    WITH RECURSIVE r(tn) AS (
        (SELECT t.tenant_id FROM queen.log_timers t ORDER BY t.tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT t.tenant_id FROM queen.log_timers t WHERE t.tenant_id > r.tn
                 ORDER BY t.tenant_id LIMIT 1)
          FROM r WHERE r.tn IS NOT NULL)
    SELECT r.tn FROM r WHERE r.tn IS NOT NULL
    ON CONFLICT (tenant_id) DO NOTHING;
END
$apply$;

-- The held rows (schema version 19): due rows in nobody's hands that a claim found locked by
-- someone else's transaction (a host's open transaction that rescheduled the timer, an ORM
-- session idle in transaction) at the head of the due index. Such a row is live, so without
-- this list it is the earliest live row, every sweeper's floor stops at it for as long as it
-- is held, and (its transaction holding the horizon back) every probe and claim walks every
-- timer fired since. Listed here, the row is passed by the floors (log_timers_due_v2,
-- log_timers_claim_v4 and log_timers_below_floor_v1 leave out a row listed at the due_at it
-- still has) and every claim tries it by its key instead (FOR UPDATE SKIP LOCKED): what the
-- row holds back is its own timer. An entry goes when its row is gone or no longer waits at
-- the due_at it was listed at (fired, cancelled, rescheduled, handed back). At most 64
-- entries: past that, the floor stops at the next held row as it did without the list.
-- Shared by the brokers (one listing serves all; nothing in it decides who fires what), and
-- written only when a held row is met.
CREATE TABLE IF NOT EXISTS queen.log_timers_held (
    tenant_id uuid NOT NULL,
    queue     text COLLATE "C" NOT NULL,
    timer_key text COLLATE "C" NOT NULL,
    due_at    timestamptz NOT NULL,
    listed_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, queue, timer_key)
);

-- ---------------------------------------------------------------------------------------
-- Small helpers
-- ---------------------------------------------------------------------------------------

-- queen.epoch_ms_v1(ts) -> bigint: Unix epoch milliseconds, rounded down. Locks: none.
-- No SET search_path: a SET clause stops the planner from inlining a SQL function, and this
-- one runs per row (claim, list, usage). Its body names every function and operator with
-- its schema instead, so an inlined copy means the same under any caller's search_path.
-- The body is immutable as declared (extract from the interval since the epoch, not from
-- the timestamptz, whose extract is only stable): an IMMUTABLE SQL function whose body is
-- less than that is never inlined, and costs a function call per row (~2 us; more under
-- pg_stat_statements.track = all, which counts every call as a statement).
CREATE OR REPLACE FUNCTION queen.epoch_ms_v1(p_ts timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT
AS $fn$
    SELECT pg_catalog.floor(pg_catalog.extract('epoch', p_ts OPERATOR(pg_catalog.-) '1970-01-01 00:00:00+00'::pg_catalog.timestamptz)
                            OPERATOR(pg_catalog.*) 1000)::bigint
$fn$;

-- queen.all_shards_v1() -> int2[]: 0..63 in order, for callers that pass null shards.
-- Locks: none.
CREATE OR REPLACE FUNCTION queen.all_shards_v1()
RETURNS int2[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT array_agg(g::int2 ORDER BY g) FROM generate_series(0, 63) AS g
$fn$;

-- queen.log_timers_not_before_v1(deliver_at, now) -> timestamptz or null: what a write puts
-- in claimed_until of a row it leaves in nobody's hands (claim_token null): the writer's now
-- when deliver_at is earlier, else null (and null with a null now: the behaviour of schema
-- versions 1-6, for their callers). So that visible_at = greatest(deliver_at,
-- claimed_until) is never earlier than the now of the write: a timer scheduled with a
-- deliverAt in the past, a replace, a reschedule, a hand-back. This is the rule the floor
-- rests on (section 2, log_timers_due_v2), with the at-commit trigger
-- (log_timers_at_commit_v1), which moves a late transaction's rows to its commit's clock.
-- The claim (now + lease) and a failure (now + backoff) keep the rule by themselves.
-- Locks: none.
-- No SET search_path (it runs per row of a hand-back): every name is schema-qualified.
CREATE OR REPLACE FUNCTION queen.log_timers_not_before_v1(p_deliver_at timestamptz, p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT CASE WHEN p_deliver_at OPERATOR(pg_catalog.<) p_now THEN p_now END
$fn$;

-- queen.log_timers_floor_slack_v1() -> interval: how far behind the now of a probe or a
-- claim the floor is kept at least (section 2). A transaction that commits late has its rows
-- moved to its commit's clock by the at-commit trigger (log_timers_at_commit_v1), so they
-- land at or ahead of every floor; the slack covers the time between that trigger and the
-- commit becoming visible (a commit waiting on a synchronous standby, a busy server). A row
-- the trigger does not see (its header lists the cases) or one whose commit becomes visible
-- more than this after the trigger ran may land behind the floor: the sweeper's walk from
-- the index head (log_timers_below_floor_v1) finds it. 5 seconds; each second of slack at
-- 3,000 timers/s is about 3,000 dead index entries a walk passes while a snapshot is held
-- (tests/bench/README.md, "held snapshot"). Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_floor_slack_v1()
RETURNS interval
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT interval '5 seconds'
$fn$;

-- queen.log_timers_not_behind_v1() -> trigger: the floor's rule (section 2) for a write that
-- does not go through this schema's functions (an operator's INSERT or UPDATE by hand, a
-- wrapper of 006_compat.sql that hands a row back without a now, log_timers_release_v1): a
-- row left in nobody's hands at a visible_at before its transaction's now() is put at now()
-- (claimed_until = now(), claim_token null), so that no sweeper's floor is past it. The trigger's WHEN clause is false for every write of this
-- schema's functions (they put such a row at their caller's now already), so the function
-- runs only for those other writes; a claim (claim_token set) never meets it.
-- The one function here that reads the clock: a write by hand has no caller's now.
-- Locks: none beyond the write's own.
CREATE OR REPLACE FUNCTION queen.log_timers_not_behind_v1()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    NEW.claimed_until := now();
    RETURN NEW;
END
$fn$;

-- Created once, behind a catalog check (CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on
-- the table; every later apply stays lock-free).
DO $apply$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = 'queen.log_timers'::regclass AND tgname = 'log_timers_not_behind') THEN
        CREATE TRIGGER log_timers_not_behind
            BEFORE INSERT OR UPDATE OF deliver_at, claimed_until, claim_token ON queen.log_timers
            FOR EACH ROW
            WHEN (NEW.claim_token IS NULL
                  AND greatest(NEW.deliver_at, coalesce(NEW.claimed_until, NEW.deliver_at)) < now())
            EXECUTE FUNCTION queen.log_timers_not_behind_v1();
    END IF;
END
$apply$;

-- queen.log_timers_at_commit_v1() -> trigger: a row lands where it belongs at its commit,
-- and its tenant is in the ring.
-- Every write puts its row at or after the now it writes with (log_timers_not_before_v1),
-- but a row becomes visible only at its transaction's commit: a transaction that commits
-- long after its now (a batch import, an ORM session left open, a host that schedules and
-- then does slow work before committing) would otherwise leave its rows behind every
-- sweeper's floor, where only the walk from the head finds them, seconds to minutes later.
-- This deferred constraint trigger runs at the commit of every transaction that inserted a
-- row or set its deliver_at, once per such row:
-- * the row's tenant is entered in queen.log_timers_tenants (the tenants' ring) unless this
--   transaction entered it already (the last tenant entered is remembered in the
--   transaction-local setting queen.ring_tenant): INSERT ... ON CONFLICT DO NOTHING, which
--   writes nothing and locks nothing when the tenant is there;
-- * a row left in nobody's hands at a due_at more than 1 second before the commit's clock
--   (clock_timestamp()) is put at that clock (claimed_until = clock_timestamp(): visible_at
--   and due_at follow, attempts unchanged), so it lands at or after every floor (a floor is
--   at least the slack, 5 s, behind the now of the probe or claim that computes it) and
--   fires like a timer committed just now, oldest first among what is due. The row is
--   updated by its address (NEW's ctid, a TID scan: no plan can walk an index for it); a
--   later write of this transaction that moved it leaves the address dead, and then it is
--   found by its primary key.
-- Cost: a transaction that commits within 1 s of the rows' due_at pays one call of this
-- function per row and one probe of the ring's primary key per tenant; a late one pays an
-- UPDATE per row it moves (tests/bench/load --phases late-commit measures it). What it does
-- not see, the walk from the head still finds: a host's SET CONSTRAINTS ALL IMMEDIATE (the
-- check then runs at the statement's end, not at the commit), a two-phase commit (the check
-- runs at PREPARE TRANSACTION), a commit that waits longer than the slack for a synchronous
-- standby.
-- SECURITY DEFINER: it runs at the commit, as the session's role (a broker role holds no
-- privilege on the tables; 007_roles.sql), and a trigger function is executed, never granted.
-- Locks: the row, already the transaction's own; a new entry of queen.log_timers_tenants.
CREATE OR REPLACE FUNCTION queen.log_timers_at_commit_v1()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off  -- a plan made on a small table would scan it for every row
AS $fn$
DECLARE
    v_clock timestamptz := clock_timestamp();
BEGIN
    IF current_setting('queen.ring_tenant', true) IS DISTINCT FROM NEW.tenant_id::text THEN
        INSERT INTO queen.log_timers_tenants (tenant_id) VALUES (NEW.tenant_id)
        ON CONFLICT (tenant_id) DO NOTHING;
        PERFORM pg_catalog.set_config('queen.ring_tenant', NEW.tenant_id::text, true);
    END IF;
    IF NEW.due_at >= v_clock - interval '1 second' THEN
        RETURN NULL;
    END IF;
    -- The row as it is now (a later write of this transaction may have moved, claimed or
    -- deleted it; NEW is the row of this event). The key is compared with IS NOT DISTINCT
    -- FROM so that no index can take it: the address is the one way in.
    UPDATE queen.log_timers AS t
       SET claimed_until = v_clock
     WHERE t.ctid = NEW.ctid
       AND (t.tenant_id, t.queue, t.timer_key) IS NOT DISTINCT FROM (NEW.tenant_id, NEW.queue, NEW.timer_key)
       AND t.claim_token IS NULL AND (t.due_at < v_clock - interval '1 second') IS TRUE;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- Moved by a later write of this transaction (or gone, or no longer late): by key.
    UPDATE queen.log_timers AS t
       SET claimed_until = v_clock
     WHERE t.tenant_id = NEW.tenant_id AND t.queue = NEW.queue AND t.timer_key = NEW.timer_key
       AND t.claim_token IS NULL AND (t.due_at < v_clock - interval '1 second') IS TRUE;
    RETURN NULL;
END
$fn$;

-- Created once, behind a catalog check, as log_timers_not_behind. A constraint trigger,
-- DEFERRABLE INITIALLY DEFERRED: it runs at commit. The claim, the fire, a failure and a
-- hand-back never set deliver_at, so they never queue it; its own UPDATE sets
-- claimed_until only, so it does not queue itself again.
DO $apply$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = 'queen.log_timers'::regclass AND tgname = 'log_timers_at_commit') THEN
        CREATE CONSTRAINT TRIGGER log_timers_at_commit
            AFTER INSERT OR UPDATE OF deliver_at ON queen.log_timers
            DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW
            WHEN (NEW.claim_token IS NULL)
            EXECUTE FUNCTION queen.log_timers_at_commit_v1();
    END IF;
END
$apply$;

-- queen.log_timers_queue_gone_v1() -> trigger, AFTER DELETE OR UPDATE OF tenant_id, name ON
-- queen.queues, per row (trigger queues_timers_follow): what becomes of the pending timers
-- of a queue that is removed or renamed (schema 18). A timer names its queue by tenant and
-- name, and the fire creates a queue it does not find (log_timers_fire_take_v1, 003): before,
-- the pending timers of a removed queue re-created a queue of the old name at their
-- instant, one nobody reads, and those of a renamed queue did the same under the old name.
-- Now, in the transaction that removes or renames the queue row:
--   removed (DELETE): every timer of (tenant, old name), claimed or not, leaves
--     queen.log_timers for queen.log_dlq (consumer_group '__timer__', log_offset -1, its
--     payload, message_id, txn, timer_key and attempts, error 'queue removed'): it never
--     fires, and nothing is lost without a trace.
--   renamed (tenant_id or name changed): the timers follow the queue: their tenant and queue
--     become the new ones, a claim on them is dropped (claim_token null, due again at once
--     when due, as a hand-back puts them), and they fire into the queue under its new name.
--     One whose key a pending timer of the new name already has goes to queen.log_dlq
--     instead (error 'queue renamed to <name>: a timer with this key is pending there').
--     A new tenant is entered in the tenants' ring (queen.log_timers_tenants).
-- A timer written for the old name by a transaction that commits after this one (or that
-- this one's statement did not see) is a new timer: its fire creates a queue of that name.
-- Runs as the caller (a queue's owner: the working roles hold no privilege on the table).
-- Reads now() for the dead letters and dropped claims (a write by hand has no caller's now).
-- Locks: the old name's rows of queen.log_timers (DELETE, UPDATE); a row a fire holds is
-- waited for (milliseconds), never the other way round: the claim and the fire skip a
-- locked row, and a claimed row this removes answers its fire busy, then stale.
CREATE OR REPLACE FUNCTION queen.log_timers_queue_gone_v1()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_tenant uuid := OLD.tenant_id;
    v_queue  text := OLD.name;
    v_to_t   uuid;
    v_to_q   text;
    v_error  text := 'queue removed';
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_to_t := NEW.tenant_id;
        v_to_q := NEW.name;
        IF v_to_t = v_tenant AND v_to_q = v_queue THEN
            RETURN NULL;
        END IF;
        v_error := 'queue renamed to ' || v_to_q || ': a timer with this key is pending there';
    END IF;
    -- Removed: every timer of the old name. Renamed: those whose key the new name has.
    WITH gone AS (
        DELETE FROM queen.log_timers AS t
         WHERE t.tenant_id = v_tenant AND t.queue = v_queue
           AND (v_to_q IS NULL
                OR EXISTS (SELECT 1 FROM queen.log_timers n
                            WHERE n.tenant_id = v_to_t AND n.queue = v_to_q AND n.timer_key = t.timer_key))
        RETURNING t.tenant_id, t.queue, t.partition, t.payload, t.payload_zstd, t.encrypted,
                  t.message_id, t.txn, t.timer_key, t.attempts
    )
    INSERT INTO queen.log_dlq (tenant_id, queue, partition, consumer_group, log_offset, payload,
                               error, message_id, txn, timer_key, attempts, created_at)
    SELECT g.tenant_id, g.queue, g.partition, '__timer__', -1,
           queen.log_timers_payload_json_v1(g.payload, g.payload_zstd, g.encrypted),
           v_error, g.message_id, g.txn, g.timer_key, g.attempts, now()
      FROM gone g
     ORDER BY g.timer_key;
    IF v_to_q IS NOT NULL THEN
        UPDATE queen.log_timers AS t
           SET tenant_id = v_to_t, queue = v_to_q, claim_token = NULL,
               claimed_until = queen.log_timers_not_before_v1(t.deliver_at, now()),
               updated_at = now()
         WHERE t.tenant_id = v_tenant AND t.queue = v_queue;
        IF FOUND AND v_to_t <> v_tenant THEN  -- timers the new tenant now has: in the ring
            INSERT INTO queen.log_timers_tenants (tenant_id) VALUES (v_to_t)
            ON CONFLICT (tenant_id) DO NOTHING;
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

-- Created once, behind a catalog check, like log_timers_not_behind (CREATE TRIGGER takes a
-- SHARE ROW EXCLUSIVE lock on queen.queues once, on the first apply of schema 18).
DO $apply$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = 'queen.queues'::regclass AND tgname = 'queues_timers_follow') THEN
        CREATE TRIGGER queues_timers_follow
            AFTER DELETE OR UPDATE OF tenant_id, name ON queen.queues
            FOR EACH ROW
            EXECUTE FUNCTION queen.log_timers_queue_gone_v1();
    END IF;
END
$apply$;

-- queen.log_timers_op_field_v1(op, index, field, json type, required) -> jsonb
-- One field of an apply op, type-checked; a JSON null counts as absent; strings other than
-- payload must not be empty. Raises 22023 naming the op index and the field. Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_op_field_v1(
    p_op jsonb, p_idx int, p_field text, p_type text, p_required boolean)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_val jsonb := p_op -> p_field;
BEGIN
    IF v_val IS NULL OR jsonb_typeof(v_val) = 'null' THEN
        IF p_required THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].%: missing required field', p_idx, p_field
                USING ERRCODE = '22023';
        END IF;
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v_val) <> p_type THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].%: must be a JSON %, got %',
            p_idx, p_field, p_type, jsonb_typeof(v_val) USING ERRCODE = '22023';
    END IF;
    -- An empty payload is a payload (a bare signal); an empty name is a mistake.
    IF p_type = 'string' AND v_val #>> '{}' = '' AND p_field <> 'payload' THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].%: must not be empty', p_idx, p_field
            USING ERRCODE = '22023';
    END IF;
    RETURN v_val;
END
$fn$;

-- queen.log_timers_payload_json_v1(payload, zstd, encrypted) -> jsonb
-- What a dead letter carries: the payload itself when it is UTF-8 JSON; otherwise
-- {"_raw_b64": ...}, plus "_zstd": true when it is compressed (SQL cannot decompress it)
-- and "_encrypted": true when it is ciphertext (never decrypted here). Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_payload_json_v1(
    p_payload bytea, p_zstd boolean, p_encrypted boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_raw   jsonb := jsonb_build_object('_raw_b64', translate(encode(p_payload, 'base64'), E'\n\r', ''));
    v_first text;
BEGIN
    IF p_zstd THEN
        v_raw := v_raw || jsonb_build_object('_zstd', true);
    END IF;
    IF p_encrypted THEN
        v_raw := v_raw || jsonb_build_object('_encrypted', true);
    END IF;
    IF p_zstd OR p_encrypted THEN
        RETURN v_raw;
    END IF;
    -- Cheap pre-check so that obviously non-JSON payloads cost no subtransaction.
    v_first := substring(ltrim(encode(substring(p_payload FROM 1 FOR 64), 'escape'), E' \t\r\n') FROM 1 FOR 1);
    IF v_first IS NULL OR v_first = '' OR v_first !~ '^[\[{"0-9tfn-]$' THEN
        RETURN v_raw;
    END IF;
    BEGIN
        RETURN convert_from(p_payload, 'UTF8')::jsonb;
    EXCEPTION WHEN others THEN
        RETURN v_raw;
    END;
END
$fn$;

-- queen.zstd_frame_problem_v1(payload, max_content) -> text
-- NULL when payload is exactly one zstd frame the sweeper can inflate within max_content
-- bytes; otherwise why not, in words. Read from the frame format (RFC 8878): magic number
-- 0xFD2FB528 little-endian; the Frame_Header_Descriptor (reserved bit clear; no dictionary,
-- since the sweeper has none); Frame_Content_Size present (a frame that does not declare
-- its size could inflate to anything) and at most max_content; then the blocks walked to
-- the one marked last (none of the reserved type, none over 128 KiB, raw and RLE blocks
-- not regenerating more than declared), the checksum if flagged, and nothing after it
-- (a second frame appended to a small first one would inflate unchecked). zstd itself
-- refuses a frame whose blocks inflate to other than its declared size, so the declared
-- size bounds what the packer inflates. At most 4096 blocks: every real encoder writes
-- blocks of up to 128 KiB, and the walk stays cheap on a hostile megabyte of empty blocks.
-- What SQL cannot see: the inside of a compressed block and the checksum's value. A frame
-- corrupt there passes this door; the packer then fails that timer alone as permanent,
-- and still never inflates it past the declared size.
-- Pure. Locks: none.
CREATE OR REPLACE FUNCTION queen.zstd_frame_problem_v1(p_payload bytea, p_max_content bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    c_max_block  constant int := 131072;
    c_max_blocks constant int := 4096;
    v_len      int := octet_length(p_payload);
    v_fhd      int;
    v_single   boolean;
    v_did_len  int;
    v_fcs_len  int;
    v_pos      int;
    v_declared numeric := 0;
    v_plain    numeric := 0;
    v_header   int;
    v_type     int;
    v_size     int;
    v_blocks   int := 0;
BEGIN
    IF v_len < 4 OR get_byte(p_payload, 0) <> 40 OR get_byte(p_payload, 1) <> 181
       OR get_byte(p_payload, 2) <> 47 OR get_byte(p_payload, 3) <> 253 THEN
        RETURN 'not a zstd frame (no magic number 0xFD2FB528 at byte 0)';
    END IF;
    IF v_len < 5 THEN
        RETURN 'zstd frame header truncated';
    END IF;
    v_fhd := get_byte(p_payload, 4);
    IF v_fhd & 8 <> 0 THEN
        RETURN 'zstd frame header descriptor has its reserved bit set';
    END IF;
    v_single := v_fhd & 32 <> 0;
    v_did_len := (ARRAY[0, 1, 2, 4])[(v_fhd & 3) + 1];
    v_fcs_len := CASE v_fhd >> 6 WHEN 0 THEN CASE WHEN v_single THEN 1 ELSE 0 END
                                 WHEN 1 THEN 2 WHEN 2 THEN 4 ELSE 8 END;
    v_pos := 5 + CASE WHEN v_single THEN 0 ELSE 1 END;
    IF v_pos + v_did_len + v_fcs_len > v_len THEN
        RETURN 'zstd frame header truncated';
    END IF;
    FOR v_k IN 0 .. v_did_len - 1 LOOP
        IF get_byte(p_payload, v_pos + v_k) <> 0 THEN
            RETURN 'zstd frame needs a dictionary (the sweeper has none)';
        END IF;
    END LOOP;
    v_pos := v_pos + v_did_len;
    IF v_fcs_len = 0 THEN
        RETURN format('zstd frame does not declare its content size (Frame_Content_Size absent),'
                      ' so the %s-byte limit cannot be checked', p_max_content);
    END IF;
    FOR v_k IN REVERSE v_fcs_len - 1 .. 0 LOOP
        v_declared := v_declared * 256 + get_byte(p_payload, v_pos + v_k);
    END LOOP;
    IF v_fcs_len = 2 THEN
        v_declared := v_declared + 256;
    END IF;
    v_pos := v_pos + v_fcs_len;
    IF v_declared > p_max_content THEN
        RETURN format('zstd frame declares %s bytes of content, over the %s-byte limit',
                      v_declared, p_max_content);
    END IF;
    LOOP
        IF v_pos + 3 > v_len THEN
            RETURN format('zstd frame truncated: block header missing at byte %s', v_pos);
        END IF;
        v_blocks := v_blocks + 1;
        IF v_blocks > c_max_blocks THEN
            RETURN format('zstd frame has more than %s blocks', c_max_blocks);
        END IF;
        v_header := get_byte(p_payload, v_pos) | (get_byte(p_payload, v_pos + 1) << 8)
                    | (get_byte(p_payload, v_pos + 2) << 16);
        v_type := (v_header >> 1) & 3;
        v_size := v_header >> 3;
        IF v_type = 3 THEN
            RETURN format('zstd block at byte %s has the reserved block type', v_pos);
        END IF;
        IF v_size > c_max_block THEN
            RETURN format('zstd block at byte %s is %s bytes, over the %s-byte block maximum',
                          v_pos, v_size, c_max_block);
        END IF;
        IF v_type IN (0, 1) THEN
            v_plain := v_plain + v_size;
            IF v_plain > v_declared THEN
                RETURN format('zstd blocks regenerate more than the %s bytes the frame declares',
                              v_declared);
            END IF;
        END IF;
        v_pos := v_pos + 3 + CASE WHEN v_type = 1 THEN 1 ELSE v_size END;
        IF v_pos > v_len THEN
            RETURN format('zstd frame truncated inside a block (%s bytes needed, %s present)',
                          v_pos, v_len);
        END IF;
        EXIT WHEN v_header & 1 = 1;
    END LOOP;
    IF v_fhd & 4 <> 0 THEN
        v_pos := v_pos + 4;
    END IF;
    IF v_pos > v_len THEN
        RETURN 'zstd frame truncated inside its checksum';
    END IF;
    IF v_pos < v_len THEN
        RETURN format('%s bytes follow the end of the zstd frame at byte %s (one frame only)',
                      v_len - v_pos, v_pos);
    END IF;
    RETURN NULL;
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- 1. apply: schedule / reschedule / cancel
-- ---------------------------------------------------------------------------------------

-- queen.log_timers_op_parse_v1(op jsonb, idx int) -> (kind, queue, timer_key, part, txn,
--     delay_ms, payload, zstd, enc): ONE op of an apply batch, validated and decoded (the
-- checks and refusals listed under log_timers_apply_v1, each message naming ops[idx] and
-- the field). An internal helper of log_timers_apply_v1: SECURITY INVOKER, granted to
-- nobody. Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_op_parse_v1(
    v_op jsonb, v_idx int, OUT kind text, OUT queue text, OUT timer_key text, OUT part text,
    OUT txn text, OUT delay_ms bigint, OUT payload bytea, OUT zstd boolean, OUT enc boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    c_max_payload constant int := 1048576;
    c_max_delay   constant bigint := 90::bigint * 24 * 3600 * 1000;
    -- The base64 text of a payload at the limit is 4/3 of it; twice the limit leaves room
    -- for any line breaks and is checked before the text is scanned at all.
    c_max_b64     constant int := 2 * 1048576;
    -- Names are index keys (log_timers, queues, log_partitions, log_dlq): a btree entry must
    -- fit in a third of a page (about 2.7 kB), so each name gets a fixed share of that.
    c_max_queue   constant int := 512;
    c_max_part    constant int := 512;
    c_max_key     constant int := 1024;
    -- The segment frame carries txn and producer sub lengths as u16 (src/codec/codec.hpp).
    c_max_u16     constant int := 65535;
    c_owned       constant text[] := ARRAY['messageId', 'deliverAt', 'deliverAtMs', 'attempts',
        'claimToken', 'claimedUntil', 'shard', 'visibleAt', 'createdAt', 'updatedAt',
        'tenantId', 'lastError', 'producerSub'];
    c_known       constant text[] := ARRAY['op', 'queue', 'timerKey', 'partition', 'delayMs',
        'txn', 'payload', 'payloadZstd', 'encrypted'];
    v_where    text;
    v_field    text;
    v_val      jsonb;
    v_str      text;
    v_num      numeric;
BEGIN
    IF jsonb_typeof(v_op) <> 'object' THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%]: each op must be a JSON object, got %',
            v_idx, jsonb_typeof(v_op) USING ERRCODE = '22023';
    END IF;
    -- The payload's length before anything else reads the op: a 64 MiB string must be
    -- refused before any scan of it (and before the op is handed to the field checks).
    IF jsonb_typeof(v_op -> 'payload') = 'string'
       AND octet_length(v_op ->> 'payload') > c_max_b64 THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].payload: % characters of base64, more than a payload at the 1 MiB limit (% bytes) can take (at most % characters)',
            v_idx, octet_length(v_op ->> 'payload'), c_max_payload, c_max_b64 USING ERRCODE = '22023';
    END IF;
    FOR v_field IN SELECT k FROM jsonb_object_keys(v_op) AS k LOOP
        IF v_field = ANY (c_owned) THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].%: server-owned field, not accepted in an op',
                v_idx, v_field USING ERRCODE = '22023';
        END IF;
        IF NOT v_field = ANY (c_known) THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].%: unknown field', v_idx, v_field
                USING ERRCODE = '22023';
        END IF;
    END LOOP;

    v_str := queen.log_timers_op_field_v1(v_op, v_idx, 'op', 'string', true) #>> '{}';
    IF v_str NOT IN ('schedule', 'reschedule', 'cancel') THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].op: unknown op "%" (expected schedule, reschedule or cancel)',
            v_idx, v_str USING ERRCODE = '22023';
    END IF;
    kind := v_str;
    queue := queen.log_timers_op_field_v1(v_op, v_idx, 'queue', 'string', true) #>> '{}';
    timer_key := queen.log_timers_op_field_v1(v_op, v_idx, 'timerKey', 'string', true) #>> '{}';
    part := queen.log_timers_op_field_v1(v_op, v_idx, 'partition', 'string', false) #>> '{}';
    txn := queen.log_timers_op_field_v1(v_op, v_idx, 'txn', 'string', v_str = 'schedule') #>> '{}';
    -- Lengths compared here; check_bytes_v1 (which words the refusal) runs only on a
    -- refusal: a call per field per op cost a sixth of a 256-op apply (measured
    -- 2026-11-30: 103 ms with the calls, 86 ms without, both under load).
    v_where := 'ops[' || v_idx || ']';
    IF octet_length(queue) > c_max_queue THEN
        PERFORM queen.check_bytes_v1('log_timers_apply_v1', v_where || '.queue',
                                     queue, c_max_queue, 'names are index keys');
    END IF;
    IF octet_length(timer_key) > c_max_key THEN
        PERFORM queen.check_bytes_v1('log_timers_apply_v1', v_where || '.timerKey',
                                     timer_key, c_max_key, 'names are index keys');
    END IF;
    IF octet_length(part) > c_max_part THEN
        PERFORM queen.check_bytes_v1('log_timers_apply_v1', v_where || '.partition',
                                     part, c_max_part, 'names are index keys');
    END IF;
    IF octet_length(txn) > c_max_u16 THEN
        PERFORM queen.check_bytes_v1('log_timers_apply_v1', v_where || '.txn', txn,
                                     c_max_u16, 'the segment frame carries its length as u16');
    END IF;

    v_val := queen.log_timers_op_field_v1(v_op, v_idx, 'delayMs', 'number', v_str <> 'cancel');
    IF v_val IS NULL THEN
        delay_ms := NULL;
    ELSE
        v_num := (v_val #>> '{}')::numeric;
        IF v_num <> trunc(v_num) THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].delayMs: must be an integer number of milliseconds',
                v_idx USING ERRCODE = '22023';
        END IF;
        IF v_num > c_max_delay THEN
            -- A JSON number can have hundreds of digits: quote at most 40 of them.
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].delayMs: % ms is beyond the 90-day horizon (% ms)',
                v_idx, CASE WHEN length(v_num::text) > 40 THEN left(v_num::text, 40) || '...'
                            ELSE v_num::text END,
                c_max_delay USING ERRCODE = '22023';
        END IF;
        delay_ms := greatest(v_num, 0)::bigint;
    END IF;

    v_val := queen.log_timers_op_field_v1(v_op, v_idx, 'payload', 'string', v_str = 'schedule');
    IF v_val IS NULL THEN
        payload := NULL;
    ELSE
        v_field := regexp_replace(v_val #>> '{}', '[[:space:]]', '', 'g');
        IF v_field !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].payload: invalid base64', v_idx
                USING ERRCODE = '22023';
        END IF;
        IF length(v_field) / 4 * 3 > c_max_payload + 2 THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].payload: over the 1 MiB limit (% bytes)',
                v_idx, c_max_payload USING ERRCODE = '22023';
        END IF;
        payload := decode(v_field, 'base64');
        IF octet_length(payload) > c_max_payload THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].payload: % bytes decoded, over the 1 MiB limit (% bytes)',
                v_idx, octet_length(payload), c_max_payload USING ERRCODE = '22023';
        END IF;
    END IF;

    zstd := (queen.log_timers_op_field_v1(v_op, v_idx, 'payloadZstd', 'boolean', false) #>> '{}')::boolean;
    enc := (queen.log_timers_op_field_v1(v_op, v_idx, 'encrypted', 'boolean', false) #>> '{}')::boolean;
    -- A payload stored compressed is inflated by the packer before framing: only a frame
    -- it can inflate, to at most the payload limit, is accepted (decompression bombs).
    IF coalesce(zstd, false) AND payload IS NOT NULL THEN
        v_field := queen.zstd_frame_problem_v1(payload, c_max_payload);
        IF v_field IS NOT NULL THEN
            RAISE EXCEPTION 'log_timers_apply_v1: ops[%].payload: payloadZstd is true but %; the limit is % bytes inflated',
                v_idx, v_field, c_max_payload USING ERRCODE = '22023';
        END IF;
    END IF;
    -- Ciphertext is never empty (nonce and tag at least): an empty payload flagged
    -- encrypted could never be decrypted by its consumer.
    IF coalesce(enc, false) AND octet_length(payload) = 0 THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].encrypted: true with an empty payload (ciphertext is at least 1 byte)',
            v_idx USING ERRCODE = '22023';
    END IF;
    IF v_str = 'reschedule' AND payload IS NULL
       AND (zstd IS NOT NULL OR enc IS NOT NULL) THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].%: only accepted together with payload',
            v_idx, CASE WHEN zstd IS NOT NULL THEN 'payloadZstd' ELSE 'encrypted' END
            USING ERRCODE = '22023';
    END IF;
END
$fn$;

-- queen.log_timers_apply_write_v1(tenant, producer_sub, now, kind, queue, timer_key, part,
--     txn, delay_ms, payload, zstd, enc) -> jsonb: ONE validated op of an apply batch written,
-- and its answer (the contract under log_timers_apply_v1). An internal helper of
-- log_timers_apply_v1: SECURITY INVOKER, granted to nobody.
-- Locks: the op's row of queen.log_timers (INSERT ... ON CONFLICT / UPDATE / DELETE).
CREATE OR REPLACE FUNCTION queen.log_timers_apply_write_v1(
    p_tenant uuid, p_producer_sub text, p_now timestamptz, p_kind text, p_queue text, p_key text,
    p_part text, p_txn text, p_delay_ms bigint, p_payload bytea, p_zstd boolean, p_enc boolean)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_deliver  timestamptz;
    v_mid      uuid;
    v_rmid     uuid;
    v_rdeliver timestamptz;
    v_replaced boolean;
BEGIN
    v_rmid := NULL;
    v_rdeliver := NULL;
    IF p_kind IN ('schedule', 'reschedule') THEN
        v_deliver := p_now + p_delay_ms * interval '1 millisecond';
    END IF;

    IF p_kind = 'schedule' THEN
        v_mid := gen_random_uuid();
        INSERT INTO queen.log_timers AS t
               (tenant_id, queue, timer_key, partition, deliver_at, txn, message_id, payload,
                payload_zstd, encrypted, producer_sub, attempts, last_error, claimed_until,
                claim_token, created_at, updated_at)
        VALUES (p_tenant, p_queue, p_key, coalesce(p_part, 'Default'), v_deliver,
                p_txn, v_mid, p_payload, coalesce(p_zstd, false),
                coalesce(p_enc, false), p_producer_sub, 0, NULL,
                queen.log_timers_not_before_v1(v_deliver, p_now), NULL, p_now, p_now)
        ON CONFLICT (tenant_id, queue, timer_key) DO UPDATE
           SET partition = excluded.partition, deliver_at = excluded.deliver_at,
               txn = excluded.txn, message_id = excluded.message_id,
               payload = excluded.payload, payload_zstd = excluded.payload_zstd,
               encrypted = excluded.encrypted, producer_sub = excluded.producer_sub,
               attempts = 0, last_error = NULL, claimed_until = excluded.claimed_until, claim_token = NULL,
               created_at = excluded.created_at, updated_at = excluded.updated_at
         WHERE NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
        RETURNING t.message_id, t.deliver_at, (t.xmax <> 0)
             INTO v_rmid, v_rdeliver, v_replaced;
        IF FOUND THEN
            RETURN jsonb_build_object('ok', true, 'status', 'scheduled',
                'messageId', v_rmid, 'deliverAt', v_rdeliver,
                'deliverAtMs', queen.epoch_ms_v1(v_rdeliver), 'replaced', v_replaced);
        END IF;

    ELSIF p_kind = 'reschedule' THEN
        UPDATE queen.log_timers AS t
           SET deliver_at = v_deliver,
               claimed_until = queen.log_timers_not_before_v1(v_deliver, p_now), claim_token = NULL,
               attempts = 0, last_error = NULL,
               partition = coalesce(p_part, t.partition),
               txn = coalesce(p_txn, t.txn),
               payload = coalesce(p_payload, t.payload),
               payload_zstd = CASE WHEN p_payload IS NULL THEN t.payload_zstd
                                   ELSE coalesce(p_zstd, false) END,
               encrypted = CASE WHEN p_payload IS NULL THEN t.encrypted
                                ELSE coalesce(p_enc, false) END,
               producer_sub = CASE WHEN p_payload IS NULL THEN t.producer_sub
                                   ELSE p_producer_sub END,
               updated_at = p_now
         WHERE t.tenant_id = p_tenant AND t.queue = p_queue AND t.timer_key = p_key
           AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
        RETURNING t.message_id, t.deliver_at INTO v_rmid, v_rdeliver;
        IF FOUND THEN
            RETURN jsonb_build_object('ok', true, 'status', 'rescheduled',
                'messageId', v_rmid, 'deliverAt', v_rdeliver,
                'deliverAtMs', queen.epoch_ms_v1(v_rdeliver));
        END IF;

    ELSE
        DELETE FROM queen.log_timers AS t
         WHERE t.tenant_id = p_tenant AND t.queue = p_queue AND t.timer_key = p_key
           AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
        RETURNING t.message_id, t.deliver_at INTO v_rmid, v_rdeliver;
        IF FOUND THEN
            RETURN jsonb_build_object('ok', true, 'status', 'cancelled',
                'messageId', v_rmid, 'deliverAt', v_rdeliver,
                'deliverAtMs', queen.epoch_ms_v1(v_rdeliver));
        END IF;
    END IF;

    -- Nothing written: the row is in somebody's hands, or it does not exist.
    SELECT t.message_id, t.deliver_at INTO v_rmid, v_rdeliver
      FROM queen.log_timers t
     WHERE t.tenant_id = p_tenant AND t.queue = p_queue AND t.timer_key = p_key;
    IF FOUND THEN
        RETURN jsonb_build_object('ok', false, 'status', 'too_late',
            'messageId', v_rmid, 'deliverAt', v_rdeliver,
            'deliverAtMs', queen.epoch_ms_v1(v_rdeliver));
    ELSE
        RETURN jsonb_build_object('ok', false, 'status', 'absent',
            'messageId', NULL, 'deliverAt', NULL, 'deliverAtMs', NULL);
    END IF;
END
$fn$;

-- queen.log_timers_apply_v1(ops jsonb, tenant uuid, producer_sub text, now timestamptz) -> jsonb
-- A batch of at most 256 ops; returns a JSON array index-aligned with ops, each
--   {"ok", "status", "messageId", "deliverAt", "deliverAtMs"}  (+ "replaced" for schedule)
-- status: scheduled | rescheduled | cancelled | absent | too_late. ok is true only for
-- scheduled, rescheduled and cancelled.
--   schedule   inserts; an existing row in nobody's hands is REPLACED (new message id,
--              payload, txn, partition, deliver_at; attempts, last_error and any backoff
--              cleared; "replaced": true). A row in somebody's hands -> too_late.
--   reschedule sets deliver_at = now + delayMs on an existing row in nobody's hands, and
--              clears attempts, last_error and backoff (it is the user's new instruction);
--              payload (+ payloadZstd, encrypted, taken as false when omitted), txn and
--              partition change only when given. Missing -> absent; in hands -> too_late.
--   cancel     deletes unless in somebody's hands (too_late); missing -> absent.
-- delayMs is relative to now; a negative delay counts as 0 and fires on the first cycle.
-- Refused with 22023, message naming ops[i] and the field: server-owned fields (messageId,
-- deliverAt, deliverAtMs, attempts, claimToken, claimedUntil, shard, visibleAt, createdAt,
-- updatedAt, tenantId, lastError, producerSub), unknown fields, unknown op, missing
-- required field (queue, timerKey always; txn, payload, delayMs for schedule; delayMs for
-- reschedule), wrong JSON type, empty string, non-integer delayMs, delayMs over 90 days,
-- invalid base64, payload base64 text over 2 MiB (checked before any scan of it), payload
-- over 1 MiB decoded, payloadZstd/encrypted on a reschedule without payload, a duplicate
-- (queue, timerKey), more than 256 ops, ops not an array; and every value the sweeper could
-- not deliver later: queue or partition over 512 bytes, timerKey over 1024 bytes (index
-- keys), txn or producer_sub over 65535 bytes (u16 lengths in the frame), a payloadZstd
-- payload that is not exactly one zstd frame without dictionary declaring a content size
-- of at most 1 MiB (zstd_frame_problem_v1), encrypted with an empty payload, and now
-- outside [1970-01-01, 10000-01-01) UTC or infinite (check_now_v1). Each message names
-- ops[i].field (or producer_sub / now) and the limit.
-- Refused with 55000 'timers_schedule_enabled is off' when that switch is false and the
-- batch holds a schedule or reschedule (cancel is always allowed). Validation completes
-- before any write: a refused batch writes nothing.
-- Locks: rows of queen.log_timers only (INSERT ... ON CONFLICT / UPDATE / DELETE), taken
-- in (queue, timerKey) order under collation "C" whatever the order of ops, so two
-- concurrent applies cannot deadlock. May wait on a row held by a running claim or fire
-- transaction (this is the user's write path, not the sweeper's).
CREATE OR REPLACE FUNCTION queen.log_timers_apply_v1(
    p_ops jsonb, p_tenant uuid, p_producer_sub text, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    c_max_ops  constant int := 256;
    -- The segment frame carries txn and producer sub lengths as u16 (src/codec/codec.hpp).
    c_max_u16  constant int := 65535;
    v_n        int;
    v_op       record;
    v_kind     text[] := '{}'::text[];
    v_queue    text[] := '{}'::text[];
    v_key      text[] := '{}'::text[];
    v_part     text[] := '{}'::text[];
    v_delay    bigint[] := '{}'::bigint[];
    v_txn      text[] := '{}'::text[];
    v_payload  bytea[] := '{}'::bytea[];
    v_zstd     boolean[] := '{}'::boolean[];
    v_enc      boolean[] := '{}'::boolean[];
    v_order    int[];
    v_results  jsonb[] := '{}'::jsonb[];
    v_dup      record;
    v_i        int;
BEGIN
    IF p_tenant IS NULL OR p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_apply_v1: tenant and now must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM queen.check_now_v1('log_timers_apply_v1', p_now);
    PERFORM queen.check_bytes_v1('log_timers_apply_v1', 'producer_sub', p_producer_sub, c_max_u16,
                                 'the segment frame carries its length as u16');
    IF p_ops IS NULL OR jsonb_typeof(p_ops) <> 'array' THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops must be a JSON array' USING ERRCODE = '22023';
    END IF;
    v_n := jsonb_array_length(p_ops);
    IF v_n > c_max_ops THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops has % operations, at most % per call', v_n, c_max_ops
            USING ERRCODE = '22023';
    END IF;
    IF v_n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;

    -- Validate every op, in index order, before writing anything.
    FOR v_idx IN 0 .. v_n - 1 LOOP
        v_op := queen.log_timers_op_parse_v1(p_ops -> v_idx, v_idx);
        v_kind := v_kind || v_op.kind;
        v_queue := v_queue || v_op.queue;
        v_key := v_key || v_op.timer_key;
        v_part := v_part || v_op.part;
        v_txn := v_txn || v_op.txn;
        v_delay := v_delay || v_op.delay_ms;
        v_payload := v_payload || v_op.payload;
        v_zstd := v_zstd || v_op.zstd;
        v_enc := v_enc || v_op.enc;
    END LOOP;

    -- One op per timer per call.
    SELECT d.ord, d.first_ord INTO v_dup
      FROM (SELECT u.ord,
                   first_value(u.ord) OVER (PARTITION BY u.q, u.k ORDER BY u.ord) AS first_ord
              FROM unnest(v_queue, v_key) WITH ORDINALITY AS u(q, k, ord)) d
     WHERE d.ord <> d.first_ord
     ORDER BY d.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'log_timers_apply_v1: ops[%].timerKey: duplicate (queue, timerKey), already named by ops[%]; one op per timer per call',
            v_dup.ord - 1, v_dup.first_ord - 1 USING ERRCODE = '22023';
    END IF;

    IF ('schedule' = ANY (v_kind) OR 'reschedule' = ANY (v_kind))
       AND NOT queen.switch_enabled_v1('timers_schedule_enabled', true) THEN
        RAISE EXCEPTION 'timers_schedule_enabled is off'
            USING ERRCODE = '55000',
                  HINT = 'an operator paused scheduling (queen.system_state); cancel is still accepted';
    END IF;

    -- Write in (queue, timerKey) order; answer in ops order.
    SELECT array_agg(u.ord::int ORDER BY u.q COLLATE "C", u.k COLLATE "C")
      INTO v_order
      FROM unnest(v_queue, v_key) WITH ORDINALITY AS u(q, k, ord);
    v_results := array_fill(NULL::jsonb, ARRAY[v_n]);

    FOREACH v_i IN ARRAY v_order LOOP
        v_results[v_i] := queen.log_timers_apply_write_v1(
            p_tenant, p_producer_sub, p_now, v_kind[v_i], v_queue[v_i], v_key[v_i], v_part[v_i],
            v_txn[v_i], v_delay[v_i], v_payload[v_i], v_zstd[v_i], v_enc[v_i]);
    END LOOP;

    RETURN to_jsonb(v_results);
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- 2. due and claim, from a floor
-- ---------------------------------------------------------------------------------------
-- A row the fire deleted stays in the due index (due_at) until a vacuum may remove them, and no vacuum may while any snapshot older than
-- them is open (a report, a pg_dump, a session idle in transaction, a standby's
-- hot_standby_feedback). They sit at the index's head, where the drain works: a walk from
-- the head passes every one of them, a cost that grows for as long as the snapshot is
-- held (measured in tests/bench/README.md, "held snapshot"). The floor is where the walk
-- starts instead: an instant no live row is behind. The sweeper keeps it (one per
-- sweeper, in memory; nothing shared, no leader) and passes it to each probe and claim,
-- which answer the next one:
--
--   floor' = least(h, t0 - slack)
--
-- h: the earliest due_at of a live row at or after the floor, as a plain read sees it
-- (a row another claim has locked is seen where it was, so a claim that rolls back leaves
-- its rows in front of the floor, never behind); t0: the caller's now (its transaction's
-- start: every transaction committed before it is in the read's snapshot); slack:
-- log_timers_floor_slack_v1(). Every write puts its row at or after the now it writes with
-- (log_timers_not_before_v1), so a row that commits after the read is at or after
-- t0 - slack unless its transaction committed more than the slack after that now: no row
-- lands behind the floor but such a slow transaction's,
-- and that one the sweeper's walk from the head finds (log_timers_below_floor_v1, on its
-- own clock, off the drain's path). A null floor is the index's head (a sweeper's first
-- probe, a new server after a failover).
--
-- Plans under a held snapshot (schema version 29): ANALYZE counts live rows only, so while a
-- snapshot keeps a million fired rows in the table the planner takes it for the few hundred
-- that live, and a scan of a whole index range looks as cheap as one descent: a bitmap scan
-- reads every entry from the floor (or of a tenant) before the first row is returned, where
-- an index scan in the index's order stops at the LIMIT. So every function that walks the
-- due index (the probe, the claim, its head, the ring, the walk from the head, a lost
-- claim's hand-back) pins enable_seqscan and enable_bitmapscan off: each walk is an index
-- scan from the floor in index order (tests/sql/test_tenant_ring.py asserts the plans with
-- a table ANALYZEd that way). Measured (tests/bench/load --phases held-row, schema version 27,
-- before): the ring's descent planned as a bitmap scan of the whole (tenant_id, due_at)
-- index, 1,062,213 entries, 373 ms.
-- The same estimates make an index scan of log_timers_tenant_due_at_idx bounded on due_at
-- alone (its second column: every entry of the index is read, every tenant's, every dead
-- one) cost what the due index's range costs, and a generic plan may take either. So a
-- statement that walks a range of due_at without naming its tenant orders by due_at, and
-- the functions whose statements all walk so (the probe, a lost claim's hand-back) pin
-- enable_sort off: the tenant index, which would need a sort, is never taken for them.
-- Measured (tests/bench/load --phases held-row, schema version 36, before): the probe's
-- count of the due rows planned so, 16.5 ms a call at minute 29, growing with the index.

-- queen.log_timers_due_v2(shards int2[], now, cap int, floor timestamptz, horizon_ms int)
--   -> jsonb {"now", "nowMs", "nextInMs", "beyond", "due", "dueCapped", "lateMs", "floor",
--             "floorMs", "held", "turnTimeouts", "fireEnabled", "maintenance", "scheduleEnabled"}
--      "nextInMs": ms from now until the next instant something may come due over the given
--                  shards (null shards = all 64), rounded up, 0 when it has passed, null when
--                  nothing is found: the earlier of the first row in nobody's hands and the
--                  earliest lease end of the rows in flight in front of it (a row in flight
--                  is passed by its lease);
--      "due": rows in nobody's hands with due_at <= now, counted up to cap (null cap = 2000);
--      "dueCapped": more than cap exist; "lateMs": now - the earliest of them (0 when none);
--      "fireEnabled" = timers_fire_enabled AND NOT maintenance_mode; "maintenance",
--      "scheduleEnabled": the switches;
--      "floor", "floorMs": the floor the next probe and claim start from (only with every
--                          shard; with a subset, the floor given back unchanged);
--      "beyond": true when horizon_ms bounded the search for the next row and none was
--                found within now + horizon_ms (nextInMs is then null, and the table may
--                still hold rows further out: not the same as empty);
--      "held": the rows of queen.log_timers_held that are due and in nobody's hands (not
--               counted in due: the walks pass them; the claim tries them by key);
--      "turnTimeouts": claims of the whole fleet that walked without the claim turn because
--                      its wait ran out, since the schema was created (a counter).
-- The walks start at the floor (null: the index's head) and pass a listed held row. The search for the next row stops
-- at now + horizon_ms (null: no bound).
-- Read-only. Locks: none. Refused with 22023: null now.
CREATE OR REPLACE FUNCTION queen.log_timers_due_v2(p_shards int2[], p_now timestamptz, p_cap int,
                                                   p_floor timestamptz, p_horizon_ms int)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_bitmapscan = off  -- "Plans under a held snapshot" (section 2)
SET enable_sort = off  -- every walk in the due index's order ("Plans under a held snapshot")
-- Planned once per session, as the claim (log_timers_claim_v4): every
-- statement here walks the due index by range, and the probe runs once a cycle on every
-- broker, idle or not.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    -- now is the caller's now() (its transaction's start): every transaction committed
    -- before it is in the snapshot this STABLE function reads with.
    v_t0      timestamptz := p_now;
    v_from    timestamptz := coalesce(p_floor, '-infinity');
    v_shards  int2[];
    v_all     boolean;
    v_cap     int := greatest(coalesce(p_cap, 2000), 0);
    v_until   timestamptz;
    v_first   timestamptz;
    v_head    timestamptz;
    v_lease   timestamptz;
    v_due     bigint := 0;
    v_floor   timestamptz;
    v_fire    boolean;
    v_maint   boolean;
    v_listed  boolean := EXISTS (SELECT 1 FROM queen.log_timers_held);
    v_held    bigint := 0;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_due_v2: now must not be null' USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(DISTINCT s) INTO v_shards
      FROM unnest(coalesce(p_shards, queen.all_shards_v1())) AS s
     WHERE s BETWEEN 0 AND 63;
    v_all := coalesce(cardinality(v_shards), 0) = 64;
    v_until := CASE WHEN p_horizon_ms IS NULL THEN 'infinity'::timestamptz
                    ELSE p_now + greatest(p_horizon_ms, 0) * interval '1 millisecond' END;

    IF v_all OR v_shards IS NOT NULL THEN
        -- The first live row at or after the floor, in flight or not: the floor's h.
        SELECT t.due_at INTO v_first
          FROM queen.log_timers t
         WHERE t.due_at >= v_from AND t.due_at <= v_until
           AND (v_all OR t.shard = ANY (v_shards))
           AND (NOT v_listed OR NOT EXISTS (
                   SELECT 1 FROM queen.log_timers_held h
                    WHERE h.tenant_id = t.tenant_id AND h.queue = t.queue
                      AND h.timer_key = t.timer_key AND h.due_at = t.due_at))
         ORDER BY t.due_at
         LIMIT 1;
    END IF;
    IF v_listed THEN
        -- The listed held rows that are due and in nobody's hands: the claim tries them by
        -- key (their lock may be gone); they are not in "due", which counts the walk's.
        -- By key, one primary-key lookup per listed row (OFFSET 0 keeps the sublink from
        -- becoming a join, which a generic plan may hash over the whole due index).
        SELECT count(*) INTO v_held
          FROM queen.log_timers_held h
         WHERE EXISTS (SELECT 1 FROM queen.log_timers t
                        WHERE t.tenant_id = h.tenant_id AND t.queue = h.queue AND t.timer_key = h.timer_key
                          AND t.due_at = h.due_at AND t.due_at <= p_now
                          AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
                          AND (v_all OR t.shard = ANY (v_shards))
                       OFFSET 0);
    END IF;

    IF v_first IS NOT NULL THEN
        -- The first row in nobody's hands: the rows in flight at the head are passed by
        -- their lease (a bounded number: what the brokers hold at once).
        SELECT t.due_at INTO v_head
          FROM queen.log_timers t
         WHERE t.due_at >= v_first AND t.due_at <= v_until
           AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
           AND (v_all OR t.shard = ANY (v_shards))
           AND (NOT v_listed OR NOT EXISTS (
                   SELECT 1 FROM queen.log_timers_held h
                    WHERE h.tenant_id = t.tenant_id AND h.queue = t.queue
                      AND h.timer_key = t.timer_key AND h.due_at = t.due_at))
         ORDER BY t.due_at
         LIMIT 1;
        IF v_head IS NULL OR v_head > p_now THEN
            -- Nothing due in nobody's hands: the earliest lease end of the rows in flight
            -- (claimed at or before now, so all of them sit at a due_at <= now) is an
            -- instant something may come due (a broker that dies lets its lease lapse).
            SELECT min(f.claimed_until) INTO v_lease
              FROM (SELECT t.claimed_until
                      FROM queen.log_timers t
                     WHERE t.due_at >= v_first AND t.due_at <= least(coalesce(v_head, v_until), p_now)
                       AND t.claim_token IS NOT NULL AND t.claimed_until > p_now
                       AND (v_all OR t.shard = ANY (v_shards))
                     ORDER BY t.due_at) f;  -- the due index's range ("Plans under a held snapshot")
        END IF;
    END IF;

    IF v_head IS NOT NULL AND v_head <= p_now THEN
        SELECT count(*) INTO v_due
          FROM (SELECT 1
                  FROM queen.log_timers t
                 WHERE t.due_at >= v_head AND t.due_at <= p_now
                   AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
                   AND (v_all OR t.shard = ANY (v_shards))
                 ORDER BY t.due_at  -- the due index's range ("Plans under a held snapshot")
                 LIMIT v_cap::bigint + 1) d;
    END IF;

    v_floor := CASE WHEN v_all
                    THEN least(coalesce(v_first, 'infinity'::timestamptz),
                               v_t0 - queen.log_timers_floor_slack_v1(),
                               -- with a bounded search, nothing is known past its end
                               v_until)
                    ELSE p_floor END;
    IF p_floor IS NOT NULL AND v_floor < p_floor THEN
        v_floor := p_floor;  -- a clock stepped back: the floor never moves back by itself
    END IF;

    v_fire := queen.switch_enabled_v1('timers_fire_enabled', true);
    v_maint := queen.switch_enabled_v1('maintenance_mode', false);

    RETURN jsonb_build_object(
        'now', p_now,
        'nowMs', queen.epoch_ms_v1(p_now),
        'nextInMs', CASE WHEN coalesce(v_head, v_lease) IS NULL THEN NULL
                         ELSE greatest(0, ceil(extract(epoch FROM (least(v_head, v_lease) - p_now)) * 1000))::bigint END,
        'beyond', coalesce(v_head, v_lease) IS NULL AND p_horizon_ms IS NOT NULL,
        'due', least(v_due, v_cap),
        'dueCapped', v_due > v_cap,
        'lateMs', CASE WHEN v_due > 0
                       THEN floor(extract(epoch FROM (p_now - v_head)) * 1000)::bigint
                       ELSE 0 END,
        'floor', v_floor,
        'floorMs', CASE WHEN v_floor IS NULL OR NOT isfinite(v_floor) THEN NULL ELSE queen.epoch_ms_v1(v_floor) END,
        'held', v_held,
        'turnTimeouts', (SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END
                           FROM queen.log_timers_turn_timeouts s),
        'fireEnabled', v_fire AND NOT v_maint,
        'maintenance', v_maint,
        'scheduleEnabled', queen.switch_enabled_v1('timers_schedule_enabled', true));
END
$fn$;

-- queen.log_timers_below_floor_v1(from timestamptz, until timestamptz) -> bigint or null
-- The due_at (Unix ms, rounded down) of the earliest row with from <= due_at < until (null
-- from: the index's head) that is not listed in queen.log_timers_held, or null when there is
-- none: one slice of the walk from the index's head that finds a slow transaction's row
-- behind the floor (see section 2). It passes every dead entry of its slice, so the sweeper
-- walks [head, floor) a slice at a time, each slice sized to take a few milliseconds and
-- followed by a pause 20 times as long, on a clock of its own, never on the drain's path, and
-- lowers its floor to what a slice finds (src/sweeper/floor.hpp, "the walk from the head").
-- Read-only. Locks: none. Null until: null.
CREATE OR REPLACE FUNCTION queen.log_timers_below_floor_v1(p_from timestamptz, p_until timestamptz)
RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_bitmapscan = off  -- "Plans under a held snapshot" (section 2)
AS $fn$
    SELECT queen.epoch_ms_v1(t.due_at)
      FROM queen.log_timers t
     WHERE t.due_at >= coalesce(p_from, '-infinity')
       AND t.due_at < p_until
       AND NOT EXISTS (SELECT 1 FROM queen.log_timers_held h
                        WHERE h.tenant_id = t.tenant_id AND h.queue = t.queue
                          AND h.timer_key = t.timer_key AND h.due_at = t.due_at)
     ORDER BY t.due_at
     LIMIT 1
$fn$;

-- queen.log_timers_take_turn_v1() -> boolean: the claim turn ("The turn" in
-- log_timers_claim_v4's header): the one row of queen.log_timers_claim_turn
-- locked FOR UPDATE for the caller's transaction, waited for under a 50 ms lock_timeout
-- (PostgreSQL applies it to each of a row lock's two waits, for a place in the row's queue
-- and then for its holder: 100 ms at the very worst). True when had;
-- false when the wait ran out (counted: nextval of queen.log_timers_turn_timeouts) or the
-- row is missing, and then nothing is held: the failed try is a subtransaction, undone with
-- the lock_timeout it set. The caller's lock_timeout
-- is its own again either way. An internal helper (SECURITY INVOKER, granted to nobody).
-- Locks: that row, FOR UPDATE (waits under a 50 ms lock_timeout).
CREATE OR REPLACE FUNCTION queen.log_timers_take_turn_v1()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_lt  text := current_setting('lock_timeout');
    v_had boolean := false;
BEGIN
    BEGIN
        PERFORM pg_catalog.set_config('lock_timeout', '50ms', true);
        SELECT true INTO v_had FROM queen.log_timers_claim_turn c WHERE c.id = 1 FOR UPDATE;
        PERFORM pg_catalog.set_config('lock_timeout', v_lt, true);
    EXCEPTION WHEN lock_not_available THEN
        v_had := false;
        PERFORM nextval('queen.log_timers_turn_timeouts');
    END;
    RETURN coalesce(v_had, false);
END
$fn$;

-- queen.log_timers_claim_check_v1(now, lease_ms, skip_tenants, skip_queues, skip_partitions)
-- The claim's refusals (log_timers_claim_v4), with 22023: a null now, lease_ms < 1, skip
-- arrays of different lengths. Internal to the claim (granted to no role). Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_claim_check_v1(p_now timestamptz, p_lease_ms int,
    p_skip_tenants uuid[], p_skip_queues text[], p_skip_partitions text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_claim: now must not be null' USING ERRCODE = '22023';
    END IF;
    IF p_lease_ms IS NULL OR p_lease_ms < 1 THEN
        RAISE EXCEPTION 'log_timers_claim: lease_ms must be at least 1 (got %)', p_lease_ms
            USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_skip_partitions), 0) > 0
       AND (coalesce(cardinality(p_skip_tenants), 0) <> cardinality(p_skip_partitions)
            OR coalesce(cardinality(p_skip_queues), 0) <> cardinality(p_skip_partitions)) THEN
        RAISE EXCEPTION 'log_timers_claim: skip_tenants, skip_queues and skip_partitions must line up (% / % / % elements)',
            coalesce(cardinality(p_skip_tenants), 0), coalesce(cardinality(p_skip_queues), 0),
            cardinality(p_skip_partitions) USING ERRCODE = '22023';
    END IF;
END
$fn$;

-- queen.log_timers_tenants_after_v1(after uuid, n int) -> uuid[]: the next n (1 to 1,024)
-- entries of the tenants' ring (queen.log_timers_tenants) in ring order: those after `after`
-- in uuid order, then from the ring's start up to `after` itself. Shared by the ring and its
-- tidy. Internal (granted to no role). Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_tenants_after_v1(p_after uuid, p_n int)
RETURNS uuid[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off
AS $fn$
DECLARE
    v_n    int := least(greatest(coalesce(p_n, 1), 1), 1024);
    v_look uuid[];
BEGIN
    v_look := ARRAY(SELECT r.tenant_id FROM queen.log_timers_tenants r WHERE r.tenant_id > p_after
                     ORDER BY r.tenant_id LIMIT v_n);
    IF cardinality(v_look) < v_n THEN
        v_look := v_look || ARRAY(SELECT r.tenant_id FROM queen.log_timers_tenants r
                                   WHERE r.tenant_id <= p_after
                                   ORDER BY r.tenant_id LIMIT v_n - cardinality(v_look));
    END IF;
    RETURN v_look;
END
$fn$;

-- queen.log_timers_tenant_ring_v1(now timestamptz, floor timestamptz, turn boolean,
--                                  name int) -> uuid[]
-- The tenants a claim under a backlog serves first (log_timers_claim_v4, "the ring"): the
-- tenants with pending timers (queen.log_timers_tenants), in uuid order, form one ring for
-- the whole fleet. From the fleet's place (queen.log_timers_ring_place_hi and _lo; with turn
-- false, or no place yet: after a random uuid), it looks at the next tenants in ring order,
-- at most 1,024 a call, and names those whose first row at or after floor is due (in flight
-- or not), at most name (1 to 64), in ring order. With turn (the caller holds the claim
-- turn, so the place is its own), the place moves to the last tenant named when name were
-- named, else to the last looked at: the next claim, on any broker, goes on from there.
-- Looking at a tenant is one descent of log_timers_tenant_due_at_idx from (tenant, floor);
-- the ring itself is read from queen.log_timers_tenants, where nothing churns, so neither
-- passes the tenants' fired rows that a snapshot held elsewhere keeps (only those between
-- the floor and the first live row). Every tenant with due rows is named at least once
-- every ceil(T / 1024) claims (T: tenants with pending timers) and every ceil(D / name)
-- (D: tenants with due rows).
-- Internal to the claim: runs in its transaction, as its owner (granted to no role).
-- Locks: none (the place's sequences are set only with the turn, which the caller holds).
CREATE OR REPLACE FUNCTION queen.log_timers_tenant_ring_v1(p_now timestamptz, p_floor timestamptz,
                                                         p_turn boolean, p_name int)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_sort = off SET enable_incremental_sort = off  -- each read in the order of the index that serves it
AS $fn$
DECLARE
    v_start uuid;
    v_look  uuid[];
    v_named uuid[];
    v_name  int := least(greatest(coalesce(p_name, 1), 1), 64);
    v_last  uuid;
    v_from  timestamptz := coalesce(p_floor, '-infinity'::timestamptz);
BEGIN
    IF p_turn THEN
        SELECT (lpad(to_hex(h.last_value), 16, '0') || lpad(to_hex(l.last_value), 16, '0'))::uuid INTO v_start
          FROM queen.log_timers_ring_place_hi h, queen.log_timers_ring_place_lo l
         WHERE h.is_called AND l.is_called;
    END IF;
    v_start := coalesce(v_start, gen_random_uuid());
    v_look := queen.log_timers_tenants_after_v1(v_start, 1024);
    -- Those with a due row, in ring order (unnest yields the array in order; the LIMIT stops
    -- the descents at the name-th). A scalar subquery in index order, not EXISTS: a semi-join
    -- may be planned as one scan of the whole index, which the planner prices at nothing when
    -- ANALYZE saw only the live rows of a table a held snapshot fills with dead ones (300 ms
    -- a ring measured, tests/sql/test_tenant_ring.py).
    v_named := ARRAY(SELECT u.tn FROM unnest(v_look) AS u(tn)
                      WHERE (SELECT t.due_at FROM queen.log_timers t
                              WHERE (t.tenant_id, t.due_at) >= (u.tn, v_from)
                                AND (t.tenant_id, t.due_at) <= (u.tn, p_now)
                              ORDER BY t.tenant_id, t.due_at LIMIT 1) IS NOT NULL
                      LIMIT v_name);
    v_last := CASE WHEN cardinality(v_named) >= v_name THEN v_named[cardinality(v_named)]
                   ELSE v_look[cardinality(v_look)] END;
    IF p_turn AND v_last IS NOT NULL THEN
        PERFORM setval('queen.log_timers_ring_place_hi',
                       ('x' || substr(replace(v_last::text, '-', ''), 1, 16))::bit(64)::bigint),
                setval('queen.log_timers_ring_place_lo',
                       ('x' || substr(replace(v_last::text, '-', ''), 17, 16))::bit(64)::bigint);
    END IF;
    RETURN v_named;
END
$fn$;

-- queen.log_timers_tenants_tidy_v1(max int) -> jsonb {"looked": n, "removed": n, "tenants": n}
-- Removes from the tenants' ring (queen.log_timers_tenants) the tenants that have no timer
-- left: looks at up to max (1 to 1,024) entries from a random place in uuid order and deletes
-- each whose tenant has no row in queen.log_timers; tenants: the entries left. The sweeper
-- calls it beside the cycle (the KV prune's sub-clock, every 10 s), never on the drain's
-- path: the test of a tenant's rows passes the dead entries of its fired rows that a snapshot
-- held elsewhere keeps, one descent of the primary key otherwise.
-- The race it leaves, and what it costs: a transaction of that tenant that found the entry
-- present at its commit (log_timers_at_commit_v1 locks nothing) and became visible between
-- the delete and the second look this function takes after it (a fresh snapshot): its
-- tenant is out of the ring until its next commit enters it again, and its rows are reached
-- oldest first meanwhile. Locks: the entries it deletes (a concurrent tidy's are passed).
CREATE OR REPLACE FUNCTION queen.log_timers_tenants_tidy_v1(p_max int)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off
AS $fn$
DECLARE
    v_max     int := least(greatest(coalesce(p_max, 1), 1), 1024);
    v_start   uuid := gen_random_uuid();
    v_look    uuid[];
    v_tn      uuid;
    v_removed int := 0;
BEGIN
    v_look := queen.log_timers_tenants_after_v1(v_start, v_max);
    FOREACH v_tn IN ARRAY v_look LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM queen.log_timers t WHERE t.tenant_id = v_tn);
        DELETE FROM queen.log_timers_tenants r
         WHERE r.ctid = (SELECT x.ctid FROM queen.log_timers_tenants x WHERE x.tenant_id = v_tn
                           FOR UPDATE SKIP LOCKED);
        CONTINUE WHEN NOT FOUND;
        -- A second look, with a snapshot taken after the delete: a commit that landed
        -- between the two puts its tenant back.
        IF EXISTS (SELECT 1 FROM queen.log_timers t WHERE t.tenant_id = v_tn) THEN
            INSERT INTO queen.log_timers_tenants (tenant_id) VALUES (v_tn)
            ON CONFLICT (tenant_id) DO NOTHING;
        ELSE
            v_removed := v_removed + 1;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('looked', cardinality(v_look), 'removed', v_removed,
                              'tenants', (SELECT count(*) FROM queen.log_timers_tenants));
END
$fn$;

-- queen.log_timers_claim_head_v1(floor timestamptz, now timestamptz, walk boolean)
--   -> (head timestamptz, listed boolean)
-- The claim's first steps (log_timers_claim_v4, "the floor" and "the held rows"):
-- * the entries of queen.log_timers_held whose row is gone or no longer waits at the due_at
--   listed are deleted (FOR UPDATE SKIP LOCKED: another claim tidying them is passed);
-- * with walk (the claim covers every shard): head is the earliest live row at or after
--   floor (null: the index's head) that is not listed. When that row is due and in nobody's
--   hands it is locked here, FOR UPDATE SKIP LOCKED (the claim's walk then takes it, already
--   this transaction's); when someone else's transaction holds it, it is listed (at most 64
--   in all) and the next one read, at most 4 a call. Null: none (or no walk);
-- * listed: whether the list holds anything now.
-- Internal to the claim: runs in its transaction, as its owner (granted to no role).
-- Locks: entries of queen.log_timers_held and one row of queen.log_timers, SKIP LOCKED
-- (never waits; the insert of an entry another claim is inserting waits for that claim).
CREATE OR REPLACE FUNCTION queen.log_timers_claim_head_v1(p_floor timestamptz, p_now timestamptz,
                                                          p_walk boolean,
                                                          OUT head timestamptz, OUT listed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_bitmapscan = off  -- "Plans under a held snapshot" (section 2)
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    v_tid  tid;
    v_tn   uuid;
    v_q    text;
    v_k    text;
    v_due  boolean;
BEGIN
    listed := EXISTS (SELECT 1 FROM queen.log_timers_held);
    IF listed THEN
        DELETE FROM queen.log_timers_held h
         WHERE h.ctid = ANY (ARRAY(
                SELECT x.ctid FROM queen.log_timers_held x
                 WHERE NOT EXISTS (SELECT 1 FROM queen.log_timers t  -- by key (OFFSET 0: no join)
                                    WHERE t.tenant_id = x.tenant_id AND t.queue = x.queue
                                      AND t.timer_key = x.timer_key AND t.due_at = x.due_at
                                   OFFSET 0)
                   FOR UPDATE SKIP LOCKED));
        listed := EXISTS (SELECT 1 FROM queen.log_timers_held);
    END IF;
    IF NOT coalesce(p_walk, false) THEN
        RETURN;
    END IF;
    FOR v_i IN 1 .. 4 LOOP
        SELECT t.due_at, t.ctid, t.tenant_id, t.queue, t.timer_key,
               t.due_at <= p_now AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
          INTO head, v_tid, v_tn, v_q, v_k, v_due
          FROM queen.log_timers t
         WHERE t.due_at >= coalesce(p_floor, '-infinity')
           AND (NOT listed OR NOT EXISTS (
                   SELECT 1 FROM queen.log_timers_held h
                    WHERE h.tenant_id = t.tenant_id AND h.queue = t.queue
                      AND h.timer_key = t.timer_key AND h.due_at = t.due_at))
         ORDER BY t.due_at
         LIMIT 1;
        EXIT WHEN head IS NULL OR NOT v_due;
        PERFORM 1 FROM queen.log_timers t WHERE t.ctid = v_tid FOR UPDATE SKIP LOCKED;
        EXIT WHEN FOUND;
        EXIT WHEN (SELECT count(*) FROM queen.log_timers_held) >= 64;
        INSERT INTO queen.log_timers_held (tenant_id, queue, timer_key, due_at, listed_at)
        VALUES (v_tn, v_q, v_k, head, p_now)
        ON CONFLICT (tenant_id, queue, timer_key) DO NOTHING;
        listed := true;
    END LOOP;
END
$fn$;

-- queen.log_timers_held_due_v1(now timestamptz, shards int2[], skip_tenants uuid[],
--                              skip_queues text[], skip_partitions text[], max_rows int)
--   -> table(tid, ct, cq, ck, cv, cd, cb): the claim's pool columns
-- The listed held rows (queen.log_timers_held), by key, where they were listed: due, in
-- nobody's hands and free now (a host's transaction that ended leaves its row to be taken
-- here), oldest first, up to max_rows, locked FOR UPDATE SKIP LOCKED; shards and skip_* as
-- log_timers_claim_v4's (null shards: every shard). Internal to the claim, in its
-- transaction (granted to no role). Locks: those rows (SKIP LOCKED, never waits).
CREATE OR REPLACE FUNCTION queen.log_timers_held_due_v1(
    p_now timestamptz, p_shards int2[], p_skip_tenants uuid[], p_skip_queues text[],
    p_skip_partitions text[], p_max_rows int)
RETURNS TABLE (tid tid, ct uuid, cq text, ck text, cv timestamptz, cd timestamptz, cb bigint)
LANGUAGE sql
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    -- By key: one primary-key lookup per listed row (a LATERAL subquery that locks is never
    -- flattened into a join, which a generic plan may hash over the whole due index).
    SELECT x.tid, x.ct, x.cq, x.ck, x.cv, x.cd, x.cb
      FROM queen.log_timers_held h
      CROSS JOIN LATERAL (
            SELECT t.ctid AS tid, t.tenant_id AS ct, t.queue AS cq, t.timer_key AS ck, t.due_at AS cv,
                   t.deliver_at AS cd, octet_length(t.payload)::bigint AS cb
              FROM queen.log_timers t
             WHERE t.tenant_id = h.tenant_id AND t.queue = h.queue AND t.timer_key = h.timer_key
               AND t.due_at = h.due_at AND t.due_at <= p_now
               AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
               AND (p_shards IS NULL OR t.shard = ANY (p_shards))
               AND NOT EXISTS (
                       SELECT 1 FROM unnest(p_skip_tenants, p_skip_queues, p_skip_partitions) AS k(st, sq, sp)
                        WHERE k.st = t.tenant_id AND k.sq = t.queue AND k.sp = t.partition)
               FOR UPDATE SKIP LOCKED) x
     ORDER BY x.cv
     LIMIT p_max_rows
$fn$;

-- queen.log_timers_claim_v4(shards int2[], now, lease_ms int, max_rows int, per_tenant int,
--                           max_bytes bigint, claim_id uuid, skip_tenants uuid[],
--                           skip_queues text[], skip_partitions text[], floor timestamptz,
--                           tenants uuid[])
--   -> table(tenant_id uuid, queue text, timer_key text, partition text, txn text,
--            message_id uuid, payload bytea, payload_zstd bool, encrypted bool,
--            producer_sub text, claim_token uuid, deliver_at_ms bigint, late_ms bigint,
--            attempts int, floor_ms bigint, row_tid tid)
-- Takes due rows (due_at <= now and in nobody's hands), oldest first, and puts them in the
-- caller's hands for lease_ms:
-- * the floor: a plain read finds the earliest live row at or after the given floor (h),
--   passing a row listed in queen.log_timers_held; when h is due and in nobody's hands it is
--   locked (FOR UPDATE SKIP LOCKED) and, when someone else holds it, listed there and the
--   next row read (at most 4 a claim; at most 64 listed in all). floor_ms (the same on
--   every row) is the floor the next call starts from: least(h, now - slack) (see above; a
--   floor given with a subset of shards is kept as it is). The ring, the shares and the
--   oldest-first walk start at h, not at the floor: nothing live is between them but listed
--   rows (taken by key) and rows committed after the head's read (at or after the floor
--   answered, rule 3: the next probe or claim finds them), so the fired rows a snapshot held
--   elsewhere keeps inside the slack are passed once a claim, by the head's read;
-- * the held rows: entries of queen.log_timers_held whose row is gone or no longer at the
--   due_at listed are deleted; the listed rows due, in nobody's hands and free now are taken
--   by key (FOR UPDATE SKIP LOCKED) into the pool, in front of the walk's;
-- * the ring (tenants not null: the caller has a backlog, more due than one claim takes;
--   every shard): the tenants named from the fleet's ring of tenants
--   (log_timers_tenant_ring_v1: with due rows, as many as can have a share of
--   least(per_tenant, 32), at most 64, from where the last claim holding
--   the turn left off; that place moves with this claim when it holds the turn). When the
--   ring names two or more, they are named with those given in tenants (at most 64 in all);
--   one tenant's backlog is served by the oldest-first walk alone. Null tenants: no ring;
-- * the pool: first, for each tenant named (at most 64), its own oldest due rows in nobody's
--   hands, up to its share, least(per_tenant, max_rows / tenants named) and at least 1, by
--   log_timers_tenant_due_at_idx, FOR UPDATE SKIP LOCKED; then the oldest due rows in one
--   walk of the due index, up to what the shares leave of max_rows, passing the shares'
--   rows, FOR UPDATE SKIP LOCKED. A tenant's share is written as
--   one range of that index, (tenant, floor) <= (tenant_id, due_at) <= (tenant, now) in row
--   comparisons ordered by (tenant_id, due_at), not as tenant_id = tenant: with the
--   equality the planner may walk the due index filtering on the tenant, through the whole
--   of another tenant's backlog first (measured 2026-12-01: 333 ms behind 1M rows, 3.8 s
--   behind 10M, tests/bench/load --phases tenants). shards: null = every shard (the
--   sweeper's case); a non-null array is a filter on the walk, not an order;
-- The rule between tenants: under a backlog every tenant with due rows gets an equal share
-- of the claims that name it, and every one is named in turn; within a tenant, oldest first.
-- A tenant with a few due timers behind other tenants' backlogs is reached within
-- ceil(D / K) claims (K = least(64, max_rows / least(per_tenant, 32)) named a claim; D:
-- tenants with due rows; at most ceil(T / 256), T: tenants with pending timers, while most of
-- them have nothing due), and up to 32 of its timers go in the claim that names it.
-- * the choice: when the whole pool fits max_rows and the byte budget, all of it;
--   otherwise per_tenant rows per tenant (null, < 1 or >= max_rows: no share), round by
--   round, oldest first within each round (by due_at, then deliver_at: timers written at
--   once with a deliverAt in the past share a due_at and go by their deliverAt), up to
--   max_rows rows and, in the same order, max_bytes of payload (octet_length, read from the
--   row's header: a TOASTed payload is not fetched to be measured; the first row is always
--   taken, each later one while the running sum stays within max_bytes; null or < 1: no
--   byte budget). Pool rows not chosen stay locked until the caller's transaction ends;
-- * skip_*: (tenant, queue, partition) triples, element by element, whose rows the walks
--   pass over (null or empty: none): the partitions someone else holds right now (a push,
--   another broker's fire), whose claimed rows the caller is already keeping;
-- * the claim: every chosen row gets claim_token = claim_id (unique, a random v4 uuid: what
--   the fire and the release match, and what log_timers_release_claims_v2 names when the
--   answer was lost) or, with a null claim_id, a fresh token of its own; claimed_until =
--   now + lease_ms (one instant for the whole claim); claim_due = its due_at (the row stays
--   where it waits: the UPDATE changes no indexed column, heap-only). Rows come back in
--   their due_at order; late_ms = now - deliver_at; row_tid is the address of the row
--   version this claim wrote, which the fire takes back (log_timers_fire_v2) to find the
--   row without a descent of the primary key (a hint only: the fire checks what it finds
--   there, and goes by key when the row has moved).
-- Returns nothing when max_rows is null or < 1, timers_fire_enabled is false or
-- maintenance_mode is true. Refused with 22023: null now, lease_ms < 1, skip arrays of
-- different lengths.
-- Plans: generic, made once per session, as the fire's (003): a custom plan was made afresh
-- on every call (1.7 ms a claim with one broker, 2.1-2.7 ms with four;
-- pg_stat_statements.track_planning, tests/bench/README.md "Ninth pass"), estimating its
-- ranges by reading the index's live ends past the rows in flight and the dead entries at
-- its head. Every statement walks one of the two due indexes by range (enable_seqscan off),
-- which a generic plan keeps. Incremental sorts are off: without the values of its range, a
-- generic plan otherwise takes a tenant's share through the primary key (its tenant_id
-- prefix) and sorts every row the tenant has by due_at (tests/sql/test_floor.py asserts the
-- share's index).
-- The turn: before its walk, the claim locks the one row of queen.log_timers_claim_turn
-- FOR UPDATE, waiting for it under a 50 ms lock_timeout (log_timers_take_turn_v1: 100 ms at
-- the very worst), and keeps it until its transaction ends. Claims sent at the same moment
-- by several brokers then walk the due index one after the other: each one's snapshot is
-- taken once the claim before it has committed, so it passes that claim's rows by their
-- lease, a filter on a page already read. Without the turn they walked through each
-- other's rows: a row another claim was locking cost a lock attempt to be skipped, and a
-- row another claim committed during the walk was followed to its new version and LOCKED
-- there before being dropped, its lock held until this claim's commit, where it stopped
-- the owner's fire (lock_timeout 1 ms) from deleting the row. Four sweepers on one backlog:
-- about 15,800 such locks for 60,000 timers fired, and 8.5 shared-buffer pages per timer in
-- the claim against 6.4 for one sweeper (tests/bench/README.md, "Thirteenth pass"). A claim
-- that has not had the turn by then walks without it; a failed try takes nothing with it
-- (a subtransaction). The turn decides no ownership and no order.
-- Locks: the row of queen.log_timers_claim_turn, FOR UPDATE (the bounded wait above);
-- rows of queen.log_timers, FOR UPDATE SKIP LOCKED (never waits); the floor's read takes
-- none.
CREATE OR REPLACE FUNCTION queen.log_timers_claim_v4(
    p_shards int2[], p_now timestamptz, p_lease_ms int, p_max_rows int, p_per_tenant int,
    p_max_bytes bigint, p_claim_id uuid, p_skip_tenants uuid[], p_skip_queues text[],
    p_skip_partitions text[], p_floor timestamptz, p_tenants uuid[])
RETURNS TABLE (tenant_id uuid, queue text, timer_key text, partition text, txn text,
               message_id uuid, payload bytea, payload_zstd boolean, encrypted boolean,
               producer_sub text, claim_token uuid, deliver_at_ms bigint, late_ms bigint,
               attempts int, floor_ms bigint, row_tid tid)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_bitmapscan = off  -- "Plans under a held snapshot" (section 2)
SET plan_cache_mode = force_generic_plan SET enable_incremental_sort = off  -- "Plans" above
AS $fn$
#variable_conflict use_column
DECLARE
    v_per      int;
    v_all      boolean;
    v_bytes    bigint := CASE WHEN p_max_bytes IS NULL OR p_max_bytes < 1 THEN NULL ELSE p_max_bytes END;
    v_skip     boolean := coalesce(cardinality(p_skip_partitions), 0) > 0;
    v_tenants  uuid[];
    v_head     timestamptz;
    v_floor    timestamptz := p_floor;
    v_from     timestamptz;  -- where the walks start
    v_floor_ms bigint;
    v_listed   boolean := false;
    v_turn     boolean;
    v_ring     uuid[];
    v_share    int;
BEGIN
    PERFORM queen.log_timers_claim_check_v1(p_now, p_lease_ms, p_skip_tenants, p_skip_queues, p_skip_partitions);
    IF p_max_rows IS NULL OR p_max_rows < 1 OR NOT queen.switch_enabled_v1('timers_fire_enabled', true)
       OR queen.switch_enabled_v1('maintenance_mode', false) THEN
        RETURN;
    END IF;

    v_per := CASE WHEN p_per_tenant IS NULL OR p_per_tenant < 1 OR p_per_tenant >= p_max_rows
                  THEN p_max_rows ELSE p_per_tenant END;
    v_all := p_shards IS NULL
             OR (SELECT count(DISTINCT s) FROM unnest(p_shards) AS s WHERE s BETWEEN 0 AND 63) = 64;
    SELECT array_agg(DISTINCT u) INTO v_tenants
      FROM (SELECT u FROM unnest(p_tenants) AS u WHERE u IS NOT NULL LIMIT 64) x;
    v_turn := queen.log_timers_take_turn_v1();  -- "The turn" above
    -- The held rows' list tidied, and the head ("The held rows" above; the floor never moves back).
    SELECT h.head, h.listed INTO v_head, v_listed FROM queen.log_timers_claim_head_v1(p_floor, p_now, v_all) h;
    IF v_all THEN
        v_floor := greatest(p_floor, least(coalesce(v_head, 'infinity'::timestamptz),
                                           p_now - queen.log_timers_floor_slack_v1()));
    END IF;
    v_floor_ms := CASE WHEN v_floor IS NULL THEN NULL ELSE queen.epoch_ms_v1(v_floor) END;
    v_from := CASE WHEN v_all THEN greatest(v_head, v_floor) ELSE v_floor END;  -- the walks' start: "the floor" above
    IF p_tenants IS NOT NULL AND v_all THEN  -- a backlog: "The ring" above
        -- As many as can have a share of 32 (a handful of timers in one naming), up to 64.
        v_ring := queen.log_timers_tenant_ring_v1(p_now, v_from, v_turn, p_max_rows / least(v_per, 32));
        IF cardinality(v_ring) > 1 THEN
            v_tenants := ARRAY(SELECT DISTINCT u FROM unnest(v_ring || v_tenants) AS u LIMIT 64);
        END IF;
    END IF;
    v_share := greatest(1, least(v_per, p_max_rows / greatest(cardinality(v_tenants), 1)));

    RETURN QUERY
    WITH shares AS MATERIALIZED (
        SELECT s.*
          FROM unnest(coalesce(v_tenants, '{}'::uuid[])) AS u(tn)
          CROSS JOIN LATERAL (
                SELECT t.ctid AS tid, t.tenant_id AS ct, t.queue AS cq, t.timer_key AS ck,
                       t.due_at AS cv, t.deliver_at AS cd, octet_length(t.payload)::bigint AS cb
                  FROM queen.log_timers t
                 -- One range of log_timers_tenant_due_at_idx (see the header: not tenant_id = tn).
                 WHERE (t.tenant_id, t.due_at) >= (u.tn, coalesce(v_from, '-infinity'))
                   AND (t.tenant_id, t.due_at) <= (u.tn, p_now)
                   AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
                   AND (v_all OR t.shard = ANY (p_shards))
                   AND (NOT v_skip OR NOT EXISTS (
                           SELECT 1 FROM unnest(p_skip_tenants, p_skip_queues, p_skip_partitions) AS k(st, sq, sp)
                            WHERE k.st = t.tenant_id AND k.sq = t.queue AND k.sp = t.partition))
                 ORDER BY t.tenant_id, t.due_at
                 LIMIT v_share
                   FOR UPDATE SKIP LOCKED) s
    ), oldest AS MATERIALIZED (
        SELECT t.ctid AS tid, t.tenant_id AS ct, t.queue AS cq, t.timer_key AS ck, t.due_at AS cv,
               t.deliver_at AS cd, octet_length(t.payload)::bigint AS cb
          FROM queen.log_timers t
         WHERE t.due_at <= p_now
           AND t.due_at >= coalesce(v_from, '-infinity')
           AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
           AND (v_all OR t.shard = ANY (p_shards))
           AND (NOT v_skip OR NOT EXISTS (
                   SELECT 1 FROM unnest(p_skip_tenants, p_skip_queues, p_skip_partitions) AS k(st, sq, sp)
                    WHERE k.st = t.tenant_id AND k.sq = t.queue AND k.sp = t.partition))
           AND t.ctid NOT IN (SELECT s.tid FROM shares s)  -- ours (not skipped); hashed, once
         ORDER BY t.due_at
         LIMIT greatest(p_max_rows - (SELECT count(*) FROM shares), 0)  -- what the shares leave
           FOR UPDATE OF t SKIP LOCKED
    ), held AS MATERIALIZED (
        SELECT d.* FROM queen.log_timers_held_due_v1(p_now, CASE WHEN v_all THEN NULL ELSE p_shards END,
                                                     p_skip_tenants, p_skip_queues, p_skip_partitions,
                                                     p_max_rows) d
         WHERE v_listed
    ), pool AS MATERIALIZED (
        -- A held row's can be in the oldest walk or its tenant's share too.
        SELECT d.* FROM held d
        UNION ALL
        SELECT o.* FROM oldest o WHERE NOT EXISTS (SELECT 1 FROM held d WHERE d.tid = o.tid)
        UNION ALL
        SELECT s.* FROM shares s WHERE NOT EXISTS (SELECT 1 FROM held d WHERE d.tid = s.tid)
    ), whole AS (  -- The claim takes the whole pool: nothing to choose.
        SELECT count(*) <= p_max_rows AND (v_bytes IS NULL OR coalesce(sum(p.cb), 0) <= v_bytes) AS ok
          FROM pool p
    ), ranked AS (
        SELECT p.tid, p.ct, p.cq, p.ck, p.cv, p.cd, p.cb,
               row_number() OVER (PARTITION BY p.ct ORDER BY p.cv, p.cd, p.cq COLLATE "C", p.ck COLLATE "C") AS rn
          FROM pool p
         WHERE NOT (SELECT w.ok FROM whole w)
    ), ordered AS (
        SELECT r.tid, r.ct, r.cq, r.ck, r.cv, r.cd,
               row_number() OVER w AS pos,
               sum(r.cb) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
          FROM ranked r
        WINDOW w AS (ORDER BY (r.rn - 1) / v_per, r.cv, r.cd, r.ct, r.cq COLLATE "C", r.ck COLLATE "C")
    ), chosen AS MATERIALIZED (
        SELECT p.tid, p.ct, p.cq, p.ck, p.cv, p.cd
          FROM pool p
         WHERE (SELECT w.ok FROM whole w)
        UNION ALL
        SELECT o.tid, o.ct, o.cq, o.ck, o.cv, o.cd
          FROM ordered o
         WHERE o.pos <= p_max_rows AND (o.pos = 1 OR v_bytes IS NULL OR o.cum <= v_bytes)
    ), claimed AS (
        UPDATE queen.log_timers AS t
           SET claim_token = coalesce(p_claim_id, gen_random_uuid()),
               claimed_until = p_now + p_lease_ms * interval '1 millisecond',
               claim_due = t.due_at, updated_at = p_now  -- due_at unchanged: HOT
         -- By address (a TID scan; locked, so it stays): never a join over the table.
         WHERE t.ctid = ANY (ARRAY(SELECT c.tid FROM chosen c))
        RETURNING t.tenant_id, t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.payload,
                  t.payload_zstd, t.encrypted, t.producer_sub, t.claim_token, t.deliver_at,
                  t.attempts, t.ctid, t.due_at
    )
    -- In chosen's order, read from the updated rows (claim_due keeps due_at as the claim found
    -- it): no join back to chosen, a hash of every key (a tenth of the claim at 1,000 rows).
    SELECT x.tenant_id, x.queue::text, x.timer_key::text, x.partition::text, x.txn, x.message_id,
           x.payload, x.payload_zstd, x.encrypted, x.producer_sub, x.claim_token,
           queen.epoch_ms_v1(x.deliver_at),
           floor(extract(epoch FROM (p_now - x.deliver_at)) * 1000)::bigint,
           x.attempts, v_floor_ms, x.ctid
      FROM claimed x
     ORDER BY x.due_at, x.deliver_at, x.tenant_id, x.queue, x.timer_key;
END
$fn$;


-- ---------------------------------------------------------------------------------------
-- 4. fire
-- ---------------------------------------------------------------------------------------

-- queen.log_timers_fire_v1 lives in 003_fire.sql.

-- ---------------------------------------------------------------------------------------
-- 5. fail
-- ---------------------------------------------------------------------------------------

-- queen.log_timers_fail_v2(tenants uuid[], queues text[], keys text[], tokens uuid[],
--     error text, class text, now timestamptz, backoff_min_ms int, backoff_max_ms int,
--     transient_backoff_ms int, max_attempts int) -> jsonb
--   {"released": n, "exhausted": [{"tenant", "queue", "key", "attempts"}, ...], "moved": n}
-- For each named row whose claim_token matches: the token is nulled, last_error set
-- (truncated to 4000 characters), and claimed_until pushed out as backoff:
--   transient          -> now + transient_backoff_ms (default 1000), attempts unchanged;
--   config | permanent -> attempts + 1, now + least(backoff_max_ms, backoff_min_ms *
--                         2^(attempts before this failure)) (defaults 1000 / 60000).
-- exhausted lists the config/permanent failures whose attempts reached max_attempts
-- (default 5); they are moved to queen.log_dlq in this same transaction
-- (log_timers_dlq_v1), moved = rows moved (every exhausted row). The rows the failure
-- updates stay locked by it until the move, so exhaustion and dead-lettering are one
-- decision: a host that reschedules, replaces, cancels or re-creates the timer meanwhile
-- waits for this call and then finds it gone (absent), instead of being told "rescheduled"
-- about a timer that is then dead-lettered with its new payload.
-- Refused with 22023: unknown class, arrays of different lengths, null now.
-- Locks: rows of queen.log_timers, FOR UPDATE SKIP LOCKED (never waits); then new log_dlq
-- rows.
CREATE OR REPLACE FUNCTION queen.log_timers_fail_v2(
    p_tenants uuid[], p_queues text[], p_keys text[], p_tokens uuid[], p_error text,
    p_class text, p_now timestamptz, p_backoff_min_ms int, p_backoff_max_ms int,
    p_transient_backoff_ms int, p_max_attempts int)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_n          int := coalesce(cardinality(p_tenants), 0);
    v_transient  boolean;
    v_min        double precision := greatest(coalesce(p_backoff_min_ms, 1000), 0);
    v_max        double precision := greatest(coalesce(p_backoff_max_ms, 60000), 0);
    v_tr         double precision := greatest(coalesce(p_transient_backoff_ms, 1000), 0);
    v_max_att    int := coalesce(p_max_attempts, 5);
    v_result     jsonb;
    v_moved      jsonb := jsonb_build_object('moved', 0);
    v_t          uuid[];
    v_q          text[];
    v_k          text[];
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_fail_v2: now must not be null' USING ERRCODE = '22023';
    END IF;
    IF p_class IS NULL OR p_class NOT IN ('transient', 'config', 'permanent') THEN
        RAISE EXCEPTION 'log_timers_fail_v2: class must be transient, config or permanent (got %)',
            coalesce(p_class, 'null') USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_queues), 0) <> v_n OR coalesce(cardinality(p_keys), 0) <> v_n
       OR coalesce(cardinality(p_tokens), 0) <> v_n THEN
        RAISE EXCEPTION 'log_timers_fail_v2: tenants, queues, keys and tokens must line up (% / % / % / % elements)',
            v_n, coalesce(cardinality(p_queues), 0), coalesce(cardinality(p_keys), 0),
            coalesce(cardinality(p_tokens), 0) USING ERRCODE = '22023';
    END IF;
    v_transient := p_class = 'transient';
    IF v_n = 0 THEN
        RETURN jsonb_build_object('released', 0, 'exhausted', '[]'::jsonb, 'moved', 0);
    END IF;

    WITH held AS (
        SELECT h.tenant_id, h.queue, h.timer_key
          FROM unnest(p_tenants, p_queues, p_keys, p_tokens) AS u(ut, uq, uk, utok)
          CROSS JOIN LATERAL (
                SELECT t.tenant_id, t.queue, t.timer_key
                  FROM queen.log_timers t
                 WHERE t.tenant_id = u.ut AND t.queue = u.uq AND t.timer_key = u.uk
                   AND t.claim_token = u.utok
                   FOR UPDATE SKIP LOCKED) h
    ), upd AS (
        UPDATE queen.log_timers AS t
           SET claim_token = NULL,
               last_error = left(p_error, 4000),
               updated_at = p_now,
               attempts = CASE WHEN v_transient THEN t.attempts ELSE t.attempts + 1 END,
               claimed_until = p_now + (CASE WHEN v_transient THEN v_tr
                                             ELSE least(v_max, v_min * power(2::double precision, least(t.attempts, 60)))
                                        END) * interval '1 millisecond'
          FROM (SELECT DISTINCT * FROM held) x
         WHERE t.tenant_id = x.tenant_id AND t.queue = x.queue AND t.timer_key = x.timer_key
        RETURNING t.tenant_id, t.queue, t.timer_key, t.attempts
    )
    SELECT jsonb_build_object(
               'released', count(*),
               'exhausted', coalesce(jsonb_agg(jsonb_build_object('tenant', upd.tenant_id,
                                                                  'queue', upd.queue,
                                                                  'key', upd.timer_key,
                                                                  'attempts', upd.attempts)
                                               ORDER BY upd.tenant_id, upd.queue, upd.timer_key)
                                     FILTER (WHERE NOT v_transient AND upd.attempts >= v_max_att),
                                     '[]'::jsonb))
      INTO v_result
      FROM upd;
    IF jsonb_array_length(v_result -> 'exhausted') > 0 THEN
        SELECT array_agg((e ->> 'tenant')::uuid), array_agg(e ->> 'queue'), array_agg(e ->> 'key')
          INTO v_t, v_q, v_k
          FROM jsonb_array_elements(v_result -> 'exhausted') AS e;
        -- The rows are locked by the UPDATE above (this transaction), so nobody changed
        -- them since; SKIP LOCKED does not skip a transaction's own locks.
        v_moved := queen.log_timers_dlq_v1(v_t, v_q, v_k, p_now);
    END IF;
    RETURN v_result || v_moved;
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- 6. dlq
-- ---------------------------------------------------------------------------------------

-- queen.log_timers_dlq_v1(tenants uuid[], queues text[], keys text[], now timestamptz)
--   -> jsonb {"moved": n}
-- Moves the named timers that are in nobody's hands into queen.log_dlq (consumer group
-- '__timer__', log_offset -1, payload as JSON when it is UTF-8 JSON, else
-- {"_raw_b64": ...} with "_zstd"/"_encrypted" flags; error = last_error; message_id, txn,
-- timer_key, attempts kept), then deletes them. A row that is in somebody's hands, or
-- locked by anyone, is left alone, and so is a row with attempts = 0: a timer the host
-- rescheduled, replaced or re-created since it last failed starts again at 0 attempts and
-- is never dead-lettered for what its old version did. log_timers_fail_v2 calls it for
-- the rows it exhausts, in its own transaction; an operator may call it directly.
-- Refused with 22023: arrays of different lengths, null now.
-- Locks: rows of queen.log_timers, FOR UPDATE SKIP LOCKED (never waits); new log_dlq rows.
CREATE OR REPLACE FUNCTION queen.log_timers_dlq_v1(
    p_tenants uuid[], p_queues text[], p_keys text[], p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_n     int := coalesce(cardinality(p_tenants), 0);
    v_moved bigint;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'log_timers_dlq_v1: now must not be null' USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_queues), 0) <> v_n OR coalesce(cardinality(p_keys), 0) <> v_n THEN
        RAISE EXCEPTION 'log_timers_dlq_v1: tenants, queues and keys must line up (% / % / % elements)',
            v_n, coalesce(cardinality(p_queues), 0), coalesce(cardinality(p_keys), 0)
            USING ERRCODE = '22023';
    END IF;
    IF v_n = 0 THEN
        RETURN jsonb_build_object('moved', 0);
    END IF;

    WITH victims AS (
        SELECT DISTINCT h.tenant_id, h.queue, h.timer_key
          FROM unnest(p_tenants, p_queues, p_keys) AS u(ut, uq, uk)
          CROSS JOIN LATERAL (
                SELECT t.tenant_id, t.queue, t.timer_key
                  FROM queen.log_timers t
                 WHERE t.tenant_id = u.ut AND t.queue = u.uq AND t.timer_key = u.uk
                   AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > p_now)
                   AND t.attempts > 0
                   FOR UPDATE SKIP LOCKED) h
    ), moved AS (
        DELETE FROM queen.log_timers AS t
         USING victims v
         WHERE t.tenant_id = v.tenant_id AND t.queue = v.queue AND t.timer_key = v.timer_key
        RETURNING t.*
    ), ins AS (
        INSERT INTO queen.log_dlq (tenant_id, queue, partition, consumer_group, log_offset, payload,
                                   error, message_id, txn, timer_key, attempts, created_at)
        SELECT m.tenant_id, m.queue, m.partition, '__timer__', -1,
               queen.log_timers_payload_json_v1(m.payload, m.payload_zstd, m.encrypted),
               m.last_error, m.message_id, m.txn, m.timer_key, m.attempts, p_now
          FROM moved m
         ORDER BY m.tenant_id, m.queue, m.timer_key
        RETURNING 1
    )
    SELECT count(*) INTO v_moved FROM ins;
    RETURN jsonb_build_object('moved', v_moved);
END
$fn$;

-- ---------------------------------------------------------------------------------------
-- 7. release
-- ---------------------------------------------------------------------------------------

-- queen.log_timers_release_v2(tenants uuid[], queues text[], keys text[], tokens uuid[],
--                              now timestamptz) -> int
-- A hand-back (a graceful stop, a claim that cannot be fired): every named row whose
-- claim_token matches gets claim_token nulled and claimed_until set by
-- log_timers_not_before_v1(deliver_at, now) (so a due row is at visible_at = now, in front
-- of every sweeper's floor), and another broker can claim it at once. No attempt is spent
-- and updated_at is left alone. Returns the number released.
-- Refused with 22023: arrays of different lengths.
-- Locks: rows of queen.log_timers, FOR UPDATE SKIP LOCKED (never waits).
CREATE OR REPLACE FUNCTION queen.log_timers_release_v2(
    p_tenants uuid[], p_queues text[], p_keys text[], p_tokens uuid[], p_now timestamptz)
RETURNS int
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    v_n int := coalesce(cardinality(p_tenants), 0);
    v_released int;
BEGIN
    IF coalesce(cardinality(p_queues), 0) <> v_n OR coalesce(cardinality(p_keys), 0) <> v_n
       OR coalesce(cardinality(p_tokens), 0) <> v_n THEN
        RAISE EXCEPTION 'log_timers_release_v2: tenants, queues, keys and tokens must line up (% / % / % / % elements)',
            v_n, coalesce(cardinality(p_queues), 0), coalesce(cardinality(p_keys), 0),
            coalesce(cardinality(p_tokens), 0) USING ERRCODE = '22023';
    END IF;
    IF v_n = 0 THEN
        RETURN 0;
    END IF;

    WITH held AS (
        SELECT DISTINCT h.tenant_id, h.queue, h.timer_key
          FROM unnest(p_tenants, p_queues, p_keys, p_tokens) AS u(ut, uq, uk, utok)
          CROSS JOIN LATERAL (
                SELECT t.tenant_id, t.queue, t.timer_key
                  FROM queen.log_timers t
                 WHERE t.tenant_id = u.ut AND t.queue = u.uq AND t.timer_key = u.uk
                   AND t.claim_token = u.utok
                   FOR UPDATE SKIP LOCKED) h
    ), upd AS (
        UPDATE queen.log_timers AS t
           SET claim_token = NULL, claimed_until = queen.log_timers_not_before_v1(t.deliver_at, p_now)
          FROM held x
         WHERE t.tenant_id = x.tenant_id AND t.queue = x.queue AND t.timer_key = x.timer_key
        RETURNING 1
    )
    SELECT count(*) INTO v_released FROM upd;
    RETURN v_released;
END
$fn$;

-- queen.log_timers_release_claims_v2(claims uuid[], lease_from timestamptz,
--                                     lease_to timestamptz, now timestamptz,
--                                     floor timestamptz) -> int
-- Hands back every row still held under one of the given claim ids (claim_token = the
-- claim_id given to log_timers_claim_v4) whose lease ends between lease_from and lease_to:
-- claim_token nulled and claimed_until set, no attempt spent, as log_timers_release_v2. For a
-- caller whose claim's answer was lost (the connection died after the claim committed):
-- it never saw the rows, but it knows the claim ids it sent, the floor it sent them with,
-- and, within its clock's uncertainty, when their lease ends (a claim's rows all have
-- claimed_until = its now + lease_ms; they wait at the due_at they were claimed at, at or
-- after the floor the claim was given, at or before its now). So the walk is the due index
-- from floor (null: its head) to the window's end, and the listed held rows
-- (queen.log_timers_held), the one kind a claim takes behind its floor, by key. A claim
-- that never committed has no rows. Returns the number released.
-- Refused with 22023: a null or inverted window, or one over 10 minutes (a bounded walk).
-- Locks: rows of queen.log_timers, FOR UPDATE SKIP LOCKED (never waits).
CREATE OR REPLACE FUNCTION queen.log_timers_release_claims_v2(
    p_claims uuid[], p_lease_from timestamptz, p_lease_to timestamptz, p_now timestamptz,
    p_floor timestamptz)
RETURNS int
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
SET enable_seqscan = off SET enable_bitmapscan = off  -- "Plans under a held snapshot" (section 2)
SET enable_sort = off  -- the walk in the due index's order ("Plans under a held snapshot")
AS $fn$
DECLARE
    v_released int;
BEGIN
    IF p_lease_from IS NULL OR p_lease_to IS NULL OR p_lease_to < p_lease_from
       OR p_lease_to - p_lease_from > interval '10 minutes' THEN
        RAISE EXCEPTION 'log_timers_release_claims_v2: the lease window must run forward over at most 10 minutes (got % .. %)',
            p_lease_from, p_lease_to USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_claims), 0) = 0 THEN
        RETURN 0;
    END IF;
    WITH walked AS (
        SELECT t.ctid AS tid
          FROM queen.log_timers t
         -- A claim's rows wait at the due_at they had when claimed, at or after its floor
         -- and at or before its now, so before the window's end: a walk of the due index
         -- over that range, checking each row's lease (claim_token, and claimed_until in the
         -- window). Rows claimed under version 8 or earlier wait at their lease's end,
         -- inside the same range.
         WHERE t.due_at >= coalesce(p_floor, '-infinity'::timestamptz) AND t.due_at <= p_lease_to
           AND t.claimed_until BETWEEN p_lease_from AND p_lease_to
           AND t.claim_token = ANY (p_claims)
         ORDER BY t.due_at  -- the due index's range ("Plans under a held snapshot")
           FOR UPDATE OF t SKIP LOCKED
    ), listed AS (  -- a held row the claim took by key, perhaps behind its floor; by key
        SELECT x.tid
          FROM queen.log_timers_held h
          CROSS JOIN LATERAL (
                SELECT t.ctid AS tid FROM queen.log_timers t
                 WHERE t.tenant_id = h.tenant_id AND t.queue = h.queue AND t.timer_key = h.timer_key
                   AND t.claimed_until BETWEEN p_lease_from AND p_lease_to
                   AND t.claim_token = ANY (p_claims)
                   FOR UPDATE SKIP LOCKED) x
    ), upd AS (
        UPDATE queen.log_timers AS t
           SET claim_token = NULL, claimed_until = queen.log_timers_not_before_v1(t.deliver_at, p_now)
         WHERE t.ctid = ANY (ARRAY(SELECT w.tid FROM walked w UNION SELECT l.tid FROM listed l))
           AND t.claim_token = ANY (p_claims)
        RETURNING 1
    )
    SELECT count(*) INTO v_released FROM upd;
    RETURN v_released;
END
$fn$;

-- queen.log_timers_in_doubt_v1(seg int[], tenants uuid[], queues text[], hashes bytea[],
--                              row_seg int[], keys text[])
--   -> TABLE(seg int, present bigint, unlocked bigint, base_offset bigint)
-- The sweeper's check of fires whose answer a lost connection took (a failover, a killed
-- backend). For each segment it sent: how many of its timers are still in the table (the
-- fire deletes them in its own transaction, so any left means it did not commit), how many
-- of those nobody holds (a row locked by someone is a fire still running: undecided), and
-- the offset at which exactly this segment (the same txn hashes) is in the log, or NULL.
-- SECURITY DEFINER so that a role holding queen_sweeper only, which reads no table, can
-- still confirm a fire and announce it. Locks: FOR UPDATE SKIP LOCKED on the timers it
-- finds, released at the end of the caller's transaction.
CREATE OR REPLACE FUNCTION queen.log_timers_in_doubt_v1(
    p_seg int[], p_tenants uuid[], p_queues text[], p_hashes bytea[], p_row_seg int[], p_keys text[])
RETURNS TABLE (seg int, present bigint, unlocked bigint, base_offset bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
WITH s AS (
    SELECT * FROM unnest(p_seg, p_tenants, p_queues, p_hashes) AS s(i, tenant, queue, hashes)
), k AS (
    SELECT u.i, s.tenant, s.queue, u.key
      FROM unnest(p_row_seg, p_keys) AS u(i, key)
      JOIN s ON s.i = u.i
), present AS (
    SELECT k.i, t.tenant_id, t.queue, t.timer_key
      FROM k
      JOIN queen.log_timers t ON t.tenant_id = k.tenant AND t.queue = k.queue AND t.timer_key = k.key
), free AS MATERIALIZED (
    SELECT t.tenant_id, t.queue, t.timer_key
      FROM queen.log_timers t
     WHERE (t.tenant_id, t.queue, t.timer_key) IN (SELECT k.tenant, k.queue, k.key FROM k)
       FOR UPDATE SKIP LOCKED
)
SELECT s.i,
       (SELECT count(*) FROM present p WHERE p.i = s.i),
       (SELECT count(*) FROM present p JOIN free f USING (tenant_id, queue, timer_key) WHERE p.i = s.i),
       lt.base_offset
  FROM s
  LEFT JOIN queen.queues q ON q.tenant_id = s.tenant AND q.name = s.queue
  LEFT JOIN queen.log_txn_index x
         ON octet_length(s.hashes) >= 16 AND x.queue_id = q.id AND x.hash = substring(s.hashes FROM 1 FOR 16)
  LEFT JOIN queen.log_txns lt
         ON lt.partition_id = x.partition_id AND lt.base_offset = x.log_offset AND lt.hashes = s.hashes
 ORDER BY s.i
$fn$;

-- ---------------------------------------------------------------------------------------
-- 8. peek and list
-- ---------------------------------------------------------------------------------------

-- queen.log_timers_view_v1(row) -> jsonb: the public view of one timer, never its payload.
-- "claimed" says a token is set; whether that claim is still live depends on a `now`
-- this view does not take, so claimedUntil is given alongside. Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_view_v1(t queen.log_timers)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT jsonb_build_object(
        'tenant', t.tenant_id, 'queue', t.queue, 'timerKey', t.timer_key,
        'partition', t.partition, 'deliverAt', t.deliver_at,
        'deliverAtMs', queen.epoch_ms_v1(t.deliver_at), 'txn', t.txn,
        'messageId', t.message_id, 'payloadBytes', octet_length(t.payload),
        'payloadZstd', t.payload_zstd, 'encrypted', t.encrypted,
        'producerSub', t.producer_sub, 'attempts', t.attempts, 'lastError', t.last_error,
        'claimed', t.claim_token IS NOT NULL, 'claimedUntil', t.claimed_until,
        'visibleAt', t.visible_at, 'shard', t.shard,
        'createdAt', t.created_at, 'updatedAt', t.updated_at)
$fn$;

-- queen.log_timers_peek_v1(tenant uuid, queue text, timer_key text) -> jsonb
-- One timer without its payload (see log_timers_view_v1), or SQL null when absent.
-- Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_peek_v1(p_tenant uuid, p_queue text, p_timer_key text)
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT queen.log_timers_view_v1(t)
      FROM queen.log_timers t
     WHERE t.tenant_id = p_tenant AND t.queue = p_queue AND t.timer_key = p_timer_key
$fn$;

-- queen.log_timers_list_v1(tenant uuid, queue text, after_key text, page_size int) -> jsonb
--   {"items": [timer views ordered by timerKey (collation "C")], "nextKey": text | null}
-- Keyset page on the primary key: keys strictly after after_key (null = from the start);
-- page_size is clamped to 1..1000 (null = 100); nextKey is the last key of this page when
-- more remain, else null. No payloads. Locks: none.
CREATE OR REPLACE FUNCTION queen.log_timers_list_v1(
    p_tenant uuid, p_queue text, p_after_key text, p_page_size int)
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    WITH lim AS (
        SELECT least(greatest(coalesce(p_page_size, 100), 1), 1000) AS n
    ), page AS (
        SELECT x AS t, x.timer_key, row_number() OVER (ORDER BY x.timer_key) AS rn
          FROM queen.log_timers x
         WHERE x.tenant_id = p_tenant AND x.queue = p_queue
           AND (p_after_key IS NULL OR x.timer_key > p_after_key COLLATE "C")
         ORDER BY x.timer_key
         LIMIT (SELECT n + 1 FROM lim)
    )
    SELECT jsonb_build_object(
        'items', coalesce((SELECT jsonb_agg(queen.log_timers_view_v1(p.t) ORDER BY p.rn)
                             FROM page p, lim WHERE p.rn <= lim.n), '[]'::jsonb),
        'nextKey', (SELECT p.timer_key FROM page p, lim WHERE p.rn = lim.n
                       AND EXISTS (SELECT 1 FROM page q WHERE q.rn = lim.n + 1)))
$fn$;
