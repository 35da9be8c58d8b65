"""Fixtures of the failover suite: a primary with a synchronous hot standby (tests/pgpair)
and a private single cluster (tests/pg) whose settings a test may change. Both are
stopped and removed however the tests end.

Roles: the schema is applied as the superuser (a sweeper with apply_schema=true, the
migration role's way); the sweepers under test then log in as queen_test_sweeper (member of
queen_sweeper only) and timers are scheduled as queen_test_broker (queen_broker only). On the
pair this fixture creates those LOGIN roles after the apply (tests/pg creates its own); the
superuser only sets up and inspects."""

import tempfile

import pytest

from queenkit import ROOT, apply_schema_via_sweeper, as_user, connect, sh


def _apply_schema(ci):
    """The schema, applied the way a broker does: a sweeper with apply_schema=true."""
    apply_schema_via_sweeper(ci, "schema-apply", first_cycle=False, require_push=False)


@pytest.fixture(scope="module")
def pair():
    d = tempfile.mkdtemp(prefix="queen-pair-")
    try:
        env = sh(ROOT / "tests" / "pgpair", "start", d)
        _apply_schema(env["QUEEN_PAIR_CONNINFO"])
        c = connect(env["QUEEN_PAIR_CONNINFO"])
        try:
            with c.cursor() as cur:
                cur.execute("CREATE ROLE queen_test_sweeper LOGIN IN ROLE queen_sweeper;"
                            "CREATE ROLE queen_test_broker LOGIN IN ROLE queen_broker")
        finally:
            c.close()
        for name in ("QUEEN_PAIR_CONNINFO", "QUEEN_PAIR_STANDBY_CONNINFO"):
            base = name[:-len("_CONNINFO")]
            env[base + "_SWEEPER_CONNINFO"] = as_user(env[name], "queen_test_sweeper")
            env[base + "_BROKER_CONNINFO"] = as_user(env[name], "queen_test_broker")
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
