"""Many brokers, one database: 16 sweeper processes (64 client connections) through the
bouncer's server pool of 4. Every timer once; no connection error storm (every broker's
pool counts its lost connections and failed calls); every broker took part; then the
idle query rate per broker, counted by the bouncer, is printed."""

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bouncerkit import admin, close_queen, delivered_once, op_schedule, queen, wait_for

BROKERS = 16
N = 16_000
HERE = Path(__file__).resolve().parent


def _stats(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _counts(bouncer):
    """(transactions, queries) the bouncer passed to the server for database postgres since it
    started (SHOW STATS: database | total_xact_count | total_query_count | ...). A sweeper's
    call is one transaction (BEGIN, the pinned settings, the statement, COMMIT)."""
    for r in admin(bouncer, "SHOW STATS"):
        if r[0] == "postgres":
            return int(r[1]), int(r[2])
    raise AssertionError("no SHOW STATS row for database postgres")


def test_sixteen_brokers_through_a_pool_of_four(bouncer, direct_conninfo):
    q = queen(bouncer, direct_conninfo)
    queue = f"many-brokers-{uuid.uuid4().hex[:8]}"
    txns = [f"txn-{i:05d}" for i in range(N)]
    d = tempfile.mkdtemp(prefix="queen-many-")
    procs, files = [], []
    try:
        for i in range(BROKERS):
            f = f"{d}/b{i}.json"
            files.append(f)
            # The batch stays at its base size: what this test asks is whether 16 brokers all
            # get their turns through 4 server connections, and a batch that grows lets the
            # first brokers to grow take a 16,000-timer backlog in a few 2,000-row claims
            # (seen: two of 16 fired nothing, every call of theirs answered).
            procs.append(subprocess.Popen([sys.executable, str(HERE / "broker_proc.py"), "--broker-id", f"mb-{i:02d}",
                                           "--stats", f, "--conninfo", bouncer["QUEEN_BOUNCER_SWEEPER_CONNINFO"],
                                           "--knob", "sweeper_claim_batch_max=200"],
                                          stderr=subprocess.PIPE, text=True))
        # Every broker has finished a cycle through the bouncer before the timers are scheduled:
        # a broker still starting when the drain runs could miss it whole (seen in CI, on a
        # loaded machine: one of 16 fired nothing), and this test asks about turns, not starts.
        wait_for(lambda: all((s := _stats(f)) and s["cycles_total"] >= 1 for f in files), 120, 0.1,
                 "every broker's first cycle")
        q.schedule([op_schedule(queue, f"k{i:05d}", b"m%05d" % i, partition=f"p{i % 64:02d}",
                                delay_ms=3000 + (i * 3000) // N, txn=txns[i]) for i in range(N)])
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0, 240, 0.1,
                 "every timer fired")
        time.sleep(1.0)  # one more stats write from every broker
        stats = [_stats(f) for f in files]
        fired = [s["fired_total"] for s in stats]
        errors = [(s["pool"]["disconnects_total"], s["pool"]["calls_failed_total"]) for s in stats]
        print(f"\n[many brokers] fired per broker: {fired}")
        print(f"[many brokers] (disconnects, failed calls) per broker: {errors}")
        assert sum(fired) == N, fired
        assert delivered_once(q, queue, txns) == N
        assert all(e == (0, 0) for e in errors), f"connection errors through the bouncer: {errors}"
        calls = [(s["cycles_total"], s["claims_total"], s["empty_claims_total"], s["contended_claims_total"])
                 for s in stats]
        assert all(f > 0 for f in fired), f"a broker never fired: {fired}; (cycles, claims, empty, contended): {calls}"
        assert all(s["claims_total"] > 0 and s["claim_batch"] == 200 for s in stats)
        assert all(s["dlq_total"] == 0 and s["duplicate_total"] == 0 for s in stats)

        # Idle: the bouncer counts every query it passes on; the brokers are the only clients.
        time.sleep(5)
        (x0, q0), t0 = _counts(bouncer), time.monotonic()
        time.sleep(20)
        (x1, q1), t1 = _counts(bouncer), time.monotonic()
        per_min = (x1 - x0) / (t1 - t0) / BROKERS * 60
        print(f"[many brokers] idle, 5-25 s after the drain (the idle backoff not settled yet): "
              f"{per_min:.1f} calls/min per broker ({x1 - x0} transactions, {q1 - q0} statements in "
              f"{t1 - t0:.1f} s from {BROKERS} brokers)")
        assert x1 > x0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for p in procs:
            if p.returncode not in (0, -15):
                print(p.stderr.read()[-2000:])
        close_queen(q)
    stopped = [_stats(f) for f in files]
    assert all(s["state"] == "stopped" and s["teardown_clean"] for s in stopped), [s["state"] for s in stopped]
    shutil.rmtree(d, ignore_errors=True)  # kept only when the test fails: the brokers' stats files
