"""Helpers of the Patroni suite: a scheduler thread (the broker role), sweeper processes
(the sweeper role), the poll that dates "the new primary accepts writes", and reading back
what the new primary's log holds."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg2

import queenkit
from queenkit import APPLY_SQL, ROOT, TENANT_A, connect, decode_segment, op_schedule  # noqa: F401

HERE = Path(__file__).resolve().parent

# The kit's wait_for, a database error (a server going away mid-failover) counting as "not yet".
wait_for = functools.partial(queenkit.wait_for, ignore=(psycopg2.Error,))


class Scheduler(threading.Thread):
    """Schedules BATCH timers every EVERY seconds, each due DELAY_MS after its commit, through
    the multi-host conninfo as the broker role, until stopped. Every call's fate is kept:
    acknowledged (the keys and their deliverAtMs), or in doubt (sent on a connection that
    broke before the answer: committed entirely or not at all, the log says which). A call
    that could not be sent (no writable server) is simply not made; the next one tries again."""

    def __init__(self, conninfo, queue, batch=20, every=0.1, delay_ms=400, partitions=16):
        super().__init__(daemon=True)
        self.conninfo = conninfo + " connect_timeout=2 options='-c statement_timeout=5000'"
        self.queue, self.batch, self.every, self.delay_ms, self.partitions = queue, batch, every, delay_ms, partitions
        self.acked: dict[str, int] = {}      # key -> deliverAtMs
        self.in_doubt: list[list[str]] = []  # batches whose answer was lost
        self.errors: list[str] = []
        self.seq = 0
        self.failure = None
        self._stop_ev = threading.Event()
        self.lock = threading.Lock()

    def stop(self):
        self._stop_ev.set()
        self.join(30)

    def run(self):
        conn = None
        next_at = time.monotonic()
        while not self._stop_ev.is_set():
            if conn is None:
                try:
                    conn = connect(self.conninfo)
                except psycopg2.Error as e:
                    self.errors.append(str(e).strip().splitlines()[0])
                    self._stop_ev.wait(0.05)
                    continue
            keys = [f"k{self.seq + i:07d}" for i in range(self.batch)]
            ops = [op_schedule(self.queue, k, k.encode(), partition=f"p{(self.seq + i) % self.partitions:02d}",
                               delay_ms=self.delay_ms, txn=k) for i, k in enumerate(keys)]
            try:
                with conn.cursor() as cur:
                    cur.execute(APPLY_SQL, (json.dumps(ops), TENANT_A))
                    res = cur.fetchone()[0]
            except psycopg2.Error as e:
                self.errors.append(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
                with self.lock:
                    self.in_doubt.append(keys)
                self.seq += self.batch
                try:
                    conn.close()
                except psycopg2.Error:
                    pass
                conn = None
                continue
            bad = [r for r in res if r.get("status") != "scheduled"]
            if bad:  # a refusal is a test failure, reported by the test (not lost in this thread)
                self.failure = f"schedule refused: {bad[:3]}"
                break
            with self.lock:
                for k, r in zip(keys, res):
                    self.acked[k] = int(r["deliverAtMs"])
            self.seq += self.batch
            next_at += self.every
            self._stop_ev.wait(max(0.0, next_at - time.monotonic()))
        if conn is not None:
            conn.close()


class SweeperProc:
    """One sweeper_proc.py: stats, fired calls and log lines read back from its files."""

    def __init__(self, workdir, broker_id, conninfo, knobs=None, way=""):
        self.broker_id, self.way = broker_id, way
        self.prefix = str(Path(workdir) / broker_id)
        args = [sys.executable, str(HERE / "sweeper_proc.py"), "--broker-id", broker_id, "--conninfo", conninfo,
                "--out", self.prefix]
        for k, v in (knobs or {}).items():
            args += ["--knob", f"{k}={v}"]
        self.stderr = open(self.prefix + ".stderr", "w")
        self.p = subprocess.Popen(args, stdout=self.stderr, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stats(self):
        try:
            return json.loads(Path(self.prefix + ".stats.json").read_text())
        except (OSError, ValueError):
            return None

    def fired(self):
        """[(unix s, tenant, queue, partition, count, base_offset)]"""
        try:
            text = Path(self.prefix + ".fired.jsonl").read_text()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(tuple(json.loads(line)))
            except ValueError:
                pass  # a line being written
        return out

    def announced(self, queue):
        return sum(c[4] for c in self.fired() if c[2] == queue)

    def log_text(self, last=30):
        try:
            lines = Path(self.prefix + ".log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  [{self.broker_id}] {l}" for l in lines[-last:])

    def log_count(self, needle):
        try:
            return Path(self.prefix + ".log").read_text(errors="replace").count(needle)
        except OSError:
            return 0

    def log_contains(self, needle):
        try:
            return needle in Path(self.prefix + ".log").read_text(errors="replace")
        except OSError:
            return False

    def stop(self, timeout=30):
        """SIGTERM: a graceful stop; the final stats (None if it did not stop cleanly)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
        self.stderr.close()
        return self.stats() if self.p.returncode == 0 else None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        if not self.stderr.closed:
            self.stderr.close()


