"""The Python test kit: what every Python suite of this repository shares.

Connections and statements (connect, as_user, rows, one, set_switch), clocks (now_ms),
waiting (wait_for), scheduling (op_schedule, op_reschedule, op_cancel, stand_in_hash, Queen),
sweepers (sweeper_config, make_sweeper, Sweepers, Handle, FiredLog, assert_clean_stop), the
schema (sql_files, schema_version, schema_text, apply_schema: one execute as the library
applies it; run_sql_files, apply_sql_files: file by file as an operator does;
apply_schema_via_sweeper, schema_ready, wait_schema), reading back what was delivered
(delivered_once, backend_of), the scripts (sh, parse_exports, closed_port, env_for_scripts)
and the broker processes (knob, stop_event, dump_stats, serve). Next to it, cutproxy.py (a
TCP proxy that cuts connections; the integration and failover suites use it). What one suite
alone uses stays in it (tests/sql's sqlkit: the fixed NOW, T1/T2 and its wrappers over the
queen.* functions; tests/subclocks' conftest, bouncerkit, hakit, patronikit, _benchlib), and
takes what it shares from here. connect(conninfo="", **params) takes libpq's keywords
alone too (tests/sql connects through the PG* variables that way).

Where it is found (one place each, never a sys.path line in a suite):
  - pytest suites under tests/: tests/conftest.py, which pytest loads for every folder of
    tests/ (tests/pytest.ini makes tests/ the rootdir, so it does on every pytest), puts
    tests/kit on sys.path; it also holds the shared fixtures (conninfo, schema, q,
    sweepers, connections, ...).
  - scripts run by hand (tests/bench/*, tests/soak/soak): one bootstrap line each (in
    tests/bench/_benchlib.py for the benchmarks).
  - child processes (tests/chaos/broker.py, tests/soak/broker.py, tests/bouncer_py/
    broker_proc.py, tests/patroni/sweeper_proc.py): importing this module appends tests/kit
    and bindings/python to os.environ["PYTHONPATH"], which every child inherits.

Importing it also puts bindings/python (the binding of this tree) first on sys.path.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

KIT_DIR = Path(__file__).resolve().parent
ROOT = KIT_DIR.parents[1]
BINDINGS = ROOT / "bindings" / "python"
SQL_DIR = ROOT / "sql"
PG_SCRIPT = ROOT / "tests" / "pg"


def _export_paths():
    """bindings/python first on sys.path; tests/kit and bindings/python on PYTHONPATH for
    every child process (appended: whatever the caller put first stays first)."""
    if str(BINDINGS) not in sys.path:
        sys.path.insert(0, str(BINDINGS))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for p in (str(BINDINGS), str(KIT_DIR)):
        if p not in parts:
            parts.append(p)
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)


_export_paths()

from queen_sweeper import Sweeper, decode_segment, txn_hash  # noqa: E402,F401

TENANT_A = "00000000-0000-0000-0000-000000000001"
TENANT_B = "00000000-0000-0000-0000-000000000002"

# Everything the queen schema owns that a test can fill; emptied around every test.
QUEEN_TABLES = [
    "queen.queues", "queen.log_partitions", "queen.log_segments", "queen.log_txns",
    "queen.log_txn_index", "queen.log_dlq", "queen.system_state", "queen.log_timers",
    "queen.kv", "queen.kv_quota", "queen.kv_usage", "queen.kv_usage_gate", "queen.log_timers_held",
    "queen.log_timers_tenants",
]

# Triggers the tests install are all named with this prefix and dropped between tests.
TEST_TRIGGER_PREFIX = "fire_test_"

APPLY_SQL = "SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())"


# ---------------------------------------------------------------------------------------
# Clocks, waiting, names
# ---------------------------------------------------------------------------------------

def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (what deliverAtMs and the schema count in)."""
    return time.time_ns() // 1_000_000


