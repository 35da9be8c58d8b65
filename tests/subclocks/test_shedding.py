"""4. Shedding under pressure: from the bottom, and the fire never switches off.

Pressure is the count of consecutive cycles whose drain was capped (its row budget or its
half-lease deadline). A backlog of due timers far larger than the cycle's budget
(sweeper_cycle_max_rows=200 in claims of sweeper_claim_batch=100) keeps every drain
capped: pressure 1 sheds the prune, 2 and more shed the rollup too, and what the customer
sees is a rising lateness, not a loss. A backlog drained in good time is not a slow
database, so the fire keeps its budget and its floor sleep; only drains that run out of
time (slow_pressure) halve the fire's budget down to one claim batch and lengthen its sleep
up to the ceiling (the second test slows every segment insert with a trigger).
Once the backlog is gone pressure returns to 0 and both phases come back.

The stats are sampled every ~10 ms on a side thread; the log callback records each stage
change, which must be logged once per change, not once per cycle."""

import threading
import time

from conftest import assert_clean_stop, op_schedule, wait_for
from queen_sweeper import decode_segment

BACKLOG = 5000
QUEUE = "shed-q"


class Sampler(threading.Thread):
    FIELDS = ("cycles_total", "pressure", "slow_pressure", "fired_total", "timers_oldest_late_ms", "sleep_ms",
              "kv_prune_calls_total", "kv_deleted_total", "capped_cycles_total")

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


def test_pressure_sheds_prune_then_rollup_and_the_fire_only_slows(q, sweepers):
    q.schedule([op_schedule(QUEUE, f"b{i:05d}", b"p%05d" % i, partition=f"p{i % 4}")
                for i in range(BACKLOG)])
    h = sweepers("shed", sweeper_cycle_max_rows=200, sweeper_claim_batch=100,
                 sweeper_fire_rate_per_tenant=100000, sweeper_min_sleep_ms=20,
                 sweeper_max_sleep_ms=100, kv_expire_every_ms=50, kv_expire_batch=100,
                 kv_usage_every_ms=50)
    sampler = Sampler(h)
    sampler.start()
    inserted_while_shed = False
    try:
        h.start()
        # Expired keys that arrive while the prune is shed wait for the pressure to go.
        wait_for(lambda: h.stats()["phases"]["prune"] == "shed", 15, 0.005,
                 what="the prune to be shed")
        q.kv_insert("shed-kv", 300, expires_sql="now() - interval '1 second'")
        inserted_while_shed = True
        wait_for(lambda: q.timers_left() == 0, 60, 0.1, what="the backlog to drain")
        wait_for(lambda: (lambda s: s["pressure"] == 0 and s["phases"]["prune"] == "on"
                          and s["phases"]["rollup"] == "on")(h.stats()), 10,
                 what="pressure 0 and both phases back on")
        wait_for(lambda: h.stats()["kv_deleted_total"] >= 300, 10,
                 what="the prune to catch up once back on")
        time.sleep(0.3)
    finally:
        sampler.stop()
        final = assert_clean_stop(h)
    s = sampler.samples
    assert inserted_while_shed
    assert len(s) > 100, len(s)

    print(f"\n[shedding] {len(s)} samples; peak pressure {max(x['pressure'] for x in s)};"
          f" prune-only samples {sum(1 for x in s if x['prune'] == 'shed' and x['rollup'] == 'on')};"
          f" max lateness {max(x['timers_oldest_late_ms'] for x in s)} ms;"
          f" capped cycles {final['capped_cycles_total']} of {final['cycles_total']}")
    print("\n".join(h.messages("shedding stage") + [m for m in h.messages("pressure ")
                                                     if m.startswith("pressure ")]))

    # --- the order: the prune goes first, the rollup second, the fire never ---------------
    assert all(x["fire"] == "on" for x in s)
    assert not [x for x in s if x["rollup"] == "shed" and x["prune"] == "on"], \
        "the rollup was shed while the prune still ran"
    first_prune = next(i for i, x in enumerate(s) if x["prune"] == "shed")
    first_rollup = next(i for i, x in enumerate(s) if x["rollup"] == "shed")
    assert first_prune < first_rollup, (first_prune, first_rollup)
    prune_only = [x for x in s if x["prune"] == "shed" and x["rollup"] == "on"]
    assert prune_only, "no sample showed the prune shed while the rollup still ran"
    # The ladder: the rollup goes only at pressure 2 or more. (A sample taken between the
    # end of the cycle whose drain finished and the next one shows pressure 0 with the
    # stage that cycle ran under; never pressure 1.)
    assert not [x for x in s if x["rollup"] == "shed" and x["pressure"] == 1], \
        "the rollup was shed at pressure 1"

    # --- pressure rises, one step per capped cycle, then falls back to 0 ------------------
    peak = max(x["pressure"] for x in s)
    assert peak >= 10, peak
    i_peak = next(i for i, x in enumerate(s) if x["pressure"] == peak)
    rising = [x["pressure"] for x in s[:i_peak + 1]]
    assert rising == sorted(rising), "pressure fell while the backlog was still there"
    assert s[-1]["pressure"] == 0 and s[-1]["prune"] == "on" and s[-1]["rollup"] == "on", s[-1]
    assert final["capped_cycles_total"] >= BACKLOG // 200 - 3, final["capped_cycles_total"]

    # --- a backlog drained in good time keeps the fire's full budget and its floor sleep ---
    deep = [x for x in s if x["pressure"] >= 3]
    per_cycle = (deep[-1]["fired_total"] - deep[0]["fired_total"]) / max(
        1, deep[-1]["cycles_total"] - deep[0]["cycles_total"])
    assert per_cycle > 100, f"{per_cycle:.1f} timers per cycle: the budget was halved by a mere backlog"
    assert all(x["slow_pressure"] == 0 for x in s), "a backlog counted as a slow database"
    assert min(x["sleep_ms"] for x in deep) == 20, "a backlog lengthened the sleep"
    # The visible cost is a rising fire lag, never a loss.
    lates = [x["timers_oldest_late_ms"] for x in deep]
    assert max(lates) > lates[0], (lates[0], max(lates))

    # --- shed phases do not run; they come back when the pressure goes ---------------------
    shed_prune = [x for x in s if x["prune"] == "shed"]
    assert shed_prune[-1]["kv_prune_calls_total"] - shed_prune[0]["kv_prune_calls_total"] <= 1
    shed_both = [x for x in s if x["rollup"] == "shed"]
    assert shed_both[-1]["rollup_runs"] - shed_both[0]["rollup_runs"] <= 1
    assert final["kv_deleted_total"] == 300
    assert final["rollup"]["runs_total"] > shed_both[-1]["rollup_runs"]
    assert q.kv_count("shed-kv") == 0

    # --- every timer fired exactly once -------------------------------------------------
    assert final["fired_total"] == BACKLOG, final["fired_total"]
    assert q.timers_left() == 0
    txns = []
    for _base, count, blob in q.segments(QUEUE):
        frames = decode_segment(blob)
        assert len(frames) == count
        txns.extend(f.txn for f in frames)
    assert len(txns) == BACKLOG
    assert sorted(txns) == sorted(f"txn-b{i:05d}" for i in range(BACKLOG))

    # --- logged once per change, not per cycle -------------------------------------------
    stages = h.messages("shedding stage")
    assert 3 <= len(stages) <= 4, "\n".join(stages)
    order = [m.split(": ", 1)[1].split(" (")[0] for m in stages]
    assert order[:3] == ["on/on -> on/shed", "on/shed -> shed/shed", "shed/shed -> on/on"], order
    pressure_lines = h.messages("pressure ")
    pressure_lines = [m for m in pressure_lines if m.startswith("pressure ")]
    assert len(pressure_lines) <= 5, "\n".join(pressure_lines)


