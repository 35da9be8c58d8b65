"""Helpers of the failover suite: private PostgreSQL clusters and pairs (tests/pg,
tests/pgpair), sweepers through the Python binding, and reading what was delivered.

The tests here start their own databases (a pair with a synchronous standby, a single
cluster whose settings they change with ALTER SYSTEM), never the suite's shared one,
except the dead-first-host test, which only needs some server behind a closed port.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "bindings" / "python", ROOT / "tests" / "integration_py"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import psycopg2  # noqa: E402

from firekit import (TENANT_A, FiredLog, Handle, PartitionLock, Queen,  # noqa: E402,F401
                     assert_clean_stop, decode_segment, op_schedule, wait_for)
from queen_sweeper import Sweeper  # noqa: E402


def sh(*args, env=None):
    """Run one of the repository's scripts; its `export` lines as a dict."""
    out = subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, env=env).stdout
    found = {}
    for m in re.finditer(r"(\w+)=('([^']*)'|(\S+))", out):
        found[m.group(1)] = m.group(3) if m.group(3) is not None else m.group(4)
    return found


def closed_port():
    """A loopback port nobody listens on (bound once, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def as_user(conninfo, user):
    """The same conninfo logged in as another role."""
    out, n = re.subn(r"\buser=\S+", f"user={user}", conninfo)
    return out if n else f"{conninfo} user={user}"


def connect(conninfo, autocommit=True):
    conn = psycopg2.connect(conninfo)
    conn.autocommit = autocommit
    return conn


def make_sweeper(conninfo, broker_id, fired=None, **knobs):
    cfg = {"conninfo": conninfo, "apply_schema": True, "read_env": False, "broker_id": broker_id,
           "sweeper_min_sleep_ms": 5, "sweeper_max_sleep_ms": 200, "log_level": "info"}
    cfg.update(knobs)
    h = Handle(Sweeper(**cfg), broker_id)
    h.sw.on_log(h.on_log)
    if fired is not None:
        h.sw.on_fired(fired)
    return h


def wait_schema(q: Queen, timeout=60):
    wait_for(lambda: q.one("SELECT to_regproc('queen.log_timers_fire_v2') IS NOT NULL"
                           " AND to_regproc('queen.log_read_v1') IS NOT NULL"), timeout, 0.05,
             "the queen schema applied by a sweeper")


def delivered_once(q: Queen, queue, expected_txns):
    """Decode the queue's log: assert every expected txn is there exactly once; the count."""
    seen = Counter()
    for _t, _q, _p, _b, _e, count, _ca, blob, _h in q.log_rows(queue=queue):
        frames = decode_segment(blob)
        assert len(frames) == count
        for f in frames:
            seen[f.txn] += 1
    dupes = [t for t, n in seen.items() if n != 1]
    missing = set(expected_txns) - set(seen)
    extra = set(seen) - set(expected_txns)
    assert not dupes, f"{len(dupes)} delivered more than once, e.g. {dupes[:5]}"
    assert not missing, f"{len(missing)} never delivered, e.g. {sorted(missing)[:5]}"
    assert not extra, f"{len(extra)} unexpected, e.g. {sorted(extra)[:5]}"
    return sum(seen.values())


def backend_of(q: Queen, like, wait_event_type=None, wait_event=None):
    """pids of client backends whose query text matches `like` (and wait event, if given)."""
    rows = q.q("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
               " AND pid <> pg_backend_pid() AND query LIKE %s"
               " AND (%s::text IS NULL OR wait_event_type = %s)"
               " AND (%s::text IS NULL OR wait_event = %s)",
               (like, wait_event_type, wait_event_type, wait_event, wait_event))
    return [r[0] for r in rows]


def env_for_scripts():
    env = dict(os.environ)
    env.setdefault("PATH", "/usr/bin:/bin")
    return env


def now_ms():
    return int(time.time() * 1000)
