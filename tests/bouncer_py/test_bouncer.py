"""Behind PgBouncer in transaction pooling mode (server pool of 4, tests/bouncer).

- Four sweepers (16 client connections) fire 8,000 timers exactly once through it.
- Nothing the plugin sets leaks: after the sweepers ran, every server connection of the
  pool, as a plain client sees it, has every setting at the server's default.
- Claim, fire, release (a graceful stop's hand-back), KV prune and usage rollup work.
- A short chaos run: the real server's backends terminated three times and the bouncer
  SIGKILLed and restarted while 6,000 timers fire: every timer once, announced once.

Least privilege, as in production: the sweepers log in through the bouncer as
queen_test_sweeper (member of queen_sweeper only) and timers are scheduled through it as
queen_test_broker (queen_broker only). The superuser applies the schema (conftest.py) and, on a
direct connection, sets up and inspects (table reads, locks, pg_terminate_backend).
"""

import os
import threading
import time
import uuid

from bouncerkit import (TENANT_A, FiredLog, PartitionLock, admin, assert_clean_stop, close_queen, connect,
                        delivered_once, make_sweeper, op_schedule, queen, restart, wait_for)

# What the plugin pins per transaction (and a few it must leave alone): none may differ
# from the server's own default on a pooled server connection afterwards.
SETTINGS = ["statement_timeout", "client_connection_check_interval", "search_path", "bytea_output",
            "lock_timeout", "idle_in_transaction_session_timeout", "DateStyle", "IntervalStyle", "TimeZone",
            "extra_float_digits", "standard_conforming_strings", "row_security", "jit", "synchronous_commit",
            "default_transaction_isolation", "default_transaction_read_only", "application_name",
            "client_min_messages", "work_mem"]


