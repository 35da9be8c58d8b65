"""4. Shedding under database pressure: from the bottom, and the fire never switches off.

Every rung of the ladder answers *database* pressure. `pressure` counts consecutive cycles
whose drain ran out of its half-lease (the database is slow) or whose drain call failed
transiently (the database is unreachable or overloaded); at 1 it sheds the prune, at 2 the
rollup too. A drain that merely used up its row budget in good time is a backlog on a
healthy database: nothing is shed, the prune's alarm keeps its exact count, and the fire
keeps its full budget and its floor sleep.

The first test keeps every drain at its row budget (a 5,000-timer backlog in cycles of 100
rows) on a healthy database, with 250 expired keys held by another transaction (the prune
skips them, so its alarm must say 250 on every pass, exactly) and 300 more expiring during
the backlog (pruned during the backlog). The second slows every segment insert with a
trigger (30 ms), so a drain with a 150 ms deadline (lease 300 ms) runs out of time: the
prune goes first, the rollup second, the fire's budget halves and its sleep lengthens, and
once the backlog is gone both phases come back.

The stats are sampled every ~10 ms on a side thread; the log callback records each stage
change, which must be logged once per change, not once per cycle."""

import threading
import time

from queenkit import assert_clean_stop, op_schedule, wait_for
from queen_sweeper import Ephemeral, decode_segment

QUEUE = "shed-q"


class Sampler(threading.Thread):
    FIELDS = ("cycles_total", "pressure", "slow_pressure", "fired_total", "timers_oldest_late_ms", "sleep_ms",
              "kv_prune_calls_total", "kv_deleted_total", "kv_expired_not_pruned",
              "kv_expired_not_pruned_capped", "capped_cycles_total")

    def __init__(self, h, interval=0.01):
        super().__init__(daemon=True)
        self.h, self.interval = h, interval
        self.samples = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            st = self.h.stats()
            row = {k: st[k] for k in self.FIELDS}
            row["t"] = time.monotonic()
            row["prune"] = st["phases"]["prune"]
            row["rollup"] = st["phases"]["rollup"]
            row["fire"] = st["phases"]["fire"]
            row["rollup_runs"] = st["rollup"]["runs_total"]
            self.samples.append(row)
            time.sleep(self.interval)

    def stop(self):
        self.halt.set()
        self.join(5)


def assert_fired_once(q, n, prefix):
    txns = []
    for _base, count, blob in q.segments(QUEUE):
        frames = decode_segment(blob)
        assert len(frames) == count
        txns.extend(f.txn for f in frames)
    assert len(txns) == n
    assert sorted(txns) == sorted(f"txn-{prefix}{i:05d}" for i in range(n))


def stage_lines(h):
    return [m.split(": ", 1)[1].split(" (")[0] for m in h.messages("shedding stage")]


