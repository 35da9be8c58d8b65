"""The floor and the tenants' shares (issue 20, schema version 7: sql/002_timers.sql, 3a).

The probe (log_timers_due_v2) and the claim (log_timers_claim_v4) start from a floor the
caller keeps and answer the next one: least(earliest live row at or after the floor,
now - slack). Every write puts its row at or after the now it writes with, so no row lands
behind a floor but a slow transaction's, which the walk from the head finds
(log_timers_below_floor_v1). These tests hold the promises: no timer is skipped (a
deliverAt in the past, a hand-back, a write by hand, a claim that rolls back, a slow
transaction), oldest first within a tenant, and under a backlog the claims name tenants from
the fleet's ring (log_timers_tenant_ring_v1): a tenant behind others' backlogs is reached
within a few claims and given the same share as each of them.
"""
import base64
import datetime as dt
import json
import uuid

import psycopg2

from sqlkit import NOW, T1, T2, ms, nested_plans, ring_place, sched_many, set_ring_place

SLACK = ms(5000)


def due2(q, now=NOW, cap=2000, floor=None, horizon_ms=None, shards=None):
    return q.one("SELECT queen.log_timers_due_v2(%s::int2[], %s, %s, %s, %s)", (shards, now, cap, floor, horizon_ms))


def claim3(q, now=NOW, max_rows=200, per_tenant=50, floor=None, tenants=None, lease_ms=30000, shards=None):
    return q.all("SELECT * FROM queen.log_timers_claim_v4(%s::int2[], %s, %s, %s, %s, NULL, NULL, NULL, NULL, NULL,"
                 " %s, %s::uuid[])",
                 (shards, now, lease_ms, max_rows, per_tenant, floor,
                  None if tenants is None else [None if t is None else str(t) for t in tenants]))


def floor_of(answer):
    return dt.datetime.fromtimestamp(answer["floorMs"] / 1000, tz=dt.timezone.utc)


def test_the_floor_is_the_earliest_live_row_or_now_minus_the_slack(q):
    # an empty table: now - slack
    d = due2(q)
    assert floor_of(d) == NOW - SLACK and d["nextInMs"] is None and d["beyond"] is False
    # a backlog older than the slack: its head
    sched_many(q, 3, now=NOW - ms(60000))
    d = due2(q)
    assert floor_of(d) == NOW - ms(60000) and d["due"] == 3
    # a claim answers the same floor, and starts its walk there
    rows = claim3(q, floor=NOW - ms(3600_000))
    assert len(rows) == 3 and {r["floor_ms"] for r in rows} == {d["floorMs"]}
    # schema version 9: the rows in flight wait where they were claimed (due_at), so they
    # hold the floor at their instant; once fired (deleted here), it is now - slack again
    d = due2(q)
    assert floor_of(d) == NOW - ms(60000) and d["due"] == 0 and d["nextInMs"] == 30000
    q.exec("DELETE FROM queen.log_timers")
    assert floor_of(due2(q)) == NOW - SLACK


def test_a_probe_with_a_horizon_stops_there_and_says_so(q):
    sched_many(q, 1, delay_ms=10_000)
    d = due2(q, horizon_ms=1000)
    assert d["nextInMs"] is None and d["beyond"] is True and d["due"] == 0
    d = due2(q, horizon_ms=None)
    assert d["nextInMs"] == 10_000 and d["beyond"] is False
    d = due2(q, horizon_ms=20_000)
    assert d["nextInMs"] == 10_000 and d["beyond"] is False


