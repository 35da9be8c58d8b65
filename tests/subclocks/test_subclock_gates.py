"""7. The sub-clocks are not paced by the fire and do not depend on its health.

A phase whose cost tracks space must not be paced by the phase that tracks work: the
prune's budget is kv_expire_batch rows per call whatever the drain did, so its alarm
(expired-but-present rows) stays exact while a backlog keeps the fire at its cap. And a
probe that fails on a broken timer schema must not stop the rollup or the prune: they run
on their own gates whatever the fire's health."""

import threading
import time

from queenkit import assert_clean_stop, now_ms, op_schedule, wait_for

DUE_FN = "queen.log_timers_due_v2(int2[], timestamptz, int, timestamptz, int)"


def insert_due_timers(q, queue, n):
    """n timers due a minute ago, straight into the table (one statement)."""
    q.q("INSERT INTO queen.log_timers (queue, timer_key, partition, deliver_at, txn, message_id, payload)"
        " SELECT %s, 't' || g, 'p' || (g %% 8), now() - interval '1 minute', %s || g,"
        "        gen_random_uuid(), '\\x0102'::bytea"
        "   FROM generate_series(1, %s) g", (queue, f"{queue}-txn-", n))


class StatsTape(threading.Thread):
    """Every stats snapshot, taken as fast as the binding answers, until stopped."""

    def __init__(self, h):
        super().__init__(daemon=True)
        self.h = h
        self.halt = threading.Event()
        self.tape = []

    def run(self):
        while not self.halt.is_set():
            st = self.h.stats()
            self.tape.append({k: st[k] for k in ("kv_prune_calls_total", "kv_deleted_total",
                                                  "kv_expired_not_pruned", "kv_expired_not_pruned_capped",
                                                  "fired_total", "pressure", "capped_cycles_total")})
            time.sleep(0.001)

    def stop(self):
        self.halt.set()
        self.join(5)


def test_prune_has_its_own_budget_and_an_exact_alarm_while_the_fire_is_at_its_cap(q, sweepers):
    expired, backlog = 3000, 12000
    q.kv_insert("gates", expired, expires_sql="now() - interval '1 minute' + g * interval '1 ms'")
    insert_due_timers(q, "gates-q", backlog)
    # A drain budget of 1000 rows per cycle: every cycle of the backlog hits it, so the
    # fire's leftover is zero on every one of them.
    h = sweepers("gates-prune", sweeper_cycle_max_rows=1000, sweeper_claim_batch=200,
                 kv_expire_batch=1000, kv_expire_every_ms=50)
    tape = StatsTape(h)
    h.start()
    tape.start()
    try:
        wait_for(lambda: h.stats()["kv_deleted_total"] == expired, 30,
                 what="the prune to delete every expired key")
        wait_for(lambda: h.stats()["fired_total"] == backlog, 60, what="the backlog to drain")
        wait_for(lambda: h.stats()["kv_expired_not_pruned"] == 0, 5, what="the alarm at zero")
    finally:
        tape.stop()
        final = assert_clean_stop(h)

    passes = [s for s in tape.tape if s["kv_prune_calls_total"] > 0]
    assert passes, "no prune pass was observed"
    # The alarm is exact on every observed pass: what is left plus what was deleted is
    # what expired, never "8, capped".
    wrong = [s for s in passes
             if s["kv_expired_not_pruned_capped"] or s["kv_expired_not_pruned"] + s["kv_deleted_total"] != expired]
    assert not wrong, f"the alarm was not exact: {wrong[:5]}"
    # The prune cleared the table while the fire was still at its cap.
    first_done = next(s for s in tape.tape if s["kv_deleted_total"] == expired)
    assert first_done["fired_total"] < backlog, first_done
    assert final["capped_cycles_total"] >= backlog // 1000 - 1, final["capped_cycles_total"]
    # In calls of the full batch: 1000 rows per call, not the fire's leftover.
    deltas = sorted({s["kv_deleted_total"] for s in passes})
    assert all(d % 1000 == 0 for d in deltas), deltas
    assert final["kv_deleted_total"] == expired and final["fired_total"] == backlog
    assert q.kv_count("gates") == 0 and q.timers_left() == 0
    print(f"\n[gates] {len(tape.tape)} snapshots; deleted-total values seen {deltas}; "
          f"fired when the prune finished {first_done['fired_total']} of {backlog}; "
          f"capped cycles {final['capped_cycles_total']}")


def test_a_failing_probe_does_not_stop_the_rollup_or_the_prune(q, sweepers):
    q.kv_insert("gates-probe", 500, expires_sql="now() - interval '1 minute'")
    # A broken timer schema: the probe's function is missing (42883), the fire fails on
    # every cycle with a doubling backoff.
    q.q(f"ALTER FUNCTION {DUE_FN} RENAME TO log_timers_due_v2_hidden")
    h = sweepers("gates-probe", kv_expire_batch=100, kv_expire_every_ms=100, kv_usage_every_ms=300,
                 sweeper_backoff_min_ms=200, sweeper_backoff_max_ms=5000)
    restored = False
    try:
        h.start()
        wait_for(lambda: h.stats()["cycle_errors_total"] >= 1, 10, what="the probe to fail")
        wait_for(lambda: h.stats()["kv_deleted_total"] == 500, 15,
                 what="the prune to run while the probe fails")
        runs = h.stats()["rollup"]["runs_total"]
        calls = h.stats()["kv_prune_calls_total"]
        # Both keep their own cadence, not the fire's backoff (which reaches 5 s here).
        wait_for(lambda: h.stats()["rollup"]["runs_total"] >= runs + 3, 10,
                 what="the rollup to keep its 300 ms gate")
        q.kv_insert("gates-probe", 50, expires_sql="now() - interval '1 second'", prefix="late")
        wait_for(lambda: h.stats()["kv_deleted_total"] == 550, 10,
                 what="keys that expire later to be pruned too")
        st = h.stats()
        assert st["kv_prune_calls_total"] > calls
        assert st["kv_expired_not_pruned"] == 0 and st["kv_expired_not_pruned_capped"] is False
        assert st["phases"]["prune"] == "on" and st["phases"]["rollup"] == "on", st["phases"]
        assert "42883" in st["last_error"] or "probe" in st["last_error"], st["last_error"]
        assert st["fired_total"] == 0

        # The schema is repaired: the fire picks up again, nothing else changed.
        q.q("ALTER FUNCTION queen.log_timers_due_v2_hidden(int2[], timestamptz, int, timestamptz, int) RENAME TO log_timers_due_v2")
        restored = True
        q.schedule([op_schedule("gates-probe-q", "k1", b"after the repair")])
        h.wake(now_ms())
        wait_for(lambda: h.stats()["fired_total"] == 1, 15, what="the fire after the repair")
    finally:
        if not restored:
            q.q("ALTER FUNCTION queen.log_timers_due_v2_hidden(int2[], timestamptz, int, timestamptz, int) "
                "RENAME TO log_timers_due_v2")
        final = assert_clean_stop(h)
    assert final["kv_deleted_total"] == 550
    assert q.kv_count("gates-probe") == 0
