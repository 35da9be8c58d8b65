"""Every hand-over is atomic (issue 18): what the host was told is what happens.

- Exhaustion and the move to the DLQ are one decision (log_timers_fail_v2): a timer the host
  rescheduled, replaced, cancelled or re-created is never dead-lettered for what its old
  version did. Each host operation is raced against the failure, both ways round.
- A claim is named by the caller's claim id, so a claim whose answer was lost can be handed
  back by id (log_timers_release_claims_v2), bounded to the window its lease ends in.
- A claim is bounded in payload bytes as well as rows (the claim's max_bytes).
- Every statement of the fire that deletes a claimed row applies the claim check to the row
  it deletes (log_timers_ours_v1), so it does not depend on the server re-checking a TID.
"""
import base64
import threading
import time
import uuid

import psycopg2
import pytest

from sqlkit import NOW, T1, Queen, ms


def sched(q, key, payload=b'{"v": 1}', now=NOW, **extra):
    op = {"op": "schedule", "queue": "q", "timerKey": key, "delayMs": 0, "txn": "txn-" + key,
          "payload": base64.b64encode(payload).decode()}
    op.update(extra)
    return q.apply([op], now=now)[0]


def exhaust_to_last_attempt(q, key, max_attempts=2):
    """Fails the timer until one attempt is left; returns the claim of its last attempt."""
    now = NOW
    for _ in range(max_attempts - 1):
        rows = q.claim(now=now)
        q.fail2(rows, klass="permanent", now=now, backoff_min_ms=10, max_attempts=max_attempts)
        now = now + ms(10)
    rows = q.claim(now=now)
    assert [r["timer_key"] for r in rows] == [key]
    return rows, now


HOST_OPS = {
    "reschedule": lambda key: {"op": "reschedule", "queue": "q", "timerKey": key, "delayMs": 0,
                               "payload": base64.b64encode(b'{"v": 2}').decode()},
    "replace": lambda key: {"op": "schedule", "queue": "q", "timerKey": key, "delayMs": 0,
                            "txn": "txn-new", "payload": base64.b64encode(b'{"v": 2}').decode()},
}


def test_dlq_leaves_a_rescheduled_timer_alone(q):
    """A timer that failed, then was rescheduled by its host (attempts back to 0, new
    payload), is not dead-lettered by an operator's dlq_v1 for what its old version did."""
    sched(q, "a")
    now = NOW
    res = q.fail(q.claim(now=now), klass="permanent", now=now)
    assert res["exhausted"] == [] and q.timer("a")["attempts"] == 1
    told = q.apply([HOST_OPS["reschedule"]("a")], now=now)[0]
    assert told["ok"] is True and told["status"] == "rescheduled"
    assert q.dlq([{"tenant": T1, "queue": "q", "key": "a"}], now=now) == {"moved": 0}
    t = q.timer("a")
    assert t is not None and t["attempts"] == 0 and bytes(t["payload"]) == b'{"v": 2}'
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 0


def test_fail_v2_moves_what_it_exhausts_in_the_same_call(q):
    sched(q, "a")
    sched(q, "b")
    now = NOW
    res = None
    for _ in range(2):
        rows = [r for r in q.claim(now=now) if r["timer_key"] == "a"]
        res = q.fail2(rows, klass="permanent", now=now, backoff_min_ms=10, max_attempts=2,
                      error="poison")
        now = now + ms(10)
    assert res["moved"] == 1 and [e["key"] for e in res["exhausted"]] == ["a"]
    assert q.timer("a") is None and q.timer("b") is not None
    dl = q.all("SELECT timer_key, attempts, error, payload FROM queen.log_dlq")
    assert dl == [{"timer_key": "a", "attempts": 2, "error": "poison", "payload": {"v": 1}}]
    # A transient failure never exhausts, never moves.
    rows = q.claim(now=now)
    assert q.fail2(rows, klass="transient", now=now, max_attempts=1)["moved"] == 0


