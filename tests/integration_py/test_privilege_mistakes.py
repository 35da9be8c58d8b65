"""Privilege mistakes never dead-letter (issue 8, item 7).

Before, after a REVOKE every due timer was in queen.log_dlq within seconds: the class 42
error of the fire was replayed timer by timer, each spending its attempts. A configuration
error is never one timer's fault: the claims are handed back (no attempt spent), the fire
backs off and says so loudly (stats, metrics, log), and once the grant is back every timer
fires exactly once."""

from queenkit import TENANT_A, FiredLog, assert_clean_stop, op_schedule, wait_for

FIRE_FN = ("queen.log_timers_fire_v2(uuid[], text[], text[], int[], bytea[], bytea[], text[], int[],"
           " uuid[], timestamptz, boolean, tid[], boolean, tid[])")
N = 50


def test_a_revoked_fire_spends_no_attempt_and_recovers_when_granted(q, sweepers):
    q.schedule([op_schedule("revoked", f"k{i:02d}", b"p%d" % i, partition=f"p{i % 3}") for i in range(N)])
    fired = FiredLog()
    q.q(f"REVOKE EXECUTE ON FUNCTION {FIRE_FN} FROM queen_sweeper")
    try:
        h = sweepers("revoked", fired=fired, sweeper_max_attempts=2, sweeper_backoff_min_ms=200,
                     sweeper_backoff_max_ms=400)
        h.start()
        # Several refused fires: each would have spent an attempt before (2 are the max).
        wait_for(lambda: h.stats()["fire_failures"]["config"] >= 3, 30, 0.02, "refused fires")
        st = h.stats()
        assert st["fired_total"] == 0
        assert st["dlq_total"] == 0
        assert q.one("SELECT count(*) FROM queen.log_dlq") == 0
        assert q.one("SELECT max(attempts) FROM queen.log_timers") == 0, "a config error spent an attempt"
        assert q.one("SELECT count(*) FROM queen.log_timers WHERE claim_token IS NOT NULL"
                     " AND claimed_until > now() + interval '5 s'") == 0, "claims were left to the lease"
        assert "42501" in st["last_error"], st["last_error"]
        assert st["healthy"] is False
        assert any("no timer spends an attempt" in line for line in h.log_text(200).splitlines()), h.log_text()
        metrics = h.sw.metrics()
        assert 'queen_sweeper_errors_total{phase="fire",class="config"}' in metrics
    finally:
        q.q(f"GRANT EXECUTE ON FUNCTION {FIRE_FN} TO queen_sweeper")
    h.wake(0)
    wait_for(lambda: q.timers_left() == 0 and fired.total() == N, 60, 0.05, "every timer once the grant is back")
    st = assert_clean_stop(h)
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, "revoked")]
    assert len(delivered) == len(set(delivered)) == N
    assert st["dlq_total"] == 0
