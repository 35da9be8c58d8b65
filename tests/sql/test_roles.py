"""Least privilege (issue 8, item 14): the group roles of sql/007_roles.sql, the schema
version of 007, and search_path pinning.

Runs as the LOGIN roles tests/pg creates: queen_test_sweeper (member of queen_sweeper
only) and queen_test_broker (queen_broker only). Setup and inspection use the superuser."""
import base64
import json
import uuid

import psycopg2
import pytest

from queenkit import apply_schema, stand_in_hash
from sqlkit import NOW, SCHEMA_VERSION, T1, Queen, ms

CLAIM = "SELECT * FROM queen.log_timers_claim_v1(NULL, %s, 30000, 10, 10)"

# Every function the sweeper calls, with arguments that make each call a harmless no-op
# (or a real step where there is something to do).
SWEEPER_CALLS = {
    "due": ("SELECT queen.log_timers_due_v1(NULL, %s, 100)", (NOW,)),
    "claim": (CLAIM, (NOW,)),
    "fire": ("SELECT queen.log_timers_fire_v1('{}'::uuid[], '{}'::text[], '{}'::text[], '{}'::int[],"
             " '{}'::bytea[], '{}'::bytea[], '{}'::text[], '{}'::int[], '{}'::uuid[], %s, false)", (NOW,)),
    "fail": ("SELECT queen.log_timers_fail_v1('{}'::uuid[], '{}'::text[], '{}'::text[], '{}'::uuid[],"
             " 'e', 'permanent', %s, 1000, 60000, 1000, 5)", (NOW,)),
    "dlq": ("SELECT queen.log_timers_dlq_v1('{}'::uuid[], '{}'::text[], '{}'::text[], %s)", (NOW,)),
    "release": ("SELECT queen.log_timers_release_v1('{}'::uuid[], '{}'::text[], '{}'::text[], '{}'::uuid[])", ()),
    "in_doubt": ("SELECT * FROM queen.log_timers_in_doubt_v1('{}'::int[], '{}'::uuid[], '{}'::text[],"
                 " '{}'::bytea[], '{}'::int[], '{}'::text[])", ()),
    "kv_expire_step": ("SELECT queen.kv_expire_step_v1(NULL, %s, 10)", (NOW,)),
    "kv_usage_step": ("SELECT queen.kv_usage_step_v1(NULL, %s, 10)", (NOW,)),
    "kv_usage_step_v2": ("SELECT queen.kv_usage_step_v2(NULL, %s, 10, 1000)", (NOW,)),
}

BROKER_CALLS = {
    "apply": ("SELECT queen.log_timers_apply_v1('[]'::jsonb, %s, NULL, %s)", (T1, NOW)),
    "peek": ("SELECT queen.log_timers_peek_v1(%s, 'q', 'k')", (T1,)),
    "list": ("SELECT queen.log_timers_list_v1(%s, 'q', NULL, 10)", (T1,)),
    "kv_put": ("SELECT queen.kv_put_v1(%s, 'ns', 'role-k', '1', NULL, true, %s)", (T1, NOW)),
    "kv_get": ("SELECT queen.kv_get_v1(%s, 'ns', 'role-k', %s)", (T1, NOW)),
    "kv_delete": ("SELECT queen.kv_delete_v1(%s, 'ns', 'role-k', %s)", (T1, NOW)),
    "log_push": ("SELECT queen.log_push_v1(%s, 'q', 'p', 1, %s, '\\x00'::bytea, %s)", (T1, stand_in_hash("x"), NOW)),
    "log_read": ("SELECT count(*) FROM queen.log_read_v1(%s, 'q', 'p', 0, 10)", (T1,)),
}

