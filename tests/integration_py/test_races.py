"""7. The user's writes racing the sweeper.

* Cancel racing the claim: every cancel answers cancelled, too_late or absent, and the
  answer is the truth: a cancelled timer is never delivered, every other one is delivered
  exactly once.
* A claimed timer cannot be changed: schedule (replace), reschedule and cancel answer
  too_late, and the timer fires as it was claimed.
* A timer in backoff (its fire failed, the token is gone) is in nobody's hands: cancel
  succeeds, and a reschedule clears its attempts and lets it fire."""

import base64
import os
import random
import time

import psycopg2
import psycopg2.errors

from queenkit import (TENANT_A, PartitionLock, Queen, assert_clean_stop, op_cancel,
                      op_reschedule, op_schedule, pg_waiting_on_locks, wait_for)


def test_cancel_racing_the_claim_answers_the_truth(q, sweepers, connections):
    queue = "cancel-race"
    n = 600
    keys = [f"k{i:04d}" for i in range(n)]
    # Small batches held at 10 (no growth): grown batches fire all 600 before the cancels start,
    # and the race this test is about never happens.
    h = sweepers("cancel-race", sweeper_claim_batch=10, sweeper_claim_batch_max=10, sweeper_max_sleep_ms=50)
    h.start()
    wait_for(lambda: h.stats()["cycles_total"] >= 1, 10, 0.02, "the first cycle")
    res = q.schedule([op_schedule(queue, k, k.encode(), partition=f"p{i % 6}", delay_ms=400)
                      for i, k in enumerate(keys)])
    due_ms = max(r["deliverAtMs"] for r in res)
    h.sw.wake(min(r["deliverAtMs"] for r in res))

    answers = {}
    order = keys[:]
    random.Random(7).shuffle(order)
    cq = Queen(connections())
    # Start cancelling just before the timers fall due, and keep going through the fire.
    while time.time() * 1000 < due_ms - 30:
        time.sleep(0.005)
    for i in range(0, n, 4):
        chunk = order[i:i + 4]
        for k, r in zip(chunk, cq.apply([op_cancel(queue, k) for k in chunk])):
            answers[k] = r["status"]
    wait_for(lambda: q.timers_left() == 0, 15, 0.05, "the rest to fire")
    st = h.stats()
    assert_clean_stop(h)

    counts = {s: sum(1 for v in answers.values() if v == s) for s in set(answers.values())}
    print(f"\n[cancel race] answers {counts}; fired {st['fired_total']} stale {st['stale_total']}")
    assert set(answers.values()) <= {"cancelled", "too_late", "absent"}, counts
    delivered = [f.txn[4:] for *_x, f in q.delivered(TENANT_A, queue)]
    assert len(delivered) == len(set(delivered)), "a timer was delivered twice"
    cancelled = {k for k, v in answers.items() if v == "cancelled"}
    assert not cancelled & set(delivered), sorted(cancelled & set(delivered))[:5]
    assert cancelled | set(delivered) == set(keys)
    assert st["fired_total"] == len(delivered) == n - len(cancelled)
    # The race really happened on both sides.
    assert counts.get("cancelled", 0) > 0 and len(delivered) > 0, counts


def test_claimed_timer_answers_too_late(q, sweepers):
    """SQL level: a claim taken by a broker (live lease) makes the row untouchable."""
    queue = "claimed"
    q.schedule([op_schedule(queue, "k", b"original")])
    claimed = q.q("SELECT timer_key FROM queen.log_timers_claim_v1("
                  "array(select generate_series(0,63))::int2[], now(), 60000, 100, 100)")
    assert [r[0] for r in claimed] == ["k"]
    before = q.peek(queue, "k")
    for op in (op_reschedule(queue, "k", 5000),
               op_schedule(queue, "k", b"replacement", delay_ms=0),
               op_cancel(queue, "k")):
        (r,) = q.apply([op])
        assert r["ok"] is False and r["status"] == "too_late", (op["op"], r)
        assert r["deliverAtMs"] == before["deliverAtMs"]
    after = q.peek(queue, "k")
    assert after["deliverAt"] == before["deliverAt"] and after["claimed"] is True
    assert after["messageId"] == before["messageId"]


