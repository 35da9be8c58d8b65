"""A held row costs itself (issue 36, schema version 18: queen.log_timers_held).

A due row in nobody's hands that someone else's transaction keeps locked (a host's open
transaction that rescheduled the timer, an ORM session idle in transaction) was the earliest
live row: every floor stopped at it for as long as it was held, and every walk passed what
was fired since. Now the claim lists it, the floors pass it, and every claim tries it by key:
it fires once its holder lets go, and nothing else waits for it.
"""
import datetime as dt

import pytest

from sqlkit import NOW, T1, ms, nested_plans, sched_many

from test_floor import claim3, due2, floor_of

LOCK = "SELECT 1 FROM queen.log_timers WHERE timer_key = %s FOR UPDATE"


@pytest.fixture
def holder(connections):
    """A session of a host's that keeps rows locked in an open transaction."""
    conn = connections()
    conn.autocommit = False
    yield conn
    conn.rollback()


def hold(holder, key):
    with holder.cursor() as cur:
        cur.execute(LOCK, (key,))
        assert cur.fetchone() == (1,)


def listed(q):
    return [r["timer_key"] for r in q.all("SELECT timer_key FROM queen.log_timers_held ORDER BY 1")]


def test_a_held_row_is_listed_passed_by_the_floor_and_fired_once_let_go(q, holder):
    sched_many(q, 1, now=NOW - ms(60_000), prefix="held")
    sched_many(q, 3, now=NOW - ms(50_000), prefix="free")
    hold(holder, "held000000")
    floor = NOW - ms(3_600_000)
    rows = claim3(q, floor=floor)
    assert sorted(r["timer_key"] for r in rows) == ["free000000", "free000001", "free000002"]
    assert listed(q) == ["held000000"]
    # the floor passed the held row: at the next row's instant, not the held one's
    assert {r["floor_ms"] for r in rows} == {int((NOW - ms(50_000)).timestamp() * 1000)}
    q.exec("DELETE FROM queen.log_timers WHERE timer_key LIKE 'free%%'")  # fired
    floor = floor_of(due2(q, floor=floor_of(due2(q))))
    d = due2(q, floor=floor)
    assert floor == NOW - ms(5000) and d["due"] == 0 and d["held"] == 1, d
    # the walk from the head does not bring the floor back to it
    assert q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,)) is None
    # still held: the claim tries it by key and gets nothing
    assert claim3(q, floor=floor) == []
    holder.rollback()  # the host lets go
    rows = claim3(q, floor=floor)
    assert [r["timer_key"] for r in rows] == ["held000000"]
    assert due2(q, floor=floor)["held"] == 0  # in flight
    q.exec("DELETE FROM queen.log_timers")  # fired
    claim3(q, floor=floor)
    assert listed(q) == []  # the entry goes with its row


def test_a_held_row_that_is_rescheduled_leaves_the_list_and_waits_at_its_new_instant(q, holder):
    sched_many(q, 1, now=NOW - ms(60_000), prefix="held")
    hold(holder, "held000000")
    claim3(q, floor=NOW - ms(3_600_000))
    assert listed(q) == ["held000000"]
    holder.rollback()
    q.apply([{"op": "reschedule", "queue": "q", "timerKey": "held000000", "delayMs": 10_000}], tenant=T1, now=NOW)
    assert claim3(q, floor=NOW - ms(5000)) == []  # not due yet
    assert listed(q) == []
    rows = claim3(q, now=NOW + ms(10_000), floor=NOW)
    assert [r["timer_key"] for r in rows] == ["held000000"]


def test_rows_in_flight_and_rows_not_due_are_never_listed(q, connections):
    sched_many(q, 2, now=NOW - ms(60_000), prefix="a")
    sched_many(q, 1, now=NOW + ms(60_000), prefix="later")
    other = connections()
    other.autocommit = False
    with other.cursor() as cur:  # another broker's claim, committed: its rows in flight
        cur.execute("SELECT count(*) FROM queen.log_timers_claim_v4(NULL, %s, 30000, 2, 2, NULL, NULL, NULL,"
                    " NULL, NULL, NULL, NULL)", (NOW,))
        assert cur.fetchone()[0] == 2
    other.commit()
    assert claim3(q, floor=NOW - ms(3_600_000)) == []
    assert listed(q) == []
    # the floor stays at the rows in flight (their lease may lapse)
    assert floor_of(due2(q)) == NOW - ms(60_000)


def test_at_most_64_rows_are_listed_and_4_a_claim(q, holder):
    sched_many(q, 70, now=NOW - ms(60_000), prefix="h")
    with holder.cursor() as cur:
        cur.execute("SELECT count(*) FROM (SELECT 1 FROM queen.log_timers FOR UPDATE) x")
    floor = NOW - ms(3_600_000)
    assert claim3(q, floor=floor) == []
    assert len(listed(q)) == 4
    for _ in range(20):
        claim3(q, floor=floor)
    assert len(listed(q)) == 64
    holder.rollback()
    # every row fires: the listed ones by key, the others from the floor
    rows = claim3(q, floor=floor, max_rows=100, per_tenant=None)
    assert len(rows) == 70


def test_the_sweeper_role_cannot_touch_the_list(q, as_sweeper):
    import psycopg2
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        as_sweeper.one("SELECT count(*) FROM queen.log_timers_held")


def test_a_listed_row_is_looked_up_by_its_primary_key_in_the_probe_and_the_claim(q, db, holder):
    """The probe's count of listed rows, the claim's take of them and the list's tidying each
    look a listed row up by its primary key, one lookup per entry: never a join the planner
    may hash over the due index, which it did under the generic plans with log_timers_held
    never analyzed (a held row for 30 minutes at 3,000 timers/s: probe and claim up to 8 s,
    tests/bench/load --phases held-row, schema version 20)."""
    sched_many(q, 1, now=NOW - ms(60_000), prefix="held")
    sched_many(q, 5000, now=NOW - ms(50_000), prefix="free")
    q.exec("ANALYZE queen.log_timers")
    hold(holder, "held000000")
    claim3(q, max_rows=10)
    assert listed(q) == ["held000000"]
    holder.rollback()
    for sql, args in (("SELECT queen.log_timers_due_v2(NULL, %s, 2000, NULL, NULL)", (NOW,)),
                      ("SELECT count(*) FROM queen.log_timers_claim_v4(NULL, %s, 30000, 10, 50, NULL, NULL, NULL,"
                       " NULL, NULL, NULL, NULL)", (NOW,))):
        for _ in range(6):  # past plpgsql's first custom plans: the generic one is what runs
            db.rollback() if not db.autocommit else None
            _, plans = nested_plans(db, sql, args, like="log_timers_held h")
        # the statements that look listed rows up (the walks only pass them, by a filter)
        plans = [p for p in plans if "count(*)" in p or "CROSS JOIN LATERAL" in p]
        assert plans, sql
        for p in plans:
            body = p[p.index("Query Text"):]
            assert "Hash Join" not in body and "Hash Semi Join" not in body, p
            assert "log_timers_pkey" in body, p
