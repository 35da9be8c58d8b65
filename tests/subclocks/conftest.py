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

The generic helpers are the shared test kit's (tests/kit/queenkit.py); the roles' conninfo
fixtures and `connections` are tests/conftest.py's. Without QUEEN_TEST_CONNINFO every test
FAILS with a message saying so (nothing here is ever skipped). Other suites share the database, one after the other: the schema is applied
from sql/*.sql at the start, the queen tables are emptied around every test, and whatever
a test breaks on purpose (a dropped function, a role) is put back by the fixtures.
"""

from __future__ import annotations

import json
import subprocess
import tempfile

import psycopg2
import pytest

import queenkit
from queenkit import PG_SCRIPT, Sweepers, apply_sql_files, connect, parse_exports, reset_tables

TENANT_B = "00000000-0000-0000-0000-0000000000b2"

# The functions of 005 that the class-42 tests drop or revoke (and the fixtures restore):
# the prune and the rollup the sweeper calls (kv_usage_step_v2 since schema version 10),
# then the rollup's pass that v2 runs (v1).
MAINTENANCE_FUNCTIONS = ("queen.kv_expire_step_v1(int2[], timestamptz, int)",
                         "queen.kv_usage_step_v2(int2[], timestamptz, int, int)",
                         "queen.kv_usage_step_v1(int2[], timestamptz, int)")


class Queen(queenkit.Queen):
    """The kit's SQL surface (tests/kit/queenkit.py) plus the conninfo and the KV calls:
    scheduling and KV calls go through the broker's role when the fixture gives one; setup
    and inspection (direct table reads and writes) use `conn`, the superuser."""

    def __init__(self, conn, conninfo, broker=None):
        super().__init__(conn, broker)
        self.conninfo = conninfo

    def segments(self, queue):
        """(base_offset, count, blob) of every segment of `queue`, in log order."""
        return [(int(b), int(c), bytes(bl)) for b, c, bl in self.q(
            "SELECT s.base_offset, s.count, s.blob FROM queen.log_segments s"
            "  JOIN queen.log_partitions p ON p.id = s.partition_id"
            "  JOIN queen.queues qu ON qu.id = p.queue_id"
            " WHERE qu.name = %s ORDER BY p.name, s.base_offset", (queue,))]

    # -- kv --------------------------------------------------------------------------

    def kv_insert(self, namespace, n, *, expires_sql, tenant=queenkit.TENANT_A, prefix="k"):
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

    def kv_get(self, namespace, key, tenant=queenkit.TENANT_A):
        return queenkit.one(self.broker, "SELECT queen.kv_get_v1(%s::uuid, %s, %s, now())",
                            (tenant, namespace, key))

    def kv_put(self, namespace, key, value, *, ttl_ms=None, forever=None, tenant=queenkit.TENANT_A):
        return queenkit.one(self.broker, "SELECT queen.kv_put_v1(%s::uuid, %s, %s, %s::jsonb, %s, %s, now())",
                            (tenant, namespace, key, json.dumps(value), ttl_ms, forever))

    def functions_present(self):
        return [self.one("SELECT to_regprocedure(%s) IS NOT NULL", (f,))
                for f in MAINTENANCE_FUNCTIONS]


def restore_maintenance(conn):
    """Put 005_kv_maintenance.sql back if a test dropped anything from it."""
    with conn.cursor() as cur:
        cur.execute("SELECT bool_and(to_regprocedure(f) IS NOT NULL) FROM unnest(%s::text[]) f",
                    (list(MAINTENANCE_FUNCTIONS),))
        complete = cur.fetchone()[0]
    if not complete:
        apply_sql_files(conn, {"005_kv_maintenance.sql"})


# ---------------------------------------------------------------------------------------
# Fixtures (conninfo, sweeper_conninfo, broker_conninfo and connections: tests/conftest.py)
# ---------------------------------------------------------------------------------------

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
    """make(broker_id, *, conninfo_override=None, **knobs) -> Handle (created, log callback
    set, NOT started), logged in as the queen_sweeper role unless a test overrides the
    conninfo; apply_schema off (the fixtures own the schema: a test may drop a function).
    Depends on q so that every sweeper is closed before the tables are emptied."""
    make = Sweepers(sweeper_conninfo)
    yield make
    make.close_all()


# ---------------------------------------------------------------------------------------
# A private PostgreSQL cluster (for the test that stops its database)
# ---------------------------------------------------------------------------------------

class PrivateCluster:
    """tests/pg start/halt/resume/stop on a directory of its own."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pgsub-private.")
        out = self._pg("start")
        env = parse_exports(out)
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
