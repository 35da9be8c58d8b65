"""A row of ours the fire could not lock is kept and fired once the lock goes: not handed
back, not left to the lease.

The fire verifies its claimed rows with FOR UPDATE SKIP LOCKED. When another transaction
holds one of them for an instant (another broker's claim statement does, for the rows its
snapshot still saw as due: tests/sql/test_fire.py shows how), the row is still ours. Since
schema version 10 the fire answers that segment busy (a plain read finds every row it
missed still ours), as it answers a segment whose partition someone holds: the sweeper
keeps it, still claimed, and fires it on a later try (busy_retry), without releasing a row
or claiming it again. (Before, the segment came back stale: its rows were released and
handed back, then claimed and fired again.)

Set-up: two timers, each its own fire transaction (sweeper_max_fire_bytes 4096 and 3000-byte
payloads). The log's segment table is locked by the test (ACCESS EXCLUSIVE, as an
operator's maintenance would), so the first fire waits there (a fire never waits on a
partition someone holds: it would keep those segments and go on); meanwhile the test locks
the second timer's row; it lets the table go, and the row 60 ms later."""

import os
import time

from queenkit import assert_clean_stop, connect, op_schedule, pg_waiting_on_locks, wait_for

QUEUE = "lockedrow"


def test_a_row_of_ours_the_fire_could_not_lock_is_kept_and_fired_once_the_lock_goes(q, sweepers, conninfo):
    q.provision("00000000-0000-0000-0000-000000000001", QUEUE, "p1")
    q.provision("00000000-0000-0000-0000-000000000001", QUEUE, "p2")
    q.schedule([op_schedule(QUEUE, "k1", os.urandom(3000), partition="p1")])
    time.sleep(0.01)  # k2 is due after k1: the claim returns k1 first, so k1 fires first
    q.schedule([op_schedule(QUEUE, "k2", os.urandom(3000), partition="p2")])
    lock = connect(conninfo, autocommit=False)
    with lock.cursor() as cur:
        cur.execute("LOCK TABLE queen.log_segments IN ACCESS EXCLUSIVE MODE")
    row = connect(conninfo, autocommit=False)
    h = sweepers("lockedrow", sweeper_max_fire_bytes=4096, sweeper_lease_ms=30000)
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
        print(f"\n[lockedrow] k2 fired {took:.2f}s after its row was unlocked; busy {st['fire_busy_total']},"
              f" busy retries {st['busy_retries_total']}, stale {st['stale_total']},"
              f" released {st['released_total']}, claimed {st['claimed_total']}, fired {st['fired_total']}")
        assert st["fired_total"] == 2
        assert st["fire_busy_total"] >= 1          # k2's segment came back busy ...
        assert st["stale_total"] == 0              # ... not stale
        assert st["released_total"] == 0           # nothing released or handed back
        assert st["claimed_total"] == 2            # nor claimed a second time
        assert took < 5.0
    finally:
        lock.close()
        row.close()
        assert_clean_stop(h)
    delivered = q.delivered(queue=QUEUE)
    assert len(delivered) == 2, delivered
