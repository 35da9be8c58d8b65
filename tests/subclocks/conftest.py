"""Shared fixtures of the sub-clock integration tests (the sweeper's "second clock").

What is under test: below the timer fire, every cycle runs the usage rollup
(queen.kv_usage_step_v1) and the KV prune (queen.kv_expire_step_v1) on their own gates,
sheds them from the bottom under pressure, turns either off for good on a SQLSTATE class
42 error, and, on its own one-second timer with no database at all, runs the ephemeral
backstop of an in-RAM engine handed over with set_backstop.

Everything runs in-process through the Python binding against a real throwaway
PostgreSQL:

    eval "$(tests/pg start $(mktemp -d /tmp/pgsub.XXXX))"
    QUEEN_SWEEPER_LIBRARY=<build>/libqueen_sweeper.so \
    QUEEN_EPHEMERAL_LIBRARY=<build>/plugins/ephemeral/libqueen_ephemeral.so \
    PYTHONPATH=bindings/python /usr/bin/python3 -m pytest -q tests/subclocks

Without QUEEN_TEST_CONNINFO every test FAILS with a message saying so (nothing here is
ever skipped). Other suites share the database, one after the other: the schema is applied
from sql/*.sql at the start, the queen tables are emptied around every test, and whatever
a test breaks on purpose (a dropped function, a role) is put back by the fixtures.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SQL_DIR = ROOT / "sql"
PG_SCRIPT = ROOT / "tests" / "pg"
_BINDINGS = ROOT / "bindings" / "python"
if str(_BINDINGS) not in sys.path:
    sys.path.insert(0, str(_BINDINGS))

import psycopg2  # noqa: E402

from queen_sweeper import Sweeper  # noqa: E402

TENANT_A = "00000000-0000-0000-0000-000000000001"
TENANT_B = "00000000-0000-0000-0000-0000000000b2"

# Everything the queen schema owns that a test can fill; emptied around every test.
QUEEN_TABLES = [
    "queen.queues", "queen.log_partitions", "queen.log_segments", "queen.log_txns",
    "queen.log_txn_index", "queen.log_dlq", "queen.system_state", "queen.log_timers",
    "queen.kv", "queen.kv_quota", "queen.kv_usage", "queen.kv_usage_gate",
]

# The functions of 005 that the class-42 tests drop or revoke (and the fixtures restore):
# the prune and the rollup the sweeper calls (kv_usage_step_v2 since schema version 10),
# then the rollup's pass that v2 runs (v1).
MAINTENANCE_FUNCTIONS = ("queen.kv_expire_step_v1(int2[], timestamptz, int)",
                         "queen.kv_usage_step_v2(int2[], timestamptz, int, int)",
                         "queen.kv_usage_step_v1(int2[], timestamptz, int)")


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------

def wait_for(predicate, timeout=15.0, interval=0.02, what="condition"):
    """Poll predicate until it returns something truthy; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(conninfo, autocommit=True):
    conn = psycopg2.connect(conninfo)
    conn.autocommit = autocommit
    return conn


def apply_sql_files(conn, names=None):
    """Apply sql/*.sql (or just `names`) in numeric order; the files are idempotent. After a
    partial apply the roles and version files run too: a function a test dropped comes back
    owned by whoever applied it and executable by PUBLIC until 006 puts its owner and
    grants back, and the sweepers here log in as the queen_sweeper role."""
    files = sorted(SQL_DIR.glob("*.sql"))
    if names is not None:
        files = [f for f in files if f.name in names or f.name >= "006"]
    assert files, f"no sql files found under {SQL_DIR}"
    with conn.cursor() as cur:
        for f in files:
            cur.execute(f.read_text())


def op_schedule(queue, key, payload: bytes, *, partition="p0", delay_ms=0, txn=None):
    return {"op": "schedule", "queue": queue, "timerKey": key, "partition": partition,
            "delayMs": int(delay_ms), "txn": txn if txn is not None else f"txn-{key}",
            "payload": base64.b64encode(payload).decode("ascii")}


