"""Containment (issue 17): what one partition does is borne by it alone.

A host transaction that pushed into one partition and stays open holds that partition's
queen.log_partitions row. Before: the fire's second call for the busy segments waited on the
lock with no deadline and the drain waited behind it, so seven OTHER partitions' timers
(75 of their 100 each) waited as long as the lock. Now a held partition's segments are kept,
still claimed, and tried again with backoff while the rest of the drain goes on; the claims
leave that partition alone meanwhile; its timers fire within a cycle of the release; and
the calls it costs stay bounded. Every timer exactly once, every fire inside its lease.
"""
import time

from queenkit import PartitionLock, TENANT_A, assert_clean_stop, op_schedule, wait_for

OTHERS = 7
PER = 100


def schedule_partitions(q, queue, held="held"):
    ids = {p: q.provision(TENANT_A, queue, p) for p in [held] + [f"p{i}" for i in range(OTHERS)]}
    ops = [op_schedule(queue, f"{held}-{i:03d}", b'{"x": 1}', partition=held) for i in range(PER)]
    for i in range(OTHERS):
        ops += [op_schedule(queue, f"p{i}-{j:03d}", b'{"x": 1}', partition=f"p{i}") for j in range(PER)]
    # The held partition's timers are the oldest: the first claim takes them first.
    for k in range(0, len(ops), 200):
        q.schedule(ops[k:k + 200])
    return ids


def install_late_fire_check(q):
    """Counts timer rows deleted by a fire after their claim's lease ended: must stay 0."""
    q.q("CREATE TABLE IF NOT EXISTS public.fire_test_late (n int)")
    q.q("TRUNCATE public.fire_test_late")
    q.q("CREATE OR REPLACE FUNCTION public.fire_test_late_fn() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF OLD.claimed_until IS NOT NULL AND OLD.claimed_until <= now() THEN"
        "   INSERT INTO public.fire_test_late VALUES (1); END IF; RETURN OLD; END $$")
    q.q("CREATE TRIGGER fire_test_late BEFORE DELETE ON queen.log_timers FOR EACH ROW"
        " EXECUTE FUNCTION public.fire_test_late_fn()")


def calls(h):
    return h.stats()["pool"]["calls_total"]


def run_held(q, sweepers, conninfo, queue, hold_s, **knobs):
    ids = schedule_partitions(q, queue)
    install_late_fire_check(q)
    lock = PartitionLock(conninfo, [ids["held"]])
    h = sweepers(queue, **knobs)
    t0 = time.monotonic()
    try:
        h.start()
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s"
                               " AND partition <> 'held'", (queue,)) == 0, 10,
                 what="the other partitions' timers to fire while one partition is held")
        others_done = time.monotonic() - t0
        c0, w0 = calls(h), time.monotonic()
        left = hold_s - (time.monotonic() - t0)
        time.sleep(max(left, 0))
        rate = (calls(h) - c0) / max(time.monotonic() - w0, 0.001)
        assert q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == PER
        lock.release()
        released = time.monotonic()
        wait_for(lambda: q.timers_left() == 0, 10, what="the held partition's timers to fire after the release")
        after_release = time.monotonic() - released
        st = h.stats()
    finally:
        lock.close()
        assert_clean_stop(h)
    delivered = q.delivered(queue=queue)
    txns = [d[4].txn for d in delivered]
    assert len(txns) == PER * (OTHERS + 1) and len(set(txns)) == len(txns), "lost or duplicated"
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 0
    late = q.one("SELECT count(*) FROM public.fire_test_late")
    print(f"\n[containment {queue}] other partitions fired {others_done:.2f} s after start; while held "
          f"{rate:.1f} calls/s; held partition fired {after_release:.2f} s after release; kept retries "
          f"{st['busy_retries_total']}, handed back late {st['late_handed_back_total']}, fired after lease {late}")
    return others_done, rate, after_release, st, late


