"""The claim mark (schema version 12: sql/002_timers.sql, log_timers_claim_mark).

Every broker's claim advances one shared due_at past what its walk for the oldest rows
covered, so the next claim's walk starts there and does not pass, one heap read each, the
rows the other brokers hold in flight. These tests hold its rules: a walk from the mark
never starts behind now - slack (a row committed late within the slack is taken at once); a
row that lands behind the mark another way (a lapsed lease here) is taken by the first walk
from the floor, at most log_timers_claim_mark_age_v1() after the mark was founded, or after
a short claim; the mark moves only past rows a pool covered; claims over some shards leave it
alone and claims with a skip list never found it; nobody waits for its row. The decision
itself (log_timers_claim_mark_next_v1) is tested at both ends.
"""
import base64
import os
import uuid

import pytest

from sqlkit import NOW, T1, ms

AGE = ms(1000)


def sched_spread(q, n, oldest_ms=60_000, step_ms=10, prefix="k", payload="e30="):
    """n timers, one per write, each written with its own now, step_ms apart starting
    oldest_ms before NOW: distinct due_at values, in key order."""
    for i in range(n):
        res = q.apply([{"op": "schedule", "queue": "q", "timerKey": f"{prefix}{i:03d}", "delayMs": 0,
                        "txn": f"txn-{prefix}{i}", "payload": payload}],
                      now=NOW - ms(oldest_ms - i * step_ms))
        assert res[0]["ok"], res


def claim(q, now=NOW, max_rows=10, lease_ms=30000, max_bytes=None, shards=None, skip=None):
    skip = skip or []
    rows = q.all("SELECT * FROM queen.log_timers_claim_v4(%s::int2[], %s, %s, %s, NULL, %s, %s::uuid,"
                 " %s::uuid[], %s::text[], %s::text[], NULL, NULL)",
                 (shards, now, lease_ms, max_rows, max_bytes, str(uuid.uuid4()),
                  [str(t) for t, _, _ in skip] or None, [x for _, x, _ in skip] or None,
                  [p for _, _, p in skip] or None))
    return [r["timer_key"] for r in rows]


def slow(q):
    """A timer its transaction wrote with a now of NOW - 59.985 s (between k001 and k002 of
    sched_spread), committed now: behind the floor's slack and behind any mark."""
    res = q.apply([{"op": "schedule", "queue": "q", "timerKey": "slow", "delayMs": 0, "txn": "txn-slow",
                    "payload": "e30="}], now=NOW - ms(59_985))
    assert res[0]["ok"], res


def mark(q):
    return q.all("SELECT mark, founded_at FROM queen.log_timers_claim_mark WHERE id = 1")[0]


def due_of(q, key):
    return q.one("SELECT due_at FROM queen.log_timers WHERE timer_key = %s", (key,))


def keys(a, b, prefix="k"):
    return [f"{prefix}{i:03d}" for i in range(a, b)]


def test_a_full_pool_founds_the_mark_and_the_next_walk_starts_there(q):
    sched_spread(q, 30)
    assert mark(q) == {"mark": None, "founded_at": None}
    # Leases of 1 ms: the ten rows are free again 1 ms later, at the due_at they were
    # claimed at, behind the mark (a lease that lapsed with its broker).
    assert claim(q, lease_ms=1) == keys(0, 10)
    assert mark(q) == {"mark": due_of(q, "k009"), "founded_at": NOW}
    # The mark is trusted: the walk starts there (k009 sits on it) and passes k000-k008.
    assert claim(q, now=NOW + ms(2)) == keys(9, 19)
    m = mark(q)
    assert m == {"mark": due_of(q, "k018"), "founded_at": NOW}  # moved forward, founding kept
    # Still trusted just before the age runs out: k019 onwards.
    assert claim(q, now=NOW + AGE - ms(1)) == keys(19, 29)
    # Once the mark is as old as log_timers_claim_mark_age_v1(), the walk starts at the
    # floor again and the lapsed rows go first, oldest first; that walk founds a new mark.
    assert claim(q, now=NOW + AGE) == keys(0, 9) + ["k029"]
    assert mark(q) == {"mark": due_of(q, "k029"), "founded_at": NOW + AGE}


