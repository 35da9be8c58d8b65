"""The root of the Python test tree: pytest loads this file for every suite under tests/
(tests/pytest.ini makes tests/ the rootdir, so it does whatever folder or file is named).

It is the one place the suites' import path comes from: tests/kit (the shared test kit,
queenkit.py) goes on sys.path here, and importing the kit puts bindings/python on it and
both on PYTHONPATH for the suites' child processes. It also holds the shared fixtures: the
database's roles (conninfo, sweeper_conninfo, broker_conninfo), the schema applied by a
sweeper, extra connections, a Queen over emptied tables, and the sweeper factory. A suite's
own conftest.py may override any of them (tests/subclocks and tests/sql do).

Roles (tests/pg start creates them and exports their conninfos): the sweepers under test
log in as a role holding queen_sweeper only (QUEEN_TEST_SWEEPER_CONNINFO), scheduling goes
through a role holding queen_broker only (QUEEN_TEST_BROKER_CONNINFO), and setup and
inspection (direct table reads, switches, triggers, locks) use the superuser
(QUEEN_TEST_ADMIN_CONNINFO). Without those variables every test FAILS with a message saying
so: nothing here is ever skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

_KIT = str(Path(__file__).resolve().parent / "kit")
if _KIT not in sys.path:
    sys.path.insert(0, _KIT)

import psycopg2  # noqa: E402
import pytest  # noqa: E402

from queenkit import (Connections, Queen, Sweepers, apply_schema_via_sweeper, connect, env_conninfo,  # noqa: E402
                      reset_tables)


@pytest.fixture(scope="session")
def conninfo():
    """The superuser: the schema apply under test, setup and inspection."""
    return env_conninfo("QUEEN_TEST_ADMIN_CONNINFO")


@pytest.fixture(scope="session")
def sweeper_conninfo():
    """A LOGIN role holding queen_sweeper only: what the sweepers under test log in as."""
    return env_conninfo("QUEEN_TEST_SWEEPER_CONNINFO")


@pytest.fixture(scope="session")
def broker_conninfo():
    """A LOGIN role holding queen_broker only: scheduling (and KV calls)."""
    return env_conninfo("QUEEN_TEST_BROKER_CONNINFO")


@pytest.fixture(scope="session")
def schema(conninfo):
    """Apply the schema once, the way a broker does: a sweeper with apply_schema=True,
    started until the functions exist, then stopped cleanly."""
    try:
        connect(conninfo).close()
    except psycopg2.Error as e:  # pragma: no cover - environment problem
        pytest.fail(f"cannot connect with QUEEN_TEST_CONNINFO ({conninfo}): {e}", pytrace=False)
    try:
        apply_schema_via_sweeper(conninfo, "schema-apply")
    except AssertionError as e:
        pytest.fail(str(e), pytrace=False)
    return True


@pytest.fixture
def connections(conninfo, schema):
    """Extra connections (queenkit.Connections), all closed at teardown."""
    make = Connections(conninfo)
    yield make
    make.close_all()


@pytest.fixture
def q(connections, broker_conninfo):
    """A Queen over a fresh autocommit connection (superuser) that schedules through the
    broker role, with every queen table emptied."""
    conn = connections()
    broker = connect(broker_conninfo)
    reset_tables(conn, drop_test_triggers=True)
    yield Queen(conn, broker)
    broker.close()
    # Leave no trigger behind for the next test (or the next suite on this database).
    try:
        reset_tables(conn, drop_test_triggers=True)
    except psycopg2.Error:
        pass


@pytest.fixture
def sweepers(sweeper_conninfo, schema):
    """make(broker_id, *, fired=None, **knobs) -> Handle (created, log callback set, NOT
    started), logged in as the queen_sweeper role (a `conninfo` knob overrides it).
    apply_schema is off by default here: the schema fixture applied it, and the sweeper role
    may not run DDL. Whatever a test leaves running is stopped and closed at teardown."""
    make = Sweepers(sweeper_conninfo)
    yield make
    make.close_all()