class Queen:
    """The SQL surface the tests use, over one autocommit connection."""

    def __init__(self, conn, conninfo, broker=None):
        self.conn = conn
        self.conninfo = conninfo
        # Scheduling and KV calls go through the broker's role when the fixture gives one;
        # setup and inspection (direct table reads and writes) use `conn`, the superuser.
        self.broker = broker if broker is not None else conn

    def _broker_one(self, sql, args=None):
        with self.broker.cursor() as cur:
            cur.execute(sql, args)
            rows = cur.fetchall()
        assert len(rows) == 1, rows
        return rows[0][0]

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

    # -- timers ----------------------------------------------------------------------

    def schedule(self, ops, tenant=TENANT_A):
        """log_timers_apply_v1 in calls of at most 256 ops; every op must be scheduled."""
        for i in range(0, len(ops), 256):
            chunk = ops[i:i + 256]
            res = self._broker_one("SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())",
                                   (json.dumps(chunk), tenant))
            bad = [r for r in res if r.get("status") != "scheduled"]
            assert not bad, f"schedule refused: {bad[:5]}"

    def timers_left(self):
        return self.one("SELECT count(*) FROM queen.log_timers")

    def segments(self, queue):
        """(base_offset, count, blob) of every segment of `queue`, in log order."""
        return [(int(b), int(c), bytes(bl)) for b, c, bl in self.q(
            "SELECT s.base_offset, s.count, s.blob FROM queen.log_segments s"
            "  JOIN queen.log_partitions p ON p.id = s.partition_id"
            "  JOIN queen.queues qu ON qu.id = p.queue_id"
            " WHERE qu.name = %s ORDER BY p.name, s.base_offset", (queue,))]

    # -- kv --------------------------------------------------------------------------

    def kv_insert(self, namespace, n, *, expires_sql, tenant=TENANT_A, prefix="k"):
        """n rows inserted directly, expires_at given as an SQL expression."""
        self.q("INSERT INTO queen.kv (tenant_id, namespace, key, value, expires_at)"
               f" SELECT %s::uuid, %s, %s || g, jsonb_build_object('n', g), {expires_sql}"
               "   FROM generate_series(1, %s) g", (tenant, namespace, prefix, n))

    def kv_count(self, namespace=None, *, expired=None):
        """Rows present (namespace optional); expired=True/False filters on kv_live_v1."""
        cond = ""
        if expired is True:
            cond = " AND NOT queen.kv_live_v1(expires_at, now())"
        elif expired is False:
            cond = " AND queen.kv_live_v1(expires_at, now())"
        return self.one("SELECT count(*) FROM queen.kv WHERE (%s::text IS NULL OR namespace = %s)"
                        + cond, (namespace, namespace))

    def kv_get(self, namespace, key, tenant=TENANT_A):
        return self._broker_one("SELECT queen.kv_get_v1(%s::uuid, %s, %s, now())",
                                (tenant, namespace, key))

    def kv_put(self, namespace, key, value, *, ttl_ms=None, forever=None, tenant=TENANT_A):
        return self._broker_one("SELECT queen.kv_put_v1(%s::uuid, %s, %s, %s::jsonb, %s, %s, now())",
                                (tenant, namespace, key, json.dumps(value), ttl_ms, forever))

    def functions_present(self):
        return [self.one("SELECT to_regprocedure(%s) IS NOT NULL", (f,))
                for f in MAINTENANCE_FUNCTIONS]


def reset_tables(conn):
    with conn.cursor() as cur:
        cur.execute("TRUNCATE %s RESTART IDENTITY CASCADE" % ", ".join(QUEEN_TABLES))


def restore_maintenance(conn):
    """Put 005_kv_maintenance.sql back if a test dropped anything from it."""
    with conn.cursor() as cur:
        cur.execute("SELECT bool_and(to_regprocedure(f) IS NOT NULL) FROM unnest(%s::text[]) f",
                    (list(MAINTENANCE_FUNCTIONS),))
        complete = cur.fetchone()[0]
    if not complete:
        apply_sql_files(conn, {"005_kv_maintenance.sql"})


# ---------------------------------------------------------------------------------------
# Sweepers
# ---------------------------------------------------------------------------------------

class Handle:
    """A Sweeper plus what it told us through its log callback."""

    def __init__(self, sweeper: Sweeper, name: str):
        self.sw = sweeper
        self.name = name
        self.logs: list[tuple[float, int, str]] = []
        self._lock = threading.Lock()

    def on_log(self, level, message):
        with self._lock:
            self.logs.append((time.monotonic(), level, message))

    def messages(self, containing=None, level=None):
        with self._lock:
            lines = list(self.logs)
        return [m for _t, lvl, m in lines
                if (containing is None or containing in m) and (level is None or lvl == level)]

    def log_text(self, last=60):
        with self._lock:
            lines = self.logs[-last:]
        return "\n".join(f"  [{self.name} L{lvl}] {msg}" for _t, lvl, msg in lines)

    def stats(self):
        return self.sw.stats()

    def __getattr__(self, item):
        return getattr(self.sw, item)


def assert_clean_stop(h: Handle, timeout_ms=15000):
    """Every test that starts a sweeper ends here: a graceful stop, state "stopped", the
    loop closed with rc 0 and no stray handle; then the handle is destroyed."""
    h.sw.stop(timeout_ms=timeout_ms)
    st = h.sw.stats()
    assert st["state"] == "stopped", (h.name, st["state"])
    assert st["teardown_clean"] is True, (h.name, st["teardown_clean"], st["loop_close_rc"],
                                          h.log_text())
    assert st["loop_close_rc"] == 0, (h.name, st["loop_close_rc"])
    h.sw.close()
    assert h.sw.closed
    return st


def sweeper_config(conninfo, broker_id, knobs):
    cfg = {
        "conninfo": conninfo,
        "apply_schema": False,   # the fixtures own the schema (a test may drop a function)
        "read_env": False,
        "broker_id": broker_id,
        "sweeper_min_sleep_ms": 5,
        "sweeper_max_sleep_ms": 200,
        "log_level": "info",
    }
    cfg.update(knobs)
    return cfg