def wait_for(predicate, timeout=15.0, interval=0.02, what="condition", ignore=()):
    """Poll predicate until it returns something truthy (that value); fail naming `what`
    after `timeout` seconds. An exception of a type in `ignore` counts as a falsy answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignore:  # an empty tuple catches nothing
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def unique(prefix, digits=10):
    return f"{prefix}-{uuid.uuid4().hex[:digits]}"


# ---------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------

def connect(conninfo="", autocommit=True, *, attempts=1, retry_delay=0.5, **params):
    """A psycopg2 connection (autocommit by default). `params` go to psycopg2.connect
    (application_name=..., or the keywords alone with an empty conninfo); attempts > 1
    retries an OperationalError (a database restarting) every retry_delay seconds.
    psycopg2 is imported here, not with the kit: the broker processes (children that only
    run a sweeper) load no more than before. A missing driver fails the run, never a skip."""
    import psycopg2
    for k in range(attempts):
        try:
            conn = psycopg2.connect(conninfo, **params)
            break
        except psycopg2.OperationalError:
            if k == attempts - 1:
                raise
            time.sleep(retry_delay)
    conn.autocommit = autocommit
    return conn


class Connections:
    """A factory of extra connections, all closed by close_all() (an open transaction rolled
    back first): make(dsn=default, autocommit=True, **keywords) as connect() takes them. The
    one behind every suite's `connections` fixture."""

    def __init__(self, default_dsn=""):
        self.default_dsn = default_dsn
        self.opened = []

    def __call__(self, dsn=None, autocommit=True, **kw):
        c = connect(self.default_dsn if dsn is None else dsn, autocommit, **kw)
        self.opened.append(c)
        return c

    def close_all(self):
        for c in self.opened:
            try:
                if not c.closed and not c.autocommit:
                    c.rollback()
                c.close()
            except Exception:
                pass
        self.opened = []


def as_user(conninfo, user):
    """The same conninfo logged in as another role."""
    out, n = re.subn(r"\buser=\S+", f"user={user}", conninfo)
    return out if n else f"{conninfo} user={user}"


def rows(conn, sql, args=None):
    """Every row of one statement ([] when it returns none, as a DDL or an INSERT does)."""
    with conn.cursor() as cur:
        cur.execute(sql, args)
        if cur.description is None:
            return []
        return cur.fetchall()


def one(conn, sql, args=None):
    """The one row of one statement (it must return exactly one): its value when it has one
    column, else the row."""
    got = rows(conn, sql, args)
    assert len(got) == 1, got
    return got[0][0] if len(got[0]) == 1 else got[0]


def set_switch(conn, key, value):
    """Write queen.system_state[key] = value (JSON); None deletes the key."""
    if value is None:
        rows(conn, "DELETE FROM queen.system_state WHERE key = %s", (key,))
    else:
        rows(conn, "INSERT INTO queen.system_state (key, value) VALUES (%s, %s::jsonb)"
             " ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()",
             (key, json.dumps(value)))


def env_conninfo(var):
    """$var, or the test FAILS saying how to start a database (these tests never skip)."""
    value = os.environ.get(var)
    if not value:
        import pytest
        pytest.fail(f"{var} is not set: start a throwaway database with "
                    "`eval \"$(tests/pg start $(mktemp -d /tmp/pg.XXXX))\"` "
                    "(these integration tests need PostgreSQL and never skip)", pytrace=False)
    return value


# ---------------------------------------------------------------------------------------
# Scheduling
# ---------------------------------------------------------------------------------------

def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def stand_in_hash(txn) -> bytes:
    """16 bytes standing in for a transaction id's xxh3-128 (txn_hash) where the SQL is
    called directly: the schema stores and compares the hashes, never computes them."""
    return hashlib.md5(txn.encode()).digest()


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