# Direct table access: neither group role holds any table privilege.
TABLE_STATEMENTS = [
    "SELECT count(*) FROM queen.log_timers",
    "UPDATE queen.log_timers SET claimed_until = now() + interval '1 hour', claim_token = gen_random_uuid()",
    "DELETE FROM queen.log_timers",
    "INSERT INTO queen.system_state (key, value) VALUES ('timers_fire_enabled', 'false')",
    "SELECT count(*) FROM queen.kv",
    "SELECT count(*) FROM queen.log_segments",
    "SELECT count(*) FROM queen.schema_info",
    "SELECT nextval('queen.kv_version_seq')",
]


def denied(q, sql, args=()):
    with pytest.raises(psycopg2.Error) as e:
        q.exec(sql, args)
    assert e.value.pgcode == "42501", (sql, e.value.pgcode, e.value.pgerror)


def schedule_due(q, keys, queue="q"):
    ops = [{"op": "schedule", "queue": queue, "timerKey": k, "delayMs": 0, "txn": "txn-" + k,
            "payload": base64.b64encode(b'{"k": "%s"}' % k.encode()).decode()} for k in keys]
    return q.one("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, 'prod', %s)",
                 (json.dumps(ops), T1, NOW))


@pytest.mark.parametrize("name", sorted(SWEEPER_CALLS))
def test_broker_cannot_call_the_sweepers_functions(q, as_broker, name):
    schedule_due(as_broker, ["a"])
    sql, args = SWEEPER_CALLS[name]
    denied(as_broker, sql, args)
    # Nothing claimed by the attempt: the timer is still in nobody's hands.
    assert q.timer("a")["claim_token"] is None


@pytest.mark.parametrize("name", sorted(BROKER_CALLS))
def test_sweeper_cannot_call_the_brokers_functions(as_sweeper, name):
    sql, args = BROKER_CALLS[name]
    denied(as_sweeper, sql, args)


@pytest.mark.parametrize("sql", TABLE_STATEMENTS)
def test_no_table_privilege_for_either_role(q, as_broker, as_sweeper, sql):
    schedule_due(q, ["a"])
    denied(as_broker, sql)
    denied(as_sweeper, sql)
    t = q.timer("a")
    assert t is not None and t["claim_token"] is None


def test_sweeper_can_call_everything_it_uses(q, as_sweeper):
    for name in sorted(SWEEPER_CALLS):
        sql, args = SWEEPER_CALLS[name]
        as_sweeper.exec(sql, args)
    assert as_sweeper.one("SELECT queen.switch_enabled_v1('timers_fire_enabled', true)") is True
    assert as_sweeper.one("SELECT queen.schema_version_v1()") == SCHEMA_VERSION


def test_broker_can_call_everything_it_uses(as_broker):
    for name in sorted(BROKER_CALLS):
        sql, args = BROKER_CALLS[name]
        as_broker.exec(sql, args)
    assert as_broker.one("SELECT queen.switch_enabled_v1('timers_schedule_enabled', true)") is True
    assert as_broker.one("SELECT queen.schema_version_v1()") == SCHEMA_VERSION


def test_a_timer_goes_through_with_each_role_doing_its_part(q, as_broker, as_sweeper):
    """broker schedules, sweeper probes, claims, fails one, fires the rest, releases and
    dead-letters; the broker reads the log back. Every step as the role that owns it."""
    schedule_due(as_broker, ["a", "b", "c"])
    due = as_sweeper.one("SELECT queen.log_timers_due_v1(NULL, %s, 100)", (NOW,))
    assert due["due"] == 3 and due["fireEnabled"] is True
    rows = as_sweeper.all(CLAIM, (NOW,))
    assert sorted(r["timer_key"] for r in rows) == ["a", "b", "c"]
    by_key = {r["timer_key"]: r for r in rows}

    # c fails permanently on its last attempt and is dead-lettered.
    c = by_key["c"]
    res = as_sweeper.fail([c], max_attempts=1)
    assert res["released"] == 1 and len(res["exhausted"]) == 1 and res["moved"] == 1
    # Already moved by the failure itself: the operator's dlq finds nothing left.
    assert as_sweeper.dlq([{"tenant": T1, "queue": "q", "key": "c"}]) == {"moved": 0}

    # b is handed back (graceful stop), a is fired.
    assert as_sweeper.release([by_key["b"]]) == 1
    fired = as_sweeper.fire([(T1, "q", "Default", [by_key["a"]])])
    assert fired["fired"] == 1, fired

    segs = as_broker.read(queue="q", partition="Default")
    assert len(segs) == 1 and segs[0]["count"] == 1
    assert as_broker.peek("b")["claimed"] is False
    assert as_broker.peek("a") is None
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 1
    assert q.one("SELECT count(*) FROM queen.kv_usage") == 0   # untouched by all this
    assert as_sweeper.one("SELECT queen.kv_usage_step_v1(NULL, %s, 10)", (NOW,))["tenants"]


