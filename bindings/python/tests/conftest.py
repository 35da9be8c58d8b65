"""Shared fixtures: the library, the throwaway database. The generic helpers (wait_for,
unique, ...) are the repository's test kit (tests/kit/queenkit.py): bindings/python's
pyproject.toml puts tests/kit on sys.path for pytest (its pythonpath setting), and importing
the kit puts this package (bindings/python) first on sys.path.

Run:  cd /work/main && QUEEN_SWEEPER_BUILD_DIR=<build> QUEEN_TEST_CONNINFO=... \
          /usr/bin/python3 -m pytest -q bindings/python/tests
Tests that need PostgreSQL fail (never skip) without QUEEN_TEST_CONNINFO.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time

import pytest

from queenkit import unique, wait_for  # noqa: F401 - the tests import them from here

import queen_sweeper  # noqa: E402
from queen_sweeper import _native  # noqa: E402

TENANT = "00000000-0000-0000-0000-000000000001"


@pytest.fixture(scope="session")
def native():
    return _native.load()


@pytest.fixture(scope="session")
def conninfo():
    value = os.environ.get("QUEEN_TEST_CONNINFO")
    if not value:
        pytest.fail("QUEEN_TEST_CONNINFO is not set: start a database with "
                    "`eval \"$(tests/pg start $(mktemp -d))\"` (database tests never skip)")
    return value


@pytest.fixture()
def base_config(conninfo):
    """A sweeper configuration isolated from the environment, quick to react."""
    return {
        "conninfo": conninfo,
        "apply_schema": True,
        "read_env": False,
        "sweeper_min_sleep_ms": 5,
        "sweeper_max_sleep_ms": 200,
    }


@pytest.fixture()
def db(conninfo):
    # A missing driver fails the test (tests/run installs python3-psycopg2): never a skip.
    import psycopg2
    conn = psycopg2.connect(conninfo)
    conn.autocommit = True
    yield conn
    conn.close()


def wait_for_schema(db, timeout=30.0):
    """The sweeper applies the schema on its own thread after start; wait for it."""
    def ready():
        with db.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                        " WHERE n.nspname = 'queen' AND p.proname IN"
                        " ('log_timers_apply_v1', 'log_read_v1')")
            return cur.fetchone()[0] >= 2
    wait_for(ready, timeout, 0.05, "the queen schema (apply_schema)")


def schedule(db, queue, timer_key, payload: bytes, partition="p0", txn="t1", delay_ms=0):
    ops = [{
        "op": "schedule", "queue": queue, "timerKey": timer_key, "partition": partition,
        "delayMs": delay_ms, "txn": txn, "payload": base64.b64encode(payload).decode("ascii"),
    }]
    with db.cursor() as cur:
        cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())",
                    (json.dumps(ops), TENANT))
        cur.fetchall()


def read_log(db, tenant, queue, partition):
    with db.cursor() as cur:
        cur.execute("SELECT base_offset, blob FROM queen.log_read_v1(%s::uuid, %s, %s, 0, 1000)",
                    (tenant, queue, partition))
        return [(int(off), bytes(blob)) for off, blob in cur.fetchall()]


class FiredRecorder:
    """An on_fired callback that records calls and lets a test wait for a queue."""

    def __init__(self):
        self.calls = []
        self.cond = threading.Condition()

    def __call__(self, tenant, queue, partition, count, base_offset):
        with self.cond:
            self.calls.append((tenant, queue, partition, count, base_offset))
            self.cond.notify_all()

    def wait_queue(self, queue, timeout=15.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hits = [c for c in self.calls if c[1] == queue]
                if hits:
                    return hits
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no on_fired for queue {queue!r} within {timeout}s;"
                                         f" calls: {self.calls}")
                self.cond.wait(left)


def assert_clean_teardown(sw):
    """Every test that starts a sweeper ends here: stop succeeds, the loop closed
    cleanly (uv_loop_close returned 0), close is final."""
    sw.stop(timeout_ms=10000)
    stats = sw.stats()
    assert stats["state"] == "stopped", stats["state"]
    assert stats["teardown_clean"] is True, stats
    sw.stop(timeout_ms=10000)  # idempotent
    sw.close()
    assert sw.closed
    sw.close()
