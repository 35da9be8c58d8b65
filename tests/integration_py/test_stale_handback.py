"""A row the fire could not lock is handed back, not left to the lease.

The fire verifies its claimed rows with FOR UPDATE SKIP LOCKED. When another transaction
holds one of them for an instant (another broker's claim statement does, for the rows its
snapshot still saw as due), the segment comes back stale while our token is still on that
row. The sweeper then releases the segment's rows, token-matched, with a few short
retries, so the timer is due again at once instead of after the lease (30 s here).

Set-up: two timers, each its own fire transaction (sweeper_max_fire_bytes 4096 and 3000-byte
payloads). The log's segment table is locked by the test (ACCESS EXCLUSIVE, as an
operator's maintenance would), so the first fire waits there (a fire never waits on a
partition someone holds: it would keep those segments and go on); meanwhile the test locks
the second timer's row; it lets the table go, and the row 60 ms later."""

import os
import time

from firekit import assert_clean_stop, connect, op_schedule, pg_waiting_on_locks, wait_for

QUEUE = "handback"


def test_a_row_the_fire_could_not_lock_is_handed_back_at_once(q, sweepers, conninfo):
    q.provision("00000000-0000-0000-0000-000000000001", QUEUE, "p1")
    q.provision("00000000-0000-0000-0000-000000000001", QUEUE, "p2")
    q.schedule([op_schedule(QUEUE, "k1", os.urandom(3000), partition="p1")])
    time.sleep(0.01)  # k2 is due after k1: the claim returns k1 first, so k1 fires first
    q.schedule([op_schedule(QUEUE, "k2", os.urandom(3000), partition="p2")])
    lock = connect(conninfo, autocommit=False)
    with lock.cursor() as cur:
        cur.execute("LOCK TABLE queen.log_segments IN ACCESS EXCLUSIVE MODE")
    row = connect(conninfo, autocommit=False)
    h = sweepers("handback", sweeper_max_fire_bytes=4096, sweeper_lease_ms=30000)
    try:
        h.start()
        wait_for(lambda: pg_waiting_on_locks(q) >= 1, 15, what="the first fire to wait on the locked table")
        with row.cursor() as cur:
            cur.execute("SELECT claim_token FROM queen.log_timers WHERE queue = %s AND timer_key = 'k2'"
                        " FOR UPDATE", (QUEUE,))
            assert cur.fetchone()[0] is not None, "k2 was not claimed with k1"
        lock.rollback()
        time.sleep(0.06)
        row.rollback()
        t0 = time.monotonic()
        wait_for(lambda: q.timers_left() == 0, 10, what="k2 to fire (it must not wait out the 30 s lease)")
        # Counted once the sweeper has read the fire's answer, an instant after the COMMIT.
        wait_for(lambda: h.stats()["fired_total"] >= 2, 10, what="the fire's answer to be counted")
        took = time.monotonic() - t0
        st = h.stats()
        print(f"\n[handback] k2 fired {took:.2f}s after its row was unlocked; stale {st['stale_total']},"
              f" released {st['released_total']}, fired {st['fired_total']}")
        assert st["fired_total"] == 2
        assert st["stale_total"] >= 1
        assert st["released_total"] >= 1
        assert took < 5.0
    finally:
        lock.close()
        row.close()
        assert_clean_stop(h)
    delivered = q.delivered(queue=QUEUE)
    assert len(delivered) == 2, delivered