def test_grants_are_exact(q):
    """What each group role may execute in schema queen, read from the catalog: the lists in
    007 and 008, nothing more, and nothing at all for PUBLIC."""
    def executable(role):
        return sorted(r["proname"] for r in q.all(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'queen'::regnamespace"
            "   AND has_function_privilege(%s, p.oid, 'EXECUTE')", (role,)))
    assert executable("queen_sweeper") == sorted([
        "kv_expire_step_v1", "kv_usage_step_v1", "kv_usage_step_v2", "log_timers_claim_v1",
        "log_timers_claim_v4", "log_timers_below_floor_v1", "log_timers_tenants_tidy_v1",
        "log_timers_dlq_v1", "log_timers_due_v1", "log_timers_due_v2", "log_timers_fail_v1", "log_timers_fail_v2",
        "log_timers_fire_v1", "log_timers_fire_v2", "log_timers_release_v1",
        "log_timers_release_v2", "log_timers_release_claims_v2",
        "log_timers_in_doubt_v1",
        "schema_version_v1", "switch_enabled_v1"])
    assert executable("queen_broker") == sorted([
        "kv_delete_v1", "kv_get_v1", "kv_put_v1", "log_push_v1", "log_read_v1",
        "log_timers_apply_v1", "log_timers_list_v1", "log_timers_peek_v1", "schema_version_v1",
        "switch_enabled_v1"])
    public = q.all("SELECT p.proname FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
                   " WHERE p.pronamespace = 'queen'::regnamespace AND a.grantee = 0")
    assert public == []
    tables = q.all("SELECT c.relname, a.grantee::regrole::text AS grantee FROM pg_class c,"
                   " aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a"
                   " WHERE c.relnamespace = 'queen'::regnamespace AND c.relkind IN ('r', 'S')"
                   "   AND a.grantee <> 'queen_owner'::regrole")
    assert tables == []
    owners = q.all("SELECT DISTINCT proowner::regrole::text AS o FROM pg_proc"
                   " WHERE pronamespace = 'queen'::regnamespace"
                   " UNION SELECT DISTINCT relowner::regrole::text FROM pg_class"
                   " WHERE relnamespace = 'queen'::regnamespace"
                   " UNION SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'queen'")
    assert [r["o"] for r in owners] == ["queen_owner"]
    roles = q.all("SELECT rolname, rolcanlogin, rolsuper FROM pg_roles"
                  " WHERE rolname IN ('queen_owner', 'queen_sweeper', 'queen_broker') ORDER BY 1")
    assert [(r["rolname"], r["rolcanlogin"], r["rolsuper"]) for r in roles] == [
        ("queen_broker", False, False), ("queen_owner", False, False), ("queen_sweeper", False, False)]


