"""Every PL/pgSQL function in schema queen passes plpgsql_check (the Debian package
postgresql-15-plpgsql-check, installed by tests/run): its statements are planned against the
real tables and every reference, type and variable is checked without running it.

Fails on any error, and on any warning but the accepted ones below. The checks run:
plpgsql_check_function_tb with extra_warnings and security_warnings on. Not run: the
performance warnings. They name VOLATILE functions that could be STABLE (the claim reads the
floor in a snapshot of its own, which only VOLATILE gives it; the probe's helpers are
deliberate) and implicit casts between compatible types (int into bigint and the like); each
was read on 2026-12-04 and none is a fault.

Accepted warnings (function, message), each with its reason:
- kv_usage_step_v2: unused parameter "p_shards": the rollup covers every shard; the
  parameter stays in the signature the library calls (src/pg/statements.hpp kKvUsageStep).
"""

import pytest

from sqlkit import Queen

ACCEPTED = {("kv_usage_step_v2", 'unused parameter "p_shards"')}


@pytest.fixture
def checked(connections):
    conn = connections()
    conn.autocommit = True
    with conn.cursor() as cur:
        # The extension is the superuser's to create (the test cluster's connection is one).
        cur.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
    return Queen(conn)


def test_every_plpgsql_function_passes_plpgsql_check(checked):
    functions = checked.all(
        "SELECT p.oid::regprocedure::text AS fn FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.pronamespace = 'queen'::regnamespace AND l.lanname = 'plpgsql'")
    # The schema's PL/pgSQL: the claim, the fire and its helpers, the apply... (a guard against
    # a query that finds nothing and so checks nothing).
    assert len(functions) >= 30, functions
    findings = checked.all(
        "SELECT p.proname, r.level, r.sqlstate, r.message, r.lineno, r.statement"
        "  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql'"
        "  CROSS JOIN LATERAL plpgsql_check_function_tb(p.oid,"
        "      CASE WHEN p.prorettype = 'trigger'::regtype"
        "           THEN coalesce((SELECT t.tgrelid FROM pg_trigger t WHERE t.tgfoid = p.oid LIMIT 1),"
        "                         'queen.log_timers'::regclass) ELSE 0 END,"
        "      fatal_errors => false, extra_warnings => true, security_warnings => true,"
        "      performance_warnings => false) r"
        " WHERE p.pronamespace = 'queen'::regnamespace"
        " ORDER BY p.proname, r.lineno")
    errors = [f for f in findings if f["level"] == "error"]
    assert errors == [], errors
    unexpected = [f for f in findings if (f["proname"], f["message"]) not in ACCEPTED]
    assert unexpected == [], unexpected
    # The accepted ones are still there (a fixed one leaves the list).
    assert {(f["proname"], f["message"]) for f in findings} == ACCEPTED


def test_the_checker_finds_a_fault_it_is_meant_to_find(checked):
    """The check is not vacuous: a function naming a column that does not exist is an error."""
    checked.exec("CREATE OR REPLACE FUNCTION pg_temp.broken() RETURNS int LANGUAGE plpgsql AS"
                 " $$ BEGIN RETURN (SELECT t.no_such_column FROM queen.log_timers t LIMIT 1); END $$")
    found = checked.all("SELECT level, message FROM plpgsql_check_function_tb('pg_temp.broken()'::regprocedure,"
                        " fatal_errors => false)")
    assert any(f["level"] == "error" and "no_such_column" in f["message"] for f in found), found
