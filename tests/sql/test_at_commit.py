"""A row lands where it belongs at its commit (log_timers_at_commit_v1, schema version 17).

Every write puts its row at or after the now it writes with; a transaction that commits more
than a second after that now has its rows moved to the commit's clock by a deferred
constraint trigger, so no row becomes visible behind a floor (at least the slack, 5 s,
behind the now of whoever computed it). These tests use the real clock (the trigger reads
it), as the broker's LOGIN role (least privilege: the trigger runs at the broker's commit).
"""
import base64
import datetime as dt
import json
import os
import time

import psycopg2
import pytest

from sqlkit import T1

APPLY = "SELECT queen.log_timers_apply_v1(%s::jsonb, %s, 'p', {now})"


def ops(keys, delay_ms=0, kind="schedule"):
    out = []
    for k in keys:
        op = {"op": kind, "queue": "q", "timerKey": k, "delayMs": delay_ms}
        if kind == "schedule":
            op.update(txn="t-" + k, payload=base64.b64encode(b"{}").decode())
        out.append(op)
    return json.dumps(out)


@pytest.fixture
def broker(schema):
    conninfo = os.environ.get("QUEEN_TEST_BROKER_CONNINFO")
    if not conninfo:
        pytest.fail("QUEEN_TEST_BROKER_CONNINFO is not set: tests/pg start exports it", pytrace=False)
    conn = psycopg2.connect(conninfo)
    conn.autocommit = False
    yield conn
    conn.rollback()
    conn.close()


def rows(q):
    return {r["timer_key"]: r for r in q.all(
        "SELECT timer_key, deliver_at, claimed_until, due_at, attempts FROM queen.log_timers")}


def commit_clocked(conn):
    """Commit; the server's clock just before and just after (from another statement)."""
    with conn.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        before = cur.fetchone()[0]
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        after = cur.fetchone()[0]
    conn.commit()
    return before, after


def test_a_transaction_that_commits_late_has_its_due_rows_moved_to_the_commit(q, broker):
    with broker.cursor() as cur:
        cur.execute("SELECT now()")
        start = cur.fetchone()[0]
        cur.execute(APPLY.format(now="now()"), (ops(["a", "b", "c"]), T1))
        cur.execute(APPLY.format(now="now()"), (ops(["later"], delay_ms=600_000), T1))
        time.sleep(1.6)
    before, after = commit_clocked(broker)
    got = rows(q)
    for k in ("a", "b", "c"):
        r = got[k]
        assert r["deliver_at"] == start, r  # the timer's own instant is kept
        assert before <= r["due_at"] <= after and r["claimed_until"] == r["due_at"], (r, before, after)
        assert r["attempts"] == 0
    # a row due after the commit is left where it was written
    assert got["later"]["claimed_until"] is None and got["later"]["due_at"] == start + dt.timedelta(minutes=10)
    # so a floor computed during the transaction (its now - slack is past the rows' now) is
    # not past them: the probe sees them due, and nothing is behind it
    floor = before - dt.timedelta(seconds=1)
    d = q.one("SELECT queen.log_timers_due_v2(NULL, clock_timestamp(), 100, %s, NULL)", (floor,))
    assert d["due"] == 3, d
    assert q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,)) is None


def test_a_prompt_commit_keeps_every_due_at_as_written(q, broker):
    with broker.cursor() as cur:
        cur.execute("SELECT now()")
        start = cur.fetchone()[0]
        cur.execute(APPLY.format(now="now()"), (ops(["a", "b"]), T1))
    broker.commit()
    got = rows(q)
    assert {k: (r["due_at"], r["claimed_until"]) for k, r in got.items()} == {"a": (start, None), "b": (start, None)}


def test_a_writer_whose_now_lies_back_lands_at_its_transactions_now_and_then_at_its_commit(q, broker):
    """A caller's now far behind the server's (a skewed host clock): the row is put at the
    transaction's now() when written (log_timers_not_behind), and at the commit's clock if
    the commit is late."""
    with broker.cursor() as cur:
        cur.execute("SELECT now()")
        start = cur.fetchone()[0]
        cur.execute(APPLY.format(now="now() - interval '10 minutes'"), (ops(["m600"]), T1))
        # 10 s ahead of its now, still 20 s behind the transaction's start
        cur.execute(APPLY.format(now="now() - interval '30 seconds'"), (ops(["d10"], delay_ms=10_000), T1))
    broker.commit()
    assert {k: r["due_at"] for k, r in rows(q).items()} == {"m600": start, "d10": start}
    with broker.cursor() as cur:
        cur.execute(APPLY.format(now="now() - interval '10 minutes'"), (ops(["late"]), T1))
        time.sleep(1.2)
    before, after = commit_clocked(broker)
    assert before <= rows(q)["late"]["due_at"] <= after


def test_a_reschedule_in_a_late_transaction_is_moved_and_a_cancel_or_rollback_leaves_nothing(q, broker):
    with broker.cursor() as cur:
        cur.execute(APPLY.format(now="now()"), (ops(["r", "gone", "kept"], delay_ms=3_600_000), T1))
    broker.commit()
    with broker.cursor() as cur:
        cur.execute(APPLY.format(now="now() - interval '1 minute'"), (ops(["r"], kind="reschedule"), T1))
        cur.execute(APPLY.format(now="now() - interval '1 minute'"), (ops(["gone"], kind="reschedule"), T1))
        cur.execute(APPLY.format(now="now()"), (ops(["gone"], kind="cancel"), T1))
        time.sleep(1.2)
    before, after = commit_clocked(broker)
    got = rows(q)
    assert set(got) == {"r", "kept"}
    assert before <= got["r"]["due_at"] <= after
    # a rolled-back late transaction moves nothing
    with broker.cursor() as cur:
        cur.execute(APPLY.format(now="now() - interval '1 minute'"), (ops(["kept"], kind="reschedule"), T1))
    broker.rollback()
    assert rows(q)["kept"]["due_at"] == got["kept"]["due_at"]


def test_only_the_deferred_check_moves_rows_and_the_walk_from_the_head_finds_what_it_cannot(q, broker):
    """SET CONSTRAINTS ALL IMMEDIATE runs the check at the statement's end, not at the commit:
    the row keeps its now and a floor can pass it. The walk from the head is the net."""
    with broker.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute("SELECT now()")
        start = cur.fetchone()[0]
        cur.execute(APPLY.format(now="now()"), (ops(["imm"]), T1))
        time.sleep(1.3)
    broker.commit()
    r = rows(q)["imm"]
    assert r["due_at"] == start and r["claimed_until"] is None
    floor = start + dt.timedelta(milliseconds=500)
    assert q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,)) is not None


def test_the_trigger_is_deferred_and_never_queued_by_a_claim(q):
    t = q.one("SELECT row_to_json(x) FROM (SELECT tgdeferrable, tginitdeferred, tgenabled"
              " FROM pg_trigger WHERE tgrelid = 'queen.log_timers'::regclass"
              " AND tgname = 'log_timers_at_commit') x")
    assert t == {"tgdeferrable": True, "tginitdeferred": True, "tgenabled": "O"}
    # the columns it watches: deliver_at only (a claim, a fire, a failure and a hand-back
    # never set it)
    cols = q.one("SELECT array_agg(a.attname::text) FROM pg_trigger g"
                 " JOIN pg_attribute a ON a.attrelid = g.tgrelid AND a.attnum = ANY (g.tgattr)"
                 " WHERE g.tgrelid = 'queen.log_timers'::regclass AND g.tgname = 'log_timers_at_commit'")
    assert cols == ["deliver_at"]