@pytest.mark.parametrize("op", ["reschedule", "replace", "cancel_then_schedule"])
def test_a_host_operation_racing_the_last_failure_is_told_the_truth(q, connections, op):
    """The failure goes first and holds its row locks until it commits. The host's operation
    is answered from what is true: a reschedule or a cancel sees the row still in the
    sweeper's hands (too_late) or, having waited, gone (absent), and changes nothing; a
    schedule waits for the failure and then creates a NEW timer (attempts 0). The DLQ holds
    the OLD version. Never 'rescheduled' about a timer that is then dead-lettered."""
    sched(q, "a")
    rows, now = exhaust_to_last_attempt(q, "a")
    sweeper = connections()
    sweeper.autocommit = False
    with sweeper.cursor() as cur:
        cur.execute("SELECT queen.log_timers_fail_v2(%s::uuid[], %s::text[], %s::text[], %s::uuid[],"
                    " 'poison', 'permanent', %s, 10, 60000, 1000, 2)",
                    ([rows[0]["tenant_id"]], ["q"], ["a"], [rows[0]["claim_token"]], now))
        assert cur.fetchone()[0]["moved"] == 1
    host = Queen(connections())
    answer = {}

    def host_acts():
        if op == "cancel_then_schedule":
            answer["cancel"] = host.apply([{"op": "cancel", "queue": "q", "timerKey": "a"}], now=now)[0]
            answer["op"] = host.apply([HOST_OPS["replace"]("a")], now=now)[0]
        else:
            answer["op"] = host.apply([HOST_OPS[op]("a")], now=now)[0]

    t = threading.Thread(target=host_acts)
    t.start()
    time.sleep(0.3)                          # the host acts while the failure is uncommitted
    sweeper.commit()
    t.join(10)
    assert not t.is_alive()
    dl = q.all("SELECT timer_key, attempts, payload FROM queen.log_dlq")
    assert dl == [{"timer_key": "a", "attempts": 2, "payload": {"v": 1}}]   # the old version
    if op == "reschedule":
        assert answer["op"]["status"] in ("too_late", "absent") and answer["op"]["ok"] is False
        assert q.timer("a") is None
    elif op == "replace":
        # schedule on a missing key creates a new timer: it is a new timer, not dead-lettered
        assert answer["op"]["status"] == "scheduled" and answer["op"]["replaced"] is False
        assert q.timer("a")["attempts"] == 0
    else:
        assert answer["cancel"]["status"] in ("too_late", "absent") and answer["cancel"]["ok"] is False
        assert answer["op"]["status"] == "scheduled" and answer["op"]["replaced"] is False
        assert q.timer("a")["attempts"] == 0


@pytest.mark.parametrize("op", ["reschedule", "replace", "cancel_then_schedule"])
def test_a_host_operation_before_the_last_failure_is_never_dead_lettered(q, op):
    """The host goes first (the lease lapsed, the row is in nobody's hands): the failure's
    token no longer matches, so nothing is failed and nothing moved."""
    sched(q, "a")
    rows, now = exhaust_to_last_attempt(q, "a")
    later = now + ms(30001)                              # the last claim's lease has lapsed
    if op == "cancel_then_schedule":
        assert q.apply([{"op": "cancel", "queue": "q", "timerKey": "a"}], now=later)[0]["status"] == "cancelled"
        told = q.apply([HOST_OPS["replace"]("a")], now=later)[0]
    else:
        told = q.apply([HOST_OPS[op]("a")], now=later)[0]
    assert told["ok"] is True
    res = q.fail2(rows, klass="permanent", now=later, max_attempts=2)
    assert res == {"released": 0, "exhausted": [], "moved": 0}
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 0
    t = q.timer("a")
    assert t["attempts"] == 0 and bytes(t["payload"]) == b'{"v": 2}'


def test_a_claim_carries_the_callers_id_and_one_lease_instant(q):
    for k in ("a", "b", "c"):
        sched(q, k)
    cid = uuid.uuid4()
    rows = q.claim2(claim_id=cid, lease_ms=30000)
    assert {r["claim_token"] for r in rows} == {cid}
    until = {t["claimed_until"] for t in q.all("SELECT claimed_until FROM queen.log_timers")}
    assert until == {NOW + ms(30000)}
    # without an id every row gets a fresh token of its own (the v1 behaviour)
    q.release(rows)
    rows = q.claim2()
    assert len({r["claim_token"] for r in rows}) == 3


