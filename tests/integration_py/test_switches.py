"""9. The operator switches in queen.system_state.

* timers_fire_enabled = false: nothing fires, nothing is lost; on resume the backlog
  drains oldest first (single partition: the order of the log follows deliver_at), both
  when the backlog fits in one claim and when it takes several.
* maintenance_mode = true suspends the fire the same way.
* timers_schedule_enabled = false refuses new schedules (SQLSTATE 55000) while cancel is
  still accepted and the fire goes on for the timers already scheduled."""

import random
import time

import psycopg2
import pytest

from queenkit import TENANT_A, assert_clean_stop, op_cancel, op_schedule, wait_for


def _log_order(q, queue):
    return [f.txn for *_x, f in q.delivered(TENANT_A, queue)]


@pytest.mark.parametrize("backlog,claim_batch", [(30, 200), (200, 25)],
                         ids=["one-claim", "several-claims"])
def test_fire_paused_keeps_timers_and_drains_oldest_first(q, sweepers, backlog, claim_batch):
    queue = "paused"
    q.set_switch("timers_fire_enabled", False)
    h = sweepers(f"paused-{backlog}", sweeper_claim_batch=claim_batch, sweeper_max_sleep_ms=200)
    h.start()
    # deliver_at = now + 2 ms * rank, with random keys (so shards and key order say nothing
    # about the deliver order).
    rng = random.Random(backlog)
    ranks = list(range(backlog))
    rng.shuffle(ranks)
    ops = [op_schedule(queue, f"{rng.getrandbits(64):016x}", b"x", partition="only",
                       delay_ms=2 * r, txn=f"rank-{r:04d}") for r in ranks]
    res = q.schedule(ops)
    deliver = {op["txn"]: r["deliverAtMs"] for op, r in zip(ops, res)}
    t_pause = time.monotonic()
    while time.monotonic() - t_pause < 2.0:
        assert h.stats()["fired_total"] == 0, "fired while timers_fire_enabled = false"
        time.sleep(0.1)
    st = h.stats()
    assert st["switches"]["fire_enabled"] is False and st["fire_paused_cycles_total"] > 0, st["switches"]
    assert q.timers_left() == backlog
    assert q.one("SELECT count(*) FROM queen.log_segments") == 0

    q.set_switch("timers_fire_enabled", True)
    wait_for(lambda: q.timers_left() == 0, 15, 0.05, "the drain after resume")
    st = h.stats()
    assert_clean_stop(h)
    order = _log_order(q, queue)
    assert len(order) == backlog
    by_deliver = sorted(order, key=lambda t: (deliver[t], t))
    inversions = sum(1 for a, b in zip(order, order[1:]) if deliver[a] > deliver[b])
    print(f"\n[fire paused {backlog}/{claim_batch}] drained in {st['claims_total']} claims; "
          f"{inversions} adjacent deliver_at inversions in the log; first 8 in the log: "
          f"{order[:8]}")
    assert order == by_deliver, (
        f"the backlog did not drain oldest first: {inversions} adjacent inversions; log order "
        f"starts {order[:10]}, deliver order starts {by_deliver[:10]}")


def test_maintenance_mode_suspends_the_fire(q, sweepers):
    queue = "maintenance"
    q.set_switch("maintenance_mode", True)
    h = sweepers("maintenance")
    h.start()
    q.schedule([op_schedule(queue, f"k{i}", b"m") for i in range(10)])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5:
        assert h.stats()["fired_total"] == 0, "fired during maintenance mode"
        time.sleep(0.1)
    st = h.stats()
    assert st["switches"] == {"fire_enabled": False, "maintenance": True}, st["switches"]
    assert q.timers_left() == 10
    # A claim by anyone returns nothing during maintenance, too.
    assert q.q("SELECT * FROM queen.log_timers_claim_v1(NULL, now(), 1000, 100, 100)") == []
    q.set_switch("maintenance_mode", False)
    wait_for(lambda: q.timers_left() == 0, 10, 0.05, "the fire after maintenance")
    # The table empties at the fire's commit; the stats count it a few ms later.
    wait_for(lambda: h.stats()["fired_total"] == 10, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    assert st["fired_total"] == 10 and st["switches"]["maintenance"] is False


def test_schedule_paused_refuses_new_timers_while_the_fire_goes_on(q, sweepers):
    queue = "sched-paused"
    h = sweepers("sched-paused")
    h.start()
    res = q.schedule([op_schedule(queue, f"early{i}", b"e", delay_ms=700) for i in range(5)]
                     + [op_schedule(queue, "cancel-me", b"c", delay_ms=60000)])
    q.set_switch("timers_schedule_enabled", False)
    with pytest.raises(psycopg2.Error) as info:
        q.apply([op_schedule(queue, "late", b"l")])
    assert info.value.pgcode == "55000", (info.value.pgcode, str(info.value))
    assert "timers_schedule_enabled" in str(info.value)
    with pytest.raises(psycopg2.Error) as info:
        q.apply([{"op": "reschedule", "queue": queue, "timerKey": "early0", "delayMs": 0}])
    assert info.value.pgcode == "55000"
    # Cancel is always accepted.
    (c,) = q.apply([op_cancel(queue, "cancel-me")])
    assert c["status"] == "cancelled", c
    # The already scheduled timers fire on time while scheduling stays paused.
    h.sw.wake(min(r["deliverAtMs"] for r in res))
    wait_for(lambda: q.timers_left() == 0, 10, 0.05, "the early timers")
    # The table empties at the fire's commit; the stats count it a few ms later.
    wait_for(lambda: h.stats()["fired_total"] == 5, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    assert st["fired_total"] == 5
    assert sorted(_log_order(q, queue)) == [f"txn-early{i}" for i in range(5)]
    assert q.one("SELECT value FROM queen.system_state WHERE key = 'timers_schedule_enabled'") is False
