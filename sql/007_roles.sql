-- 007_roles.sql: who may call what. Three NOLOGIN group roles, the schema's ownership, and
-- every privilege on schema queen stated explicitly (nothing left to PUBLIC).
--
--   queen_owner    owns schema queen and everything in it. Nobody logs in as it; an
--                  operator's migration role may be made a member to apply the schema.
--   queen_sweeper  exactly what the sweeper calls: the probe (log_timers_due_v2), claim,
--                  fire, fail, dlq, release, the KV prune step and the usage rollup step,
--                  and the switches it reads (switch_enabled_v1); and the wrappers of
--                  006_compat.sql, which a 1.0.0 sweeper calls.
--   queen_broker   scheduling (log_timers_apply_v1: schedule, reschedule, cancel), KV
--                  put / get / delete, log push and read, timer peek and list, switches.
-- Both group roles also get queen.schema_version_v1 (008). Neither gets any privilege on a
-- table or a sequence: they act only through the functions.
--
-- Why the entry-point functions are SECURITY DEFINER (owned by queen_owner). Under SECURITY
-- INVOKER a caller needs the table privileges the function body uses: the broker's apply
-- inserts, updates and deletes queen.log_timers, and with those privileges a broker could
-- set claim_token / claimed_until itself, which is the claim it must not have, for every
-- tenant. Function-level grants separate the roles only if the roles hold no table
-- privileges, so the functions run as their owner. Safe because every one of them pins
-- search_path (pg_catalog first, then queen, pg_temp last), builds no dynamic SQL from its
-- arguments, and EXECUTE on it is granted to named roles only. Internal helpers (name and
-- length checks, provisioning, the partition locks and the append of 001, the fire's
-- helpers of 003, the zstd frame check, epoch_ms_v1, kv_live_v1) stay SECURITY INVOKER and
-- are granted to nobody: they are only ever called from inside the functions, and the
-- REVOKE from PUBLIC below covers them as it covers every function of the schema.
--
-- Applying. Idempotent like 001-006, and part of the same apply (the plugin embeds it). The
-- roles are created only when missing and only when the applier may create roles
-- (superuser or CREATEROLE); ownership moves to queen_owner only for objects it does not
-- own yet, and only when the applier may do that (superuser, or a member of queen_owner);
-- an ALTER ... OWNER is skipped when it would change nothing, because it takes an ACCESS
-- EXCLUSIVE lock on its table. GRANT and REVOKE take no lock on the tables. An applier that
-- may do none of it (the schema owner without CREATEROLE) still gets the REVOKEs from PUBLIC
-- on what it owns, and the GRANTs to whichever group roles exist.
--
-- An operator applies sql/*.sql once as a superuser (see sql/README.md), then grants the
-- group roles to LOGIN roles:
--     CREATE ROLE sweeper_login LOGIN PASSWORD '...' IN ROLE queen_sweeper;
--     GRANT queen_broker TO broker_login;

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

-- The group roles, when missing and when this applier may create them.
DO $roles$
DECLARE
    v_role       text;
    v_can_create boolean;
BEGIN
    SELECT r.rolsuper OR r.rolcreaterole INTO v_can_create
      FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
    FOREACH v_role IN ARRAY ARRAY['queen_owner', 'queen_sweeper', 'queen_broker'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = v_role) THEN
            IF v_can_create THEN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
            ELSE
                RAISE NOTICE '007_roles: role % is missing and % may not create roles; a superuser must apply this file',
                    v_role, current_user;
            END IF;
        END IF;
    END LOOP;
END
$roles$;

-- queen_owner takes the schema and every object in it that it does not own yet.
DO $owner$
DECLARE
    v_obj record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = 'queen_owner') THEN
        RETURN;
    END IF;
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
       AND NOT pg_catalog.pg_has_role(current_user, 'queen_owner', 'MEMBER') THEN
        RAISE NOTICE '007_roles: % is neither superuser nor a member of queen_owner; ownership left as it is',
            current_user;
        RETURN;
    END IF;
    IF (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'queen')
       <> 'queen_owner'::regrole THEN
        ALTER SCHEMA queen OWNER TO queen_owner;
    END IF;
    -- Tables carry their indexes, row types and owned sequences with them.
    FOR v_obj IN
        SELECT c.oid::regclass AS rel, c.relkind
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'queen'::regnamespace
           AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
           AND c.relowner <> 'queen_owner'::regrole
         ORDER BY c.relkind DESC, c.relname
    LOOP
        -- An owned sequence may already have moved with its table in this loop.
        CONTINUE WHEN (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = v_obj.rel)
                      = 'queen_owner'::regrole;
        EXECUTE pg_catalog.format('ALTER %s %s OWNER TO queen_owner',
            CASE v_obj.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                               WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
            v_obj.rel);
    END LOOP;
    FOR v_obj IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'queen'::regnamespace
           AND p.proowner <> 'queen_owner'::regrole
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO queen_owner', v_obj.fn);
    END LOOP;
END
$owner$;

-- Nothing in schema queen for PUBLIC: new functions are executable by PUBLIC by default,
-- and a SECURITY DEFINER function executable by anyone would be a way around the roles.
REVOKE ALL ON SCHEMA queen FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA queen FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA queen FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;

-- The grants, stated in full each time: whatever a group role held before is revoked
-- first, so the list below is exactly what it holds (all in this one statement).
DO $grants$
DECLARE
    -- (role, function) pairs: the whole of what the group roles may call.
    c_grants constant text[] := ARRAY[
        ['queen_sweeper', 'queen.log_timers_due_v1(int2[], timestamptz, int)'],
        ['queen_sweeper', 'queen.log_timers_claim_v1(int2[], timestamptz, int, int, int)'],
        ['queen_sweeper', 'queen.log_timers_claim_v4(int2[], timestamptz, int, int, int, bigint, uuid, uuid[], text[], text[], timestamptz, uuid[])'],
        ['queen_sweeper', 'queen.log_timers_due_v2(int2[], timestamptz, int, timestamptz, int)'],
        ['queen_sweeper', 'queen.log_timers_below_floor_v1(timestamptz, timestamptz)'],
        ['queen_sweeper', 'queen.log_timers_tenants_tidy_v1(int)'],
        ['queen_sweeper', 'queen.log_timers_fire_v1(uuid[], text[], text[], int[], bytea[], bytea[], text[], int[], uuid[], timestamptz, boolean)'],
        ['queen_sweeper', 'queen.log_timers_fire_v2(uuid[], text[], text[], int[], bytea[], bytea[], text[], int[], uuid[], timestamptz, boolean, tid[], boolean, tid[])'],
        ['queen_sweeper', 'queen.log_timers_fail_v1(uuid[], text[], text[], uuid[], text, text, timestamptz, int, int, int, int)'],
        ['queen_sweeper', 'queen.log_timers_fail_v2(uuid[], text[], text[], uuid[], text, text, timestamptz, int, int, int, int)'],
        ['queen_sweeper', 'queen.log_timers_dlq_v1(uuid[], text[], text[], timestamptz)'],
        ['queen_sweeper', 'queen.log_timers_release_v1(uuid[], text[], text[], uuid[])'],
        ['queen_sweeper', 'queen.log_timers_release_v2(uuid[], text[], text[], uuid[], timestamptz)'],
        ['queen_sweeper', 'queen.log_timers_release_claims_v2(uuid[], timestamptz, timestamptz, timestamptz, timestamptz)'],
        ['queen_sweeper', 'queen.log_timers_in_doubt_v1(int[], uuid[], text[], bytea[], int[], text[])'],
        ['queen_sweeper', 'queen.kv_expire_step_v1(int2[], timestamptz, int)'],
        ['queen_sweeper', 'queen.kv_usage_step_v1(int2[], timestamptz, int)'],
        ['queen_sweeper', 'queen.kv_usage_step_v2(int2[], timestamptz, int, int)'],
        ['queen_sweeper', 'queen.switch_enabled_v1(text, boolean)'],
        ['queen_broker', 'queen.log_timers_apply_v1(jsonb, uuid, text, timestamptz)'],
        ['queen_broker', 'queen.log_timers_peek_v1(uuid, text, text)'],
        ['queen_broker', 'queen.log_timers_list_v1(uuid, text, text, int)'],
        ['queen_broker', 'queen.kv_put_v1(uuid, text, text, jsonb, bigint, boolean, timestamptz)'],
        ['queen_broker', 'queen.kv_get_v1(uuid, text, text, timestamptz)'],
        ['queen_broker', 'queen.kv_delete_v1(uuid, text, text, timestamptz)'],
        ['queen_broker', 'queen.log_push_v1(uuid, text, text, int, bytea, bytea, timestamptz)'],
        ['queen_broker', 'queen.log_read_v1(uuid, text, text, bigint, int)'],
        ['queen_broker', 'queen.switch_enabled_v1(text, boolean)']];
    v_i    int;
    v_role text;
BEGIN
    FOR v_i IN 1 .. pg_catalog.array_length(c_grants, 1) LOOP
        -- 005 is optional (a broker serves without it, see its header); anything else
        -- missing means the list and the functions disagree: a bug here, never a silent gap.
        IF pg_catalog.to_regprocedure(c_grants[v_i][2]) IS NULL
           AND c_grants[v_i][2] NOT IN ('queen.kv_expire_step_v1(int2[], timestamptz, int)',
                                        'queen.kv_usage_step_v2(int2[], timestamptz, int, int)') THEN
            RAISE EXCEPTION '007_roles: % does not exist (the grant list is out of date)', c_grants[v_i][2];
        END IF;
    END LOOP;
    FOREACH v_role IN ARRAY ARRAY['queen_sweeper', 'queen_broker'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA queen FROM %I', v_role);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA queen FROM %I', v_role);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM %I', v_role);
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA queen TO %I', v_role);
        FOR v_i IN 1 .. pg_catalog.array_length(c_grants, 1) LOOP
            CONTINUE WHEN c_grants[v_i][1] <> v_role
                       OR pg_catalog.to_regprocedure(c_grants[v_i][2]) IS NULL;
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I',
                                      pg_catalog.to_regprocedure(c_grants[v_i][2]), v_role);
        END LOOP;
    END LOOP;
END
$grants$;
