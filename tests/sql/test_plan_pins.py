"""Plan pins (issue 34, schema version 14: sql/README.md "Plan pins").

No statement the sweeper runs, directly or inside a function, is ever JIT-compiled or goes
parallel because the table grew. With 10 million future timers the claim's estimated cost
crossed jit_above_cost and PostgreSQL compiled it anew on every call (1.4 s of JIT for a
1 ms statement): every function in schema queen carries `SET jit = off` and `SET
max_parallel_workers_per_gather = 0`, except the one-line SQL helpers that are inlined into
their (pinned) callers, which must stay inlinable. A new function that forgets fails here.
"""
import os
import re
import uuid

import psycopg2
import pytest

from queenkit import ROOT
from sqlkit import NOW, nested_plans, sched_many

PINS = {"jit": "off", "max_parallel_workers_per_gather": "0",
        "search_path": "pg_catalog, queen, pg_temp"}
# Inlined into their callers (a SET clause would stop the planner from inlining them, and
# they run per row): they take their caller's pins. sql/README.md "search_path".
INLINED = {"epoch_ms_v1", "log_timers_not_before_v1", "log_timers_ours_v1", "kv_live_v1"}


def functions(db):
    with db.cursor() as cur:
        cur.execute("""
            SELECT p.proname, p.oid::regprocedure::text, l.lanname, p.proconfig, p.prosecdef, p.provolatile
              FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              JOIN pg_language l ON l.oid = p.prolang
             WHERE n.nspname = 'queen' ORDER BY 1""")
        return cur.fetchall()


def config_of(proconfig):
    return dict(c.split("=", 1) for c in (proconfig or []))


def library_functions():
    """Every queen function the library's named statements call (src/pg/statements.hpp)."""
    with open(os.path.join(ROOT, "src", "pg", "statements.hpp"), encoding="utf-8") as f:
        text = f.read()
    names = set(re.findall(r"queen\.([a-z0-9_]+)\(", text))
    assert len(names) >= 10, names
    return names


def test_every_function_in_the_schema_pins_its_plan(db):
    found = functions(db)
    assert len(found) > 40
    missing = []
    for name, sig, lang, proconfig, secdef, volatility in found:
        if name in INLINED:
            # Inlinable: plain SQL, no SET clause, not SECURITY DEFINER, not volatile.
            assert lang == "sql" and proconfig is None and not secdef and volatility in ("i", "s"), sig
            continue
        cfg = config_of(proconfig)
        for k, v in PINS.items():
            if cfg.get(k) != v:
                missing.append("%s: %s = %r" % (sig, k, cfg.get(k)))
    assert not missing, "functions without their plan pins:\n" + "\n".join(missing)


def test_the_library_calls_only_pinned_functions(db):
    by_name = {}
    for name, sig, lang, proconfig, secdef, volatility in functions(db):
        by_name.setdefault(name, []).append(config_of(proconfig))
    for name in library_functions():
        assert name in by_name, "statements.hpp names queen.%s, which the schema does not hold" % name
        assert name not in INLINED
        for cfg in by_name[name]:
            assert all(cfg.get(k) == v for k, v in PINS.items()), (name, cfg)


JIT_EVERYWHERE = ["SET jit = on", "SET jit_above_cost = 0", "SET jit_inline_above_cost = 0",
                  "SET jit_optimize_above_cost = 0", "SET max_parallel_workers_per_gather = 4",
                  "SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0",
                  "SET min_parallel_table_scan_size = 0", "SET min_parallel_index_scan_size = 0"]

PROBE = "SELECT queen.log_timers_due_v2(NULL, %s, 2000, NULL, NULL)"
CLAIM = ("SELECT timer_key FROM queen.log_timers_claim_v4(NULL, %s, 30000, 50, 50, NULL, %s::uuid,"
         " NULL, NULL, NULL, NULL, NULL)")


def everything_compiles(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT pg_jit_available()")
        assert cur.fetchone()[0], "this server cannot JIT (no llvmjit): the test could not fail"
        for s in JIT_EVERYWHERE:
            cur.execute(s)


def jit_plans(conn, sql, args, inner_only=True):
    """The plans auto_explain showed for sql that were compiled or parallel. inner_only: the
    plans of the statements inside the function (the top-level call's own plan is pinned by
    the library's transaction, pinned_settings_sql, which tests/unit asserts)."""
    _, plans = nested_plans(conn, sql, args)
    if inner_only:
        top = sql.split("%s")[0]
        plans = [p for p in plans if ("Query Text: " + top) not in p]
    assert plans, "auto_explain showed no plan"
    return [p for p in plans if "JIT:" in p or "Parallel" in p or "Gather" in p]


def test_probe_and_claim_are_never_compiled_nor_parallel_with_every_threshold_at_zero(q, connections):
    sched_many(q, 300)
    conn = connections()
    everything_compiles(conn)
    # The control: an unpinned statement on the same table is compiled under these settings,
    # so auto_explain would show it.
    assert jit_plans(conn, "SELECT count(*) FROM queen.log_timers WHERE deliver_at > %s", (NOW,), inner_only=False)
    assert not jit_plans(conn, PROBE, (NOW,))
    assert not jit_plans(conn, CLAIM, (NOW, str(uuid.uuid4())))


def test_without_its_pin_the_claim_would_be_compiled(q, connections):
    """The pin is what keeps the JIT out (not, say, a plan too cheap to compile): with the
    claim's `jit = off` reset in an open transaction, the same call is compiled."""
    sched_many(q, 300)
    conn = connections()
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("ALTER FUNCTION queen.log_timers_claim_v4 RESET jit")
        everything_compiles(conn)
        assert any("JIT:" in p for p in jit_plans(conn, CLAIM, (NOW, str(uuid.uuid4()))))
    finally:
        conn.rollback()