def test_a_deliver_at_in_the_past_is_written_at_the_writers_now(q):
    """A timer whose deliverAt is before the now it is written with lands at visible_at =
    that now, in front of any floor that has passed its deliverAt: it fires, and timers
    written at one now go oldest first by deliverAt. (With the real clock: the trigger puts a
    write by hand there too; the functions do it with their caller's now.)"""
    q.exec("INSERT INTO queen.log_timers (queue, timer_key, deliver_at, txn, message_id, payload)"
           " SELECT 'q', k, now() - d, 'x', gen_random_uuid(), '\\x00'"
           "   FROM (VALUES ('b-later', interval '1 minute'), ('a-late', interval '1 hour'), ('c-now', interval '0')) v(k, d)")
    assert q.one("SELECT count(DISTINCT visible_at) FROM queen.log_timers") == 1
    floor = q.one("SELECT now() - interval '1 second'")
    rows = q.all("SELECT timer_key, late_ms FROM queen.log_timers_claim_v4(NULL, now(), 30000, 10, 10, NULL, NULL,"
                 " NULL, NULL, NULL, %s, NULL)", (floor,))
    assert [r["timer_key"] for r in rows] == ["a-late", "b-later", "c-now"]
    assert rows[0]["late_ms"] >= 3_600_000
    # through the function, with the caller's now: deliverAt = now - 0 is not behind it
    assert q.schedule("fn", now=NOW)["ok"]
    assert q.one("SELECT visible_at FROM queen.log_timers WHERE timer_key = 'fn'") == NOW
    assert q.one("SELECT queen.log_timers_not_before_v1(%s, %s)", (NOW - ms(1), NOW)) == NOW
    assert q.one("SELECT queen.log_timers_not_before_v1(%s, %s)", (NOW, NOW)) is None
    assert q.one("SELECT queen.log_timers_not_before_v1(%s, NULL)", (NOW,)) is None


def test_a_hand_back_puts_the_row_at_the_now_of_the_hand_back(q):
    sched_many(q, 2, now=NOW - ms(60_000))
    rows = claim3(q, now=NOW)
    later = NOW + ms(20_000)
    assert q.one("SELECT queen.log_timers_release_v2(%s::uuid[], %s::text[], %s::text[], %s::uuid[], %s)",
                 ([r["tenant_id"] for r in rows[:1]], [r["queue"] for r in rows[:1]],
                  [r["timer_key"] for r in rows[:1]], [r["claim_token"] for r in rows[:1]], later)) == 1
    cid = uuid.uuid4()
    q.exec("UPDATE queen.log_timers SET claim_token = %s WHERE timer_key = %s", (str(cid), rows[1]["timer_key"]))
    lease_end = NOW + ms(30_000)
    assert q.release_claims([cid], lease_end - ms(1), lease_end + ms(1), now=later) == 1
    got = q.all("SELECT timer_key, visible_at FROM queen.log_timers ORDER BY 1")
    assert [r["visible_at"] for r in got] == [later, later], got
    # a floor from before the hand-back: both fire
    floor = floor_of(due2(q, now=later - ms(1)))
    assert len(claim3(q, now=later, floor=floor)) == 2


def test_the_old_hand_back_leaves_a_row_behind_and_the_walk_from_the_head_finds_it(q):
    """release_v1 (a sweeper of schema version 6) has no now: claimed_until is nulled, the
    row goes back to its deliverAt. The trigger puts it at the real now() (later than the
    fixed test NOW), so here the row is behind a floor only because NOW lies in 2030: the
    walk from the head is what finds a row behind, whatever put it there."""
    sched_many(q, 1, now=NOW - ms(60_000))
    rows = claim3(q, now=NOW)
    q.release(rows)
    v = q.one("SELECT visible_at FROM queen.log_timers")
    assert v == NOW - ms(60_000)  # deliver_at is in 2030, after the real now(): no trigger
    floor = NOW - ms(1000)
    assert claim3(q, now=NOW, floor=floor) == []
    behind = q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,))
    assert behind == int((NOW - ms(60_000)).timestamp() * 1000)
    assert len(claim3(q, now=NOW, floor=dt.datetime.fromtimestamp(behind / 1000, tz=dt.timezone.utc))) == 1
    # in flight, the row still waits where it was claimed (schema version 9): still found
    # behind the floor (were its lease to lapse, this is the walk that would find it again)
    assert q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,)) == behind
    q.exec("DELETE FROM queen.log_timers")  # fired
    assert q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,)) is None


def test_a_slice_of_the_walk_from_the_head_finds_only_what_lies_within_it(q):
    """The sweeper walks [head, floor) a slice at a time (src/sweeper/floor.hpp): a slice
    [from, until) answers the earliest row in it, from included, until not; the head slice
    (null from) everything before until; a null until nothing."""
    sched_many(q, 1, now=NOW - ms(60_000))
    q.release(claim3(q, now=NOW))  # back at its deliverAt, 60 s before NOW (see above)
    at = int((NOW - ms(60_000)).timestamp() * 1000)

    def walk(frm, until):
        return q.one("SELECT queen.log_timers_below_floor_v1(%s, %s)", (frm, until))
    assert walk(None, NOW) == at
    assert walk(NOW - ms(60_000), NOW) == at  # from included
    assert walk(NOW - ms(59_999), NOW) is None  # after the slice's row
    assert walk(None, NOW - ms(60_000)) is None  # until not included
    assert walk(NOW - ms(120_000), NOW - ms(59_999)) == at
    assert walk(None, None) is None


