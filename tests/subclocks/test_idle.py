"""6. Idle: with both tables empty the sleep backs off, and the backstop is not work.

The sleep is sweeper_max_sleep_ms for the first sweeper_idle_after_cycles idle cycles,
then doubles up to sweeper_idle_max_sleep_ms. The ephemeral backstop runs on its own timer
and deliberately does not feed the idle count, so a busy engine leaves the backoff alone.
One wake (queen_sweeper_wake for now) cuts the long sleep at once and resets the count.

The one-second net, decided (README, "The one-second net"): the idle backoff is kept. A
timer scheduled with no wake (on a broker that died before ringing, or by a plain SQL
client) into an idle table is fired at the end of the idle sleep in progress, so while idle
the net is sweeper_idle_max_sleep_ms, not the ceiling. An operator who needs the ceiling
as the net in every state sets sweeper_idle_max_sleep_ms to sweeper_max_sleep_ms; both
behaviours are asserted here."""

import json
import threading
import time

from queenkit import TENANT_A, assert_clean_stop, now_ms, op_schedule, wait_for
from queen_sweeper import Ephemeral

IDLE_KNOBS = dict(sweeper_max_sleep_ms=50, sweeper_idle_max_sleep_ms=800,
                  sweeper_idle_after_cycles=2)


def watch_sleeps(h, until_ms, timeout):
    """The sleep_ms of every cycle (sampled per cycle change) until sleep_ms == until_ms
    has been seen on two cycles in a row."""
    seen = []
    last_cycle = -1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = h.stats()
        if st["cycles_total"] != last_cycle:
            last_cycle = st["cycles_total"]
            seen.append((st["cycles_total"], st["idle_cycles"], st["sleep_ms"]))
            if len(seen) >= 2 and seen[-1][2] == seen[-2][2] == until_ms:
                return seen
        time.sleep(0.005)
    raise AssertionError(f"sleep_ms never settled at {until_ms}: {seen}")


def wake_now_and_measure(h):
    """Right after a cycle that chose the 800 ms sleep, wake for now: the next cycle must
    follow within ~100 ms, with the idle count reset."""
    st = h.stats()
    c0 = st["cycles_total"]
    wait_for(lambda: h.stats()["cycles_total"] > c0, 3, 0.002, what="a cycle boundary")
    st = h.stats()
    assert st["sleep_ms"] == 800, st["sleep_ms"]
    c1, signals = st["cycles_total"], st["wake_signals_total"]
    time.sleep(0.05)   # well inside the 800 ms sleep
    assert h.stats()["cycles_total"] == c1
    t0 = time.monotonic()
    h.wake(now_ms())
    wait_for(lambda: h.stats()["cycles_total"] > c1, 2, 0.002, what="the woken cycle")
    elapsed = time.monotonic() - t0
    after = h.stats()
    # The wake, not the end of the 800 ms sleep, ran the cycle: the loop says it cut a sleep.
    # (The time is printed, not asserted: a loaded machine may be slow to schedule the loop.)
    print(f"\n[idle] the woken cycle came {elapsed * 1000:.0f} ms after the wake")
    assert after["wake_cut_sleeps_total"] >= st["wake_cut_sleeps_total"] + 1, (st, after)
    assert after["wake_signals_total"] == signals + 1
    # The wake reset the count; this cycle was idle again, so it is 1 and the sleep is back
    # at the ceiling.
    assert after["idle_cycles"] <= 1, after["idle_cycles"]
    assert after["sleep_ms"] == 50, after["sleep_ms"]
    return elapsed


def test_idle_backoff_doubles_to_its_cap_and_a_wake_cuts_it(q, sweepers):
    h = sweepers("idle", **IDLE_KNOBS)
    h.start()
    try:
        seen = watch_sleeps(h, 800, 15)
        wake_now_and_measure(h)
        # And it backs off again.
        watch_sleeps(h, 800, 10)
    finally:
        final = assert_clean_stop(h)
    sleeps = [s for _c, _i, s in seen]
    # 50 for the first two idle cycles, then doubling: 100, 200, 400, 800.
    distinct = [s for k, s in enumerate(sleeps) if k == 0 or s != sleeps[k - 1]]
    assert distinct[-5:] == [50, 100, 200, 400, 800], sleeps
    assert max(sleeps) == 800
    assert final["cycle_errors_total"] == 0, final["last_error"]
    assert final["fired_total"] == 0 and final["kv_deleted_total"] == 0