def test_a_held_partition_holds_back_nothing_else(q, sweepers, conninfo):
    others, rate, after, st, late = run_held(q, sweepers, conninfo, "contain-cycle", 6.0)
    assert others < 5.0, "other partitions waited for the held one"
    assert rate < 50, f"{rate:.1f} database calls a second while a partition was held"
    assert after < 3.0, "the held partition's timers did not fire within a cycle of its release"
    assert st["busy_retries_total"] >= 1
    assert late == 0


def test_a_partition_held_longer_than_the_lease(q, sweepers, conninfo):
    """The lease is 3 s and the partition is held 8 s: kept segments go back before their
    lease ends (never fired after it), are claimed again, kept again, and fire once."""
    others, rate, after, st, late = run_held(q, sweepers, conninfo, "contain-lease", 8.0,
                                             sweeper_lease_ms=3000)
    assert others < 5.0
    assert rate < 50, f"{rate:.1f} database calls a second while a partition was held"
    assert after < 3.0
    assert st["late_handed_back_total"] >= PER, "kept rows were not handed back before their lease"
    assert late == 0, "a timer was fired after its claim's lease had ended"


def test_a_claim_around_a_held_partition_that_found_nothing_is_not_sent_again_for_nothing(q, sweepers, conninfo):
    """Every due timer is in one held partition, most of them unclaimed. A claim around it
    (the partition left out)
    walks that partition's whole due backlog to come back empty; it is not sent again until
    the partition is freed, a wake rings or sweeper_empty_claim_max_ms passes. A timer that
    comes due meanwhile in another partition still fires, without a wake, and every timer
    fires once."""
    queue = "contain-around"
    held = q.provision(TENANT_A, queue, "held")
    q.provision(TENANT_A, queue, "other")
    q.schedule([op_schedule(queue, f"held-{i:03d}", b'{"x": 1}', partition="held") for i in range(PER)])
    lock = PartitionLock(conninfo, [held])
    window_ms = 1000
    # Claims of 20: the held partition keeps 80 due rows nobody has claimed, which every claim
    # around it walks (the probe sees them due, so the drain runs). The window is the
    # empty-claim band's high end, never above the max sleep (200 ms in these tests otherwise).
    h = sweepers(queue, sweeper_empty_claim_min_ms=25, sweeper_empty_claim_max_ms=window_ms,
                 sweeper_max_sleep_ms=window_ms, sweeper_claim_batch=20, sweeper_claim_batch_max=20)
    try:
        h.start()
        wait_for(lambda: h.stats()["claims_held_back_total"] >= 1, 10,
                 what="a claim around the held partition to be held back")
        s0, t0 = h.stats(), time.monotonic()
        time.sleep(3.0)
        s1, held_s = h.stats(), time.monotonic() - t0
        # Another partition's timer, due at once, no wake rung: the hold-back lasts at most
        # its window, so it fires.
        q.schedule([op_schedule(queue, "other-000", b'{"x": 1}', partition="other")])
        scheduled = time.monotonic()
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s AND partition = 'other'",
                               (queue,)) == 0, 10, what="another partition's timer to fire during the hold")
        other_after = time.monotonic() - scheduled
        assert q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == PER
        lock.release()
        wait_for(lambda: q.timers_left() == 0, 10, what="the held partition's timers to fire after the release")
    finally:
        lock.close()
        assert_clean_stop(h)
    walks = s1["claims_around_held_empty_total"] - s0["claims_around_held_empty_total"]
    retries = s1["busy_retries_total"] - s0["busy_retries_total"]
    held_back = s1["claims_held_back_total"] - s0["claims_held_back_total"]
    print(f"\n[around {queue}] in {held_s:.1f} s held: {walks} empty claims around it, {retries} kept retries, "
          f"{held_back} claims held back; another partition's timer fired {other_after:.2f} s after it was written")
    # At most one walk per window while the same partition stays held, however often its
    # kept segments are tried again.
    assert walks <= held_s * 1000 / window_ms + 2, (walks, retries)
    assert held_back >= 1
    delivered = q.delivered(queue=queue)
    txns = [d[4].txn for d in delivered]
    assert len(txns) == PER + 1 and len(set(txns)) == len(txns), "lost or duplicated"
