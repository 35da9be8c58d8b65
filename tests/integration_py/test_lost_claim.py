"""A claim whose answer was lost is handed back at once, not after the lease (issue 18).

The connection dies after a claim commits and before its answer is read (a failover, a
bouncer restart, a network cut). The claim's rows are then held under a token the sweeper
never saw. Since schema version 5 a claim is sent with an id the sweeper makes
(log_timers_claim_v4's claim_id, the rows' claim_token), and a sweeper remembers the ids of
claims it has no answer for; once connected again it hands them back by id
(log_timers_release_claims_v2) and they fire at once, exactly once.

The cut is real: a TCP proxy (cutproxy.py) between the sweeper and PostgreSQL forwards the
claim, lets it commit, and closes both sockets at the COMMIT's CommandComplete without
forwarding any of the answer. The lease is 60 s: without the hand-back those rows would wait
all of it.
"""
import os
import time

from cutproxy import CutProxy
from queenkit import assert_clean_stop, op_schedule, wait_for

QUEUE = "lostclaim"
N = 600
LEASE_MS = 60000


def proxied(conninfo, port):
    parts = [p for p in conninfo.split() if not p.startswith(("host=", "port="))]
    return " ".join(parts + ["host=127.0.0.1", f"port={port}", "sslmode=disable"])


def test_a_claim_whose_answer_was_lost_fires_within_seconds_of_reconnecting(q, sweepers, sweeper_conninfo):
    host = os.environ.get("PGHOST", "127.0.0.1")
    port = int(os.environ["PGPORT"])
    proxy = CutProxy(host, port)
    try:
        ops = [op_schedule(QUEUE, f"k{i:04d}", b'{"n": %d}' % i, partition=f"p{i % 4}") for i in range(N)]
        for i in range(0, N, 200):
            q.schedule(ops[i:i + 200])
        proxy.arm(b"log_timers_claim_v4")
        h = sweepers("lostclaim", conninfo=proxied(sweeper_conninfo, proxy.port),
                     sweeper_lease_ms=LEASE_MS, sweeper_claim_batch=200, sweeper_claim_batch_max=200)
        try:
            h.start()
            wait_for(lambda: proxy.cut_at is not None, 20, what="the first claim to commit and its answer to be cut")
            cut = proxy.cut_at
            held = q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s AND claim_token IS NOT NULL"
                         " AND claimed_until > now()", (QUEUE,))
            assert held > 0, "the cut claim did not commit: nothing to hand back"
            wait_for(lambda: q.timers_left() == 0, 40,
                     what=f"every timer to fire (the cut claim's {held} rows must not wait out the {LEASE_MS} ms lease)")
            took = time.time() - cut   # polled every 20 ms: the moment the table was empty
            wait_for(lambda: h.stats()["failover"]["lost_claims"]["handed_back_total"] >= held, 10,
                     what="the hand-back to be counted")
            fo = h.stats()["failover"]
            print(f"\n[lost claim] {held} timers of a claim whose answer was cut; last of all {N} fired "
                  f"{took:.2f} s after the cut (lease {LEASE_MS / 1000:.0f} s); lost_claims {fo['lost_claims']}")
            assert fo["lost_claims"]["total"] >= 1
            assert fo["lost_claims"]["pending"] == 0
            assert took < LEASE_MS / 1000 / 2, "the lost claim's rows waited for their lease"
        finally:
            assert_clean_stop(h)
        delivered = q.delivered(queue=QUEUE)
        assert len(delivered) == N, len(delivered)
        assert len({d[4].txn for d in delivered}) == N, "a timer was delivered twice"
        assert q.one("SELECT count(*) FROM queen.log_dlq") == 0
    finally:
        proxy.close()