class WritablePoll(threading.Thread):
    """Dates the moment a node other than the old primary accepts writes: every 20 ms a
    fresh connection to each candidate, pg_is_in_recovery() false, and an UPDATE that commits
    (synchronous_commit as the server has it, so a commit that waits for an absent synchronous
    standby does not count). `at` is the unix time the first such commit returned."""

    def __init__(self, candidates, timeout=120.0):
        super().__init__(daemon=True)
        self.candidates, self.timeout = candidates, timeout
        self.at = None
        self.node = None
        self.done = threading.Event()

    def _try(self, node):
        c = psycopg2.connect(node.conninfo(connect_timeout=1, options="'-c statement_timeout=1000'"))
        try:
            c.autocommit = True
            with c.cursor() as cur:
                cur.execute("SELECT pg_is_in_recovery()")
                if cur.fetchone()[0]:
                    return False
                cur.execute("UPDATE public.ha_write_probe SET at = now() WHERE id = 1")
                return True
        finally:
            c.close()

    def run(self):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and not self.done.is_set():
            for n in self.candidates:
                try:
                    if self._try(n):
                        self.at, self.node = time.time(), n
                        self.done.set()
                        return
                except psycopg2.Error:
                    pass
            time.sleep(0.02)
        self.done.set()

    def wait(self):
        self.done.wait(self.timeout + 5)
        return self.at


class LogView:
    """What the new primary's log holds for one queue: every frame's txn (= the timer key here)
    with the fire time (the segment's created_at, the sweeper's clock at the fire call), every
    segment as (partition, base_offset, count)."""

    def __init__(self, conn, queue):
        rows = None
        with conn.cursor() as cur:
            cur.execute("SELECT p.name, s.base_offset, s.count, s.blob,"
                        "       extract(epoch FROM s.created_at)::float8"
                        "  FROM queen.log_segments s"
                        "  JOIN queen.log_partitions p ON p.id = s.partition_id"
                        "  JOIN queen.queues q ON q.id = p.queue_id"
                        " WHERE q.name = %s AND q.tenant_id = %s::uuid", (queue, TENANT_A))
            rows = cur.fetchall()
            cur.execute("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (queue,))
            self.dlq = cur.fetchone()[0]
            cur.execute("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,))
            self.pending = cur.fetchone()[0]
        self.count = Counter()
        self.fired_at: dict[str, float] = {}
        self.segments = Counter()
        for part, base, count, blob, created in rows:
            frames = decode_segment(bytes(blob))
            assert len(frames) == count, (part, base, count, len(frames))
            self.segments[(part, int(base), int(count))] += 1
            for f in frames:
                self.count[f.txn] += 1
                self.fired_at[f.txn] = created


def pending_on(conninfo, queue):
    c = connect(conninfo + " connect_timeout=2")
    try:
        with c.cursor() as cur:
            cur.execute("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,))
            return cur.fetchone()[0]
    finally:
        c.close()