def test_a_busy_backstop_does_not_count_as_work(q, sweepers):
    engine = Ephemeral(lease_ms=30000, max_retries=100)
    stop = threading.Event()
    errors = []

    def churn():
        # A fresh ring every 20 ms, popped with a 100 ms lease and never touched again:
        # every one of them is the backstop's to redeliver.
        i = 0
        try:
            while not stop.is_set():
                name = f"busy-{i}"
                engine.push(name, "p0", b"x")
                engine.pop(name, "p0", "g", lease_ms=100)
                i += 1
                time.sleep(0.02)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    h = sweepers("idle-backstop", **IDLE_KNOBS)
    worker = threading.Thread(target=churn, daemon=True)
    try:
        h.set_backstop(engine)
        h.start()
        worker.start()
        wait_for(lambda: h.stats()["backstop"]["redelivered_total"] >= 20, 10,
                 what="the backstop to be busy redelivering")
        seen = watch_sleeps(h, 800, 15)
        st = h.stats()
        assert st["backstop"]["redelivered_total"] > 0
        assert st["backstop"]["hint_wakes_total"] > 0
        runs = st["backstop"]["runs_total"]
        # Still at the cap after more backstop passes.
        wait_for(lambda: h.stats()["backstop"]["runs_total"] >= runs + 2, 5,
                 what="two more backstop passes")
        st = h.stats()
        assert st["sleep_ms"] == 800 and st["idle_cycles"] >= 6, (st["sleep_ms"],
                                                                   st["idle_cycles"])
        wake_now_and_measure(h)
    finally:
        stop.set()
        worker.join(5)
        final = assert_clean_stop(h)
        engine.close()
    assert not errors, errors
    assert final["backstop"]["failures_total"] == 0
    assert [s for _c, _i, s in seen][-1] == 800


def schedule_without_wake(q, h, queue):
    """A timer due now, scheduled from SQL with no wake; returns (cycle at schedule time,
    sleep in progress, lateness in ms once fired)."""
    st = h.stats()
    (res,) = q.one("SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())",
                   (json.dumps([op_schedule(queue, "k", b"no wake", delay_ms=0)]), TENANT_A))
    assert res["status"] == "scheduled", res
    wait_for(lambda: h.stats()["fired_total"] == 1, 10, 0.002, what="the unwoken timer to fire")
    late = now_ms() - res["deliverAtMs"]
    return st["cycles_total"], st["sleep_ms"], late


def test_while_idle_the_net_is_the_idle_cap(q, sweepers):
    h = sweepers("idle-net-backoff", **IDLE_KNOBS)
    h.start()
    try:
        watch_sleeps(h, 800, 15)
        cycle, sleeping, late = schedule_without_wake(q, h, "idle-net-b")
        wait_for(lambda: h.stats()["cycles_total"] > cycle, 5, what="the firing cycle to end")
        after = h.stats()
    finally:
        final = assert_clean_stop(h)
    print(f"\n[idle net, backoff kept] scheduled during a {sleeping} ms idle sleep with no wake: "
          f"fired {late} ms after deliverAt")
    assert sleeping == 800
    # Fired by a cycle that came at the end of the idle sleep: nothing rang the loop.
    assert after["wake_signals_total"] == 0 and after["wakes_total"] == 0
    assert final["fired_total"] == 1 and final["cycle_errors_total"] == 0