def test_a_lost_claim_is_handed_back_by_id_within_its_window(q):
    for k in ("a", "b", "c", "d"):
        sched(q, k)
    lost, other = uuid.uuid4(), uuid.uuid4()
    q.claim2(claim_id=lost, max_rows=3, lease_ms=30000)
    q.claim2(claim_id=other, max_rows=3, lease_ms=30000)         # the fourth row, another claim
    end = NOW + ms(30000)
    # a window that misses the lease end finds nothing, whatever the id
    assert q.release_claims([lost], end + ms(1), end + ms(5000)) == 0
    assert q.release_claims([uuid.uuid4()], end - ms(5000), end + ms(5000)) == 0
    assert q.release_claims([lost], end - ms(5000), end + ms(5000)) == 3
    left = q.all("SELECT timer_key, claim_token FROM queen.log_timers WHERE claim_token IS NOT NULL")
    assert [r["claim_token"] for r in left] == [other]
    assert q.claim2(now=NOW) and q.release_claims([lost], end - ms(5000), end + ms(5000)) == 0
    # due again at once: another broker's claim takes the three
    again = q.all("SELECT count(*) AS n FROM queen.log_timers WHERE claim_token IS NULL")
    assert again[0]["n"] == 0        # the claim just above took them


def test_a_lost_claims_hand_back_walks_from_its_floor_and_takes_listed_held_rows_behind_it(q):
    """The hand-back walks the due index from the floor the claim was sent with, not from
    its head (schema version 22): a claim's rows are at or after its floor, but a listed held
    row, which the claim takes by key wherever it waits. A row of that claim behind the floor
    and not listed (none can be, short of a hand edit, as here) is not walked."""
    sched(q, "old", now=NOW - ms(60_000))
    for k in ("a", "b"):
        sched(q, k, now=NOW - ms(1000))
    lost = uuid.uuid4()
    assert len(q.claim2(claim_id=lost, max_rows=3, lease_ms=30000)) == 3
    end = NOW + ms(30000)
    floor = NOW - ms(2000)  # "old" is behind it
    assert q.release_claims([lost], end - ms(5000), end + ms(5000), floor=floor) == 2
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE claim_token = %s", (str(lost),)) == 1
    # listed (a held row the claim took by key): handed back from behind the floor too
    q.exec("INSERT INTO queen.log_timers_held (tenant_id, queue, timer_key, due_at, listed_at)"
           " SELECT tenant_id, queue, timer_key, due_at, now() FROM queen.log_timers WHERE timer_key = 'old'")
    assert q.release_claims([lost], end - ms(5000), end + ms(5000), floor=floor) == 1
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE claim_token IS NOT NULL") == 0


@pytest.mark.parametrize("window", [(None, NOW), (NOW, None), (NOW + ms(1), NOW),
                                    (NOW, NOW + ms(10 * 60 * 1000 + 1))])
def test_the_release_window_is_checked(q, window):
    with pytest.raises(psycopg2.Error) as e:
        q.release_claims([uuid.uuid4()], *window)
    assert e.value.pgcode == "22023"


def test_a_claim_stops_at_its_byte_budget_and_always_takes_one_row(q):
    for i in range(10):
        sched(q, "k%d" % i, payload=b"x" * 1000, now=NOW - ms(100 - i))   # oldest first
    rows = q.claim2(max_rows=10, max_bytes=3500)
    assert [r["timer_key"] for r in rows] == ["k0", "k1", "k2"]
    q.release(rows)
    rows = q.claim2(max_rows=10, max_bytes=10)                  # one row even over the budget
    assert [r["timer_key"] for r in rows] == ["k0"]
    q.release(rows)
    assert len(q.claim2(max_rows=10, max_bytes=None)) == 10
    q.exec("UPDATE queen.log_timers SET claim_token = NULL, claimed_until = NULL")
    assert len(q.claim2(max_rows=4, max_bytes=10**9)) == 4       # rows still bound it


