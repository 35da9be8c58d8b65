"""A transaction that commits late (issue 36): its timers fire from its commit, not from the
walk from the head.

A host transaction schedules timers due at its now() and commits seconds later. Before
schema version 17 its rows became visible behind every sweeper's floor (the floor runs 5 s
behind the probe's now) and waited for the walk from the head (10 s to 5 minutes); the wake
did not help, its instant being behind the floor too. Now the commit puts them at its own
clock (log_timers_at_commit_v1), and they fire like timers committed then.

What fails without it: the floor's `behind_total` (timers the walk from the head found) is
asserted 0, and every timer fires exactly once. The lateness from the commit is printed
(target: within 1 s without a wake, 100 ms with the host's wake) and bounded loosely (a
loaded machine must not fail the suite on timing alone).
"""
import json
import threading
import time

from queenkit import TENANT_A, assert_clean_stop, connect, op_schedule, wait_for


def open_schedule(conninfo, queue, n):
    """A broker transaction that has scheduled n timers due at its now(), left open."""
    conn = connect(conninfo, autocommit=False)
    with conn.cursor() as cur:
        cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())",
                    (json.dumps([op_schedule(queue, f"{queue}-{i:03d}", b"x", partition=f"p{i % 3}")
                                 for i in range(n)]), TENANT_A))
        cur.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint")
        now_ms = cur.fetchone()[0]
    return conn, now_ms


def test_timers_of_a_late_commit_fire_from_the_commit_with_and_without_a_wake(q, sweepers, conninfo):
    fired_at = {}
    lock = threading.Lock()

    def fired(tenant, queue, partition, count, base_offset):
        t = time.time()
        with lock:
            fired_at.setdefault(queue, []).extend([t] * count)

    # Work exists (a timer an hour out): the sleep ceiling is 1 s, the band the promise is for.
    q.schedule([op_schedule("future", "f", b"f", delay_ms=3_600_000)])
    h = sweepers("late", fired=fired)
    h.start()
    h.wait_ready(30)
    holder = None
    figures = []
    try:
        for queue, open_s, wake, snapshot in (("late8", 8, False, False), ("late8w", 8, True, False),
                                              ("late30", 30, False, True)):
            if snapshot:
                # a REPEATABLE READ snapshot held elsewhere through the whole transaction
                holder = connect(conninfo, autocommit=False)
                with holder.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cur.execute("SELECT count(*) FROM queen.queues")
            conn, now_ms = open_schedule(q.broker.dsn, queue, 20)
            time.sleep(open_s)
            conn.commit()
            committed = time.time()
            conn.close()
            if wake:
                h.wake(now_ms)  # the host's post-commit wake, with the timers' deliverAt
            wait_for(lambda: len(fired_at.get(queue, [])) >= 20, timeout=60, what=f"the timers of {queue}")
            late = sorted(t - committed for t in fired_at[queue])
            figures.append((queue, open_s, wake, late[0], late[-1]))
            if holder is not None:
                holder.rollback()
                holder.close()
                holder = None
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    for queue, open_s, wake, first, last in figures:
        print(f"\n[late commit] open {open_s} s, {'with' if wake else 'without'} a wake: fired "
              f"{first * 1000:.0f}-{last * 1000:.0f} ms after the commit")
    st = h.stats()
    # Found by the probe and the claim from the floor, never by the walk from the head.
    assert st["floor"]["behind_total"] == 0, st["floor"]
    for queue in ("late8", "late8w", "late30"):
        assert len(q.delivered(queue=queue)) == 20, queue
    # Loose: well inside the 10 s before the walk from the head could have found them.
    for queue, open_s, wake, first, last in figures:
        assert last < 5.0, (queue, last)
    assert st["fired_total"] == 60
    assert_clean_stop(h)
