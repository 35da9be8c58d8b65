"""1. The KV prune: queen.kv_expire_step_v1 on its own gate, in calls of kv_expire_batch.

A late prune is invisible (kv_live_v1 hides an expired row from the first read after its
instant), so reads are checked with no sweeper at all; the prune then deletes exactly the
expired rows and spares the live ones. Its alarm, expired-but-present rows and the age of
the oldest, is computed on every pass, including passes that delete nothing because
another transaction holds the rows (the prune SKIPs LOCKED, it never waits)."""

import time

from queenkit import assert_clean_stop, wait_for

NS_DEAD = "prune-dead"
NS_LIVE = "prune-live"


def test_prune_deletes_every_expired_row_and_nothing_else(q, sweepers):
    q.kv_insert(NS_DEAD, 5000, expires_sql="now() - interval '1 minute' + g * interval '1 ms'")
    q.kv_insert(NS_LIVE, 150, expires_sql="NULL", prefix="forever")
    q.kv_insert(NS_LIVE, 150, expires_sql="now() + interval '1 hour'", prefix="later")
    # Written through kv_put_v1 with a short ttl, then left to expire.
    for i in range(20):
        q.kv_put(NS_DEAD, f"short{i}", {"i": i}, ttl_ms=50)
    live_before = q.q("SELECT key, version, value FROM queen.kv WHERE namespace = %s ORDER BY key",
                      (NS_LIVE,))
    time.sleep(0.2)
    assert q.kv_count(NS_DEAD, expired=True) == 5020

    # With the sweeper switched off nothing is pruned, yet no read returns a dead row.
    off = sweepers("prune-off", sweeper=False)
    off.start()
    assert off.stats()["state"] == "disabled"
    assert off.messages("sweeper disabled"), off.log_text()
    time.sleep(0.5)
    assert q.kv_count(NS_DEAD) == 5020
    for key in ("k1", "k2500", "k5000", "short0", "short19"):
        assert q.kv_get(NS_DEAD, key) is None, key
    assert q.kv_get(NS_LIVE, "forever1")["value"] == {"n": 1}
    assert q.kv_get(NS_LIVE, "later150")["value"] == {"n": 150}
    # A disabled sweeper never had a loop: stop leaves it "disabled" (no thread to join,
    # so no teardown to report), and close is final.
    off.stop()
    assert off.stats()["state"] == "disabled"
    off.close()
    assert off.closed

    h = sweepers("prune-on", kv_expire_every_ms=200, kv_expire_batch=500)
    h.start()
    try:
        wait_for(lambda: h.stats()["kv_deleted_total"] >= 5020, 20,
                 what="the prune to delete the 5,020 expired rows")
        # One more pass after the last delete reports a clean table.
        wait_for(lambda: h.stats()["kv_expired_not_pruned"] == 0, 5,
                 what="the alarm to fall back to zero")
        st = h.stats()
    finally:
        final = assert_clean_stop(h)
    assert final["kv_deleted_total"] == 5020, final["kv_deleted_total"]
    # In calls of at most kv_expire_batch rows: at least ceil(5020 / 500) calls.
    assert st["kv_prune_calls_total"] >= 11, st["kv_prune_calls_total"]
    assert st["kv_expired_not_pruned_capped"] is False
    assert st["kv_expiry_lag_ms"] == 0
    assert st["phases"]["prune"] == "on"
    assert q.kv_count(NS_DEAD) == 0
    assert q.q("SELECT key, version, value FROM queen.kv WHERE namespace = %s ORDER BY key",
               (NS_LIVE,)) == live_before


class RowLock:
    """Holds the expired rows of a namespace FOR UPDATE in an open transaction."""

    def __init__(self, connections, namespace):
        self.conn = connections(autocommit=False)
        with self.conn.cursor() as cur:
            cur.execute("SELECT key FROM queen.kv WHERE namespace = %s FOR UPDATE", (namespace,))
            self.count = len(cur.fetchall())

    def release(self):
        self.conn.rollback()


def test_prune_skips_locked_rows_and_still_reports_them(q, sweepers, connections):
    ns = "prune-locked"
    q.kv_insert(ns, 1000, expires_sql="now() - interval '10 seconds'")
    lock = RowLock(connections, ns)
    assert lock.count == 1000
    try:
        # Budget 500: the count cap is 8 x 500 = 4000, so all 1000 are reported, uncapped.
        h = sweepers("prune-locked-a", kv_expire_every_ms=100, kv_expire_batch=500)
        h.start()
        try:
            st = wait_for(lambda: (lambda s: s if s["kv_prune_calls_total"] >= 3 else None)(
                h.stats()), 10, what="three prune passes over locked rows")
        finally:
            assert_clean_stop(h)
        assert st["kv_deleted_total"] == 0, st["kv_deleted_total"]
        assert st["kv_expired_not_pruned"] == 1000, st["kv_expired_not_pruned"]
        assert st["kv_expired_not_pruned_capped"] is False
        assert st["kv_expiry_lag_ms"] >= 10000, st["kv_expiry_lag_ms"]
        assert st["cycle_errors_total"] == 0, st["last_error"]
        # Reads are not blocked by the lock and still hide the dead rows.
        assert q.kv_get(ns, "k1") is None

        # Budget 100: the cap is 800 < 1000, so the count stops there and says so.
        h = sweepers("prune-locked-b", kv_expire_every_ms=100, kv_expire_batch=100)
        h.start()
        try:
            st = wait_for(lambda: (lambda s: s if s["kv_prune_calls_total"] >= 2 else None)(
                h.stats()), 10, what="two prune passes with a small batch")
        finally:
            assert_clean_stop(h)
        assert st["kv_deleted_total"] == 0
        assert st["kv_expired_not_pruned"] == 800, st["kv_expired_not_pruned"]
        assert st["kv_expired_not_pruned_capped"] is True
        assert st["kv_expiry_lag_ms"] >= 10000
    finally:
        lock.release()

    # The lock gone, the same rows are pruned and the alarm clears.
    h = sweepers("prune-locked-c", kv_expire_every_ms=100, kv_expire_batch=500)
    h.start()
    try:
        wait_for(lambda: h.stats()["kv_deleted_total"] == 1000, 10,
                 what="the prune of the released rows")
        wait_for(lambda: h.stats()["kv_expired_not_pruned"] == 0, 5, what="the alarm to clear")
        st = h.stats()
        assert st["kv_expired_not_pruned_capped"] is False
        assert st["kv_expiry_lag_ms"] == 0
    finally:
        assert_clean_stop(h)
    assert q.kv_count(ns) == 0


def test_prune_spares_a_row_rewritten_with_a_later_expiry(q, sweepers):
    ns = "prune-rewrite"
    q.kv_insert(ns, 50, expires_sql="now() - interval '1 second'")
    # Rewritten over the dead row: a new key with a later expiry, never pruned.
    q.kv_put(ns, "k7", {"again": True}, ttl_ms=3_600_000)
    h = sweepers("prune-rewrite", kv_expire_every_ms=100, kv_expire_batch=10)
    h.start()
    try:
        wait_for(lambda: h.stats()["kv_deleted_total"] == 49, 10, what="49 rows pruned")
        wait_for(lambda: h.stats()["kv_expired_not_pruned"] == 0, 5, what="the alarm to clear")
    finally:
        assert_clean_stop(h)
    assert q.kv_get(ns, "k7")["value"] == {"again": True}
    assert q.kv_count(ns) == 1