def _schedule(q, queue, n, partitions, spread_ms=0):
    txns = [f"txn-{i:05d}" for i in range(n)]
    q.schedule([op_schedule(queue, f"k{i:05d}", b"payload-%05d" % i, partition=f"p{i % partitions:02d}",
                            delay_ms=(i * spread_ms) // n if spread_ms else 0, txn=txns[i]) for i in range(n)])
    return txns


def _left(q, queue):
    return q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,))


def test_four_sweepers_exactly_once_through_the_bouncer(bouncer, direct_conninfo):
    q = queen(bouncer, direct_conninfo)
    queue = f"bouncer-eo-{uuid.uuid4().hex[:8]}"
    txns = _schedule(q, queue, 8000, 20)
    fired = [FiredLog() for _ in range(4)]
    hs = [make_sweeper(bouncer["QUEEN_BOUNCER_SWEEPER_CONNINFO"], f"bq-{i}", fired=fired[i], apply_schema=False,
                       pool_size=4) for i in range(4)]
    try:
        for h in hs:
            h.start()
        wait_for(lambda: _left(q, queue) == 0, 180, 0.05, "the timers to drain through the bouncer")
        wait_for(lambda: sum(f.total() for f in fired) == 8000, 30, 0.05, "every fire announced")
        # The server connections the bouncer opened for this database (the superuser's own direct
        # one aside) belong to the least-privilege roles; one left idle in the pool by the
        # superuser's schema apply (conftest.py) may still be there.
        rows = q.q("SELECT usename, state FROM pg_stat_activity WHERE backend_type = 'client backend'"
                   " AND datname = current_database() AND pid <> pg_backend_pid()")
        assert any(u == "queen_test_sweeper" for u, _s in rows), rows
        assert all(u in ("queen_test_sweeper", "queen_test_broker") or st == "idle" for u, st in rows), rows
        stats = [h.stats() for h in hs]
        print("\n[bouncer exactly-once] fired per sweeper: "
              + ", ".join(f"{h.name}={s['fired_total']} (calls failed {s['pool']['calls_failed_total']}, "
                          f"disconnects {s['pool']['disconnects_total']})" for h, s in zip(hs, stats)))
        assert sum(s["fired_total"] for s in stats) == 8000
        assert all(s["duplicate_total"] == 0 and s["dlq_total"] == 0 for s in stats)
        assert all(s["pool"]["calls_failed_total"] == 0 for s in stats), [s["pool"] for s in stats]
        assert delivered_once(q, queue, txns) == 8000
    finally:
        for h in hs:
            assert_clean_stop(h)
        close_queen(q)


def test_nothing_the_plugin_sets_leaks_to_the_next_client(bouncer, direct_conninfo):
    # A sweeper has just used every server connection of the pool (the test above, and
    # this short run to be sure of it).
    q = queen(bouncer, direct_conninfo)
    queue = f"bouncer-leak-{uuid.uuid4().hex[:8]}"
    _schedule(q, queue, 2000, 10)
    hs = [make_sweeper(bouncer["QUEEN_BOUNCER_SWEEPER_CONNINFO"], f"leak-{i}", apply_schema=False) for i in range(2)]
    for h in hs:
        h.start()
    try:
        wait_for(lambda: _left(q, queue) == 0, 120, 0.05, "the timers to drain")
    finally:
        for h in hs:
            assert_clean_stop(h)

    # The server's defaults, as a fresh direct session sees them.
    with q.conn.cursor() as cur:
        direct = {}
        for name in SETTINGS:
            cur.execute("SELECT current_setting(%s)", (name,))
            direct[name] = cur.fetchone()[0]
    # Plain clients through the bouncer, each inside an open transaction, so together they
    # hold every server connection of the pool at once.
    # application_name is a startup parameter the bouncer tracks: a client that sends its
    # own gets its own on whichever server connection it lands.
    # The clients log in as the sweepers' role: the bouncer pools per user, so only they can
    # land on the server connections the sweepers used.
    clients = [connect(bouncer["QUEEN_BOUNCER_SWEEPER_CONNINFO"] + " application_name=plain-client",
                       autocommit=False)
               for _ in range(bouncer["POOL"])]
    try:
        seen_pids = set()
        leaked = []
        for c in clients:
            with c.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                pid = cur.fetchone()[0]
                seen_pids.add(pid)
                for name in SETTINGS:
                    cur.execute("SELECT current_setting(%s)", (name,))
                    value = cur.fetchone()[0]
                    if name == "application_name":
                        continue  # compared below
                    if value != direct[name]:
                        leaked.append((pid, name, value, direct[name]))
                cur.execute("SELECT current_setting('application_name')")
                assert cur.fetchone()[0] == "plain-client"
        assert len(seen_pids) == bouncer["POOL"], f"expected {bouncer['POOL']} server connections, got {seen_pids}"
        used = q.one("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (list(seen_pids),))
        assert used == bouncer["POOL"]
        assert not leaked, f"settings left on pooled server sessions: {leaked}"
        print(f"\n[bouncer leak] {len(SETTINGS)} settings on {len(seen_pids)} server connections: all at the "
              "server's default")
    finally:
        for c in clients:
            c.rollback()
            c.close()
        close_queen(q)


def test_claim_fire_release_prune_rollup_through_the_bouncer(bouncer, direct_conninfo):
    q = queen(bouncer, direct_conninfo)
    ns = f"bouncer-kv-{uuid.uuid4().hex[:8]}"
    q.q("INSERT INTO queen.kv (tenant_id, namespace, key, value, expires_at)"
        " SELECT %s::uuid, %s, 'k' || g, jsonb_build_object('n', g), now() - interval '1 minute'"
        "   FROM generate_series(1, 300) g", (TENANT_A, ns))
    queue = f"bouncer-rel-{uuid.uuid4().hex[:8]}"
    part = q.provision(TENANT_A, queue, "p0")
    fired = FiredLog()
    # One timer per fire call (1 KiB cap, 600 incompressible bytes each), so a stop mid-claim has
    # claims left to hand back.
    h = make_sweeper(bouncer["QUEEN_BOUNCER_SWEEPER_CONNINFO"], "bouncer-phases", fired=fired, apply_schema=False,
                     kv_expire_every_ms=100, kv_usage_every_ms=200, sweeper_max_fire_bytes=1024)
    lock = None
    try:
        h.start()
        wait_for(lambda: q.one("SELECT count(*) FROM queen.kv WHERE namespace = %s", (ns,)) == 0, 60, 0.05,
                 "the prune to delete the expired keys through the bouncer")
        wait_for(lambda: h.stats()["rollup"]["runs_total"] >= 2, 60, 0.05, "the usage rollup to run")
        # Release: the fire of the first timer waits on a partition lock; a graceful stop then
        # lets it finish and hands the rest of the claim back.
        lock = PartitionLock(direct_conninfo, [part])
        q.schedule([op_schedule(queue, f"k{i}", os.urandom(600), partition="p0") for i in range(10)])
        h.wake(0)
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s"
                               " AND claim_token IS NOT NULL", (queue,)) == 10, 30, 0.02, "the claim")
        stopper = threading.Thread(target=lambda: h.sw.stop(timeout_ms=30000))
        stopper.start()
        wait_for(lambda: h.stats()["state"] == "stopping", 10, 0.01, "the stop to begin")
        lock.release()
        stopper.join(60)
        st = h.stats()
        print(f"\n[bouncer phases] claims {st['claims_total']}, fired {st['fired_total']}, released at stop "
              f"{st['released_on_stop_total']}, kv deleted {st['kv_deleted_total']}, rollups "
              f"{st['rollup']['runs_total']}, phases {st['phases']}")
        assert st["kv_deleted_total"] >= 300
        assert st["fired_total"] >= 1 and st["released_on_stop_total"] >= 1
        assert st["fired_total"] + st["released_on_stop_total"] == 10, st
        left = q.q("SELECT claim_token FROM queen.log_timers WHERE queue = %s", (queue,))
        assert len(left) == st["released_on_stop_total"] and all(r[0] is None for r in left), left
        assert st["phases"]["prune"] == "on" and st["phases"]["rollup"] == "on", st["phases"]
    finally:
        if lock is not None:
            lock.close()
        assert_clean_stop(h)
        q.q("DELETE FROM queen.log_timers WHERE queue = %s", (queue,))
        close_queen(q)


