"""Fixtures for the SQL tests: a real PostgreSQL, the schema applied the way the plugin
applies it (every sql/*.sql concatenated in numeric order, one multi-statement string:
the kit's apply_schema), and the queen tables emptied before every test.

The connection comes from the PG* environment variables (tests/pg start prints them): the
conninfo fixture here is empty, so the kit's connect() takes libpq's defaults, and keywords
(user=, dbname=, options=) override them. Without PGHOST every test fails with a message
saying so: nothing is skipped. The least-privilege roles come from tests/conftest.py's
sweeper_conninfo and broker_conninfo.
"""
import os

import pytest

from queenkit import Connections, apply_schema, connect, reset_tables
from sqlkit import Queen


@pytest.fixture(scope="session")
def conninfo():
    """Empty: libpq's PG* variables name the database (the superuser)."""
    if not os.environ.get("PGHOST"):
        pytest.fail(
            "PGHOST is not set: these tests need a real PostgreSQL. Start one with\n"
            '  eval "$(tests/pg start $(mktemp -d /tmp/pgsql.XXXX))"\n'
            "and run them again (the PG* variables it exports are the connection).",
            pytrace=False)
    return ""


@pytest.fixture(scope="session")
def schema(conninfo):
    conn = connect(conninfo)
    try:
        apply_schema(conn)
    finally:
        conn.close()
    return True


@pytest.fixture
def connections(conninfo, schema):
    """Extra connections (queenkit.Connections), all closed at teardown."""
    make = Connections(conninfo)
    yield make
    make.close_all()


@pytest.fixture
def db(connections):
    conn = connections()
    reset_tables(conn)
    return conn


@pytest.fixture
def q(db):
    return Queen(db)


@pytest.fixture
def as_sweeper(connections, sweeper_conninfo):
    """A Queen on the LOGIN role that holds queen_sweeper only."""
    return Queen(connections(sweeper_conninfo))


@pytest.fixture
def as_broker(connections, broker_conninfo):
    """A Queen on the LOGIN role that holds queen_broker only."""
    return Queen(connections(broker_conninfo))
