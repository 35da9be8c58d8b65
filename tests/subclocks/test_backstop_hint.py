"""8. The lease instants: to the millisecond on a touch, within a second on a ring nobody touches.

The engine runs a queue's lease expiry on every push, pop and ack of that queue, so a
consumer that comes back after its lease lapsed gets the message again at once, whatever
the backstop does. For a ring nobody touches the backstop's pass, once a second, lapses
the lease: at most about a second late, never early, with its attempt count. The engine
still rings the sweeper with the instants it arms (hint_wakes_total counts them), but a pass
never runs at them: docs/design.md, "The ephemeral backstop" (2026-12-01)."""

import statistics
import time

from queenkit import assert_clean_stop, now_ms, wait_for
from queen_sweeper import Ephemeral

LEASE_MS = 300


def bs(h):
    return h.stats()["backstop"]


def test_a_touch_gets_a_lapsed_lease_back_at_once_without_a_pass(q, sweepers):
    engine = Ephemeral(lease_ms=30000, max_retries=10)
    h = sweepers("backstop-touch")
    try:
        h.set_backstop(engine)
        h.start()
        for i in range(5):
            queue = f"touch-{i}"
            engine.push(queue, "p0", b"lease me")
            # Just after a pass, so the next one is ~1 s away and the lease lapses between.
            runs = bs(h)["runs_total"]
            wait_for(lambda: bs(h)["runs_total"] > runs, 5, 0.001, what="a backstop pass")
            runs = bs(h)["runs_total"]
            m = engine.pop(queue, "p0", "g", lease_ms=50)
            time.sleep(max(0, m.lease_expires_unix_ms - now_ms()) / 1000 + 0.005)
            m2 = engine.pop(queue, "p0", "g", lease_ms=30000)
            late = now_ms() - m.lease_expires_unix_ms
            # The touch itself redelivered it, with no pass in between.
            assert bs(h)["runs_total"] == runs, "a pass ran between the lease and the touch"
            assert m2 is not None and (m2.offset, m2.attempt) == (m.offset, 2), m2
            assert late < 300, late
            engine.ack(queue, "p0", "g", m2.offset, m2.lease_id)
        st = h.stats()
    finally:
        final = assert_clean_stop(h)
        engine.close()
    assert st["backstop"]["hint_wakes_total"] >= 5
    assert final["backstop"]["redelivered_total"] == 0, "a pass, not the touch, redelivered"


def test_an_untouched_lapsed_lease_is_redelivered_by_the_next_pass(q, sweepers):
    engine = Ephemeral(lease_ms=30000, max_retries=10)
    h = sweepers("backstop-hint")
    late = []
    try:
        h.set_backstop(engine)
        h.start()
        for i in range(4):
            queue = f"hint-{i}"
            engine.push(queue, "p0", b"lease me")
            runs = bs(h)["runs_total"]
            wait_for(lambda: bs(h)["runs_total"] > runs, 5, 0.001, what="a backstop pass")
            runs, red = bs(h)["runs_total"], bs(h)["redelivered_total"]
            m = engine.pop(queue, "p0", "g", lease_ms=LEASE_MS)
            assert m.attempt == 1
            wait_for(lambda: bs(h)["redelivered_total"] > red, 5, 0.001,
                     what="the backstop to redeliver the lapsed lease")
            seen = now_ms()
            late.append(seen - m.lease_expires_unix_ms)
            # One pass did it: the one a second after the pass before the lease.
            assert bs(h)["runs_total"] == runs + 1, (runs, bs(h)["runs_total"])
            m2 = engine.pop(queue, "p0", "g", lease_ms=30000)
            assert (m2.offset, m2.attempt, m2.payload) == (m.offset, 2, b"lease me")
            assert seen >= m.lease_expires_unix_ms
            engine.ack(queue, "p0", "g", m2.offset, m2.lease_id)
        st = h.stats()
    finally:
        final = assert_clean_stop(h)
        engine.close()
    print(f"\n[backstop pass] lease {LEASE_MS} ms taken right after a pass; redelivered {late} ms "
          f"after the lease instant (median {statistics.median(late):.0f} ms; the next pass is "
          f"~{1000 - LEASE_MS} ms after it); hint wakes {st['backstop']['hint_wakes_total']}, "
          f"passes {st['backstop']['runs_total']}")
    assert st["backstop"]["hint_wakes_total"] >= 4
    assert final["backstop"]["redelivered_total"] == 4 and final["backstop"]["failures_total"] == 0
    # At the next one-second pass: never before it, and within a second of the lease.
    assert all(0 <= x <= 1000 + 300 for x in late), late
    assert statistics.median(late) > 300, f"{late}: redelivered before the one-second pass"
