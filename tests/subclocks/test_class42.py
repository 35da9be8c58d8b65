"""3. A SQLSTATE class 42 error turns the prune or the rollup off for the life of the
process, with one warning, while the fire and the other phase keep running.

The prune is broken by dropping queen.kv_expire_step_v1 (42883, undefined function); the
rollup by revoking EXECUTE on queen.kv_usage_step_v2 (the call the sweeper makes) from the role the sweeper logs in as
(42501, insufficient privilege). Both are put back by the fixtures: 005 re-applied (the
q fixture), EXECUTE granted to PUBLIC again and the role dropped (limited_role)."""

import time

import pytest
from psycopg2.extensions import make_dsn

from conftest import MAINTENANCE_FUNCTIONS
from queenkit import apply_sql_files, assert_clean_stop, now_ms, op_schedule, wait_for

PRUNE_FN, ROLLUP_FN = MAINTENANCE_FUNCTIONS[:2]
ROLE = "queen_subclocks_limited"
OFF_TEXT = "turned off for the life of this process"


def fire_one(q, h, queue):
    """Schedule a due timer, ring the sweeper, wait until it is in the log."""
    before = h.stats()["fired_total"]
    q.schedule([op_schedule(queue, "k1", b"still firing")])
    h.wake(now_ms())
    wait_for(lambda: h.stats()["fired_total"] >= before + 1, 10,
             what=f"the fire to deliver a timer on {queue}")
    wait_for(lambda: q.timers_left() == 0, 5, what="the fired timer to leave log_timers")
    segs = q.segments(queue)
    assert sum(c for _b, c, _bl in segs) == 1, segs


def test_prune_off_config_when_its_function_is_dropped(q, sweepers):
    q.kv_insert("c42", 100, expires_sql="now() - interval '1 second'")
    h = sweepers("c42-prune", kv_expire_every_ms=100, kv_expire_batch=50,
                 kv_usage_every_ms=150, sweeper_max_sleep_ms=50,
                 sweeper_idle_max_sleep_ms=100)
    h.start()
    try:
        wait_for(lambda: h.stats()["kv_deleted_total"] == 100, 10, what="the prune to work first")
        q.q(f"DROP FUNCTION {PRUNE_FN}")
        wait_for(lambda: h.stats()["phases"]["prune"] == "off_config", 10,
                 what='phases.prune == "off_config"')
        # Expired rows written once the prune is off (prune calls are one at a time, so
        # none is running now). Written before, a call already running when the function
        # was dropped could still delete them: its body was loaded before the DROP (seen
        # once in a full run: 110 rows deleted).
        q.kv_insert("c42", 10, expires_sql="now() - interval '1 second'", prefix="late")
        st_off = h.stats()
        calls_off = st_off["kv_prune_calls_total"]
        runs_off = st_off["rollup"]["runs_total"]

        # The fire keeps working.
        fire_one(q, h, "c42-prune-q")
        # The rollup keeps running on its gate.
        wait_for(lambda: h.stats()["rollup"]["runs_total"] >= runs_off + 3, 10,
                 what="the rollup to keep running")
        # For the life of the process: putting the function back does not revive it.
        apply_sql_files(q.conn, {"005_kv_maintenance.sql"})
        cycles = h.stats()["cycles_total"]
        wait_for(lambda: h.stats()["cycles_total"] >= cycles + 10, 10, what="ten more cycles")
        st = h.stats()
    finally:
        assert_clean_stop(h)

    assert st["phases"] == {"fire": "on", "rollup": "on", "prune": "off_config",
                            "backstop": "off"}, st["phases"]
    assert st["kv_prune_calls_total"] == calls_off, "the prune was called again after off"
    assert st["kv_deleted_total"] == 100
    assert q.kv_count("c42") == 10   # the late rows stay: nobody prunes them any more
    assert "42883" in st["last_error"], st["last_error"]
    warnings = h.messages(OFF_TEXT)
    assert len(warnings) == 1, h.log_text()
    w = warnings[0]
    assert w.startswith("KV prune"), w
    assert "Reads stay correct" in w and "grows" in w, w
    assert "SQLSTATE 42883" in w, w
    assert [lvl for _t, lvl, m in h.logs if OFF_TEXT in m] == [1], "logged as a warning"