def test_every_function_pins_search_path_or_is_schema_qualified(q):
    rows = q.all("SELECT p.proname, p.proconfig, p.prosecdef, p.prosrc FROM pg_proc p"
                 " WHERE p.pronamespace = 'queen'::regnamespace")
    assert len(rows) >= 25
    unpinned = {r["proname"]: r for r in rows
                if not any(c == "search_path=pg_catalog, queen, pg_temp" for c in (r["proconfig"] or []))}
    # The inlined helpers: no SET (it would stop inlining); every operator qualified.
    assert sorted(unpinned) == ["epoch_ms_v1", "kv_live_v1", "log_timers_not_before_v1", "log_timers_ours_v1"]
    for r in unpinned.values():
        assert r["prosecdef"] is False
        assert "OPERATOR(pg_catalog." in r["prosrc"]
    definer = sorted(r["proname"] for r in rows if r["prosecdef"])
    assert definer == sorted(set(
        ["kv_expire_step_v1", "kv_usage_step_v1", "kv_usage_step_v2", "log_timers_claim_v1",
         "log_timers_claim_v4", "log_timers_at_commit_v1", "log_timers_below_floor_v1", "log_timers_due_v2",
         "log_timers_tenants_tidy_v1",
         "log_timers_release_v2", "log_timers_release_claims_v2",
         "log_timers_dlq_v1", "log_timers_due_v1", "log_timers_fail_v1", "log_timers_fail_v2",
         "log_timers_fire_v1", "log_timers_fire_v2", "log_timers_release_v1",
        "log_timers_in_doubt_v1",
         "schema_version_v1", "switch_enabled_v1", "kv_delete_v1", "kv_get_v1", "kv_put_v1",
         "log_push_v1", "log_read_v1", "log_timers_apply_v1", "log_timers_list_v1",
         "log_timers_peek_v1"]))


def test_schema_version_and_its_table(q):
    assert q.one("SELECT queen.schema_version_v1()") == SCHEMA_VERSION
    row = q.all("SELECT component, version FROM queen.schema_info")
    assert row == [{"component": "queen-sweeper", "version": SCHEMA_VERSION}]


# ---------------------------------------------------------------------------------------
# Hijack: a role that can create objects in a schema ahead of pg_catalog on its path
# ---------------------------------------------------------------------------------------

HIJACKER = "queen_test_hijacker"


@pytest.fixture
def hijacker(q, connections):
    """A LOGIN role in queen_broker that owns schema `evil`, with search_path evil first
    (ahead of pg_catalog), and in it an octet_length(text) that always answers 0 and a
    timestamptz > that is always true."""
    schema = "evil_%s" % uuid.uuid4().hex[:8]
    q.exec("DROP ROLE IF EXISTS %s" % HIJACKER)
    q.exec("CREATE ROLE %s LOGIN IN ROLE queen_broker" % HIJACKER)
    q.exec("CREATE SCHEMA %s AUTHORIZATION %s" % (schema, HIJACKER))
    conn = connections(user=HIJACKER, options="-c search_path=%s,pg_catalog,public" % schema)
    h = Queen(conn)
    h.exec("CREATE FUNCTION %s.octet_length(text) RETURNS int LANGUAGE sql AS 'SELECT 0'" % schema)
    h.exec("CREATE FUNCTION %s.gt(timestamptz, timestamptz) RETURNS boolean LANGUAGE sql"
           " AS 'SELECT true'" % schema)
    h.exec("CREATE OPERATOR %s.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = %s.gt)"
           % (schema, schema))
    # The shadows are live in this session: unqualified code here would be fooled.
    assert h.one("SELECT octet_length('abc')") == 0
    assert h.one("SELECT now() > 'infinity'::timestamptz") is True
    yield h
    conn.close()
    q.exec("DROP SCHEMA %s CASCADE" % schema)
    q.exec("DROP ROLE %s" % HIJACKER)