class Queen:
    """The SQL surface the tests use, over one autocommit connection (the superuser), with
    scheduling sent through `broker` (the broker role) when one is given."""

    def __init__(self, conn, broker=None):
        self.conn = conn
        self.broker = broker if broker is not None else conn

    def q(self, sql, args=None):
        return rows(self.conn, sql, args)

    def one(self, sql, args=None):
        return one(self.conn, sql, args)

    def apply(self, ops, tenant=TENANT_A):
        """log_timers_apply_v1 in calls of at most 256 ops; the index-aligned results."""
        out = []
        for i in range(0, len(ops), 256):
            chunk = ops[i:i + 256]
            with self.broker.cursor() as cur:
                cur.execute(APPLY_SQL, (json.dumps(chunk), tenant))
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
        set_switch(self.conn, key, value)

    def provision(self, tenant, queue, partition):
        """Create the queue and partition (as a push would); the partition id."""
        return int(self.one("SELECT partition_id FROM queen.log_provision_v1(%s::uuid, %s, %s)",
                            (tenant, queue, partition)))

    def peek(self, queue, key, tenant=TENANT_A):
        return self.one("SELECT queen.log_timers_peek_v1(%s::uuid, %s, %s)", (tenant, queue, key))


def reset_tables(conn, drop_test_triggers=False):
    """Every queen table emptied (and, asked, every trigger named TEST_TRIGGER_PREFIX*
    dropped first)."""
    with conn.cursor() as cur:
        if drop_test_triggers:
            cur.execute("SELECT tgname, tgrelid::regclass::text FROM pg_trigger"
                        " WHERE tgname LIKE %s AND NOT tgisinternal", (TEST_TRIGGER_PREFIX + "%",))
            for name, rel in cur.fetchall():
                cur.execute(f'DROP TRIGGER IF EXISTS "{name}" ON {rel}')
        cur.execute("TRUNCATE %s RESTART IDENTITY CASCADE" % ", ".join(QUEEN_TABLES))


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


# ---------------------------------------------------------------------------------------
# Sweepers
# ---------------------------------------------------------------------------------------

class Handle:
    """A Sweeper plus what it told us through its log callback: logs is a list of
    (time.time(), level, message)."""

    def __init__(self, sweeper: Sweeper, name: str):
        self.sw = sweeper
        self.name = name
        self.logs: list[tuple[float, int, str]] = []
        self._lock = threading.Lock()

    def on_log(self, level, message):
        with self._lock:
            self.logs.append((time.time(), level, message))

    def messages(self, containing=None, level=None):
        with self._lock:
            lines = list(self.logs)
        return [m for _t, lvl, m in lines
                if (containing is None or containing in m) and (level is None or lvl == level)]

    def log_text(self, last=40):
        with self._lock:
            lines = self.logs[-last:]
        return "\n".join(f"  [{self.name} L{lvl}] {msg}" for _t, lvl, msg in lines)

    def stats(self):
        return self.sw.stats()

    def __getattr__(self, item):
        return getattr(self.sw, item)


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


def sweeper_config(conninfo, broker_id, knobs=None, *, apply_schema=True):
    """A sweeper configuration isolated from the environment and quick to react; `knobs`
    override any key."""
    cfg = {
        "conninfo": conninfo,
        "apply_schema": apply_schema,
        "read_env": False,
        "broker_id": broker_id,
        "sweeper_min_sleep_ms": 5,
        "sweeper_max_sleep_ms": 200,
        "log_level": "info",
    }
    cfg.update(knobs or {})
    return cfg


def _new_handle(cfg, fired):
    h = Handle(Sweeper(**cfg), cfg["broker_id"])
    h.sw.on_log(h.on_log)
    if fired is not None:
        h.sw.on_fired(fired)
    return h


def make_sweeper(conninfo, broker_id, fired=None, **knobs):
    """The sweeper factory: a Handle (created, log callback set, on_fired set when given,
    NOT started) of sweeper_config(conninfo, broker_id, knobs)."""
    return _new_handle(sweeper_config(conninfo, broker_id, knobs), fired)