def test_a_short_claim_clears_the_mark_and_the_next_walks_from_the_floor(q):
    sched_spread(q, 15)
    assert claim(q, lease_ms=1) == keys(0, 10)
    assert mark(q)["mark"] == due_of(q, "k009")
    # From the mark: k009 (lapsed, on the mark) and the five after it, fewer than asked.
    assert claim(q, now=NOW + ms(2)) == keys(9, 15)
    assert mark(q) == {"mark": None, "founded_at": None}
    # A short claim said the walk from the mark found the end: the next starts at the floor.
    assert claim(q, now=NOW + ms(3)) == keys(0, 9)


def test_the_walk_from_the_mark_never_starts_behind_now_minus_the_slack(q):
    """A row whose transaction wrote it with a now within the slack, and committed after the
    mark moved past its due_at, is taken by the next claim: the floor's rule (3a) holds."""
    sched_spread(q, 20, oldest_ms=4_000, step_ms=100)   # due NOW - 4 s .. NOW - 2.1 s
    assert claim(q) == keys(0, 10)
    assert mark(q)["mark"] == due_of(q, "k009") == NOW - ms(3_100)
    # Written with a now of NOW - 3.5 s (before the mark), committed now.
    res = q.apply([{"op": "schedule", "queue": "q", "timerKey": "late", "delayMs": 0, "txn": "txn-late",
                    "payload": "e30="}], now=NOW - ms(3_500))
    assert res[0]["ok"]
    got = claim(q, now=NOW + ms(1))
    assert got[0] == "late" and got[1:] == keys(10, 19)


def test_a_row_older_than_the_slack_committed_behind_the_mark_waits_for_the_next_walk_from_the_floor(q):
    """Beyond the slack the mark behaves as the floor does (3a): the walk from the floor
    finds such a row, here the founding walk once the mark is old enough."""
    sched_spread(q, 19)
    assert claim(q) == keys(0, 10)
    slow(q)
    assert claim(q, now=NOW + ms(1)) == keys(10, 19)    # short: the mark is cleared
    assert claim(q, now=NOW + ms(2)) == ["slow"]


def test_a_pool_not_taken_whole_moves_the_mark_only_to_its_first_row_left(q):
    # 1 KiB payloads and a byte budget of 3.5 KiB: three of the ten pooled rows are taken.
    sched_spread(q, 20, payload=base64.b64encode(os.urandom(1026)).decode())
    got = claim(q, max_bytes=3_500)
    assert got == keys(0, 3)
    assert mark(q)["mark"] == due_of(q, "k003")
    # The rows left in the pool are reached by the next walk from the mark.
    assert claim(q, now=NOW + ms(1), max_bytes=3_500) == keys(3, 6)


def test_claims_over_some_shards_leave_the_mark_alone_and_a_skip_list_never_founds_it(q):
    sched_spread(q, 30)
    shards = [q.one("SELECT shard FROM queen.log_timers WHERE timer_key = 'k000'")]
    assert claim(q, shards=shards, max_rows=1, lease_ms=1) == ["k000"]
    assert mark(q)["mark"] is None
    # A walk with a skip list does not cover the rows of the partitions it leaves out, so it
    # never founds a mark, even from the floor.
    part = q.one("SELECT partition FROM queen.log_timers WHERE timer_key = 'k000'")
    assert claim(q, now=NOW + ms(2), skip=[(T1, "q", part + "-other")], max_rows=5) == keys(0, 5)
    assert mark(q)["mark"] is None
    # A mark set by a full claim over everything is not read by a claim over some shards:
    # it walks from its floor and finds a lapsed row behind the mark.
    assert claim(q, now=NOW + ms(3), max_rows=10, lease_ms=1) == keys(5, 15)
    assert mark(q)["mark"] == due_of(q, "k014")
    shards = [q.one("SELECT shard FROM queen.log_timers WHERE timer_key = 'k005'")]
    assert claim(q, now=NOW + ms(5), shards=shards, max_rows=1) == ["k005"]
    assert mark(q)["mark"] == due_of(q, "k014")
    # A claim with a skip list starts at the trusted mark (k014, lapsed, on it), past the
    # lapsed k006-k013, and moves it forward (the founding kept): the rows of the partitions
    # it leaves out that it passes are reached by the next walk from the floor.
    assert claim(q, now=NOW + ms(6), skip=[(T1, "q", part + "-other")], max_rows=3) == keys(14, 17)
    assert mark(q) == {"mark": due_of(q, "k016"), "founded_at": NOW + ms(3)}
    # A short pool because of its skip list (every row is in the partition it leaves out)
    # says nothing of the due rows' end: the mark stays.
    assert claim(q, now=NOW + ms(7), skip=[(T1, "q", part)], max_rows=3) == []
    assert mark(q) == {"mark": due_of(q, "k016"), "founded_at": NOW + ms(3)}
    assert claim(q, now=NOW + ms(3) + AGE, max_rows=3) == keys(6, 9)


