"""Helpers and fixtures of the fire's integration tests (re-exported by conftest.py).

These tests drive libqueen_sweeper.so (through the Python binding) against a real,
throwaway PostgreSQL: timers are scheduled with queen.log_timers_apply_v1, sweepers run
in-process (each has its own loop thread and connections), and what was delivered is
read back from the log (queen.log_read_v1, log_segments, log_txn_index) and decoded
with queen_sweeper.decode_segment.

Run (the python with pytest and psycopg2 is Debian's /usr/bin/python3):

    eval "$(tests/pg start $(mktemp -d /tmp/pgfire.XXXX))"
    QUEEN_SWEEPER_LIBRARY=<build>/libqueen_sweeper.so PYTHONPATH=bindings/python \
        /usr/bin/python3 -m pytest -q tests/integration_py

Roles (tests/pg start creates them and exports their conninfos): the sweepers under test
log in as a role holding queen_sweeper only (QUEEN_TEST_SWEEPER_CONNINFO), scheduling goes
through a role holding queen_broker only (QUEEN_TEST_BROKER_CONNINFO), and setup and
inspection (direct table reads, switches, triggers, locks) use the superuser
(QUEEN_TEST_ADMIN_CONNINFO). The schema fixture applies the schema through a sweeper with
apply_schema=true as the superuser: that is the apply under test.

Without those variables every test FAILS with a message saying so: nothing here is ever
skipped.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_BINDINGS = _ROOT / "bindings" / "python"
if str(_BINDINGS) not in sys.path:
    sys.path.insert(0, str(_BINDINGS))

import psycopg2  # noqa: E402
import psycopg2.extensions  # noqa: E402

from queen_sweeper import Sweeper, decode_segment, txn_hash  # noqa: E402,F401

TENANT_A = "00000000-0000-0000-0000-000000000001"
TENANT_B = "00000000-0000-0000-0000-000000000002"

# Everything the queen schema owns that a test can fill; emptied before every test.
QUEEN_TABLES = [
    "queen.queues", "queen.log_partitions", "queen.log_segments", "queen.log_txns",
    "queen.log_txn_index", "queen.log_dlq", "queen.system_state", "queen.log_timers",
    "queen.kv", "queen.kv_quota", "queen.kv_usage", "queen.kv_usage_gate",
]

# Triggers the tests install are all named with this prefix and dropped between tests.
TEST_TRIGGER_PREFIX = "fire_test_"


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------

def wait_for(predicate, timeout=15.0, interval=0.02, what="condition"):
    """Poll predicate until it returns something truthy; fail with `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def op_schedule(queue, key, payload: bytes, *, partition="p0", delay_ms=0, txn=None):
    return {"op": "schedule", "queue": queue, "timerKey": key, "partition": partition,
            "delayMs": int(delay_ms), "txn": txn if txn is not None else f"txn-{key}",
            "payload": b64(payload)}


def op_reschedule(queue, key, delay_ms, **extra):
    op = {"op": "reschedule", "queue": queue, "timerKey": key, "delayMs": int(delay_ms)}
    op.update(extra)
    return op


def op_cancel(queue, key):
    return {"op": "cancel", "queue": queue, "timerKey": key}


def connect(conninfo, autocommit=True):
    conn = psycopg2.connect(conninfo)
    conn.autocommit = autocommit
    return conn


class Queen:
    """The SQL surface the tests use, over one autocommit connection (the superuser), with
    scheduling sent through `broker` (the broker role) when one is given."""

    def __init__(self, conn, broker=None):
        self.conn = conn
        self.broker = broker if broker is not None else conn

    def q(self, sql, args=None):
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            if cur.description is None:
                return []
            return cur.fetchall()

    def one(self, sql, args=None):
        rows = self.q(sql, args)
        assert len(rows) == 1, rows
        return rows[0][0] if len(rows[0]) == 1 else rows[0]

    def apply(self, ops, tenant=TENANT_A):
        """log_timers_apply_v1 in calls of at most 256 ops; the index-aligned results."""
        out = []
        for i in range(0, len(ops), 256):
            chunk = ops[i:i + 256]
            with self.broker.cursor() as cur:
                cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())",
                            (json.dumps(chunk), tenant))
                res = cur.fetchone()[0]
            assert len(res) == len(chunk), res
            out.extend(res)
        return out

    def schedule(self, ops, tenant=TENANT_A):
        res = self.apply(ops, tenant)
        bad = [r for r in res if r.get("status") != "scheduled"]
        assert not bad, f"schedule refused: {bad[:5]}"
        return res

    def timers_left(self):
        return self.one("SELECT count(*) FROM queen.log_timers")

    def log_rows(self, tenant=None, queue=None):
        """Every segment: (tenant, queue, partition, base, end, count, created_at, blob, hashes)."""
        sql = ("SELECT q.tenant_id::text, q.name, p.name, s.base_offset, s.end_offset, s.count,"
               "       s.created_at, s.blob, t.hashes"
               "  FROM queen.log_segments s"
               "  JOIN queen.log_partitions p ON p.id = s.partition_id"
               "  JOIN queen.queues q ON q.id = p.queue_id"
               "  LEFT JOIN queen.log_txns t"
               "         ON t.partition_id = s.partition_id AND t.base_offset = s.base_offset"
               " WHERE (%s::uuid IS NULL OR q.tenant_id = %s::uuid)"
               "   AND (%s::text IS NULL OR q.name = %s)"
               " ORDER BY q.tenant_id, q.name, p.name, s.base_offset")
        return [(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), r[6], bytes(r[7]),
                 bytes(r[8]) if r[8] is not None else None)
                for r in self.q(sql, (tenant, tenant, queue, queue))]

    def read_partition(self, tenant, queue, partition, from_offset=0, max_segments=None):
        """queen.log_read_v1: (base, end, count, hashes, blob, created_at) ascending."""
        rows = self.q("SELECT base_offset, end_offset, count, hashes, blob, created_at"
                      "  FROM queen.log_read_v1(%s::uuid, %s, %s, %s, %s)",
                      (tenant, queue, partition, from_offset, max_segments))
        return [(int(b), int(e), int(c), bytes(h) if h is not None else None, bytes(bl), ca)
                for b, e, c, h, bl, ca in rows]

    def delivered(self, tenant=None, queue=None):
        """Every delivered frame, in log order per partition:
        list of (tenant, queue, partition, offset, Frame)."""
        out = []
        for ten, qn, part, base, end, count, _ca, blob, _h in self.log_rows(tenant, queue):
            frames = decode_segment(blob)
            assert len(frames) == count, (ten, qn, part, base, count, len(frames))
            for k, f in enumerate(frames):
                out.append((ten, qn, part, base + k, f))
        return out

    def set_switch(self, key, value):
        if value is None:
            self.q("DELETE FROM queen.system_state WHERE key = %s", (key,))
        else:
            self.q("INSERT INTO queen.system_state (key, value) VALUES (%s, %s::jsonb)"
                   " ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()",
                   (key, json.dumps(value)))

    def provision(self, tenant, queue, partition):
        """Create the queue and partition (as a push would); the partition id."""
        return int(self.one("SELECT partition_id FROM queen.log_provision_v1(%s::uuid, %s, %s)",
                            (tenant, queue, partition)))

    def peek(self, queue, key, tenant=TENANT_A):
        return self.one("SELECT queen.log_timers_peek_v1(%s::uuid, %s, %s)", (tenant, queue, key))


class PartitionLock:
    """Holds log_partitions rows FOR UPDATE in an open transaction on its own connection:
    every fire into those partitions waits until release()."""

    def __init__(self, conninfo, partition_ids):
        self.conn = connect(conninfo, autocommit=False)
        with self.conn.cursor() as cur:
            cur.execute("SELECT id FROM queen.log_partitions WHERE id = ANY(%s::bigint[])"
                        " ORDER BY id FOR UPDATE", (list(partition_ids),))
            got = cur.fetchall()
        assert len(got) == len(set(partition_ids)), (got, partition_ids)
        self.held = True

    def release(self):
        if self.held:
            self.conn.rollback()
            self.held = False

    def close(self):
        self.release()
        self.conn.close()


def pg_waiting_on_locks(q: Queen):
    """Backends of this database currently waiting on a lock."""
    return q.one("SELECT count(*) FROM pg_stat_activity"
                 " WHERE datname = current_database() AND wait_event_type = 'Lock'")


# ---------------------------------------------------------------------------------------
# Sweepers
# ---------------------------------------------------------------------------------------

class Handle:
    """A Sweeper plus what it told us (log lines, fired callbacks)."""

    def __init__(self, sweeper: Sweeper, name: str):
        self.sw = sweeper
        self.name = name
        self.logs: list[tuple[float, int, str]] = []
        self._lock = threading.Lock()

    def on_log(self, level, message):
        with self._lock:
            self.logs.append((time.time(), level, message))

    def log_text(self, last=40):
        with self._lock:
            lines = self.logs[-last:]
        return "\n".join(f"  [{self.name} L{lvl}] {msg}" for _t, lvl, msg in lines)

    def stats(self):
        return self.sw.stats()

    def __getattr__(self, item):
        return getattr(self.sw, item)


def assert_clean_stop(h: Handle, timeout_ms=15000):
    """Every test that starts a sweeper ends here: a graceful stop, the loop closed with
    rc 0 and every handle gone; then the handle is destroyed."""
    h.sw.stop(timeout_ms=timeout_ms)
    st = h.sw.stats()
    assert st["state"] == "stopped", (h.name, st["state"])
    assert st["teardown_clean"] is True, (h.name, st["teardown_clean"], st["loop_close_rc"])
    assert st["loop_close_rc"] == 0, (h.name, st["loop_close_rc"])
    h.sw.close()
    assert h.sw.closed
    return st


def _env_conninfo(var):
    value = os.environ.get(var)
    if not value:
        pytest.fail(f"{var} is not set: start a throwaway database with "
                    "`eval \"$(tests/pg start $(mktemp -d /tmp/pgfire.XXXX))\"` "
                    "(these integration tests need PostgreSQL and never skip)", pytrace=False)
    return value


