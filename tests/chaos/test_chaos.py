"""Multi-broker chaos: exactly once, leaderless, through kills, terminated
connections and a database restart.

Four broker processes (tests/chaos/broker.py, each one sweeper loaded through the
Python binding, lease 3 s) drain 100,000 timers over 200 partitions and two tenants,
due across a 20-second window, while a fixed-seed plan kills brokers with SIGKILL and
restarts them, terminates the sweepers' connections with pg_terminate_backend, and
fast-restarts PostgreSQL once. Afterwards, from the log itself: every scheduled txn is
there exactly once, in the right tenant and partition, the per-segment hash column
matches the frames, offsets are contiguous, nothing is left in log_timers and nothing
went to the dead-letter table. Lateness (segment created_at - deliverAt) is printed
against the lease, never asserted: timing claims live in benchmarks.

Run (tests/run does this, with the database it started):
    eval "$(tests/pg start $(mktemp -d /tmp/pg.XXXX))"
    QUEEN_SWEEPER_LIBRARY=build/libqueen_sweeper.so /usr/bin/python3 -m pytest -q tests/chaos

Needs QUEEN_TEST_ADMIN_CONNINFO, QUEEN_TEST_SWEEPER_CONNINFO, QUEEN_TEST_BROKER_CONNINFO
and QUEEN_TEST_PGDIR (the fast restart); it fails, never
skips, without them. The database is up again when the test ends, whatever happened.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import psycopg2  # noqa: E402 - a missing driver fails the run (tests/run installs it), never a skip

import queenkit
from queenkit import ROOT, decode_segment, now_ms, txn_hash  # noqa: F401

SEED = 20261129
BROKERS = 4
# QUEEN_CHAOS_TIMERS shortens the run (tests/run uses it for the sanitizer build's chaos).
N_TIMERS = int(os.environ.get("QUEEN_CHAOS_TIMERS", "100000"))
PARTITIONS = 200
BATCH = 256
TENANTS = ["00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-0000000000c2"]
QUEUE = "chaos-suite"
LEAD_MS = 4_000        # from the first schedule call to the start of the due window
WINDOW_MS = 20_000     # timers are due evenly across this window
LEASE_MS = 3_000       # the brokers' sweeper_lease_ms: a lost claim is back after this
DRAIN_WAIT_S = 150     # after the window, the most log_timers may take to empty
STALL_S = 45           # ... and the longest it may go without a single timer leaving it
APP = "queen-chaos-test"  # our own connections; pg_terminate_backend only hits queen-sweeper


# A fresh autocommit connection under our application_name, retried while the database restarts.
connect = functools.partial(queenkit.connect, attempts=60, retry_delay=0.5, application_name=APP)


def scalar(conninfo, sql, params=None):
    """One value, on a short-lived connection (survives a restart in between)."""
    conn = connect(conninfo)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0]
    finally:
        conn.close()


class Brokers:
    """The broker processes: start, SIGKILL, restart, graceful stop."""

    def __init__(self, workdir: Path, conninfo: str):
        self.workdir = workdir
        self.conninfo = conninfo
        self.procs: dict[int, subprocess.Popen] = {}
        self.incarnation = Counter()
        self.kills = 0
        self.lock = threading.Lock()

    def start(self, i: int) -> None:
        with self.lock:
            if i in self.procs and self.procs[i].poll() is None:
                return
            self.incarnation[i] += 1
            tag = f"broker-{i}-{self.incarnation[i]}"
            log = open(self.workdir / f"{tag}.log", "w")
            self.procs[i] = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "chaos" / "broker.py"), "--broker-id", f"chaos-{i}",
                 "--stats", str(self.workdir / f"{tag}.stats.json"), "--lease-ms", str(LEASE_MS),
                 "--conninfo", self.conninfo],
                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
            log.close()

    def kill9(self, i: int) -> bool:
        with self.lock:
            p = self.procs.get(i)
            if p is None or p.poll() is not None:
                return False
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.kills += 1
            return True

    def alive(self) -> list[int]:
        with self.lock:
            return sorted(i for i, p in self.procs.items() if p.poll() is None)

    def stop_all(self, timeout=15.0) -> dict[int, int]:
        with self.lock:
            procs = dict(self.procs)
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        deadline = time.monotonic() + timeout
        for i, p in procs.items():
            try:
                codes[i] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[i] = p.wait()
        return codes

    def final_stats(self) -> list[dict]:
        out = []
        for f in sorted(self.workdir.glob("broker-*.stats.json")):
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                pass
        return out

    def log_tails(self, lines=15) -> str:
        text = []
        for f in sorted(self.workdir.glob("broker-*.log")):
            body = f.read_text(errors="replace").splitlines()
            text.append(f"--- {f.name}\n" + "\n".join(body[-lines:]))
        return "\n".join(text)


def chaos_plan() -> list[tuple[int, str, list[int]]]:
    """(ms after the window opens, action, brokers), fixed by SEED."""
    rng = random.Random(SEED)
    plan = []
    t = 1500
    for _ in range(5):
        victims = sorted(rng.sample(range(BROKERS), rng.choice([1, 1, 2])))
        plan.append((t, "kill", victims))
        plan.append((t + rng.randint(800, 2500), "restart", victims))
        t += rng.randint(2500, 4000)
    plan += [(3500, "terminate", []), (10500, "terminate", []), (17500, "terminate", []),
             (13000, "pg_restart", [])]
    return sorted(plan)


def test_chaos_exactly_once(tmp_path, capsys):
    # Least privilege: the brokers' sweepers log in as a role holding queen_sweeper only,
    # the scheduler as one holding queen_broker only; the superuser applies the schema,
    # inspects, and terminates backends.
    conninfo = os.environ.get("QUEEN_TEST_ADMIN_CONNINFO")
    sweeper_conninfo = os.environ.get("QUEEN_TEST_SWEEPER_CONNINFO")
    broker_conninfo = os.environ.get("QUEEN_TEST_BROKER_CONNINFO")
    pgdir = os.environ.get("QUEEN_TEST_PGDIR")
    if not (conninfo and sweeper_conninfo and broker_conninfo and pgdir):
        pytest.fail("QUEEN_TEST_ADMIN_CONNINFO, QUEEN_TEST_SWEEPER_CONNINFO, "
                    "QUEEN_TEST_BROKER_CONNINFO and QUEEN_TEST_PGDIR must be set: "
                    "eval \"$(tests/pg start $(mktemp -d))\" (the chaos suite never skips)")

    # The schema (every file is idempotent), then a clean slate for the log and timers.
    ctl = connect(conninfo)
    with ctl.cursor() as cur:
        for f in sorted((ROOT / "sql").glob("*.sql")):
            cur.execute(f.read_text())
        cur.execute("TRUNCATE queen.log_timers, queen.log_segments, queen.log_txns, queen.log_txn_index, "
                    "queen.log_dlq, queen.log_partitions, queen.queues")
    ctl.close()

    brokers = Brokers(tmp_path, sweeper_conninfo)
    events: list[str] = []
    errors: list[str] = []
    deliver = [0] * N_TIMERS                 # timer i -> deliverAtMs as the server answered
    sched_done = threading.Event()
    t_first = now_ms()
    w0 = t_first + LEAD_MS                   # the due window opens here

    def schedule():
        try:
            conn = psycopg2.connect(broker_conninfo, application_name=APP)
            with conn.cursor() as cur:
                for b, start in enumerate(range(0, N_TIMERS, BATCH)):
                    tenant = TENANTS[b % len(TENANTS)]
                    ops, now = [], now_ms()
                    for i in range(start, min(start + BATCH, N_TIMERS)):
                        due = w0 + i * WINDOW_MS // N_TIMERS
                        ops.append({"op": "schedule", "queue": QUEUE, "timerKey": f"k{i}",
                                    "partition": f"p{i % PARTITIONS}", "delayMs": max(0, due - now),
                                    "txn": f"chaos-{i}", "payload": ""})
                    cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, NULL, now())",
                                (json.dumps(ops), tenant))
                    results = cur.fetchone()[0]
                    conn.commit()
                    # No wake: this process has no sweeper, and a wake is local to its
                    # process. The brokers find the timers within their sleep ceiling.
                    for k, res in enumerate(results):
                        if res["status"] != "scheduled":
                            errors.append(f"timer {start + k}: {res['status']}")
                        deliver[start + k] = res["deliverAtMs"] or 0
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"scheduling failed: {e!r}")
        finally:
            sched_done.set()

    def chaos():
        conn = None
        try:
            for at, action, who in chaos_plan():
                delay = (w0 + at - now_ms()) / 1000
                if delay > 0:
                    time.sleep(delay)
                stamp = f"{(now_ms() - w0) / 1000:+6.1f}s"
                if action == "kill":
                    done = [i for i in who if brokers.kill9(i)]
                    events.append(f"{stamp} SIGKILL brokers {done}")
                elif action == "restart":
                    for i in who:
                        brokers.start(i)
                    events.append(f"{stamp} restart brokers {who}")
                elif action == "terminate":
                    conn = conn or connect(conninfo)
                    with conn.cursor() as cur:
                        cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                    "WHERE application_name = 'queen-sweeper'")
                        events.append(f"{stamp} pg_terminate_backend: {cur.fetchone()[0]} sweeper connections")
                elif action == "pg_restart":
                    # Our scheduler must not be writing while the server goes away.
                    sched_done.wait(120)
                    if conn is not None:
                        conn.close()
                        conn = None
                    t = time.monotonic()
                    subprocess.run([str(ROOT / "tests" / "pg"), "restart", pgdir], check=True)
                    events.append(f"{(now_ms() - w0) / 1000:+6.1f}s PostgreSQL fast restart "
                                  f"({time.monotonic() - t:.1f}s)")
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"chaos step failed: {e!r}")
        finally:
            if conn is not None:
                conn.close()

    try:
        for i in range(BROKERS):
            brokers.start(i)
        threads = [threading.Thread(target=schedule, name="schedule"),
                   threading.Thread(target=chaos, name="chaos")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_sched = now_ms()
        for i in range(BROKERS):          # whoever is still down comes back for the drain
            brokers.start(i)
        assert not errors, errors

        # Bounded wait for the table to drain; progress is kept for the report.
        # A stall (no timer leaves the table for STALL_S) fails early; a slow but moving
        # drain on a busy machine gets up to DRAIN_WAIT_S after the window.
        deadline = time.monotonic() + max(0, (w0 + WINDOW_MS - now_ms()) / 1000) + DRAIN_WAIT_S
        left, progress, last_note = None, [], 0.0
        best, best_at = None, time.monotonic()
        while time.monotonic() < deadline:
            try:
                left = scalar(conninfo, "SELECT count(*) FROM queen.log_timers WHERE queue = %s", (QUEUE,))
            except psycopg2.Error:
                left = None
            if left is not None and (best is None or left < best):
                best, best_at = left, time.monotonic()
            if time.monotonic() - last_note >= 10:
                last_note = time.monotonic()
                progress.append(f"{(now_ms() - w0) / 1000:+6.1f}s {left} timers left")
            if left == 0 or time.monotonic() - best_at > STALL_S:
                break
            time.sleep(0.5)
        drained_at = now_ms()
        codes = brokers.stop_all()
        if left != 0:
            stats = brokers.final_stats()
            with capsys.disabled():
                print(f"\nchaos: NOT DRAINED: {left} of {N_TIMERS} timers still in queen.log_timers "
                      f"{(now_ms() - w0 - WINDOW_MS) / 1000:.0f}s after the window closed "
                      f"(limits: {DRAIN_WAIT_S}s, or {STALL_S}s without progress)")
                for e in events + progress:
                    print(f"  {e}")
                for st in stats:
                    print(f"  {st.get('broker_id')}: state {st.get('state')} fired {st.get('fired_total')} "
                          f"fire txns {st.get('fire_txns_total')} lag {st.get('fire_lag_ms')} "
                          f"pressure {st.get('pressure')} stale {st.get('stale_total')}")
            pytest.fail(f"{left} timers still in queen.log_timers "
                        f"{(now_ms() - w0 - WINDOW_MS) / 1000:.0f}s after the window; "
                        f"fired per broker incarnation: {[s.get('fired_total') for s in stats]}")

        # Everything below is read from the log.
        conn = connect(conninfo)
        per_txn = Counter()
        wrong_place = []
        lateness = []
        segments = frames_total = 0
        with conn.cursor() as cur:
            for t_idx, tenant in enumerate(TENANTS):
                for p in range(PARTITIONS):
                    cur.execute("SELECT base_offset, end_offset, count, hashes, blob, "
                                "queen.epoch_ms_v1(created_at) FROM queen.log_read_v1(%s, %s, %s, 0, NULL)",
                                (tenant, QUEUE, f"p{p}"))
                    expect_base = 0
                    for base, end, count, hashes, blob, created in cur.fetchall():
                        segments += 1
                        frames = decode_segment(bytes(blob))
                        assert base == expect_base, f"{tenant}/p{p}: offset gap at {expect_base} -> {base}"
                        assert len(frames) == count == end - base + 1
                        assert bytes(hashes) == b"".join(txn_hash(fr.txn) for fr in frames), \
                            f"{tenant}/p{p}@{base}: log_txns.hashes do not match the frames"
                        expect_base = end + 1
                        for fr in frames:
                            frames_total += 1
                            per_txn[fr.txn] += 1
                            i = int(fr.txn.rsplit("-", 1)[1])
                            if i % PARTITIONS != p or (i // BATCH) % len(TENANTS) != t_idx:
                                wrong_place.append((fr.txn, tenant, p))
                            lateness.append(created - deliver[i])
            cur.execute("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (QUEUE,))
            dlq = cur.fetchone()[0]
            cur.execute("SELECT count(*) FROM queen.log_timers")
            timers_left = cur.fetchone()[0]
        conn.close()

        expected = {f"chaos-{i}" for i in range(N_TIMERS)}
        lost = sorted(expected - per_txn.keys())
        duplicated = sorted(t for t, c in per_txn.items() if c > 1)
        foreign = sorted(per_txn.keys() - expected)

        stats = brokers.final_stats()
        lateness.sort()

        def pct(q):
            return lateness[min(len(lateness) - 1, int(q * (len(lateness) - 1) + 0.5))] if lateness else 0

        with capsys.disabled():
            print(f"\nchaos: {N_TIMERS} timers, {PARTITIONS} partitions x {len(TENANTS)} tenants, "
                  f"{BROKERS} brokers (lease {LEASE_MS} ms), window {WINDOW_MS / 1000:.0f}s; seed {SEED}")
            for e in events + progress:
                print(f"  {e}")
            print(f"  scheduling took {(t_sched - t_first) / 1000:.1f}s (window opened at +{LEAD_MS / 1000:.0f}s); "
                  f"drained {(drained_at - w0 - WINDOW_MS) / 1000:+.1f}s after the window closed")
            print(f"  broker incarnations {sum(brokers.incarnation.values())}, SIGKILLs {brokers.kills}, "
                  f"graceful exit codes {codes}")
            print(f"  fired_total (sum of last stats per incarnation) {sum(s.get('fired_total', 0) for s in stats)}, "
                  f"stale {sum(s.get('stale_total', 0) for s in stats)}, "
                  f"duplicate {sum(s.get('duplicate_total', 0) for s in stats)}, "
                  f"released on stop {sum(s.get('released_on_stop_total', 0) for s in stats)}")
            print(f"  log: {segments} segments, {frames_total} messages, {len(per_txn)} distinct txns; "
                  f"lost {len(lost)}, duplicated {len(duplicated)}, foreign {len(foreign)}, "
                  f"misplaced {len(wrong_place)}, dlq {dlq}, log_timers left {timers_left}")
            print(f"  lateness (segment created_at - deliverAt): p50 {pct(0.5)} ms, p99 {pct(0.99)} ms, "
                  f"worst {lateness[-1] if lateness else 0} ms; lease {LEASE_MS} ms "
                  f"(worst = {(lateness[-1] if lateness else 0) / LEASE_MS:.1f} leases)")

        assert not lost, f"{len(lost)} timers lost, e.g. {lost[:10]}"
        assert not duplicated, f"{len(duplicated)} txns in the log more than once, e.g. {duplicated[:10]}"
        assert not foreign, f"unexpected txns in the queue: {foreign[:10]}"
        assert not wrong_place, f"messages in the wrong tenant/partition: {wrong_place[:10]}"
        assert frames_total == N_TIMERS
        assert dlq == 0, f"{dlq} timers dead-lettered"
        assert timers_left == 0
    except BaseException:
        # What the brokers said last (their sweepers log warnings and errors), so a failure
        # in a run nobody watched can be read from its output.
        with capsys.disabled():
            print("\nchaos: FAILED; the end of each broker incarnation's log:\n" + brokers.log_tails(25))
        raise
    finally:
        brokers.stop_all(timeout=5)
        # Leave the database up for the suites that follow, whatever happened here.
        try:
            scalar(conninfo, "SELECT 1")
        except psycopg2.Error:
            subprocess.run([str(ROOT / "tests" / "pg"), "resume", pgdir], check=False)
            scalar(conninfo, "SELECT 1")
