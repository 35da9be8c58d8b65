"""No fire goes unannounced, and a lost connection's claims do not wait out the lease.

Both tests lose the connection of a fire at a chosen instant on a private cluster:

- while the fire waits for a partition lock the test holds (before its COMMIT): the fire
  did not commit, its timers are still claimed under this sweeper's tokens. The sweeper
  finds that out after reconnecting, hands the claims back at once (not after the 60 s
  lease) and fires them in a later call: every timer once, announced once.
- while its COMMIT waits for a synchronous standby that does not exist
  (synchronous_standby_names = 'nobody'): the transaction committed locally, then
  pg_terminate_backend ends the session before the answer is sent. The sweeper finds the
  segment in the log after reconnecting and calls on_fired for it.
"""

import time
import uuid

from queenkit import (FiredLog, Queen, assert_clean_stop, backend_of, connect,
                      delivered_once, make_sweeper, op_schedule, wait_for)

N = 5


def _setting(ci, name):
    c = connect(ci)
    try:
        with c.cursor() as cur:
            cur.execute("SELECT current_setting(%s)", (name,))
            return cur.fetchone()[0]
    finally:
        c.close()

LEASE_MS = 60_000


def _setup(private_pg, name):
    ci = private_pg["QUEEN_TEST_CONNINFO"]
    # Inspection and setup as the superuser, scheduling as the broker role.
    q = Queen(connect(ci), broker=connect(private_pg["QUEEN_TEST_BROKER_CONNINFO"]))
    queue = f"in-doubt-{name}-{uuid.uuid4().hex[:8]}"
    part_id = q.provision("00000000-0000-0000-0000-000000000001", queue, "p0")
    fired = FiredLog()
    # The sweeper runs as the least-privilege role (queen_sweeper only): the in-doubt check
    # must work without reading any table (queen.log_timers_in_doubt_v1 answers for it).
    h = make_sweeper(private_pg["QUEEN_TEST_SWEEPER_CONNINFO"], f"in-doubt-{name}", fired=fired, pool_size=2,
                     sweeper_lease_ms=LEASE_MS,
                     sweeper_max_sleep_ms=100)
    h.start()
    wait_for(lambda: h.stats()["cycles_total"] >= 2, 30, 0.02, "the sweeper cycling")
    return ci, q, queue, part_id, fired, h


def _schedule_behind_lock(ci, q, queue, part_id, h):
    # The log's segment table held ACCESS EXCLUSIVE (an operator's maintenance): the whole
    # fire call waits inside one transaction. (A partition someone holds is never waited on
    # for long: the fire keeps those segments and tries again, so it cannot hold a call.)
    lock = connect(ci, autocommit=False)
    lock.cursor().execute("LOCK TABLE queen.log_segments IN ACCESS EXCLUSIVE MODE")
    txns = [f"txn-{i}" for i in range(N)]
    q.schedule([op_schedule(queue, f"k{i}", b"payload-%d" % i, partition="p0", txn=txns[i]) for i in range(N)])
    h.wake(0)
    pids = wait_for(lambda: backend_of(q, "%log_timers_fire_v%", wait_event_type="Lock"), 30, 0.02,
                    "the fire waiting for the locked table")
    claimed_until = q.one("SELECT max(claimed_until) FROM queen.log_timers WHERE queue = %s", (queue,))
    return lock, txns, pids[0], claimed_until