def test_shadowed_octet_length_does_not_bypass_the_limits(q, hijacker):
    ops = [{"op": "schedule", "queue": "q" * 600, "timerKey": "k", "delayMs": 0, "txn": "t",
            "payload": ""}]
    with pytest.raises(psycopg2.Error) as e:
        hijacker.exec("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, NULL, %s)",
                      (json.dumps(ops), T1, NOW))
    assert e.value.pgcode == "22023" and "512-byte limit" in e.value.diag.message_primary
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_shadowed_operator_does_not_revive_an_expired_key(q, hijacker):
    q.put("gone", 1, ttl_ms=10)
    later = NOW + ms(1000)
    # Inside the pinned function (kv_get_v1 inlines kv_live_v1 under its own path) ...
    assert hijacker.one("SELECT queen.kv_get_v1(%s, 'ns', 'gone', %s)", (T1, later)) is None
    # ... and kv_live_v1 inlined into the hijacker's own query, under the hijacker's path:
    # its operator is schema-qualified, so the shadow does not apply there either. (The
    # hijacker holds no EXECUTE on it; the superuser runs the same query on the same path.)
    q.exec("SET search_path = %s, pg_catalog, public" % hijacker.one("SELECT (current_schemas(false))[1]"))
    try:
        assert q.one("SELECT now() > 'infinity'::timestamptz") is True   # the shadow is live
        assert q.one("SELECT queen.kv_live_v1(%s, %s)", (NOW, later)) is False
        assert q.one("SELECT queen.epoch_ms_v1('1970-01-01 00:00:01+00')") == 1000
    finally:
        q.exec("RESET search_path")


def test_shadowed_operator_does_not_change_what_a_broker_reads(q, hijacker):
    """peek and list (definer, pinned) keep their meaning under the hijacker's path."""
    q.apply([{"op": "schedule", "queue": "q", "timerKey": "later", "delayMs": 3600000,
              "txn": "t", "payload": ""}])
    page = hijacker.one("SELECT queen.log_timers_list_v1(%s, 'q', NULL, 10)", (T1,))
    assert [i["timerKey"] for i in page["items"]] == ["later"]
    assert page["items"][0]["deliverAtMs"] == hijacker.one(
        "SELECT queen.log_timers_peek_v1(%s, 'q', 'later')", (T1,))["deliverAtMs"]


# ---------------------------------------------------------------------------------------
# Applied by a schema owner that may not create roles
# ---------------------------------------------------------------------------------------

def test_apply_by_an_owner_without_createrole(q, connections, sweeper_conninfo, broker_conninfo):
    """A database owner that is neither superuser nor CREATEROLE applies the whole schema:
    006 skips the roles and the ownership with a NOTICE, and still takes PUBLIC's rights
    away and grants the (existing) group roles exactly their functions."""
    owner = "queen_test_owner_%s" % uuid.uuid4().hex[:6]
    db = "queen_apply_%s" % uuid.uuid4().hex[:10]
    q.exec("CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEROLE" % owner)
    q.exec("CREATE DATABASE %s OWNER %s" % (db, owner))
    try:
        conn = connections(dbname=db, user=owner)
        notices_before = len(conn.notices)
        apply_schema(conn)
        apply_schema(conn)                               # and again: idempotent
        assert any("ownership left as it is" in n for n in conn.notices[notices_before:]), conn.notices
        own = Queen(conn)
        assert own.one("SELECT queen.schema_version_v1()") == SCHEMA_VERSION
        assert own.one("SELECT count(*) FROM pg_proc p, aclexplode(coalesce(p.proacl,"
                       " acldefault('f', p.proowner))) a WHERE p.pronamespace = 'queen'::regnamespace"
                       " AND a.grantee = 0") == 0
        sweeper = Queen(connections(sweeper_conninfo, dbname=db))
        broker = Queen(connections(broker_conninfo, dbname=db))
        assert broker.one("SELECT queen.log_timers_apply_v1('[]'::jsonb, %s, NULL, %s)", (T1, NOW)) == []
        assert sweeper.one("SELECT queen.log_timers_due_v1(NULL, %s, 10)", (NOW,))["due"] == 0
        denied(broker, CLAIM, (NOW,))
        conn.close()
        sweeper.conn.close()
        broker.conn.close()
    finally:
        q.exec("DROP DATABASE IF EXISTS %s WITH (FORCE)" % db)
        q.exec("DROP ROLE %s" % owner)
