"""The one-second net: a timer scheduled on another broker fires within the sleep ceiling.

The wake is local to the process: broker A commits a timer and rings its own sweeper, never
sweeper B. While timers exist (here, timers due in an hour), B is not idle and never sleeps
longer than sweeper_max_sleep_ms (1 s by default, what this test uses), so a timer that only
A knows about is fired by B within about a second of its instant: the ceiling plus one
cycle. A's role is played by a plain connection of the broker role that schedules and rings
nothing. If B slept until the nearest due instant it knows of (an hour), or backed off as if
idle, these timers would wait for minutes.

The timers are scheduled at random phases of B's sleep; each one's lateness is measured
from its deliverAt (the server's clock, on this machine) to B's on_fired."""

import random
import time

from queenkit import FiredLog, assert_clean_stop, op_schedule, unique, wait_for

CEILING_MS = 1000
ROUNDS = 5


def test_a_timer_scheduled_on_another_broker_fires_within_the_ceiling(q, sweepers):
    far = unique("net-far")
    q.schedule([op_schedule(far, f"f{i}", b"in an hour", delay_ms=3_600_000) for i in range(20)])
    fired = FiredLog()
    b = sweepers(unique("broker-b"), fired=fired, sweeper_max_sleep_ms=CEILING_MS,
                 sweeper_idle_max_sleep_ms=30000, sweeper_idle_after_cycles=2)
    b.start()
    b.sw.wait_ready(30)
    # Settled: several cycles at the ceiling, none of them idle.
    cycles = b.stats()["cycles_total"]
    wait_for(lambda: b.stats()["cycles_total"] >= cycles + 4, 15, 0.02, "B's cycles at the ceiling")
    st = b.stats()
    assert st["sleep_ms"] == CEILING_MS and st["idle_cycles"] == 0, (st["sleep_ms"], st["idle_cycles"])
    late = []
    queue = unique("net-a")
    rng = random.Random(7)
    for i in range(ROUNDS):
        time.sleep(rng.uniform(0, CEILING_MS / 1000))
        n = len(fired.snapshot())
        (res,) = q.schedule([op_schedule(queue, f"k{i}", b"from A", delay_ms=0)])   # A: no wake for B
        wait_for(lambda: len(fired.snapshot()) > n, 10, 0.002, f"B to fire A's timer {i}")
        late.append(fired.snapshot()[n][0] * 1000 - res["deliverAtMs"])
    final = assert_clean_stop(b)
    print(f"\n[one-second net] B's ceiling {CEILING_MS} ms, timers existing an hour out; A's timers "
          f"fired by B {[round(x) for x in late]} ms after their deliverAt (max {max(late):.0f})")
    assert final["wakes_total"] == 0, "B was rung: the test must not wake it"
    assert final["fired_total"] == ROUNDS
    assert final["idle_cycles"] == 0
    # The ceiling, plus one cycle and the floor; a loaded machine gets 500 ms of slack.
    assert max(late) <= CEILING_MS + 500, late
    assert min(late) >= -5, late
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (far,)) == 20
