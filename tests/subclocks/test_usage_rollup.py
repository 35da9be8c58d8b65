"""2. The usage rollup: queen.kv_usage_step_v1 on its own, slow gate (kv_usage_every_ms),
which drops to the 30-second quota cadence while a tenant is above 80% of its quota.

It fills queen.kv_usage (live KV rows and bytes, timer rows, bytes and oldest per tenant)
and the sweeper's stats: rollup.runs_total, rollup.tenants, rollup.max_quota_ratio."""

import time

import pytest
from psycopg2.extensions import make_dsn

from conftest import TENANT_B, Queen
from queenkit import (TENANT_A, apply_sql_files, assert_clean_stop, connect, Handle, op_schedule,
                      reset_tables, Sweeper, sweeper_config, wait_for)


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
    # Cycles every 50 ms at most (the timers are far: work exists, the ceiling applies),
    # four times faster than the rollup's gate.
    h = sweepers("rollup-gate", kv_usage_every_ms=200, kv_expire_every_ms=3_600_000,
                 sweeper_max_sleep_ms=50)
    h.start()
    try:
        wait_for(lambda: h.stats()["rollup"]["runs_total"] >= 4, 10,
                 what="four rollups at a 200 ms gate")
        st = h.stats()
        usage = wait_for(lambda: (lambda u: u if len(u) == 2 else None)(_usage(q)), 5,
                         what="two tenants in queen.kv_usage")
        # The gate is honoured: not once per cycle.
        assert st["rollup"]["runs_total"] * 2 < st["cycles_total"], (
            st["rollup"]["runs_total"], st["cycles_total"])
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


def test_one_pass_per_interval_serves_every_broker(q, sweepers):
    """Schema version 10: the rollup's figures are the database's, so three brokers on a
    1 s gate run about one pass a second between them, not three (kv_usage_step_v2's fleet
    gate); the others count their gate passed up (rollup.skipped_total) and still see the
    usage in queen.kv_usage."""
    q.kv_insert("fleet", 50, expires_sql="NULL", tenant=TENANT_A)
    q.schedule([op_schedule("fleet-q", f"t{i}", b"x", delay_ms=3_600_000) for i in range(3)],
               tenant=TENANT_A)
    hs = [sweepers(f"rollup-fleet-{i}", kv_usage_every_ms=1000, kv_expire_every_ms=3_600_000,
                   sweeper_max_sleep_ms=50) for i in range(3)]
    for h in hs:
        h.start()
    try:
        wait_for(lambda: sum(h.stats()["rollup"]["runs_total"] for h in hs) >= 1, 10,
                 what="the first pass")
        t0 = time.monotonic()
        runs0 = sum(h.stats()["rollup"]["runs_total"] for h in hs)
        time.sleep(4.0)
        secs = time.monotonic() - t0
        sts = [h.stats() for h in hs]
    finally:
        for h in hs:
            assert_clean_stop(h)
    runs = sum(st["rollup"]["runs_total"] for st in sts) - runs0
    skipped = sum(st["rollup"]["skipped_total"] for st in sts)
    print(f"\n[rollup-fleet] {runs} passes in {secs:.1f} s by 3 brokers on a 1 s gate; "
          f"per broker runs/skipped: {[(st['rollup']['runs_total'], st['rollup']['skipped_total']) for st in sts]}")
    # One a second between them (each interval's pass takes a few ms): at most one more for
    # the edges of the window. Without the gate it is about three a second.
    assert 2 <= runs <= secs + 1, runs
    assert skipped >= 3, skipped
    assert _usage(q)[TENANT_A] == (50, 3)
    for st in sts:
        assert st["phases"]["rollup"] == "on" and st["cycle_errors_total"] == 0, st["last_error"]


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
    # The idle backoff is capped at the ceiling so the loop keeps cycling while watched.
    h = sweepers("rollup-under", kv_usage_every_ms=600_000, sweeper_idle_max_sleep_ms=200)
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


SIDE_DB = "queen_subclocks_idle"


