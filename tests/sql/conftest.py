"""Fixtures for the SQL tests: a real PostgreSQL, the schema applied the way the plugin
applies it (every sql/*.sql concatenated in numeric order, one multi-statement string),
and the queen tables emptied before every test.

The connection comes from the PG* environment variables (tests/pg start prints them);
without PGHOST every test fails with a message saying so: nothing is skipped.
"""
import pytest

from sqlkit import QUEEN_TABLES, Queen, apply_schema, connect


@pytest.fixture(scope="session")
def schema():
    conn = connect()
    try:
        apply_schema(conn)
    finally:
        conn.close()
    return True


@pytest.fixture
def connections(schema):
    """A factory of extra autocommit connections, all closed at teardown."""
    opened = []

    def make(**kw):
        c = connect(**kw)
        opened.append(c)
        return c

    yield make
    for c in opened:
        try:
            c.close()
        except Exception:
            pass


@pytest.fixture
def db(connections):
    conn = connections()
    with conn.cursor() as cur:
        cur.execute("TRUNCATE %s RESTART IDENTITY CASCADE" % ", ".join(QUEEN_TABLES))
    return conn


@pytest.fixture
def q(db):
    return Queen(db)


def _role_conninfo(var):
    import os
    value = os.environ.get(var)
    if not value:
        pytest.fail("%s is not set: tests/pg start exports it (a LOGIN role holding one queen "
                    "group role); start the database with tests/pg" % var, pytrace=False)
    return value


@pytest.fixture
def as_sweeper(connections):
    """A Queen on the LOGIN role that holds queen_sweeper only."""
    return Queen(connections(dsn=_role_conninfo("QUEEN_TEST_SWEEPER_CONNINFO")))


@pytest.fixture
def as_broker(connections):
    """A Queen on the LOGIN role that holds queen_broker only."""
    return Queen(connections(dsn=_role_conninfo("QUEEN_TEST_BROKER_CONNINFO")))
