"""10. The local wake cuts the idle backoff.

A sweeper idle long enough to be in its doubling backoff (sleep >= 4 s, capped at 20 s)
is rung by wake() right after a timer 300 ms ahead is committed; the timer fires close to
its due time instead of after the remaining idle sleep. The bound asserted (< 900 ms late)
is generous on purpose: without the wake the lateness would be seconds. The other half is
a control: the same timer scheduled without a wake is not fired before the idle sleep runs
out (proving that the test does measure the wake)."""

import time

from queenkit import FiredLog, assert_clean_stop, op_schedule, wait_for


def _idle_sweeper(sweepers, name, fired):
    h = sweepers(name, fired=fired, sweeper_max_sleep_ms=1000, sweeper_idle_max_sleep_ms=20000,
                 sweeper_idle_after_cycles=0)
    h.start()
    wait_for(lambda: h.stats()["sleep_ms"] >= 4000, 20, 0.05, "the idle backoff to reach 4 s")
    # Now well inside a sleep of >= 4 s (the stat is set just before the sleep starts).
    time.sleep(0.3)
    return h


def test_wake_rings_an_idle_loop_and_the_timer_fires_on_time(q, sweepers):
    fired = FiredLog()
    h = _idle_sweeper(sweepers, "wake", fired)
    before = h.stats()
    (res,) = q.schedule([op_schedule("wake", "k", b"now", delay_ms=300)])
    h.sw.wake(res["deliverAtMs"])  # after the commit, as a host must
    wait_for(lambda: fired.snapshot(), 5, 0.005, "the woken fire")
    t_fired_ms = fired.snapshot()[0][0] * 1000
    late = t_fired_ms - res["deliverAtMs"]
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[wake] idle sleep was {before['sleep_ms']} ms; fired {late:.0f} ms after deliverAt "
          f"(wakes {st['wakes_total']}, signals {st['wake_signals_total']}, "
          f"cut sleeps {st['wake_cut_sleeps_total']})")
    assert st["fired_total"] == 1
    assert st["wakes_total"] >= 1 and st["wake_signals_total"] >= 1
    assert late >= -5, f"fired {-late:.0f} ms BEFORE its deliverAt"
    # Without the wake it would fire only when the idle sleep (>= 4 s) runs out; the bound
    # leaves a loaded machine a full second of that sleep as slack.
    assert late < before["sleep_ms"] - 1000, \
        f"fired {late:.0f} ms late despite the wake (idle sleep {before['sleep_ms']} ms)"


def test_without_a_wake_the_idle_sleep_runs_its_course(q, sweepers):
    fired = FiredLog()
    h = _idle_sweeper(sweepers, "nowake", fired)
    sleep_ms = h.stats()["sleep_ms"]
    (res,) = q.schedule([op_schedule("nowake", "k", b"later", delay_ms=300)])
    # No wake: nothing may fire for at least the next 1.5 s (the sleep is >= 4 s).
    time.sleep(1.5)
    assert not fired.snapshot(), "fired without a wake while the loop was asleep"
    # The net under a lost wake is the sleep itself: it fires at the end of this sleep.
    wait_for(lambda: fired.snapshot(), sleep_ms / 1000 + 5, 0.02, "the fire after the idle sleep")
    late = fired.snapshot()[0][0] * 1000 - res["deliverAtMs"]
    assert_clean_stop(h)
    print(f"\n[no wake] idle sleep {sleep_ms} ms; fired {late:.0f} ms late")
    assert late > 900