def test_a_slow_database_halves_the_fire_budget_and_lengthens_its_sleep(q, sweepers):
    """Every segment insert sleeps 30 ms (a trigger), so a drain with a 150 ms deadline
    (lease 300 ms) runs out of time: slow_pressure rises, the budget halves to one claim
    batch and the sleep doubles to its ceiling; the fire still delivers everything."""
    n = 1200
    q.schedule([op_schedule(QUEUE, f"s{i:05d}", b"s%05d" % i, partition=f"p{i % 8}")
                for i in range(n)])
    q.q("""CREATE OR REPLACE FUNCTION queen.test_slow_segment() RETURNS trigger
           LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.03); RETURN NEW; END $$""")
    q.q("DROP TRIGGER IF EXISTS test_slow_segment ON queen.log_segments")
    q.q("""CREATE TRIGGER test_slow_segment BEFORE INSERT ON queen.log_segments
           FOR EACH ROW EXECUTE FUNCTION queen.test_slow_segment()""")
    try:
        h = sweepers("slow", sweeper_cycle_max_rows=800, sweeper_claim_batch=100,
                     sweeper_lease_ms=300, sweeper_fire_rate_per_tenant=100000,
                     sweeper_min_sleep_ms=10, sweeper_max_sleep_ms=160)
        sampler = Sampler(h)
        sampler.start()
        try:
            h.start()
            wait_for(lambda: q.timers_left() == 0, 90, 0.1, what="the slowed backlog to drain")
            time.sleep(0.2)
        finally:
            sampler.stop()
            final = assert_clean_stop(h)
    finally:
        q.q("DROP TRIGGER IF EXISTS test_slow_segment ON queen.log_segments")
        q.q("DROP FUNCTION IF EXISTS queen.test_slow_segment()")
    s = sampler.samples
    peak = max(x["slow_pressure"] for x in s)
    print(f"\n[slow database] peak slow_pressure {peak}; max sleep {max(x['sleep_ms'] for x in s)} ms;"
          f" fired {final['fired_total']} in {final['cycles_total']} cycles")
    assert peak >= 3, peak
    slow = [x for x in s if x["slow_pressure"] >= 3]
    assert max(x["sleep_ms"] for x in slow) == 160, "the sleep did not lengthen to its ceiling"
    per_cycle = (slow[-1]["fired_total"] - slow[0]["fired_total"]) / max(
        1, slow[-1]["cycles_total"] - slow[0]["cycles_total"])
    assert per_cycle <= 200, f"{per_cycle:.1f} timers per cycle: the budget did not shrink"
    assert final["fired_total"] == n
    assert q.timers_left() == 0