@pytest.fixture(scope="session")
def conninfo():
    """The superuser: the schema apply under test, setup and inspection."""
    return _env_conninfo("QUEEN_TEST_ADMIN_CONNINFO")


@pytest.fixture(scope="session")
def sweeper_conninfo():
    """A LOGIN role holding queen_sweeper only: what the sweepers under test log in as."""
    return _env_conninfo("QUEEN_TEST_SWEEPER_CONNINFO")


@pytest.fixture(scope="session")
def broker_conninfo():
    """A LOGIN role holding queen_broker only: scheduling."""
    return _env_conninfo("QUEEN_TEST_BROKER_CONNINFO")


def _config(conninfo, broker_id, knobs):
    cfg = {
        "conninfo": conninfo,
        "apply_schema": True,
        "read_env": False,
        "broker_id": broker_id,
        "sweeper_min_sleep_ms": 5,
        "sweeper_max_sleep_ms": 200,
        "log_level": "info",
    }
    cfg.update(knobs)
    return cfg


@pytest.fixture(scope="session")
def schema(conninfo):
    """Apply the schema once, the way a broker does: a sweeper with apply_schema=True,
    started until the functions exist, then stopped cleanly."""
    try:
        probe = connect(conninfo)
    except psycopg2.Error as e:  # pragma: no cover - environment problem
        pytest.fail(f"cannot connect with QUEEN_TEST_CONNINFO ({conninfo}): {e}", pytrace=False)
    h = Handle(Sweeper(**_config(conninfo, "schema-apply", {})), "schema")
    h.sw.on_log(h.on_log)
    h.sw.start()
    try:
        def ready():
            with probe.cursor() as cur:
                cur.execute("SELECT to_regproc('queen.log_timers_fire_v2') IS NOT NULL"
                            "   AND to_regproc('queen.log_read_v1') IS NOT NULL"
                            "   AND to_regproc('queen.log_push_v1') IS NOT NULL")
                return cur.fetchone()[0]
        try:
            wait_for(ready, 60, 0.05, "the queen schema applied by a sweeper (apply_schema)")
        except AssertionError:
            pytest.fail("schema apply did not complete:\n" + h.log_text(), pytrace=False)
        wait_for(lambda: h.stats()["cycles_total"] >= 1, 30, 0.02, "the first cycle")
    finally:
        assert_clean_stop(h)
        probe.close()
    return True