def test_fire_lost_before_commit_is_handed_back_and_fired_once(private_pg):
    ci, q, queue, part_id, fired, h = _setup(private_pg, "not-fired")
    try:
        lock, txns, pid, claimed_until = _schedule_behind_lock(ci, q, queue, part_id, h)
        q.one("SELECT pg_terminate_backend(%s)", (pid,))
        # The connection is gone before any COMMIT: the fire is in doubt until the sweeper
        # looks. Let the lock go only once the fire's backend has gone away.
        wait_for(lambda: not q.one("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)), 30, 0.02,
                 "the fire's backend to end")
        lock.close()
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0, 45, 0.05,
                 "the timers to fire after the hand-back")
        wait_for(lambda: fired.total() == N, 10, 0.02, "on_fired for every timer")
        st = h.stats()
        fo = st["failover"]
        print(f"\n[in-doubt not fired] failover stats: {fo}")
        assert fo["in_doubt"]["fires_total"] >= 1, fo
        assert fo["in_doubt"]["not_fired_total"] >= 1, fo
        assert fo["in_doubt"]["fired_total"] == 0, fo
        assert fo["in_doubt"]["pending"] == 0, fo
        assert fo["handed_back_total"] == N, fo
        assert fo["lost_total"] >= 1 and fo["last_lost_phase"] == "fire", fo
        assert st["fired_total"] == N, st["fired_total"]
        # Fired while the old claims were still live: handed back, not waited out.
        last_fire = q.one("SELECT max(s.created_at) FROM queen.log_segments s"
                          " JOIN queen.log_partitions p ON p.id = s.partition_id WHERE p.id = %s", (part_id,))
        assert last_fire < claimed_until, (last_fire, claimed_until)
        # No attempt was spent and nothing went to the DLQ.
        assert q.one("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (queue,)) == 0
        assert delivered_once(q, queue, txns) == N
        assert sum(c[4] for c in fired.snapshot()) == N
    finally:
        assert_clean_stop(h)
        q.broker.close()
        q.conn.close()


def test_fire_committed_but_answer_lost_is_announced(private_pg):
    ci, q, queue, part_id, fired, h = _setup(private_pg, "fired")
    admin = connect(ci)
    try:
        # Commits of sessions started from now on wait for a synchronous standby once one
        # is named; the sweeper's sessions started before, so it is reconnected first.
        admin.cursor().execute("ALTER SYSTEM SET synchronous_commit = 'on'")
        admin.cursor().execute("SELECT pg_reload_conf()")
        before = h.stats()["pool"]["connects_total"]
        for pid in q.q("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                       " AND application_name = 'queen-sweeper'"):
            q.one("SELECT pg_terminate_backend(%s)", (pid[0],))
        wait_for(lambda: h.stats()["pool"]["connects_total"] >= before + 2, 30, 0.05, "the sweeper reconnected")
        lost_before = h.stats()["failover"]["lost_total"]

        lock, txns, pid, _cu = _schedule_behind_lock(ci, q, queue, part_id, h)
        admin.cursor().execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.cursor().execute("SELECT pg_reload_conf()")
        wait_for(lambda: _setting(ci, "synchronous_standby_names") == "nobody", 30, 0.05, "the reload")
        time.sleep(0.3)  # the checkpointer publishes the standby list to committing backends
        lock.close()
        wait_for(lambda: backend_of(q, "%", wait_event="SyncRep") == [pid], 30, 0.02,
                 "the fire's COMMIT waiting for the (absent) synchronous standby")
        # Committed locally; the answer never leaves the server.
        q.one("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: not q.one("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)), 30, 0.02,
                 "the fire's backend to end")
        admin.cursor().execute("ALTER SYSTEM RESET synchronous_standby_names")
        admin.cursor().execute("SELECT pg_reload_conf()")
        assert q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0
        assert delivered_once(q, queue, txns) == N

        wait_for(lambda: fired.total() == N, 45, 0.05, "on_fired for the fire whose answer was lost")
        # The host hears of the timers (on_fired, from the loop) before the loop counts and
        # publishes the resolution: the figures are read once they are there.
        wait_for(lambda: h.stats()["failover"]["in_doubt"]["fired_total"] >= 1, 10, 0.02, "the resolution in the stats")
        st = h.stats()
        fo = st["failover"]
        print(f"\n[in-doubt fired] failover stats: {fo}")
        assert fo["lost_total"] > lost_before, fo
        assert fo["in_doubt"]["fired_total"] == 1, fo
        assert fo["in_doubt"]["timers_announced_total"] == N, fo
        assert fo["in_doubt"]["pending"] == 0, fo
        assert st["fired_total"] == N, st["fired_total"]
        calls = fired.snapshot()
        assert [(c[2], c[3], c[4]) for c in calls] == [(queue, "p0", N)], calls
    finally:
        try:
            admin.cursor().execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.cursor().execute("ALTER SYSTEM RESET synchronous_commit")
            admin.cursor().execute("SELECT pg_reload_conf()")
        finally:
            admin.close()
            assert_clean_stop(h)
            q.broker.close()
            q.conn.close()