def test_a_backlog_on_a_healthy_database_sheds_nothing_and_the_alarm_stays_exact(q, sweepers, connections):
    backlog, held, late = 5000, 250, 300
    q.kv_insert("shed-held", held, expires_sql="now() - interval '1 second'")
    locker = connections(autocommit=False)
    with locker.cursor() as cur:
        cur.execute("SELECT key FROM queen.kv WHERE namespace = 'shed-held' FOR UPDATE")
        assert len(cur.fetchall()) == held
    q.schedule([op_schedule(QUEUE, f"b{i:05d}", b"p%05d" % i, partition=f"p{i % 4}")
                for i in range(backlog)])
    h = sweepers("shed-backlog", sweeper_cycle_max_rows=100, sweeper_claim_batch=50,
                 sweeper_fire_rate_per_tenant=100000, sweeper_min_sleep_ms=50,
                 sweeper_max_sleep_ms=100, kv_expire_every_ms=50, kv_expire_batch=100,
                 kv_usage_every_ms=50)
    sampler = Sampler(h)
    sampler.start()
    try:
        h.start()
        wait_for(lambda: h.stats()["fired_total"] >= 500, 30, 0.005, what="the backlog to be under way")
        t_late = time.monotonic()
        q.kv_insert("shed-late", late, expires_sql="now() - interval '1 second'")
        wait_for(lambda: (lambda s: s["kv_deleted_total"] == late and s["kv_expired_not_pruned"] == held)(h.stats()),
                 15, 0.005, what="the keys that expired during the backlog to be pruned")
        during = h.stats()
        wait_for(lambda: q.timers_left() == 0, 60, 0.1, what="the backlog to drain")
        locker.rollback()
        wait_for(lambda: h.stats()["kv_deleted_total"] == late + held, 10,
                 what="the held keys to be pruned once released")
    finally:
        sampler.stop()
        final = assert_clean_stop(h)
    s = sampler.samples
    deep = [x for x in s if 0 < x["fired_total"] < backlog]
    print(f"\n[backlog, healthy database] {len(s)} samples, {len(deep)} during the backlog; "
          f"capped cycles {final['capped_cycles_total']} of {final['cycles_total']}; peak pressure "
          f"{max(x['pressure'] for x in s)}; fired when the late keys were pruned {during['fired_total']} "
          f"of {backlog}; prune calls during the backlog "
          f"{deep[-1]['kv_prune_calls_total'] - deep[0]['kv_prune_calls_total']}")
    assert len(deep) > 50, len(deep)
    # Every drain hit its row budget, and none of that is pressure: nothing was shed.
    assert final["capped_cycles_total"] >= backlog // 100 - 3, final["capped_cycles_total"]
    assert all(x["pressure"] == 0 and x["slow_pressure"] == 0 for x in s), \
        [x for x in s if x["pressure"] or x["slow_pressure"]][:3]
    assert all(x["prune"] == "on" and x["rollup"] == "on" and x["fire"] == "on" for x in s)
    assert not h.messages("shedding stage"), h.messages("shedding stage")
    assert not [m for m in h.messages("pressure ") if m.startswith("pressure ")]
    # The prune and the rollup kept running through the backlog, on their own gates.
    assert deep[-1]["kv_prune_calls_total"] - deep[0]["kv_prune_calls_total"] >= 10
    assert deep[-1]["rollup_runs"] - deep[0]["rollup_runs"] >= 5
    assert during["fired_total"] < backlog, "the late keys were pruned only after the backlog"
    # The alarm is exact on every pass of the backlog: the held keys, never capped, plus
    # whatever of the late keys was still there.
    before_late = [x for x in deep if x["t"] < t_late and x["kv_prune_calls_total"] > 0]
    assert before_late and all(x["kv_expired_not_pruned"] == held for x in before_late), before_late[:3]
    wrong = [x for x in deep if x["kv_prune_calls_total"] > 0 and (
        x["kv_expired_not_pruned_capped"]
        or x["kv_expired_not_pruned"] not in (held, held + late - x["kv_deleted_total"]))]
    assert not wrong, wrong[:3]
    # The fire kept its full budget and its floor sleep.
    per_cycle = (deep[-1]["fired_total"] - deep[0]["fired_total"]) / max(
        1, deep[-1]["cycles_total"] - deep[0]["cycles_total"])
    assert per_cycle > 80, f"{per_cycle:.1f} timers per cycle: the budget was cut by a mere backlog"
    # (The rollup's 50 ms gate may cut a sleep shorter; nothing lengthens one.)
    assert max(x["sleep_ms"] for x in deep) <= 50, max(x["sleep_ms"] for x in deep)
    assert final["fired_total"] == backlog and q.timers_left() == 0
    assert q.kv_count("shed-held") == 0 and q.kv_count("shed-late") == 0
    assert_fired_once(q, backlog, "b")


def slow_segments(q, seconds):
    q.q(f"""CREATE OR REPLACE FUNCTION queen.test_slow_segment() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NEW; END $$""")
    q.q("DROP TRIGGER IF EXISTS test_slow_segment ON queen.log_segments")
    q.q("""CREATE TRIGGER test_slow_segment BEFORE INSERT ON queen.log_segments
           FOR EACH ROW EXECUTE FUNCTION queen.test_slow_segment()""")


def fast_segments(q):
    q.q("DROP TRIGGER IF EXISTS test_slow_segment ON queen.log_segments")
    q.q("DROP FUNCTION IF EXISTS queen.test_slow_segment()")


