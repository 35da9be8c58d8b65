"""Helpers of the bouncer suite. The generic ones (scripts, sweepers, reading the log) are
the shared test kit's (tests/kit/queenkit.py, re-exported here); this adds what is about
the bouncer."""

from __future__ import annotations

import subprocess

from queenkit import *  # noqa: F401,F403
from queenkit import ROOT, Queen, connect


def queen(bouncer_env, direct_conninfo):
    """A Queen for a test: inspection on a direct superuser connection, scheduling through the
    bouncer as the broker role (queen_test_broker)."""
    return Queen(connect(direct_conninfo), broker=connect(bouncer_env["QUEEN_BOUNCER_BROKER_CONNINFO"]))


def close_queen(q):
    for c in (q.broker, q.conn):
        try:
            c.close()
        except Exception:  # noqa: BLE001 - closing on the way out
            pass


def admin(bouncer_env, sql):
    """A console command of the bouncer (SHOW POOLS, SHOW STATS, ...): rows of strings."""
    out = subprocess.run([str(ROOT / "tests" / "bouncer"), "admin", bouncer_env["QUEEN_BOUNCER_DIR"], sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def restart(bouncer_env):
    subprocess.run([str(ROOT / "tests" / "bouncer"), "restart", bouncer_env["QUEEN_BOUNCER_DIR"]],
                   check=True, capture_output=True)