class Sweepers:
    """The sweeper factory of the fixtures: make(broker_id, *, fired=None,
    conninfo_override=None, **knobs) -> Handle (created, log callback set, on_fired set when
    given, NOT started) of sweeper_config on `conninfo` (or conninfo_override; a `conninfo`
    knob overrides both), apply_schema off unless a knob turns it on; close_all() closes
    every one made (the teardown)."""

    def __init__(self, conninfo):
        self.conninfo = conninfo
        self.made: list[Handle] = []

    def __call__(self, broker_id, *, fired=None, conninfo_override=None, **knobs):
        knobs = {"apply_schema": False, **knobs}
        h = _new_handle(sweeper_config(conninfo_override or self.conninfo, broker_id, knobs), fired)
        self.made.append(h)
        return h

    def close_all(self):
        for h in self.made:
            try:
                h.sw.close()
            except Exception:
                pass


def assert_clean_stop(h: Handle, timeout_ms=15000):
    """Every test that starts a sweeper ends here: a graceful stop, state "stopped", the
    loop closed with rc 0 and no stray handle, no move the claim book refused; then the
    handle is destroyed."""
    h.sw.stop(timeout_ms=timeout_ms)
    st = h.sw.stats()
    assert st["state"] == "stopped", (h.name, st["state"])
    assert st["teardown_clean"] is True, (h.name, st["teardown_clean"], st["loop_close_rc"],
                                          h.log_text())
    assert st["loop_close_rc"] == 0, (h.name, st["loop_close_rc"])
    # Every claimed row moved through the claim book as its states allow (a refusal is a bug).
    assert st["claims"]["refused_moves_total"] == 0, (h.name, st["claims"], h.log_text())
    h.sw.close()
    assert h.sw.closed
    return st


# ---------------------------------------------------------------------------------------
# The schema
# ---------------------------------------------------------------------------------------

SCHEMA_READY_SQL = ("SELECT to_regproc('queen.log_timers_fire_v2') IS NOT NULL"
                    "   AND to_regproc('queen.log_read_v1') IS NOT NULL")


def schema_ready(conn, extra=("queen.log_push_v1",)):
    """Whether the functions a sweeper and the tests call exist yet."""
    sql = SCHEMA_READY_SQL + "".join(f" AND to_regproc('{f}') IS NOT NULL" for f in extra)
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def wait_schema(q: Queen, timeout=60):
    """Until a sweeper's apply_schema has created the schema (checked on q's connection)."""
    wait_for(lambda: q.one(SCHEMA_READY_SQL), timeout, 0.05, "the queen schema applied by a sweeper")


def apply_schema_via_sweeper(conninfo, broker_id="schema-apply", *, check_conninfo=None,
                             first_cycle=True, timeout=60, require_push=True):
    """The schema, applied the way a broker does: a sweeper with apply_schema=True on
    `conninfo`, started until the functions exist (read on check_conninfo, default the
    same), then (first_cycle) until its first cycle, then stopped cleanly. On failure the
    sweeper's log is in the AssertionError."""
    probe = connect(check_conninfo or conninfo)
    h = make_sweeper(conninfo, broker_id)
    h.sw.start()
    try:
        extra = ("queen.log_push_v1",) if require_push else ()
        try:
            wait_for(lambda: schema_ready(probe, extra), timeout, 0.05,
                     "the queen schema applied by a sweeper (apply_schema)")
        except AssertionError as e:
            raise AssertionError(f"schema apply did not complete ({e}):\n{h.log_text()}") from None
        if first_cycle:
            wait_for(lambda: h.stats()["cycles_total"] >= 1, 30, 0.02, "the first cycle")
    finally:
        assert_clean_stop(h)
        probe.close()