@pytest.fixture(scope="module")
def above_watermark(conninfo, schema):
    """One 38-second watch shared by the two tests below, for two sweepers at once, each
    with a tenant at 90% of its quota and kv_usage_every_ms = 600000:
      busy: on the suite's database, with a timer an hour away, so the loop has work and
            sleeps at its ceiling (200 ms);
      idle: on a side database with no timer and no expired key, so the loop backs off
            to its idle cap (the default, 30000 ms).
    After the first rollup the busy tenant drops to 60%, which the refresh must see."""
    main = connect(conninfo)
    reset_tables(main)
    admin = connect(conninfo)
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {SIDE_DB} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {SIDE_DB}")
    side_dsn = make_dsn(conninfo, dbname=SIDE_DB)
    side = connect(side_dsn)
    made = []
    try:
        apply_sql_files(side)
        qm, qs = Queen(main, conninfo), Queen(side, side_dsn)
        for qq in (qm, qs):
            qq.q("INSERT INTO queen.kv_quota (tenant_id, max_rows) VALUES (%s, 100)", (TENANT_A,))
            qq.kv_insert("wm", 90, expires_sql="NULL")
        qm.schedule([op_schedule("wm-q", "far", b"x", delay_ms=3_600_000)])
        busy = Handle(Sweeper(**sweeper_config(conninfo, "rollup-over-busy",
                                               {"kv_usage_every_ms": 600_000})), "busy")
        idle = Handle(Sweeper(**sweeper_config(side_dsn, "rollup-over-idle",
                                               {"kv_usage_every_ms": 600_000})), "idle")
        made = [busy, idle]
        for h in made:
            h.sw.on_log(h.on_log)
            h.sw.start()
        for h in made:
            wait_for(lambda: h.stats()["rollup"]["runs_total"] == 1, 10,
                     what=f"the first rollup ({h.name})")
        t_first = time.monotonic()
        first = {h.name: h.stats() for h in made}
        computed1 = qm.one("SELECT computed_at FROM queen.kv_usage WHERE tenant_id = %s",
                           (TENANT_A,))
        qm.q("DELETE FROM queen.kv WHERE namespace = 'wm' AND key IN"
             " (SELECT 'k' || g FROM generate_series(1, 30) g)")
        seen = {h.name: 1 for h in made}
        times = {h.name: [] for h in made}
        sleeps = {h.name: [] for h in made}
        end = time.monotonic() + 38.0
        while time.monotonic() < end:
            for h in made:
                st = h.stats()
                n = st["rollup"]["runs_total"]
                if n > seen[h.name]:
                    times[h.name].extend([time.monotonic() - t_first] * (n - seen[h.name]))
                    seen[h.name] = n
                sleeps[h.name].append(st["sleep_ms"])
            time.sleep(0.05)
        last = {h.name: h.stats() for h in made}
        for h in made:
            assert_clean_stop(h)
        computed2 = qm.one("SELECT computed_at FROM queen.kv_usage WHERE tenant_id = %s",
                           (TENANT_A,))
        usage_busy = _usage(qm)
        yield {"first": first, "last": last, "runs": seen, "times": times, "sleeps": sleeps,
               "computed": (computed1, computed2), "usage_busy": usage_busy}
    finally:
        for h in made:
            try:
                h.sw.close()
            except Exception:
                pass
        side.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {SIDE_DB} WITH (FORCE)")
        admin.close()
        reset_tables(main)
        main.close()


def test_rollup_above_the_watermark_refreshes_every_30_seconds(above_watermark):
    """The slow test of this folder: the quota cadence is a constant of 30 s."""
    w = above_watermark
    assert abs(w["first"]["busy"]["rollup"]["max_quota_ratio"] - 0.9) < 1e-6, w["first"]["busy"]
    assert w["runs"]["busy"] == 2, (f"expected exactly one refresh on the 30 s quota cadence"
                                    f" within 38 s, saw {w['runs']['busy'] - 1}")
    gap = w["times"]["busy"][0]
    assert 28.0 <= gap <= 33.0, f"second rollup {gap:.1f}s after the first, expected ~30 s"
    # The refresh saw the tenant drop under the watermark.
    assert abs(w["last"]["busy"]["rollup"]["max_quota_ratio"] - 0.6) < 1e-6
    c1, c2 = w["computed"]
    assert c2 > c1
    assert w["usage_busy"][TENANT_A] == (60, 1)   # 60 live keys, the one far timer


def test_rollup_quota_cadence_holds_while_the_loop_idles(above_watermark):
    """The same promise on a loop with no timer and no expired key: the idle backoff
    (doubling up to sweeper_idle_max_sleep_ms, 30 s by default) must not stretch the
    30-second quota refresh. The sleep has to wake for the rollup's gate."""
    w = above_watermark
    assert abs(w["first"]["idle"]["rollup"]["max_quota_ratio"] - 0.9) < 1e-6, w["first"]["idle"]
    assert w["last"]["idle"]["phases"]["rollup"] == "on"
    assert w["runs"]["idle"] >= 2, (
        f"a tenant at 90% of its quota was not refreshed within 38 s of the previous rollup"
        f" (the quota cadence is 30 s); the idle loop's sleeps were up to"
        f" {max(w['sleeps']['idle'])} ms, last sleep_ms {w['last']['idle']['sleep_ms']},"
        f" idle_cycles {w['last']['idle']['idle_cycles']},"
        f" cycles_total {w['last']['idle']['cycles_total']}")
    gap = w["times"]["idle"][0]
    assert 28.0 <= gap <= 33.0, f"second rollup {gap:.1f}s after the first, expected ~30 s"