def test_a_large_payload_is_measured_without_being_read(q):
    """octet_length of a TOASTed payload reads the row's header, not the value: a claim over
    megabyte payloads chooses by their size."""
    big = bytes(range(256)) * 4096                              # 1 MiB, incompressible-ish
    for i in range(3):
        sched(q, "big%d" % i, payload=big, now=NOW - ms(10 - i))
    rows = q.claim2(max_rows=10, max_bytes=2 * len(big))
    assert [r["timer_key"] for r in rows] == ["big0", "big1"]


def test_every_delete_of_a_claimed_row_checks_the_claim_on_the_row_it_deletes(q):
    """The fast way finds a row by key and token, then deletes it by address. The DELETE's
    own WHERE applies log_timers_ours_v1 to the row it deletes (t.claim_token ...): a row
    rescheduled between the two is judged as it is then, on any minor release. (Only a race
    inside one statement shows it by behaviour, and PostgreSQL 15.15+ re-checks the TID as
    well, so the statement's text is what is asserted here; the behaviour of a stale row is
    asserted by test_fire.py.)"""
    src = q.one("SELECT prosrc FROM pg_proc WHERE oid = 'queen.log_timers_fire_fast_v2'::regproc")
    # Both of its deletes: by address (the claim's row_tid) and by key.
    deletes = src.split("DELETE FROM queen.log_timers")[1:]
    assert len(deletes) == 2
    for delete in deletes:
        delete = delete[:delete.index("RETURNING")]
        assert "log_timers_ours_v1(t.claim_token, t.claimed_until, t.partition" in delete
    hold = q.one("SELECT prosrc FROM pg_proc WHERE oid = 'queen.log_timers_fire_hold_v1'::regproc")
    assert "log_timers_ours_v1(t.claim_token, t.claimed_until, t.partition" in hold
    for fn in ("log_timers_fire_fast_v2", "log_timers_fire_hold_v1"):
        body = q.one("SELECT prosrc FROM pg_proc WHERE oid = %s::regproc", ("queen." + fn,))
        assert "claim_token =" not in body and "claimed_until >" not in body, fn


def test_a_rescheduled_row_is_not_fired_by_its_old_claim(q):
    sched(q, "a")
    rows = q.claim2(claim_id=uuid.uuid4(), lease_ms=1000)
    later = NOW + ms(1001)                                      # the lease lapsed
    assert q.apply([HOST_OPS["reschedule"]("a")], now=later)[0]["status"] == "rescheduled"
    res = q.fire([(T1, "q", "Default", rows)], now=NOW + ms(10))
    assert res["fired"] == 0 and res["stale"] == 1
    assert bytes(q.timer("a")["payload"]) == b'{"v": 2}'


def test_a_claim_leaves_the_partitions_it_is_told_to_skip_alone(q):
    """The sweeper names the partitions someone holds: their rows are passed over, the
    others' come first, oldest first as always."""
    for i in range(6):
        sched(q, "held%d" % i, partition="held", now=NOW - ms(100 - i))   # the oldest
    for i in range(3):
        sched(q, "free%d" % i, partition="free", now=NOW - ms(50 - i))
    rows = q.claim2(max_rows=4, skip=[(T1, "q", "held")])
    assert [r["timer_key"] for r in rows] == ["free0", "free1", "free2"]
    rows = q.claim2(max_rows=4)
    assert [r["timer_key"] for r in rows] == ["held0", "held1", "held2", "held3"]
    with pytest.raises(psycopg2.Error) as e:
        q.all("SELECT * FROM queen.log_timers_claim_v4(NULL, %s, 1000, 10, 10, NULL, NULL,"
              " ARRAY[%s]::uuid[], ARRAY[]::text[], ARRAY['p'], NULL, NULL)", (NOW, str(T1)))
    assert e.value.pgcode == "22023"
