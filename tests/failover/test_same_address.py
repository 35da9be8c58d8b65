"""A failover behind the same address (issue 36): the primary SIGKILLed, its synchronous
standby promoted and moved to the dead primary's port, as a floating IP, a VIP or a shared
Unix socket makes it. The address outlives its server; the sweeper must recognise the new
server by what it is (system identifier and timeline), count the failover, look for its
recent fires in the new server's log, and fire every timer exactly once.

Its own pair (module scope, conftest.py): the test moves the standby for good.
"""

import time
import uuid

from queenkit import (FiredLog, Queen, ROOT, as_user, assert_clean_stop, connect, delivered_once, make_sweeper,
                     op_schedule, sh, wait_for)

N = 3000
SPREAD_MS = 6000
PARTITIONS = 10


def test_a_standby_promoted_behind_the_same_address_is_a_new_server(pair):
    pport = pair["QUEEN_PAIR_PRIMARY_PORT"]
    primary_ci = f"host=127.0.0.1 port={pport} user=postgres dbname=postgres"
    q = Queen(connect(primary_ci), broker=connect(as_user(primary_ci, "queen_test_broker")))
    queue = f"same-address-{uuid.uuid4().hex[:8]}"
    txns = [f"txn-{i:05d}" for i in range(N)]
    q.schedule([op_schedule(queue, f"k{i:05d}", b"payload-%05d" % i, partition=f"p{i % PARTITIONS:02d}",
                            delay_ms=1000 + (i * SPREAD_MS) // N, txn=txns[i]) for i in range(N)])
    q.broker.close()
    q.conn.close()

    fired = FiredLog()
    # One address only: the sweeper can never tell the servers apart by where it connects.
    h = make_sweeper(as_user(primary_ci, "queen_test_sweeper"), "same-address", fired=fired, apply_schema=False,
                     connect_timeout_ms=2000)
    h.start()
    try:
        wait_for(lambda: h.stats()["failover"]["server_identity"] != "", 30, 0.05, "the server identified")
        before = h.stats()["failover"]
        assert before["server"] == f"127.0.0.1:{pport}", before
        sysid, timeline = before["server_identity"].split("/")
        assert sysid.isdigit() and timeline == "00000001", before

        wait_for(lambda: fired.total() >= N // 3, 60, 0.01, "a third of the timers fired")
        sh(ROOT / "tests" / "pgpair", "kill-primary", pair["QUEEN_PAIR_DIR"])
        sh(ROOT / "tests" / "pgpair", "promote", pair["QUEEN_PAIR_DIR"])
        sh(ROOT / "tests" / "pgpair", "take-address", pair["QUEEN_PAIR_DIR"])

        nq = Queen(connect(primary_ci))  # the promoted standby, at the old address
        try:
            assert nq.one("SELECT pg_is_in_recovery()") is False
            wait_for(lambda: nq.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0,
                     120, 0.05, "every timer fired on the new primary")
            wait_for(lambda: fired.total() >= N, 30, 0.05, "every fired timer announced")
            after = h.stats()["failover"]
            print(f"\n[same address] before {before['server']} {before['server_identity']}, after "
                  f"{after['server']} {after['server_identity']}; server changes {after['server_changes_total']}, "
                  f"recent fires checked {after['recent_fires_checked_total']}, lost {after['lost_total']}")
            # The same address, another server: recognised and counted.
            assert after["server"] == before["server"], after
            assert after["server_identity"] == f"{sysid}/00000002", after
            assert after["server_changes_total"] == before["server_changes_total"] + 1, after
            assert "behind the same address" in h.log_text(200), h.log_text(20)
            # Exactly once in the new primary's log, and the host heard of each timer once.
            assert delivered_once(nq, queue, txns) == N
            assert fired.total() == N, fired.total()
        finally:
            nq.conn.close()
    finally:
        assert_clean_stop(h)
