"""Fixtures of the failover suite: a primary with a synchronous hot standby (tests/pgpair)
and a private single cluster (tests/pg) whose settings a test may change. Both are
stopped and removed however the tests end."""

import tempfile

import pytest

from failkit import ROOT, Queen, connect, make_sweeper, sh, wait_schema, assert_clean_stop


def _apply_schema(ci):
    """The schema, applied the way a broker does: a sweeper with apply_schema=true."""
    h = make_sweeper(ci, "schema-apply")
    h.start()
    q = Queen(connect(ci))
    try:
        wait_schema(q)
    finally:
        assert_clean_stop(h)
        q.conn.close()


@pytest.fixture(scope="module")
def pair():
    d = tempfile.mkdtemp(prefix="queen-pair-")
    try:
        env = sh(ROOT / "tests" / "pgpair", "start", d)
        _apply_schema(env["QUEEN_PAIR_CONNINFO"])
        yield env
    finally:
        sh(ROOT / "tests" / "pgpair", "stop", d)


@pytest.fixture(scope="module")
def private_pg():
    """A cluster of our own (ALTER SYSTEM is allowed here), schema applied."""
    d = tempfile.mkdtemp(prefix="queen-private-pg-")
    try:
        env = sh(ROOT / "tests" / "pg", "start", d)
        _apply_schema(env["QUEEN_TEST_CONNINFO"])
        yield env
    finally:
        sh(ROOT / "tests" / "pg", "stop", d)