def test_a_slow_database_sheds_the_prune_then_the_rollup_and_the_fire_only_slows(q, sweepers):
    """Every segment insert sleeps 30 ms, so a drain with a 150 ms deadline (lease 300 ms)
    runs out of time on every cycle: pressure and slow_pressure rise one step per cycle,
    the prune goes at 1 and the rollup at 2, the budget halves to one claim batch and the
    sleep doubles to its ceiling; the fire still delivers everything, once."""
    n = 1200
    q.schedule([op_schedule(QUEUE, f"s{i:05d}", b"s%05d" % i, partition=f"p{i % 8}")
                for i in range(n)])
    slow_segments(q, 0.03)
    try:
        h = sweepers("shed-slow", sweeper_cycle_max_rows=800, sweeper_claim_batch=100,
                     sweeper_lease_ms=300, sweeper_fire_rate_per_tenant=100000,
                     sweeper_min_sleep_ms=10, sweeper_max_sleep_ms=160,
                     kv_expire_every_ms=50, kv_expire_batch=100, kv_usage_every_ms=50)
        sampler = Sampler(h)
        sampler.start()
        inserted_while_shed = False
        try:
            h.start()
            # Expired keys that arrive while the prune is shed wait for the pressure to go.
            wait_for(lambda: h.stats()["phases"]["prune"] == "shed", 30, 0.005,
                     what="the prune to be shed")
            q.kv_insert("shed-kv", 300, expires_sql="now() - interval '1 second'")
            inserted_while_shed = True
            wait_for(lambda: q.timers_left() == 0, 90, 0.1, what="the slowed backlog to drain")
            wait_for(lambda: (lambda st: st["pressure"] == 0 and st["phases"]["prune"] == "on"
                              and st["phases"]["rollup"] == "on")(h.stats()), 10,
                     what="pressure 0 and both phases back on")
            wait_for(lambda: h.stats()["kv_deleted_total"] >= 300, 10,
                     what="the prune to catch up once back on")
            time.sleep(0.3)
        finally:
            sampler.stop()
            final = assert_clean_stop(h)
    finally:
        fast_segments(q)
    s = sampler.samples
    assert inserted_while_shed
    peak = max(x["pressure"] for x in s)
    print(f"\n[slow database] {len(s)} samples; peak pressure {peak}, slow_pressure "
          f"{max(x['slow_pressure'] for x in s)}; max sleep {max(x['sleep_ms'] for x in s)} ms;"
          f" fired {final['fired_total']} in {final['cycles_total']} cycles")
    print("\n".join(h.messages("shedding stage") + [m for m in h.messages("pressure ")
                                                     if m.startswith("pressure ")]))

    # --- the order: the prune goes first, the rollup second, the fire never ---------------
    assert all(x["fire"] == "on" for x in s)
    assert not [x for x in s if x["rollup"] == "shed" and x["prune"] == "on"], \
        "the rollup was shed while the prune still ran"
    first_prune = next(i for i, x in enumerate(s) if x["prune"] == "shed")
    first_rollup = next(i for i, x in enumerate(s) if x["rollup"] == "shed")
    assert first_prune < first_rollup, (first_prune, first_rollup)
    assert [x for x in s if x["prune"] == "shed" and x["rollup"] == "on"], \
        "no sample showed the prune shed while the rollup still ran"
    assert not [x for x in s if x["rollup"] == "shed" and x["pressure"] == 1], \
        "the rollup was shed at pressure 1"

    # --- pressure rises one step per slow cycle, then falls back to 0 ----------------------
    assert peak >= 3, peak
    i_peak = next(i for i, x in enumerate(s) if x["pressure"] == peak)
    rising = [x["pressure"] for x in s[:i_peak + 1]]
    assert rising == sorted(rising), "pressure fell while the database was still slow"
    assert s[-1]["pressure"] == 0 and s[-1]["prune"] == "on" and s[-1]["rollup"] == "on", s[-1]

    # --- a slow database halves the fire's budget and lengthens its sleep ------------------
    slow = [x for x in s if x["slow_pressure"] >= 3]
    assert slow, "slow_pressure never reached 3"
    assert max(x["sleep_ms"] for x in slow) == 160, "the sleep did not lengthen to its ceiling"
    per_cycle = (slow[-1]["fired_total"] - slow[0]["fired_total"]) / max(
        1, slow[-1]["cycles_total"] - slow[0]["cycles_total"])
    assert per_cycle <= 200, f"{per_cycle:.1f} timers per cycle: the budget did not shrink"

    # --- shed phases do not run; they come back when the pressure goes ---------------------
    shed_prune = [x for x in s if x["prune"] == "shed"]
    assert shed_prune[-1]["kv_prune_calls_total"] - shed_prune[0]["kv_prune_calls_total"] <= 1
    shed_both = [x for x in s if x["rollup"] == "shed"]
    assert shed_both[-1]["rollup_runs"] - shed_both[0]["rollup_runs"] <= 1
    assert final["kv_deleted_total"] == 300
    assert final["rollup"]["runs_total"] > shed_both[-1]["rollup_runs"]
    assert q.kv_count("shed-kv") == 0

    # --- every timer fired exactly once -------------------------------------------------
    assert final["fired_total"] == n and q.timers_left() == 0
    assert_fired_once(q, n, "s")

    # --- logged once per change, not per cycle -------------------------------------------
    order = stage_lines(h)
    assert order[:3] == ["on/on -> on/shed", "on/shed -> shed/shed", "shed/shed -> on/on"], order
    assert len(order) <= 4, order
    pressure_lines = [m for m in h.messages("pressure ") if m.startswith("pressure ")]
    assert len(pressure_lines) <= 5, "\n".join(pressure_lines)