def test_reschedule_of_a_timer_the_sweeper_holds_is_too_late(q, sweepers, conninfo, connections):
    """With a running sweeper: two timers whose fires are separate transactions (byte cap),
    the partition locked by the test so the first fire waits. Both are claimed: the first
    is row-locked by the waiting fire transaction, the second only carries the sweeper's
    token. A reschedule or cancel of either answers too_late (the apply's WHERE sees a live
    claim and skips the row; should it ever wait on the fire's row lock instead, the 300 ms
    lock_timeout reports it). After the lock goes, both fire as claimed, with their
    original payloads."""
    queue = "held"
    pid = q.provision(TENANT_A, queue, "blocked")
    originals = {"k1": os.urandom(3000), "k2": os.urandom(3000)}
    q.schedule([op_schedule(queue, "k1", originals["k1"], partition="blocked")])
    q.schedule([op_schedule(queue, "k2", originals["k2"], partition="blocked")])
    lock = PartitionLock(conninfo, [pid])
    h = sweepers("held", sweeper_max_fire_bytes=4096, sweeper_lease_ms=30000)
    answers = {}
    try:
        h.start()
        wait_for(lambda: h.stats()["claimed_total"] >= 2, 10, 0.02, "the claim")
        wait_for(lambda: pg_waiting_on_locks(q) >= 1, 10, 0.02, "the fire to wait")
        rq = connections()
        with rq.cursor() as cur:
            cur.execute("SET lock_timeout = '300ms'")
        for key in ("k1", "k2"):
            op = op_reschedule(queue, key, 60000,
                               payload=base64.b64encode(b"rescheduled").decode())
            try:
                (r,) = Queen(rq).apply([op])
                answers[key] = r["status"]
            except psycopg2.errors.LockNotAvailable:
                answers[key] = "row locked by the waiting fire"
        for key in ("k1", "k2"):
            try:
                (r,) = Queen(rq).apply([op_cancel(queue, key)])
                answers[key + " cancel"] = r["status"]
            except psycopg2.errors.LockNotAvailable:
                answers[key + " cancel"] = "row locked by the waiting fire"
    finally:
        lock.close()
    wait_for(lambda: q.timers_left() == 0, 10, 0.02, "both to fire")
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[too_late] answers while the sweeper held both claims: {answers}")
    assert "too_late" in answers.values(), answers
    assert all(v in ("too_late", "row locked by the waiting fire") for v in answers.values()), answers
    frames = {f.txn[4:]: f.payload for *_x, f in q.delivered(TENANT_A, queue)}
    assert frames == originals
    assert st["fired_total"] == 2


def test_cancel_and_reschedule_of_a_timer_in_backoff(q, sweepers):
    queue = "backoff"
    q.q("""
        CREATE OR REPLACE FUNCTION public.fire_test_refuse_bad() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.name = 'bad' THEN
                RAISE EXCEPTION 'fire test: partition bad is refused';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER fire_test_bad BEFORE INSERT ON queen.log_partitions
            FOR EACH ROW EXECUTE FUNCTION public.fire_test_refuse_bad();
    """)
    q.schedule([op_schedule(queue, "to-cancel", b"c", partition="bad"),
                op_schedule(queue, "to-move", b"m", partition="bad")])
    h = sweepers("backoff", sweeper_max_attempts=5, sweeper_backoff_min_ms=20000,
                 sweeper_backoff_max_ms=60000)
    h.start()

    def in_backoff():
        rows = [q.peek(queue, k) for k in ("to-cancel", "to-move")]
        return all(r and r["attempts"] == 1 and not r["claimed"] for r in rows)

    wait_for(in_backoff, 10, 0.02, "both timers to fail once and back off")
    (c,) = q.apply([op_cancel(queue, "to-cancel")])
    assert c["ok"] is True and c["status"] == "cancelled", c
    (m,) = q.apply([op_reschedule(queue, "to-move", 0, partition="good")])
    assert m["ok"] is True and m["status"] == "rescheduled", m
    peek = q.peek(queue, "to-move")
    assert peek["attempts"] == 0 and peek["lastError"] is None and peek["claimedUntil"] is None
    h.sw.wake(m["deliverAtMs"])
    wait_for(lambda: q.timers_left() == 0, 5, 0.02, "the rescheduled timer to fire")
    time.sleep(0.2)
    st = h.stats()
    assert_clean_stop(h)
    delivered = [(part, f.txn) for _t, _q, part, _o, f in q.delivered(TENANT_A, queue)]
    assert delivered == [("good", "txn-to-move")], delivered
    assert st["dlq_total"] == 0 and q.one("SELECT count(*) FROM queen.log_dlq") == 0
    assert st["fired_total"] == 1
