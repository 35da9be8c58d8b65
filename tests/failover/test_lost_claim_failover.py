"""A claim whose answer was lost, across a failover (issue 18): its rows fire within seconds
of the sweeper reaching the new primary, exactly once, not after the lease.

The pair of this module (its own: the test promotes the standby) replicates synchronously,
so a claim that committed on the primary is on the standby too, its rows held under the id
the sweeper sent. The sweeper's conninfo names a cutting proxy in front of the primary, then
the standby (target_session_attrs=read-write). The proxy lets the first claim commit and
closes the connection at its COMMIT's CommandComplete without forwarding it, then refuses
every new connection, as a dead server would; the primary is then SIGKILLed and the standby
promoted. The sweeper lands on the new primary, hands its lost claim back by id there
(log_timers_release_claims_v2), and everything fires once. The lease is 60 s: without the
hand-back the claim's rows would wait all of it.
"""
import time
import uuid

from cutproxy import CutProxy
from queenkit import (Queen, assert_clean_stop, connect, delivered_once, make_sweeper, op_schedule, sh, ROOT,
                      wait_for)

N = 600
LEASE_MS = 60_000


def test_a_claim_lost_in_a_failover_is_handed_back_on_the_new_primary(pair):
    queue = f"lostclaim-fo-{uuid.uuid4().hex[:8]}"
    txns = [f"txn-{i:04d}" for i in range(N)]
    q = Queen(connect(pair["QUEEN_PAIR_CONNINFO"]), broker=connect(pair["QUEEN_PAIR_BROKER_CONNINFO"]))
    ops = [op_schedule(queue, f"k{i:04d}", b'{"n": %d}' % i, partition=f"p{i % 4}", txn=txns[i]) for i in range(N)]
    for i in range(0, N, 200):
        q.schedule(ops[i:i + 200])
    q.broker.close()
    q.conn.close()

    proxy = CutProxy("127.0.0.1", int(pair["QUEEN_PAIR_PRIMARY_PORT"]), refuse_after_cut=True)
    sport = pair["QUEEN_PAIR_STANDBY_PORT"]
    conninfo = (f"host=127.0.0.1,127.0.0.1 port={proxy.port},{sport} user=queen_test_sweeper dbname=postgres "
                "target_session_attrs=read-write sslmode=disable")
    proxy.arm(b"log_timers_claim_v4")
    h = make_sweeper(conninfo, "lostclaim-fo", apply_schema=False, connect_timeout_ms=3000,
                     sweeper_lease_ms=LEASE_MS, sweeper_claim_batch=200, sweeper_claim_batch_max=200)
    nq = None
    try:
        h.start()
        wait_for(lambda: proxy.cut_at is not None, 30, 0.005, "the first claim to commit and its answer to be cut")
        cut = proxy.cut_at
        # The claim on the standby (a hot standby: read-only; replayed within moments of the
        # synchronous commit), read before the promotion lets the sweeper in.
        nq = Queen(connect(pair["QUEEN_PAIR_STANDBY_CONNINFO"]))
        held = wait_for(lambda: nq.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s"
                                       " AND claim_token IS NOT NULL AND claimed_until > now()", (queue,)), 5, 0.01,
                        "the cut claim's rows on the standby")
        sh(ROOT / "tests" / "pgpair", "kill-primary", pair["QUEEN_PAIR_DIR"])
        sh(ROOT / "tests" / "pgpair", "promote", pair["QUEEN_PAIR_DIR"])
        promoted = time.time()
        try:
            wait_for(lambda: nq.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0, 40,
                     0.02, f"every timer to fire on the new primary (the lost claim's rows must not wait out the "
                     f"{LEASE_MS} ms lease)")
        except AssertionError:
            st = h.stats()
            print(f"[lost claim, failover] held {held}; left "
                  f"{nq.one('SELECT count(*) FROM queen.log_timers WHERE queue = %s', (queue,))}; db_state "
                  f"{st['db_state']} ({st['db_last_error']}); fired {st['fired_total']}; failover {st['failover']}\n"
                  f"{h.log_text(30)}")
            raise
        done = time.time()
        wait_for(lambda: h.stats()["failover"]["lost_claims"]["handed_back_total"] >= held, 10, 0.05,
                 "the hand-back to be counted")
        fo = h.stats()["failover"]
        print(f"\n[lost claim, failover] {held} timers of a claim whose answer was cut on the old primary; "
              f"last of all {N} fired {done - cut:.2f} s after the cut, {done - promoted:.2f} s after the "
              f"promotion (lease {LEASE_MS / 1000:.0f} s); lost_claims {fo['lost_claims']}, server {fo['server']}")
        assert held > 0, "the cut claim did not reach the standby: nothing to hand back"
        assert fo["server"] == f"127.0.0.1:{sport}", fo["server"]
        assert fo["lost_claims"]["total"] >= 1 and fo["lost_claims"]["pending"] == 0, fo["lost_claims"]
        assert done - cut < LEASE_MS / 1000 / 2, "the lost claim's rows waited for their lease"
        assert delivered_once(nq, queue, txns) == N
        assert nq.one("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (queue,)) == 0
    finally:
        assert_clean_stop(h)
        proxy.close()
        if nq is not None:
            nq.conn.close()
