-- 008_version.sql: the schema's version, readable by both group roles. The LAST file of
-- the apply: its upsert records that everything before it is in place.
--
-- queen.schema_info holds one row per component; this project's is 'queen-sweeper'. A
-- sweeper reads queen.schema_version_v1() at start and skips applying the schema when the
-- version is already current, so a least-privilege role (queen_sweeper, which may not
-- create or replace anything) can run with apply_schema on. Bump the version below
-- whenever any file in sql/ changes what a broker or a sweeper sees.
--
-- Idempotent and lock-free on re-apply, like 001 (see its header).

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

CREATE TABLE IF NOT EXISTS queen.schema_info (
    component  text PRIMARY KEY,
    version    int NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- queen.schema_version_v1() -> int: the applied version of component 'queen-sweeper', or
-- SQL null when this schema was never applied through 008. SECURITY DEFINER for the reason
-- given in 007 (the group roles hold no table privileges). Locks: none.
CREATE OR REPLACE FUNCTION queen.schema_version_v1()
RETURNS int
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, queen, pg_temp
SET jit = off SET max_parallel_workers_per_gather = 0
AS $fn$
    SELECT i.version FROM queen.schema_info i WHERE i.component = 'queen-sweeper'
$fn$;

-- 007 ran before these two objects existed: give them the same treatment (owner, nothing
-- for PUBLIC, the function to both group roles, the table to nobody).
DO $grants$
DECLARE
    v_role text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = 'queen_owner')
       AND ((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
            OR pg_catalog.pg_has_role(current_user, 'queen_owner', 'MEMBER')) THEN
        IF (SELECT c.relowner FROM pg_catalog.pg_class c
             WHERE c.oid = 'queen.schema_info'::regclass) <> 'queen_owner'::regrole THEN
            ALTER TABLE queen.schema_info OWNER TO queen_owner;
        END IF;
        IF (SELECT p.proowner FROM pg_catalog.pg_proc p
             WHERE p.oid = 'queen.schema_version_v1()'::regprocedure) <> 'queen_owner'::regrole THEN
            ALTER FUNCTION queen.schema_version_v1() OWNER TO queen_owner;
        END IF;
    END IF;
    REVOKE ALL ON TABLE queen.schema_info FROM PUBLIC;
    REVOKE ALL ON FUNCTION queen.schema_version_v1() FROM PUBLIC;
    FOREACH v_role IN ARRAY ARRAY['queen_sweeper', 'queen_broker'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION queen.schema_version_v1() TO %I', v_role);
    END LOOP;
END
$grants$;

-- Last statement of the apply: the version it leaves behind.
INSERT INTO queen.schema_info AS i (component, version, applied_at)
VALUES ('queen-sweeper', 38, now())
ON CONFLICT (component) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at;
