"""2. The usage rollup: queen.kv_usage_step_v1 on its own, slow gate (kv_usage_every_ms),
which drops to the 30-second quota cadence while a tenant is above 80% of its quota.

It fills queen.kv_usage (live KV rows and bytes, timer rows, bytes and oldest per tenant)
and the sweeper's stats: rollup.runs_total, rollup.tenants, rollup.max_quota_ratio."""

import time

from conftest import TENANT_A, TENANT_B, assert_clean_stop, op_schedule, wait_for


def _usage(q):
    return {str(t): (int(r), int(tr)) for t, r, tr in
            q.q("SELECT tenant_id, kv_rows, timer_rows FROM queen.kv_usage")}


def test_rollup_runs_on_its_gate_and_fills_kv_usage(q, sweepers):
    q.kv_insert("use", 120, expires_sql="NULL", tenant=TENANT_A)
    q.kv_insert("use", 30, expires_sql="now() - interval '1 minute'", tenant=TENANT_A,
                prefix="dead")   # dead rows are not usage
    q.kv_insert("use", 40, expires_sql="now() + interval '1 hour'", tenant=TENANT_B)
    q.q("INSERT INTO queen.kv_quota (tenant_id, max_rows) VALUES (%s, 100)", (TENANT_B,))
    # Timers far in the future: counted, never fired during the test.
    q.schedule([op_schedule("use-q", f"t{i}", b"x" * 10, delay_ms=3_600_000) for i in range(7)],
               tenant=TENANT_A)

    # The prune runs once at start and then not for an hour: it does not matter here,
    # dead rows are not usage whether or not they are still present.
    h = sweepers("rollup-gate", kv_usage_every_ms=200, kv_expire_every_ms=3_600_000)
    h.start()
    try:
        wait_for(lambda: h.stats()["rollup"]["runs_total"] >= 4, 10,
                 what="four rollups at a 200 ms gate")
        st = h.stats()
        usage = wait_for(lambda: (lambda u: u if len(u) == 2 else None)(_usage(q)), 5,
                         what="two tenants in queen.kv_usage")
        # The gate is honoured: not once per cycle.
        assert st["rollup"]["runs_total"] < st["cycles_total"], st
    finally:
        final = assert_clean_stop(h)

    assert usage[TENANT_A] == (120, 7), usage
    assert usage[TENANT_B] == (40, 0), usage
    assert st["phases"]["rollup"] == "on"
    assert abs(st["rollup"]["max_quota_ratio"] - 0.4) < 1e-6, st["rollup"]
    assert st["rollup"]["sampled"] is False
    tenants = {t["tenant"]: t for t in st["rollup"]["tenants"]}
    assert set(tenants) == {TENANT_A, TENANT_B}, tenants
    assert tenants[TENANT_A]["kvRows"] == 120 and tenants[TENANT_A]["timerRows"] == 7
    assert tenants[TENANT_A]["kvBytes"] > 0 and tenants[TENANT_A]["timerBytes"] > 0
    assert abs(tenants[TENANT_B]["rowsRatio"] - 0.4) < 1e-6
    # Highest quota ratio first.
    assert st["rollup"]["tenants"][0]["tenant"] == TENANT_B
    assert final["rollup"]["runs_total"] >= st["rollup"]["runs_total"]
    assert final["cycle_errors_total"] == 0, final["last_error"]


def _run_times(h, seconds, interval=0.05):
    """Watch rollup.runs_total for `seconds`; the monotonic instant of every increase."""
    seen, times = h.stats()["rollup"]["runs_total"], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n = h.stats()["rollup"]["runs_total"]
        if n > seen:
            times.extend([time.monotonic()] * (n - seen))
            seen = n
        time.sleep(interval)
    return seen, times


def test_rollup_below_the_watermark_keeps_its_slow_gate(q, sweepers):
    q.q("INSERT INTO queen.kv_quota (tenant_id, max_rows) VALUES (%s, 100)", (TENANT_A,))
    q.kv_insert("wm", 50, expires_sql="NULL")          # 50% of the quota
    h = sweepers("rollup-under", kv_usage_every_ms=600_000)
    h.start()
    try:
        wait_for(lambda: h.stats()["rollup"]["runs_total"] == 1, 10, what="the first rollup")
        cycles0 = h.stats()["cycles_total"]
        runs, _ = _run_times(h, 3.0)
        st = h.stats()
    finally:
        assert_clean_stop(h)
    assert runs == 1, f"the rollup ran again within 3 s under the watermark: {runs}"
    assert st["cycles_total"] > cycles0 + 5, "the loop itself kept cycling"
    assert abs(st["rollup"]["max_quota_ratio"] - 0.5) < 1e-6, st["rollup"]
    assert _usage(q)[TENANT_A] == (50, 0)


def test_rollup_above_the_watermark_refreshes_every_30_seconds(q, sweepers):
    """The one slow test here: the quota cadence is a constant of 30 s."""
    q.q("INSERT INTO queen.kv_quota (tenant_id, max_rows) VALUES (%s, 100)", (TENANT_A,))
    q.kv_insert("wm", 90, expires_sql="NULL")          # 90% of the quota: above 80%
    h = sweepers("rollup-over", kv_usage_every_ms=600_000)
    h.start()
    try:
        wait_for(lambda: h.stats()["rollup"]["runs_total"] == 1, 10, what="the first rollup")
        t_first = time.monotonic()
        st1 = h.stats()
        assert abs(st1["rollup"]["max_quota_ratio"] - 0.9) < 1e-6, st1["rollup"]
        computed1 = q.one("SELECT computed_at FROM queen.kv_usage WHERE tenant_id = %s",
                          (TENANT_A,))
        # Drop under the watermark meanwhile: the next (quota-cadence) run must see it.
        q.q("DELETE FROM queen.kv WHERE namespace = 'wm' AND key IN (SELECT 'k' || g FROM"
            " generate_series(1, 30) g)")
        runs, times = _run_times(h, 38.0)
        st2 = h.stats()
    finally:
        assert_clean_stop(h)
    assert runs == 2, (f"expected exactly one refresh on the 30 s quota cadence within 38 s,"
                       f" saw {runs - 1}")
    gap = times[0] - t_first
    assert 28.0 <= gap <= 33.0, f"second rollup {gap:.1f}s after the first, expected ~30 s"
    assert abs(st2["rollup"]["max_quota_ratio"] - 0.6) < 1e-6, st2["rollup"]
    computed2 = q.one("SELECT computed_at FROM queen.kv_usage WHERE tenant_id = %s", (TENANT_A,))
    assert computed2 > computed1
    assert _usage(q)[TENANT_A] == (60, 0)