@pytest.fixture
def connections(conninfo, schema):
    """A factory of extra connections, all closed at teardown."""
    opened = []

    def make(autocommit=True):
        c = connect(conninfo, autocommit)
        opened.append(c)
        return c

    yield make
    for c in opened:
        try:
            c.close()
        except Exception:
            pass


def _reset(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT tgname, tgrelid::regclass::text FROM pg_trigger"
                    " WHERE tgname LIKE %s AND NOT tgisinternal", (TEST_TRIGGER_PREFIX + "%",))
        for name, rel in cur.fetchall():
            cur.execute(f'DROP TRIGGER IF EXISTS "{name}" ON {rel}')
        cur.execute("TRUNCATE %s RESTART IDENTITY CASCADE" % ", ".join(QUEEN_TABLES))


@pytest.fixture
def q(connections, broker_conninfo):
    """A Queen over a fresh autocommit connection (superuser) that schedules through the
    broker role, with every queen table emptied."""
    conn = connections()
    broker = connect(broker_conninfo)
    _reset(conn)
    yield Queen(conn, broker)
    broker.close()
    # Leave no trigger behind for the next test (or the next suite on this database).
    try:
        _reset(conn)
    except psycopg2.Error:
        pass


@pytest.fixture
def sweepers(sweeper_conninfo, schema):
    """make(broker_id, **knobs) -> Handle (created, log callback set, NOT started), logged
    in as the queen_sweeper role (a `conninfo` knob overrides it). apply_schema is off by
    default here: the schema fixture applied it, and the sweeper role may not run DDL.
    Whatever a test leaves running is stopped and closed at teardown."""
    made: list[Handle] = []

    def make(broker_id, *, fired=None, **knobs):
        knobs = {"apply_schema": False, **knobs}
        h = Handle(Sweeper(**_config(sweeper_conninfo, broker_id, knobs)), broker_id)
        h.sw.on_log(h.on_log)
        if fired is not None:
            h.sw.on_fired(fired)
        made.append(h)
        return h

    yield make
    for h in made:
        try:
            h.sw.close()
        except Exception:
            pass


class FiredLog:
    """An on_fired callback that records (wall time, tenant, queue, partition, count, base)."""

    def __init__(self, check=None):
        self.calls = []
        self.cond = threading.Condition()
        self.check = check

    def __call__(self, tenant, queue, partition, count, base_offset):
        extra = self.check(tenant, queue, partition, count, base_offset) if self.check else None
        with self.cond:
            self.calls.append((time.time(), tenant, queue, partition, count, base_offset, extra))
            self.cond.notify_all()

    def total(self):
        with self.cond:
            return sum(c[4] for c in self.calls)

    def snapshot(self):
        with self.cond:
            return list(self.calls)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