def test_holding_the_net_keeps_every_idle_sleep_at_the_ceiling(q, sweepers):
    held = dict(IDLE_KNOBS, sweeper_idle_max_sleep_ms=IDLE_KNOBS["sweeper_max_sleep_ms"])
    h = sweepers("idle-net-held", **held)
    h.start()
    try:
        seen = watch_sleeps(h, 50, 10)
        wait_for(lambda: h.stats()["idle_cycles"] >= 10, 10, what="ten idle cycles")
        st = h.stats()
        cycle, sleeping, late = schedule_without_wake(q, h, "idle-net-h")
    finally:
        final = assert_clean_stop(h)
    print(f"\n[idle net, held at the ceiling] scheduled during a {sleeping} ms idle sleep with no "
          f"wake: fired {late} ms after deliverAt")
    assert all(s <= 50 for _c, _i, s in seen), seen
    assert st["sleep_ms"] == 50 and sleeping == 50
    assert final["fired_total"] == 1 and final["wake_signals_total"] == 0


# -- a KV table of live keys with a ttl is not idle ---------------------------------------

KV_IDLE_KNOBS = dict(sweeper_max_sleep_ms=200, sweeper_idle_max_sleep_ms=3000,
                     sweeper_idle_after_cycles=2, kv_expire_every_ms=200)


def prune_cadence(h, seconds):
    """(largest sleep_ms seen, prune calls made, largest idle_cycles) over `seconds`."""
    calls0 = h.stats()["kv_prune_calls_total"]
    deadline = time.monotonic() + seconds
    sleeps, idles = [], []
    while time.monotonic() < deadline:
        st = h.stats()
        sleeps.append(st["sleep_ms"])
        idles.append(st["idle_cycles"])
        time.sleep(0.01)
    return max(sleeps), h.stats()["kv_prune_calls_total"] - calls0, max(idles)


def test_live_keys_with_a_ttl_keep_the_prune_cadence(q, sweepers):
    """No timer, and a queen.kv of live keys that expire later: not idle. A put rings no
    wake, so the prune must keep its own cadence (here 200 ms, 1 s by default) for the keys
    to come, and a key expiring during that time is pruned about one gate after its instant,
    not at the end of an idle sleep (here 3 s, 30 s by default)."""
    q.kv_insert("ttl-later", 100, expires_sql="now() + interval '1 hour'")
    h = sweepers("kv-ttl-idle", **KV_IDLE_KNOBS)
    h.start()
    try:
        wait_for(lambda: h.stats()["kv_prune_calls_total"] >= 2, 10, what="the first prune passes")
        longest, calls, idle = prune_cadence(h, 3.0)
        # A key with a short ttl, written the way a host writes it, expires while we watch.
        q.kv_put("ttl-soon", "k", {"v": 1}, ttl_ms=1500)
        expires = time.monotonic() + 1.5
        wait_for(lambda: h.stats()["kv_deleted_total"] == 1, 10, 0.005, what="the short-lived key to be pruned")
        pruned_after = time.monotonic() - expires
    finally:
        final = assert_clean_stop(h)
    print(f"\n[kv with a ttl] sleeps at most {longest} ms, {calls} prune calls in 3 s, idle cycles at "
          f"most {idle}; a 1.5 s key pruned {pruned_after * 1000:.0f} ms after it expired")
    assert longest <= 200, f"the sleep grew to {longest} ms: the idle backoff took over"
    assert idle < KV_IDLE_KNOBS["sweeper_idle_after_cycles"], idle
    assert calls >= 9, f"{calls} prune calls in 3 s: the prune lost its 200 ms cadence"
    assert pruned_after < 0.2 + 0.5, f"pruned {pruned_after:.2f} s after it expired"
    assert final["kv_deleted_total"] == 1 and q.kv_count("ttl-later") == 100


def test_keys_without_a_ttl_leave_the_table_idle(q, sweepers):
    """Keys that never expire are no work for the prune: the idle backoff grows as with an
    empty table (what the ttl rule above must not take away)."""
    q.kv_insert("forever", 100, expires_sql="NULL")
    h = sweepers("kv-forever-idle", **KV_IDLE_KNOBS)
    h.start()
    try:
        seen = watch_sleeps(h, 3000, 20)
    finally:
        final = assert_clean_stop(h)
    assert [s for _c, _i, s in seen][-1] == 3000
    assert final["kv_deleted_total"] == 0 and q.kv_count("forever") == 100