def test_chaos_terminated_backends_and_a_bouncer_restart(bouncer, direct_conninfo):
    q = queen(bouncer, direct_conninfo)
    queue = f"bouncer-chaos-{uuid.uuid4().hex[:8]}"
    n = 6000
    txns = _schedule(q, queue, n, 30, spread_ms=4000)
    fired = [FiredLog() for _ in range(3)]
    hs = [make_sweeper(bouncer["QUEEN_BOUNCER_SWEEPER_CONNINFO"], f"bchaos-{i}", fired=fired[i], apply_schema=False,
                       sweeper_lease_ms=30000) for i in range(3)]
    try:
        for h in hs:
            h.start()
        total = lambda: sum(f.total() for f in fired)  # noqa: E731
        for k, at in enumerate((n // 6, n // 3, n // 2)):
            wait_for(lambda: total() >= at, 120, 0.01, f"{at} timers fired")
            killed = q.q("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                         "   AND datname = current_database() AND application_name <> 'psql'")
            print(f"\n[bouncer chaos] round {k + 1}: {len(killed)} server backends terminated at {total()} fired")
        wait_for(lambda: total() >= 2 * n // 3, 120, 0.01, "two thirds fired")
        restart(bouncer)
        print(f"[bouncer chaos] bouncer SIGKILLed and restarted at {total()} fired")
        wait_for(lambda: _left(q, queue) == 0, 180, 0.05, "every timer fired")
        wait_for(lambda: total() >= n, 30, 0.05, "every fire announced")
        stats = [h.stats() for h in hs]
        for h, st in zip(hs, stats):
            fo = st["failover"]
            print(f"[bouncer chaos] {h.name}: fired {st['fired_total']}, lost {fo['lost_total']}, handed back "
                  f"{fo['handed_back_total']}, in doubt {fo['in_doubt']}")
        assert delivered_once(q, queue, txns) == n
        assert q.one("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (queue,)) == 0
        assert total() == n, [f.total() for f in fired]
        assert sum(st["fired_total"] for st in stats) == n
        assert all(st["failover"]["in_doubt"]["pending"] == 0 for st in stats)
    finally:
        for h in hs:
            assert_clean_stop(h)
        close_queen(q)