def _env_conninfo(var):
    value = os.environ.get(var)
    if not value:
        pytest.fail(f"{var} is not set: start a throwaway database with "
                    "`eval \"$(tests/pg start $(mktemp -d /tmp/pgsub.XXXX))\"` "
                    "(these integration tests need PostgreSQL and never skip)", pytrace=False)
    return value


@pytest.fixture(scope="session")
def conninfo():
    """The superuser: schema apply, setup and inspection (QUEEN_TEST_ADMIN_CONNINFO)."""
    return _env_conninfo("QUEEN_TEST_ADMIN_CONNINFO")


@pytest.fixture(scope="session")
def sweeper_conninfo():
    """A LOGIN role holding queen_sweeper only: what every sweeper under test logs in as."""
    return _env_conninfo("QUEEN_TEST_SWEEPER_CONNINFO")


@pytest.fixture(scope="session")
def broker_conninfo():
    """A LOGIN role holding queen_broker only: scheduling and KV calls."""
    return _env_conninfo("QUEEN_TEST_BROKER_CONNINFO")


@pytest.fixture(scope="session")
def schema(conninfo):
    """Apply sql/*.sql once (idempotent), and leave 005 complete at the end of the session."""
    try:
        conn = connect(conninfo)
    except psycopg2.Error as e:  # pragma: no cover - environment problem
        pytest.fail(f"cannot connect with QUEEN_TEST_CONNINFO ({conninfo}): {e}", pytrace=False)
    apply_sql_files(conn)
    yield True
    try:
        restore_maintenance(conn)
    finally:
        conn.close()


@pytest.fixture
def connections(conninfo, schema):
    """A factory of extra connections (autocommit by default), all closed at teardown."""
    opened = []

    def make(autocommit=True):
        c = connect(conninfo, autocommit)
        opened.append(c)
        return c

    yield make
    for c in opened:
        try:
            if not c.autocommit:
                c.rollback()
            c.close()
        except Exception:
            pass


@pytest.fixture
def q(connections, conninfo, broker_conninfo):
    """A Queen over a fresh autocommit connection (superuser), scheduling through the broker
    role; queen tables emptied before and after, and 005 restored after the test whatever
    it dropped."""
    conn = connections()
    broker = connect(broker_conninfo)
    restore_maintenance(conn)
    reset_tables(conn)
    try:
        yield Queen(conn, conninfo, broker)
    finally:
        broker.close()
    restore_maintenance(conn)
    reset_tables(conn)


@pytest.fixture
def sweepers(sweeper_conninfo, q):
    """make(broker_id, **knobs) -> Handle (created, log callback set, NOT started), logged
    in as the queen_sweeper role unless a test overrides the conninfo.
    Depends on q so that every sweeper is closed before the tables are emptied."""
    made: list[Handle] = []

    def make(broker_id, *, conninfo_override=None, **knobs):
        h = Handle(Sweeper(**sweeper_config(conninfo_override or sweeper_conninfo, broker_id,
                                            knobs)),
                   broker_id)
        h.sw.on_log(h.on_log)
        made.append(h)
        return h

    yield make
    for h in made:
        try:
            h.sw.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------
# A private PostgreSQL cluster (for the test that stops its database)
# ---------------------------------------------------------------------------------------

class PrivateCluster:
    """tests/pg start/halt/resume/stop on a directory of its own."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pgsub-private.")
        out = self._pg("start")
        env = {}
        for line in out.splitlines():
            if line.startswith("export "):
                for part in shlex.split(line[len("export "):]):
                    k, _, v = part.partition("=")
                    env[k] = v
        assert "QUEEN_TEST_SWEEPER_CONNINFO" in env, out
        # .conninfo is what the sweeper under test logs in with: the queen_sweeper role.
        self.conninfo = env["QUEEN_TEST_SWEEPER_CONNINFO"]
        self.admin_conninfo = env["QUEEN_TEST_ADMIN_CONNINFO"]
        self.up = True

    def _pg(self, cmd):
        r = subprocess.run([str(PG_SCRIPT), cmd, self.dir], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, f"tests/pg {cmd} {self.dir} failed: {r.stdout}\n{r.stderr}"
        return r.stdout

    def halt(self):
        self._pg("halt")
        self.up = False

    def resume(self):
        self._pg("resume")
        self.up = True

    def destroy(self):
        subprocess.run([str(PG_SCRIPT), "stop", self.dir], capture_output=True, timeout=120)


@pytest.fixture
def private_cluster(schema):
    """A cluster of its own with the queen schema applied; removed at teardown."""
    cluster = PrivateCluster()
    try:
        conn = connect(cluster.admin_conninfo)
        try:
            apply_sql_files(conn)
        finally:
            conn.close()
        yield cluster
    finally:
        cluster.destroy()