def test_a_write_by_hand_behind_now_is_put_at_now_by_the_trigger(q):
    """A row INSERTed by hand with a deliver_at in the past (an operator, a migration):
    the trigger sets claimed_until = now(), so visible_at = the transaction's now()."""
    q.exec("INSERT INTO queen.log_timers (queue, timer_key, deliver_at, txn, message_id, payload)"
           " VALUES ('q', 'byhand', now() - interval '1 hour', 'x', gen_random_uuid(), '\\x00')")
    r = q.one("SELECT row_to_json(t) FROM (SELECT visible_at BETWEEN now() - interval '1 minute' AND now() AS at_now,"
              " claimed_until IS NOT NULL AS set, claim_token IS NULL AS free FROM queen.log_timers) t")
    assert r == {"at_now": True, "set": True, "free": True}
    # an UPDATE by hand that hands a claim back the old way, too
    q.exec("UPDATE queen.log_timers SET claim_token = gen_random_uuid(), claimed_until = now() + interval '1 minute'")
    q.exec("UPDATE queen.log_timers SET claim_token = NULL, claimed_until = NULL")
    assert q.one("SELECT visible_at BETWEEN now() - interval '1 minute' AND now() FROM queen.log_timers") is True
    # a future row by hand is left as written
    q.exec("INSERT INTO queen.log_timers (queue, timer_key, deliver_at, txn, message_id, payload)"
           " VALUES ('q', 'future', now() + interval '1 hour', 'x', gen_random_uuid(), '\\x00')")
    assert q.one("SELECT claimed_until IS NULL FROM queen.log_timers WHERE timer_key = 'future'") is True


def test_a_claim_another_session_holds_does_not_move_the_floor_past_its_rows(q, connections):
    """Rows locked by a claim that has not committed are seen where they were: if that claim
    rolls back, they are in front of the floor."""
    sched_many(q, 5, now=NOW - ms(60_000))
    other = connections()
    other.autocommit = False
    with other.cursor() as cur:
        cur.execute("SELECT count(*) FROM queen.log_timers_claim_v4(NULL, %s, 30000, 5, 50, NULL, NULL, NULL, NULL,"
                    " NULL, NULL, NULL)", (NOW,))
        assert cur.fetchone()[0] == 5
    d = due2(q)  # reads the rows' committed place
    assert floor_of(d) == NOW - ms(60_000)
    assert claim3(q, floor=floor_of(d)) == []  # locked: skipped, not passed
    other.rollback()
    assert len(claim3(q, floor=floor_of(d))) == 5


