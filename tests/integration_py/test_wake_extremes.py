"""Every int64 is a valid wake argument (issue 8, item 4).

wake(sw, INT64_MIN) once stopped all firing until stop: `hint - now` overflowed and the
sleep timer was armed for ~292 million years, and every later wake was "not earlier than
the promise" so nothing rang again. The sweeper here sleeps for an hour unless rung, so a
timer can only fire if a wake after the extreme ones still works."""

import pytest

from queenkit import FiredLog, assert_clean_stop, op_schedule, wait_for

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1
EXTREMES = [INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX]


@pytest.mark.parametrize("extreme", [INT64_MIN, -1, 0, INT64_MAX], ids=["min", "minus1", "zero", "max"])
def test_extreme_wake_never_stalls_the_loop(q, sweepers, extreme):
    fired = FiredLog()
    # Only a wake can bring a fire before an hour is out.
    h = sweepers(f"wake-extreme-{extreme}", fired=fired, sweeper_max_sleep_ms=3600000,
                 sweeper_idle_max_sleep_ms=3600000, sweeper_idle_after_cycles=0)
    h.start()
    wait_for(lambda: h.stats()["cycles_total"] >= 1 and h.stats()["sleep_ms"] >= 1000, 30, 0.02,
             "the first cycle and a long sleep")
    h.sw._native.wake(h.sw._handle, extreme)  # the raw C call: every int64 is valid
    # Let the loop take that wake and go back to sleep, then schedule and wake for real.
    wait_for(lambda: h.stats()["cycles_total"] >= 2 or extreme >= 1 << 40, 30, 0.02,
             "the loop to run the cycle the extreme wake asked for")
    (res,) = q.schedule([op_schedule("wake-extreme", f"k{extreme}", b"x", delay_ms=0)])
    h.sw.wake(res["deliverAtMs"])
    wait_for(lambda: fired.total() == 1, 30, 0.01, f"the timer after wake({extreme})")
    st = h.stats()
    assert_clean_stop(h)
    assert st["fired_total"] == 1


def test_every_extreme_in_a_row_then_a_normal_wake(q, sweepers):
    fired = FiredLog()
    h = sweepers("wake-extremes-all", fired=fired, sweeper_max_sleep_ms=3600000,
                 sweeper_idle_max_sleep_ms=3600000, sweeper_idle_after_cycles=0)
    h.start()
    wait_for(lambda: h.stats()["cycles_total"] >= 1, 30, 0.02, "the first cycle")
    for v in EXTREMES * 3:
        h.sw._native.wake(h.sw._handle, v)
    (res,) = q.schedule([op_schedule("wake-extreme", "all", b"x", delay_ms=0)])
    h.sw.wake(res["deliverAtMs"])
    wait_for(lambda: fired.total() == 1, 30, 0.01, "the timer after every extreme wake")
    assert_clean_stop(h)