@pytest.fixture
def limited_role(q, conninfo):
    """A LOGIN role that is no superuser, with what a broker's sweeper needs on schema
    queen. Yields its conninfo; at teardown EXECUTE goes back to PUBLIC and the role goes."""
    def cleanup():
        exists = q.one("SELECT count(*) FROM pg_roles WHERE rolname = %s", (ROLE,))
        if exists:
            q.q("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (ROLE,))
            q.q(f"DROP OWNED BY {ROLE}")
            q.q(f"DROP ROLE {ROLE}")
        # Back to the default ACL (EXECUTE to PUBLIC, no explicit entry), exactly as a
        # fresh apply leaves it: recreate both functions from 005.
        acl_touched = q.one("SELECT count(*) FROM pg_proc WHERE oid = ANY(ARRAY[to_regprocedure(%s),"
                            " to_regprocedure(%s)]::oid[]) AND proacl IS NOT NULL", (PRUNE_FN, ROLLUP_FN))
        if acl_touched:
            q.q(f"DROP FUNCTION IF EXISTS {ROLLUP_FN}")
            q.q(f"DROP FUNCTION IF EXISTS {PRUNE_FN}")
            apply_sql_files(q.conn, {"005_kv_maintenance.sql"})

    cleanup()
    q.q(f"CREATE ROLE {ROLE} LOGIN NOSUPERUSER")
    q.q(f"GRANT USAGE ON SCHEMA queen TO {ROLE}")
    q.q(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA queen TO {ROLE}")
    q.q(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA queen TO {ROLE}")
    q.q(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA queen TO {ROLE}")
    try:
        yield make_dsn(conninfo, user=ROLE)
    finally:
        cleanup()


def test_rollup_off_config_when_execute_is_revoked(q, limited_role, sweepers):
    h = sweepers("c42-rollup", conninfo_override=limited_role, kv_expire_every_ms=100,
                 kv_expire_batch=50, kv_usage_every_ms=150, sweeper_max_sleep_ms=50,
                 sweeper_idle_max_sleep_ms=100)
    h.start()
    try:
        wait_for(lambda: h.stats()["rollup"]["runs_total"] >= 2, 10,
                 what="the rollup to run as the limited role first")
        assert h.stats()["phases"]["rollup"] == "on"
        # EXECUTE comes from PUBLIC and from the explicit grant: take both away.
        q.q(f"REVOKE EXECUTE ON FUNCTION {ROLLUP_FN} FROM PUBLIC")
        q.q(f"REVOKE EXECUTE ON FUNCTION {ROLLUP_FN} FROM {ROLE}")
        wait_for(lambda: h.stats()["phases"]["rollup"] == "off_config", 10,
                 what='phases.rollup == "off_config"')
        runs_off = h.stats()["rollup"]["runs_total"]

        # The prune keeps working: rows expired from now on are still deleted.
        deleted = h.stats()["kv_deleted_total"]
        q.kv_insert("c42r", 120, expires_sql="now() - interval '1 second'")
        wait_for(lambda: h.stats()["kv_deleted_total"] >= deleted + 120, 10,
                 what="the prune to keep working with the rollup off")
        # The fire keeps working.
        fire_one(q, h, "c42-rollup-q")
        # For the life of the process: the grant back does not revive it.
        q.q(f"GRANT EXECUTE ON FUNCTION {ROLLUP_FN} TO PUBLIC")
        cycles = h.stats()["cycles_total"]
        wait_for(lambda: h.stats()["cycles_total"] >= cycles + 10, 10, what="ten more cycles")
        st = h.stats()
    finally:
        assert_clean_stop(h)

    assert st["phases"] == {"fire": "on", "rollup": "off_config", "prune": "on",
                            "backstop": "off"}, st["phases"]
    assert st["rollup"]["runs_total"] == runs_off
    assert q.kv_count("c42r") == 0
    assert "42501" in st["last_error"], st["last_error"]
    warnings = h.messages(OFF_TEXT)
    assert len(warnings) == 1, h.log_text()
    w = warnings[0]
    assert w.startswith("usage rollup"), w
    assert "SQLSTATE 42501" in w and "Reads stay correct" in w, w
