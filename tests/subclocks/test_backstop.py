"""5. The ephemeral backstop: the in-RAM engine handed to the sweeper with set_backstop.

Every ring runs its own lease expiry, ttl head-drop and idle GC on each touch; the
backstop is for the rings nobody touches, once a second on its own timer, with no
connection, no lane slot and no lock outside the engine. So it keeps working while the
database is down: this test runs against a private cluster that it stops and resumes."""

import time

import pytest

from queenkit import assert_clean_stop, now_ms, wait_for
from queen_sweeper import Ephemeral, NotFound, StateError


def bs(h):
    return h.stats()["backstop"]


def test_backstop_redelivers_drops_and_collects_even_with_the_database_down(
        private_cluster, sweepers):
    engine = Ephemeral(lease_ms=30000, max_retries=5, idle_gc_ms=800)
    h = sweepers("backstop", conninfo_override=private_cluster.conninfo,
                 sweeper_transient_backoff_ms=200, connect_timeout_ms=500,
                 sweeper_idle_max_sleep_ms=200)
    try:
        h.set_backstop(engine)
        h.start()
        wait_for(lambda: h.stats()["db_state"] == "up", 15, what="the private database up")
        st = h.stats()
        assert st["phases"]["backstop"] == "on", st["phases"]

        # --- a lapsed lease on a ring nobody touches is redelivered ------------------------
        engine.push("lease-q", "p0", b"lease me")
        m1 = engine.pop("lease-q", "p0", "workers", lease_ms=300)
        assert m1.attempt == 1
        wait_for(lambda: bs(h)["redelivered_total"] == 1, 5,
                 what="the backstop to redeliver the lapsed lease")
        late = now_ms() - m1.lease_expires_unix_ms
        # The failure guarded against is a lease never redelivered; the bound is loose on purpose.
        assert late <= 4000, f"redelivered {late} ms after the lease lapsed (backstop: 1 s)"
        m2 = engine.pop("lease-q", "p0", "workers", lease_ms=30000)
        assert (m2.offset, m2.attempt, m2.payload) == (m1.offset, 2, b"lease me")
        engine.ack("lease-q", "p0", "workers", m2.offset, m2.lease_id)

        # --- a declared queue's ttl drops the message nobody consumed ---------------------
        engine.declare("ttl-q", ttl_ms=300)
        engine.push("ttl-q", "p0", b"short-lived")
        assert engine.queue_info("ttl-q")["messages"] == 1
        wait_for(lambda: bs(h)["ttl_dropped_total"] >= 1, 5,
                 what="the backstop to drop the message past its ttl")
        info = engine.queue_info("ttl-q")
        assert info["messages"] == 0 and info["declared"] is True   # declared: kept

        # --- an idle implicit queue is collected -------------------------------------------
        engine.push("idle-q", "p0", b"x")
        m = engine.pop("idle-q", "p0", "g")
        engine.ack("idle-q", "p0", "g", m.offset, m.lease_id)
        wait_for(lambda: bs(h)["queues_collected_total"] >= 1, 5,
                 what="the backstop to collect the idle implicit queue")

        def collected():
            try:
                engine.queue_info("idle-q")
                return False
            except NotFound:
                return True
        wait_for(collected, 3, what="idle-q to be gone")
        engine.queue_info("ttl-q")   # a declared queue is never collected

        # --- the database goes away; the backstop does not notice --------------------------
        private_cluster.halt()
        wait_for(lambda: h.stats()["db_state"] == "down", 20, what='db_state "down"')
        down = h.stats()
        runs0 = down["backstop"]["runs_total"]
        engine.push("down-q", "p0", b"while down")
        md = engine.pop("down-q", "p0", "workers", lease_ms=300)
        wait_for(lambda: bs(h)["redelivered_total"] == 2, 5,
                 what="a lease lapsing while the database is down to be redelivered")
        wait_for(lambda: bs(h)["runs_total"] >= runs0 + 3, 5,
                 what="the backstop to keep running while the database is down")
        st_down = h.stats()
        assert st_down["db_state"] == "down", st_down["db_state"]
        assert st_down["backstop"]["failures_total"] == 0
        assert st_down["phases"]["backstop"] == "on"
        md2 = engine.pop("down-q", "p0", "workers")
        assert (md2.offset, md2.attempt) == (md.offset, 2)
        engine.ack("down-q", "p0", "workers", md2.offset, md2.lease_id)

        # --- back up: the loop reconnects ------------------------------------------------
        private_cluster.resume()
        wait_for(lambda: h.stats()["db_state"] == "up", 30, what="the database up again")
        cycles = h.stats()["cycles_total"]
        wait_for(lambda: h.stats()["cycles_total"] > cycles + 2, 10, what="cycles after resume")
        with pytest.raises(StateError):
            engine.close()   # still the backstop of a running sweeper
        es = engine.stats()
        # Every redelivery and drop here was the backstop's: nobody touched those rings.
        assert es["redelivered_total"] == 2 and es["ttl_dropped_total"] == 1, es
    finally:
        if not private_cluster.up:
            private_cluster.resume()
        final = assert_clean_stop(h, timeout_ms=20000)
        engine.close()
    assert final["backstop"]["redelivered_total"] == 2
    assert final["backstop"]["exhausted_total"] == 0
    assert engine.closed