def test_the_backstop_keeps_its_pace_while_the_database_is_slow(q, sweepers):
    """The backstop is outside the ladder: it needs no connection, so shedding it would
    relieve nothing. While a slow database keeps pressure up (the prune and the rollup shed),
    its passes go on once a second and an untouched lease lapsed meanwhile is redelivered."""
    n = 2000
    q.schedule([op_schedule(QUEUE, f"w{i:05d}", b"w%05d" % i, partition=f"p{i % 8}")
                for i in range(n)])
    engine = Ephemeral(lease_ms=30000, max_retries=10)
    slow_segments(q, 0.03)
    try:
        h = sweepers("shed-backstop", sweeper_cycle_max_rows=800, sweeper_claim_batch=100,
                     sweeper_lease_ms=300, sweeper_fire_rate_per_tenant=100000,
                     sweeper_min_sleep_ms=10, sweeper_max_sleep_ms=160)
        h.set_backstop(engine)
        try:
            h.start()
            wait_for(lambda: h.stats()["pressure"] >= 2, 30, 0.005, what="pressure 2: both phases shed")
            st0, t0 = h.stats(), time.monotonic()
            engine.push("bs-q", "p0", b"lease me")
            m = engine.pop("bs-q", "p0", "g", lease_ms=200)
            redelivered_while_shed = False
            st1, t1 = st0, t0
            while h.stats()["pressure"] >= 2 and time.monotonic() < t0 + 60:
                st1, t1 = h.stats(), time.monotonic()
                redelivered_while_shed = redelivered_while_shed or st1["backstop"]["redelivered_total"] >= 1
                time.sleep(0.01)
            wait_for(lambda: q.timers_left() == 0, 90, 0.1, what="the slowed backlog to drain")
        finally:
            final = assert_clean_stop(h)
    finally:
        fast_segments(q)
        engine.close()
    window = t1 - t0
    passes = st1["backstop"]["runs_total"] - st0["backstop"]["runs_total"]
    print(f"\n[backstop under pressure] {window:.1f} s at pressure >= 2 (phases {st1['phases']}): "
          f"{passes} backstop passes, lease redelivered while shed: {redelivered_while_shed}")
    assert window >= 2.0, f"pressure held only {window:.1f} s: too short to judge the pace"
    assert st1["phases"]["prune"] == "shed" and st1["phases"]["rollup"] == "shed", st1["phases"]
    assert st1["phases"]["backstop"] == "on"
    assert passes >= int(window) - 1, f"{passes} passes in {window:.1f} s under pressure"
    assert redelivered_while_shed, "the lapsed lease waited for the pressure to go"
    assert (m.attempt, final["backstop"]["redelivered_total"], final["backstop"]["failures_total"]) == (1, 1, 0)
    assert final["fired_total"] == n
