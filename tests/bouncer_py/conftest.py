"""Fixtures of the bouncer suite: a transaction-pooling PgBouncer (tests/bouncer) in front
of the suite's PostgreSQL (QUEEN_TEST_CONNINFO), with a server pool of 4: smaller than the
sweepers' connections, so clients queue in the bouncer as they would in production. The
schema is applied once through the bouncer by a sweeper logged in as the superuser (the
migration role); every test's sweepers and broker then log in as queen_test_sweeper and
queen_test_broker (tests/pg creates them)."""

import os
import re
import tempfile

import pytest

from queenkit import ROOT, Queen, apply_schema_via_sweeper, connect, sh

POOL = 4


@pytest.fixture(scope="session")
def direct_conninfo():
    value = os.environ.get("QUEEN_TEST_CONNINFO")
    if not value:
        pytest.fail("QUEEN_TEST_CONNINFO is not set: start a throwaway database with "
                    "`eval \"$(tests/pg start $(mktemp -d /tmp/pg.XXXX))\"` (these tests never skip)",
                    pytrace=False)
    return value


@pytest.fixture(scope="session")
def bouncer(direct_conninfo):
    port = re.search(r"port=(\d+)", direct_conninfo).group(1)
    d = tempfile.mkdtemp(prefix="queen-bouncer-")
    try:
        env = sh(ROOT / "tests" / "bouncer", "start", d, port, POOL)
        env["POOL"] = POOL
        # The suite's sweepers and broker log in as the LOGIN roles tests/pg creates.
        q = Queen(connect(direct_conninfo))
        try:
            have = q.one("SELECT count(*) FROM pg_roles r WHERE (r.rolname, r.rolcanlogin) IN"
                         " (('queen_test_sweeper', true), ('queen_test_broker', true))")
        finally:
            q.conn.close()
        if have != 2:
            pytest.fail("the LOGIN roles queen_test_sweeper and queen_test_broker are missing: start the database "
                        "with tests/pg (it creates them)", pytrace=False)
        # The schema, applied once through the bouncer the way a broker would (checked on a
        # direct connection), until the sweeper's first cycle through the bouncer.
        apply_schema_via_sweeper(env["QUEEN_BOUNCER_CONNINFO"], "bouncer-schema",
                                 check_conninfo=direct_conninfo, require_push=False)
        yield env
    finally:
        sh(ROOT / "tests" / "bouncer", "stop", d)