def test_nobody_waits_for_the_marks_row(q, connections):
    sched_spread(q, 30)
    holder = connections()
    holder.autocommit = False
    with holder.cursor() as cur:
        cur.execute("SELECT 1 FROM queen.log_timers_claim_mark WHERE id = 1 FOR UPDATE")
        q.exec("SET lock_timeout = '200ms'")
        try:
            assert claim(q) == keys(0, 10)     # neither waits nor fails
            assert mark(q)["mark"] is None     # the held row is left as it is
        finally:
            q.exec("RESET lock_timeout")
    holder.rollback()
    assert claim(q) == keys(10, 20)
    assert mark(q)["mark"] == due_of(q, "k019")


def test_a_mark_founded_after_the_callers_now_is_not_trusted(q):
    """A broker whose clock is behind the founder's, or a caller's now going back: the walk
    starts at the floor (and founds the mark again at that now)."""
    sched_spread(q, 30)
    assert claim(q, now=NOW + ms(500)) == keys(0, 10)
    assert mark(q) == {"mark": due_of(q, "k009"), "founded_at": NOW + ms(500)}
    slow(q)
    assert claim(q, now=NOW + ms(100)) == ["slow"] + keys(10, 19)
    assert mark(q) == {"mark": due_of(q, "k018"), "founded_at": NOW + ms(100)}


@pytest.mark.parametrize("case, args, want", [
    # A short pool (fewer rows than asked, or none) clears the mark, from the floor or not.
    ("short from the floor", (None, None, True, 10, 9, "t5", None, "now"), (None, None)),
    ("short from the mark", ("t1", "t0", False, 10, 0, None, None, "now"), (None, None)),
    # A full pool from the floor founds the mark at its last row, or at its first row left.
    ("founds at the last row", ("t9", "t0", True, 10, 10, "t5", None, "now"), ("t5", "now")),
    ("founds at the first row left", (None, None, True, 10, 10, "t5", "t2", "now"), ("t2", "now")),
    # From the mark: forward only, its founding kept.
    ("moves forward", ("t3", "t0", False, 10, 10, "t5", None, "now"), ("t5", "t0")),
    ("never back", ("t9", "t0", False, 10, 10, "t5", None, "now"), ("t9", "t0")),
    ("never back past a row left", ("t3", "t0", False, 10, 10, "t5", "t1", "now"), ("t3", "t0")),
    # A mark cleared meanwhile (another broker's short claim) stays cleared.
    ("cleared meanwhile", (None, None, False, 10, 10, "t5", None, "now"), (None, None)),
])
def test_the_marks_next_value_at_both_ends(q, case, args, want):
    at = {"now": NOW, **{f"t{i}": NOW - ms(60_000 - 1000 * i) for i in range(10)}}
    conv = [at.get(a, a) if isinstance(a, str) else a for a in args]
    got = q.all("SELECT mark, founded_at FROM queen.log_timers_claim_mark_next_v1(%s, %s, %s, %s, %s, %s, %s, %s)",
                conv)
    assert len(got) == 1, case
    assert (got[0]["mark"], got[0]["founded_at"]) == tuple(at.get(w) if w else None for w in want), case