def test_a_slow_transaction_lands_behind_the_floor_and_only_the_walk_from_the_head_finds_it(q, connections):
    """The one case the floor does not cover by itself: a transaction that writes a timer with
    its now and commits more than the slack later. Its row is found by the walk from the head;
    nothing is skipped."""
    slow = connections()
    slow.autocommit = False
    with slow.cursor() as cur:
        cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, 'p', %s)",
                    (json.dumps([{"op": "schedule", "queue": "q", "timerKey": "slow", "delayMs": 0, "txn": "s",
                                  "payload": base64.b64encode(b"{}").decode()}]), T1, NOW))
    later = NOW + ms(10_000)
    floor = floor_of(due2(q, now=later))
    assert floor == later - SLACK
    slow.commit()
    assert claim3(q, now=later, floor=floor) == []
    assert due2(q, now=later, floor=floor)["due"] == 0
    behind = q.one("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,))
    assert behind == int(NOW.timestamp() * 1000)
    rows = claim3(q, now=later, floor=dt.datetime.fromtimestamp(behind / 1000, tz=dt.timezone.utc))
    assert [r["timer_key"] for r in rows] == ["slow"]


def test_a_floor_never_moves_back_by_an_answer(q):
    f = NOW + ms(1000)
    d = due2(q, now=NOW, floor=f)  # a clock stepped back: now - slack is behind the floor given
    assert floor_of(d) == f


def test_a_subset_of_shards_gives_the_floor_back_unchanged(q):
    sched_many(q, 3, now=NOW - ms(60_000))
    f = NOW - ms(3_600_000)
    d = due2(q, floor=f, shards=[0, 1])
    assert floor_of(d) == f
    rows = claim3(q, floor=f, shards=list(range(64)))
    assert rows and rows[0]["floor_ms"] == int((NOW - ms(60_000)).timestamp() * 1000)


def test_a_tenant_behind_another_tenants_backlog_gets_its_share_in_the_first_claim_under_a_backlog(q):
    """Tenant 1: 3,000 due a minute ago. Tenant 2: 10 due now. The oldest-first walk of a
    claim of 200 holds only tenant 1; a claim under a backlog (tenants given, even empty)
    names both from the ring and gives each a share of least(per_tenant, 200 / 2): tenant 2
    its 10, oldest first, tenant 1 its 50 and the 140 the walk adds."""
    sched_many(q, 3000, tenant=T1, now=NOW - ms(60_000), prefix="a")
    sched_many(q, 10, tenant=T2, now=NOW, prefix="b")
    blind = q.claim2(max_rows=200, per_tenant=50)
    assert {r["tenant_id"] for r in blind} == {T1}
    q.release(blind)
    q.exec("UPDATE queen.log_timers SET claimed_until = NULL")  # back where they were (2030 is after now())
    d = due2(q, cap=2000)
    assert d["dueCapped"] is True and "tenants" not in d
    assert claim3(q, max_rows=200, per_tenant=50, floor=floor_of(d), tenants=None)[0]["tenant_id"] == T1
    q.exec("UPDATE queen.log_timers SET claim_token = NULL, claimed_until = NULL")
    rows = claim3(q, max_rows=200, per_tenant=50, floor=floor_of(d), tenants=[])
    by = {}
    for r in rows:
        by.setdefault(r["tenant_id"], []).append(r["timer_key"])
    assert by[T2] == [f"b{i:06d}" for i in range(10)]
    # (tenant 1's rows share one due_at: which 190 is the index's order, returned in key order)
    assert len(by[T1]) == 190 and by[T1] == sorted(by[T1]) and len(set(by[T1])) == 190


def test_a_single_tenants_backlog_is_the_oldest_first_walk_alone(q):
    sched_many(q, 2500, tenant=T1, now=NOW - ms(1000))
    d = due2(q, cap=2000)
    assert d["dueCapped"] is True
    rows = claim3(q, max_rows=200, per_tenant=50, tenants=[])
    assert [r["timer_key"] for r in rows] == [f"k{i:06d}" for i in range(200)]


def test_the_ring_reaches_a_small_tenant_behind_200_busy_tenants_within_four_claims(q):
    """200 busy tenants, 100 rows each due a minute ago; a small tenant's 5 due now, the
    newest rows. Claims of 2,048 under a backlog: each names 64 tenants (2,048 / 32) from
    where the last left off and gives each 32, so the small tenant is served within
    ceil(201 / 64) = 4 claims, all 5 in the claim naming it (the oldest-first walk alone:
    after all 20,000), and the busy tenants are given the same share each."""
    busy = sorted(uuid.UUID(int=0x5000 + i) for i in range(200))
    small = uuid.UUID(int=0x4000)  # before every busy tenant in the ring's order
    for b in busy:
        sched_many(q, 100, tenant=b, now=NOW - ms(60_000), prefix="b")
    sched_many(q, 5, tenant=small, now=NOW, prefix="s")
    set_ring_place(q, busy[0])
    served = {}
    small_at = None
    for n in range(1, 5):
        rows = claim3(q, max_rows=2048, per_tenant=50, tenants=[])
        assert len(rows) == 2048
        for r in rows:
            served[r["tenant_id"]] = served.get(r["tenant_id"], 0) + 1
        if small_at is None and any(r["tenant_id"] == small for r in rows):
            small_at = n
            assert [r["timer_key"] for r in rows if r["tenant_id"] == small] == [f"s{i:06d}" for i in range(5)]
        q.exec("DELETE FROM queen.log_timers WHERE claim_token IS NOT NULL")
        assert ring_place(q) is not None
    assert small_at is not None and small_at <= 4, small_at
    assert served[small] == 5
    # 4 claims of 64 named over 201 tenants: each busy one named once or twice, 32 each time
    counts = [served.get(b, 0) for b in busy]
    assert min(counts) >= 32 and max(counts) <= 64, counts


def test_the_ring_moves_only_with_the_turn_and_a_claim_without_it_starts_anywhere_and_is_counted(q, connections):
    """Tenant 1's 100 rows are older than tenant 2's 100: a claim of 64 under a backlog names
    both (64 / 5 = 12 may be named, each given 5), so tenant 2 gets its 5 and tenant 1 its 5
    and the 54 of the oldest-first walk; outside a backlog (tenants null) tenant 1 gets all."""
    sched_many(q, 100, tenant=T1, now=NOW - ms(2000), prefix="a")
    sched_many(q, 100, tenant=T2, now=NOW - ms(1000), prefix="b")
    set_ring_place(q, None)
    other = connections(autocommit=False)
    other.cursor().execute("SELECT 1 FROM queen.log_timers_claim_turn WHERE id = 1 FOR UPDATE")
    timeouts = due2(q)["turnTimeouts"]
    try:
        rows = claim3(q, max_rows=64, per_tenant=5, tenants=[])
        # both tenants named (a random place: both are in the ring)
        assert sum(1 for r in rows if r["tenant_id"] == T2) == 5 and len(rows) == 64
        assert ring_place(q) is None
    finally:
        other.rollback()
    # the claim that walked without the turn is counted, for the fleet, by the probe
    assert due2(q)["turnTimeouts"] == timeouts + 1
    # the turn had: tenant 1's last 41 (5 + 36 of the walk) and tenant 2's 5 + 18 of the walk
    assert sum(1 for r in claim3(q, max_rows=64, per_tenant=5, tenants=[]) if r["tenant_id"] == T2) == 23
    assert ring_place(q) in (T1, T2)
    assert due2(q)["turnTimeouts"] == timeouts + 1
    # no backlog (tenants null): the ring is not walked (tenant 1's rows are all in flight)
    set_ring_place(q, None)
    assert len(claim3(q, max_rows=64, per_tenant=5, tenants=None)) == 64
    assert ring_place(q) is None


def test_a_named_tenant_without_due_rows_costs_nothing_and_changes_nothing(q):
    sched_many(q, 20, tenant=T1, now=NOW - ms(1000))
    sched_many(q, 5, tenant=T2, delay_ms=60_000, prefix="f")  # due later
    rows = claim3(q, max_rows=10, per_tenant=5, tenants=[T2, uuid.uuid4()])
    assert len(rows) == 10 and {r["tenant_id"] for r in rows} == {T1}
    assert [r["timer_key"] for r in rows] == [f"k{i:06d}" for i in range(10)]


def test_the_claim_refuses_a_null_now_a_lease_under_1_ms_and_skip_arrays_that_do_not_line_up(q):
    for bad in ("SELECT * FROM queen.log_timers_claim_v4(NULL, NULL, 1, 1, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
                "SELECT * FROM queen.log_timers_claim_v4(NULL, now(), 0, 1, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
                "SELECT * FROM queen.log_timers_claim_v4(NULL, now(), 1, 1, 1, NULL, NULL, '{00000000-0000-0000-0000-000000000001}',"
                " NULL, '{p}', NULL, NULL)"):
        try:
            q.all(bad)
            raise AssertionError("accepted: " + bad)
        except psycopg2.Error as e:
            assert e.pgcode == "22023", (bad, e.pgcode)
            q.conn.rollback() if not q.conn.autocommit else None
    # 64 tenants at most are looked at; duplicates and nulls are ignored
    assert claim3(q, tenants=[uuid.uuid4() for _ in range(500)] + [None]) == []


def claim3_bytes(q, max_rows, per_tenant, max_bytes, tenants=None):
    return q.all("SELECT * FROM queen.log_timers_claim_v4(NULL, %s, 30000, %s, %s, %s, NULL, NULL, NULL, NULL, NULL,"
                 " %s::uuid[])", (NOW, max_rows, per_tenant, max_bytes,
                                  None if tenants is None else [str(t) for t in tenants]))


def test_the_claim_locks_only_the_rows_it_takes(q, connections):
    """The oldest pool is max_rows, not 2 * max_rows: while one claim of 10 is open, another
    connection's claim takes the next 10 (the rows a wider pool would hold for nothing)."""
    sched_many(q, 30, now=NOW - ms(1000))
    other = connections()
    other.autocommit = False
    with other.cursor() as cur:
        cur.execute("SELECT timer_key FROM queen.log_timers_claim_v4(NULL, %s, 30000, 10, 3, NULL, NULL, NULL, NULL,"
                    " NULL, NULL, NULL)", (NOW,))
        first = [r[0] for r in cur.fetchall()]
        assert first == [f"k{i:06d}" for i in range(10)]
        second = [r["timer_key"] for r in claim3(q, max_rows=10, per_tenant=3)]
        assert second == [f"k{i:06d}" for i in range(10, 20)]
    other.rollback()


def test_a_pool_that_fits_is_taken_whole_oldest_first_and_one_over_the_budget_is_shared(q):
    """When the pool fits in max_rows and the byte budget, the claim takes all of it, oldest
    first; when the byte budget cuts it, the choice is per tenant, round by round, so a
    tenant with big payloads at the head does not fill the budget alone."""
    big = base64.b64encode(b"x" * 1000).decode()
    ops = [{"op": "schedule", "queue": "q", "timerKey": f"a{i:03d}", "delayMs": 0, "txn": f"ta{i}",
            "payload": big} for i in range(20)]
    q.apply(ops, tenant=T1, now=NOW - ms(2000))
    sched_many(q, 4, tenant=T2, now=NOW - ms(1000), prefix="b")
    whole = claim3_bytes(q, max_rows=100, per_tenant=2, max_bytes=None)
    assert [r["timer_key"] for r in whole] == [f"a{i:03d}" for i in range(20)] + [f"b{i:06d}" for i in range(4)]
    q.release(whole)
    q.exec("UPDATE queen.log_timers SET claimed_until = NULL")
    # 3,000 bytes: tenant 1's first two (2,000), tenant 2's first two (small), then one more
    # of tenant 1's round two: no more fit.
    cut = claim3_bytes(q, max_rows=100, per_tenant=2, max_bytes=3100)
    keys = [r["timer_key"] for r in cut]
    assert keys[:2] == ["a000", "a001"] and "b000000" in keys and "b000001" in keys, keys
    assert sum(1 for k in keys if k.startswith("a")) == 3, keys
    assert [k for k in keys if k.startswith("a")] == ["a000", "a001", "a002"]


def test_epoch_ms_is_inlined_and_exact(q):
    """epoch_ms_v1 runs per claimed row: its body is immutable, so the planner inlines it (no
    function call per row), and it rounds down to the millisecond at both ends of the range."""
    with q.conn.cursor() as cur:
        cur.execute("EXPLAIN VERBOSE SELECT queen.epoch_ms_v1(now())")
        plan = "\n".join(r[0] for r in cur.fetchall())
        assert "epoch_ms_v1" not in plan, plan
        cur.execute("SELECT queen.epoch_ms_v1(x::timestamptz) FROM unnest(%s::text[]) x",
                    (["1970-01-01 00:00:00+00", "1969-12-31 23:59:59.9995+00", "2026-12-01 12:00:00.1234+05",
                      "9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00"],))
        assert [r[0] for r in cur.fetchall()] == [0, -1, 1796108400123, 253402300799999, -62135596800000]


def test_a_named_tenants_share_is_one_range_of_its_own_index_whatever_the_backlog(q):
    """The share of a named tenant reads its own rows through log_timers_tenant_due_at_idx, never
    a walk of the (visible_at) index filtered on the tenant: that walk goes through the whole
    of another tenant's backlog first (measured: 333 ms behind 1M rows, 3.8 s behind 10M).
    Both tenants are named: the plan is generic (schema version 11), one plan for a share
    of ten rows and a share of a 50,000-row backlog, and neither goes through the primary
    key with a sort of the tenant's rows (what a generic plan chose with incremental sorts
    on)."""
    q.exec("""INSERT INTO queen.log_timers (tenant_id, queue, timer_key, partition, deliver_at, txn,
                                            message_id, payload)
              SELECT %s::uuid, 'q', 'a' || g, 'p', now() - interval '1 second', 'a' || g, gen_random_uuid(),
                     '\\x00'::bytea FROM generate_series(1, 50000) g""", (str(T1),))
    q.exec("""INSERT INTO queen.log_timers (tenant_id, queue, timer_key, partition, deliver_at, txn,
                                            message_id, payload)
              SELECT %s::uuid, 'q', 'b' || g, 'p', now(), 'b' || g, gen_random_uuid(), '\\x00'::bytea
                FROM generate_series(1, 10) g""", (str(T2),))
    q.exec("VACUUM ANALYZE queen.log_timers")
    out, plans = nested_plans(q.conn, "SELECT tenant_id::text FROM queen.log_timers_claim_v4(NULL, now(), 30000, 100,"
                                      " 10, NULL, NULL, NULL, NULL, NULL, NULL, %s::uuid[])", ([str(T1), str(T2)],),
                              like="CTE shares")
    got = [r[0] for r in out]
    assert got.count(str(T2)) == 10, got
    assert plans, "no plan of the claim's statement"
    plan = "\n".join(plans)
    shares = plan[plan.index("CTE shares"):]
    shares = shares[:shares.index("CTE ", 10)] if "CTE " in shares[10:] else shares
    assert "Index Scan using log_timers_tenant_due_at_idx" in shares, shares
    assert "Rows Removed by Filter: 5" not in shares, shares   # not the other tenant's 50,000
    assert "log_timers_pkey" not in shares and "Sort" not in shares, shares
    # Each share reads its ten rows and stops (rows=10 per loop, one loop per tenant).
    assert "rows=10 loops=2" in shares.split("log_timers_tenant_due_at_idx", 1)[1].splitlines()[0], shares


def _index_reads(q, index):
    """Entries read from `index` so far by this database's sessions (this session's counts of
    the statements before flushed first)."""
    q.exec("SELECT pg_stat_force_next_flush()")
    q.exec("SELECT pg_stat_clear_snapshot()")
    return q.one("SELECT idx_tup_read FROM pg_stat_user_indexes WHERE schemaname = 'queen'"
                 " AND indexrelname = %s", (index,))


def test_a_claim_passes_the_fired_rows_a_held_snapshot_keeps_inside_the_slack_once(q, connections):
    """A snapshot held elsewhere keeps the entries of every row fired in the last slack seconds
    between the floor and the first live row: 3,000 of tenant 1 here. The claim's head read
    passes them once; its oldest-first walk, the ring and the named tenants' shares then start
    at the head it found (nothing live is between: listed rows are taken by key), not at the
    floor again (2 x 3,000 entries of the due index, and of the tenants' index 2 x 3,000
    more, before schema 35). The floor answered is still least(head, now - slack); the probe
    passes them once too."""
    snap = connections(autocommit=False)
    snap.cursor().execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    snap.cursor().execute("SELECT count(*) FROM queen.log_timers_tenants")
    try:
        sched_many(q, 3000, tenant=T1, now=NOW - ms(3000), prefix="f")
        q.exec("DELETE FROM queen.log_timers WHERE tenant_id = %s", (str(T1),))  # fired
        sched_many(q, 5, tenant=T1, now=NOW - ms(1000), prefix="a")
        sched_many(q, 5, tenant=T2, now=NOW - ms(1000), prefix="b")
        q.exec("ANALYZE queen.log_timers")
        floor = NOW - SLACK
        due0 = _index_reads(q, "log_timers_due_idx")
        answer = due2(q, floor=floor)
        due1 = _index_reads(q, "log_timers_due_idx")
        assert answer["due"] == 10 and floor_of(answer) == floor
        assert 3000 <= due1 - due0 <= 3100, due1 - due0
        # The oldest-first walk alone (no backlog named), then a backlog's ring and shares.
        for tenants, max_rows, per_tenant, want in ((None, 4, 50, 4), ([], 6, 3, 6)):
            due_a = _index_reads(q, "log_timers_due_idx")
            ten_a = _index_reads(q, "log_timers_tenant_due_at_idx")
            rows = claim3(q, floor=floor, max_rows=max_rows, per_tenant=per_tenant, tenants=tenants)
            due_b = _index_reads(q, "log_timers_due_idx")
            ten_b = _index_reads(q, "log_timers_tenant_due_at_idx")
            assert len(rows) == want, rows
            assert {r["floor_ms"] for r in rows} == {int(floor.timestamp() * 1000)}
            assert 3000 <= due_b - due_a <= 3100, (tenants, due_b - due_a)
            assert ten_b - ten_a <= 20, (tenants, ten_b - ten_a)
        assert q.one("SELECT count(*) FROM queen.log_timers WHERE claim_token IS NOT NULL") == 10
    finally:
        snap.rollback()