def sql_files(sql_dir=SQL_DIR):
    """The schema's files, sql/NNN_*.sql (or those of another folder, such as a release's),
    in numeric order, as path strings."""
    files = sorted(glob.glob(os.path.join(str(sql_dir), "[0-9][0-9][0-9]_*.sql")))
    assert files, f"no NNN_*.sql files found under {sql_dir}"
    return files


def schema_version(sql_dir=SQL_DIR):
    """The version the last statement of 008_version.sql records (what an apply leaves)."""
    text = Path(sql_dir, "008_version.sql").read_text(encoding="utf-8")
    return int(re.search(r"VALUES \('queen-sweeper', (\d+), now\(\)\)", text).group(1))


def schema_text(files=None):
    """What the library embeds and applies: the files (default sql_files()) concatenated in
    numeric order."""
    return "\n".join(Path(f).read_text(encoding="utf-8") for f in files or sql_files())


def apply_schema(conn, files=None):
    """The schema applied the way the library applies it: schema_text(files) in one execute
    (on an autocommit connection, one implicit transaction for the whole string)."""
    with conn.cursor() as cur:
        cur.execute(schema_text(files))


def run_sql_files(conn, files):
    """Each file executed on its own, in the order given (as an operator's `psql -f` of each
    does); an error carries a note naming its file."""
    with conn.cursor() as cur:
        for f in files:
            try:
                cur.execute(Path(f).read_text(encoding="utf-8"))
            except Exception as e:
                e.add_note(f"applying {f}")
                raise


def apply_sql_files(conn, names=None, sql_dir=SQL_DIR):
    """Apply sql/NNN_*.sql (or just `names`) file by file in numeric order; the files are
    idempotent. After a partial apply the roles and version files (006 on) run too: a
    function a test dropped comes back owned by whoever applied it and executable by PUBLIC
    until 006 puts its owner and grants back."""
    files = sql_files(sql_dir)
    if names is not None:
        files = [f for f in files if os.path.basename(f) in names or os.path.basename(f) >= "006"]
    run_sql_files(conn, files)


# ---------------------------------------------------------------------------------------
# Scripts and ports
# ---------------------------------------------------------------------------------------

def parse_exports(text):
    """The NAME=value pairs of a script's `export` lines, as a dict."""
    found = {}
    for m in re.finditer(r"(\w+)=('([^']*)'|(\S+))", text):
        found[m.group(1)] = m.group(3) if m.group(3) is not None else m.group(4)
    return found


def sh(*args, env=None):
    """Run one of the repository's scripts (tests/pg, tests/pgpair, tests/bouncer); its
    `export` lines as a dict."""
    out = subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True,
                         env=env).stdout
    return parse_exports(out)


def env_for_scripts():
    env = dict(os.environ)
    env.setdefault("PATH", "/usr/bin:/bin")
    return env


def closed_port():
    """A loopback port nobody listens on (bound once, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------------------
# Broker processes (a sweeper in a process of its own, stats in a file)
# ---------------------------------------------------------------------------------------

def knob(text):
    """KEY=VALUE of a --knob argument: an int, true/false, or the string."""
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        return name, {"true": True, "false": False}.get(value, value)


def stop_event(*signals):
    """An Event set by any of `signals` (default SIGTERM): the broker process's graceful stop."""
    import signal
    done = threading.Event()
    for sig in signals or (signal.SIGTERM,):
        signal.signal(sig, lambda *_: done.set())
    return done


def dump_stats(sw, path):
    """The sweeper's stats JSON written to `path` (write + rename: a reader never sees half)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(sw.stats(), f)
    os.replace(tmp, path)


def serve(sw, stats_path, done: threading.Event, every=0.2, stop_timeout_ms=10000):
    """Write the stats every `every` seconds until `done` is set (the caller's signal
    handler sets it), then stop the sweeper gracefully, write the final stats and close it."""
    while not done.wait(every):
        dump_stats(sw, stats_path)
    try:
        sw.stop(stop_timeout_ms)
    finally:
        dump_stats(sw, stats_path)
        sw.close()
