"""Across a failover: a multi-host conninfo whose first host is down, a sweeper that
lands on a standby, and a primary SIGKILLed mid-run with its synchronous standby promoted.

The pair (tests/pgpair) is shared by the tests of this module, in order: the standby test
needs the standby still a standby, the failover test kills the primary last. Every sweeper
logs in as queen_test_sweeper and every timer is scheduled as queen_test_broker (conftest.py);
the superuser's connections only inspect.
"""

import threading
import time
import uuid
from collections import Counter

from queenkit import (TENANT_A, FiredLog, Queen, assert_clean_stop, closed_port, connect, delivered_once,
                      make_sweeper, op_schedule, sh, ROOT, wait_for, wait_schema)

N_FAILOVER = 20_000
SPREAD_MS = 4_000
PARTITIONS = 40
LEASE_MS = 30_000  # the default: what a failover would cost without the hand-back


def _queen(pair):
    """Inspection as the superuser, scheduling as the broker role, both on the primary."""
    return Queen(connect(pair["QUEEN_PAIR_CONNINFO"]), broker=connect(pair["QUEEN_PAIR_BROKER_CONNINFO"]))


def _close(q):
    q.broker.close()
    q.conn.close()


def test_dead_first_host_connects_to_the_next(pair):
    # Any server will do behind the closed port; the pair's primary is at hand.
    port = closed_port()
    ci = (f"host=127.0.0.1,127.0.0.1 port={port},{pair['QUEEN_PAIR_PRIMARY_PORT']} "
          "user=queen_test_sweeper dbname=postgres")
    fired = FiredLog()
    h = make_sweeper(ci, "dead-first-host", fired=fired, connect_timeout_ms=5000)
    q = _queen(pair)
    try:
        h.start()
        wait_schema(q)
        queue = f"dead-first-{uuid.uuid4().hex[:8]}"
        txns = [f"t{i}" for i in range(50)]
        q.schedule([op_schedule(queue, f"k{i}", b"x", partition="p0", txn=txns[i]) for i in range(50)])
        h.wake(0)
        wait_for(lambda: fired.total() == 50, 60, 0.05, "50 timers fired through the second host")
        st = h.stats()
        assert st["db_state"] == "up", st["db_state"]
        assert st["failover"]["server"] == f"127.0.0.1:{pair['QUEEN_PAIR_PRIMARY_PORT']}", st["failover"]
        assert delivered_once(q, queue, txns) == 50
    finally:
        assert_clean_stop(h)
        _close(q)


def test_standby_only_never_spends_an_attempt(pair):
    q = _queen(pair)
    queue = f"standby-{uuid.uuid4().hex[:8]}"
    q.schedule([op_schedule(queue, f"k{i}", b"x", partition="p0") for i in range(30)])
    # The standby has replayed them (synchronous standby: the commit waited for it).
    sq = Queen(connect(pair["QUEEN_PAIR_STANDBY_CONNINFO"]))
    assert sq.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 30
    h = make_sweeper(pair["QUEEN_PAIR_STANDBY_SWEEPER_CONNINFO"], "standby-only", apply_schema=False)
    try:
        h.start()
        # Let it try for a while: connects, is refused read-write, reconnects.
        wait_for(lambda: h.stats()["pool"]["disconnects_total"] >= 3, 60, 0.1,
                 "the sweeper to have been turned away by the standby a few times")
        st = h.stats()
        logs = "\n".join(m for _t, _l, m in h.logs)
        print(f"\n[standby only] db_state={st['db_state']} db_last_error={st['db_last_error']!r} "
              f"failover={st['failover']} fired={st['fired_total']}")
        # It says why: the server is read-only (25006) or in recovery (BEGIN READ WRITE refused).
        said = st["db_last_error"] + st["last_error"] + logs
        assert "read-only" in said or "during recovery" in said, (st["db_last_error"], logs[-2000:])
        assert st["fired_total"] == 0
        assert st["fire_failures"]["permanent"] == 0 and st["fire_failures"]["config"] == 0, st["fire_failures"]
        assert st["dlq_total"] == 0
        # Nothing was written: every timer unclaimed, no attempt spent, no last_error.
        rows = q.q("SELECT attempts, claim_token IS NULL, last_error IS NULL FROM queen.log_timers"
                   " WHERE queue = %s", (queue,))
        assert len(rows) == 30 and all(r == (0, True, True) for r in rows), rows[:5]
        assert q.one("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (queue,)) == 0
    finally:
        assert_clean_stop(h)
        sq.conn.close()
    # Pointed at both hosts, a sweeper finds the primary and fires them.
    fired = FiredLog()
    h2 = make_sweeper(pair["QUEEN_PAIR_SWEEPER_CONNINFO"], "both-hosts", fired=fired, apply_schema=False)
    try:
        h2.start()
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0, 60, 0.05,
                 "the timers fired on the primary")
    finally:
        assert_clean_stop(h2)
        _close(q)


def test_primary_killed_standby_promoted_every_timer_once(pair):
    q = _queen(pair)
    queue = f"failover-{uuid.uuid4().hex[:8]}"
    txns = [f"txn-{i:05d}" for i in range(N_FAILOVER)]
    ops = [op_schedule(queue, f"k{i:05d}", b"payload-%05d" % i, partition=f"p{i % PARTITIONS:02d}",
                       delay_ms=2000 + (i * SPREAD_MS) // N_FAILOVER, txn=txns[i]) for i in range(N_FAILOVER)]
    t0 = time.monotonic()
    q.schedule(ops)
    print(f"\n[failover] scheduled {N_FAILOVER} timers in {time.monotonic() - t0:.1f}s, due over "
          f"{SPREAD_MS / 1000:.0f}s")
    _close(q)

    fired = [FiredLog() for _ in range(4)]
    hs = [make_sweeper(pair["QUEEN_PAIR_SWEEPER_CONNINFO"], f"fo-{i}", fired=fired[i], apply_schema=False,
                       connect_timeout_ms=3000, sweeper_lease_ms=LEASE_MS) for i in range(4)]
    for h in hs:
        h.start()
    killed_at = None
    try:
        # Kill the primary with about a third of the timers in the log.
        def fired_so_far():
            return sum(f.total() for f in fired)

        wait_for(lambda: fired_so_far() >= N_FAILOVER // 3, 120, 0.01, "a third of the timers fired")
        killed_at = time.time()
        sh(ROOT / "tests" / "pgpair", "kill-primary", pair["QUEEN_PAIR_DIR"])
        at_kill = fired_so_far()
        sh(ROOT / "tests" / "pgpair", "promote", pair["QUEEN_PAIR_DIR"])
        promoted_at = time.time()
        print(f"[failover] primary SIGKILLed with {at_kill} timers announced; standby promoted "
              f"{(promoted_at - killed_at) * 1000:.0f} ms later")

        nq = Queen(connect(pair["QUEEN_PAIR_STANDBY_CONNINFO"]))
        try:
            wait_for(lambda: nq.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0,
                     3 * LEASE_MS / 1000 + 60, 0.05, "every timer fired on the new primary")
        except AssertionError:
            for h in hs:
                st = h.stats()
                print(f"[failover] {h.name}: db_state {st['db_state']} ({st['db_last_error']}), pool {st['pool']}, "
                      f"failover {st['failover']}\n{h.log_text(15)}")
            raise
        wait_for(lambda: fired_so_far() >= N_FAILOVER, 30, 0.05, "every fired timer announced")
        # The sweepers are on the new primary as the least-privilege role, and only as it.
        users = {r[0] for r in nq.q("SELECT usename FROM pg_stat_activity WHERE application_name = 'queen-sweeper'")}
        assert users == {"queen_test_sweeper"}, users
        last_fire = max(c[0] for f in fired for c in f.snapshot())
        # Every sweeper back on the new primary with nothing parked or in doubt. The others may
        # drain every timer while one still waits in its reconnect backoff (seen: one of four
        # still on the old server, a fire in doubt, when the last timer fired).
        new_primary = f"127.0.0.1:{pair['QUEEN_PAIR_STANDBY_PORT']}"

        def settled():
            fos = [h.stats()["failover"] for h in hs]
            return all(fo["server"] == new_primary and fo["in_doubt"]["pending"] == 0 and fo["parked_claims"] == 0
                       for fo in fos)

        wait_for(settled, 30, 0.05, "every sweeper settled on the new primary")
        stats = [h.stats() for h in hs]
        gap_ms = (last_fire - killed_at) * 1000
        print(f"[failover] kill -> last timer fired: {gap_ms:.0f} ms (lease {LEASE_MS} ms: "
              f"{gap_ms / LEASE_MS:.2f} of it)")
        for h, st in zip(hs, stats):
            fo = st["failover"]
            print(f"[failover] {h.name}: fired {st['fired_total']}, lost {fo['lost_total']} "
                  f"({fo['last_lost_phase']} on {fo['lost_server']}), now on {fo['server']}, "
                  f"reconnected +{fo['reconnected_unix_ms'] - int(killed_at * 1000)} ms, "
                  f"resumed +{fo['resumed_unix_ms'] - int(killed_at * 1000)} ms, gap {fo['last_gap_ms']} ms, "
                  f"handed back {fo['handed_back_total']}, in doubt {fo['in_doubt']}")

        # Exactly once in the new primary's log; nothing in the DLQ; nothing pending.
        assert delivered_once(nq, queue, txns) == N_FAILOVER
        assert nq.one("SELECT count(*) FROM queen.log_dlq WHERE queue = %s", (queue,)) == 0
        assert nq.one("SELECT count(*) FROM queen.log_timers WHERE queue = %s", (queue,)) == 0
        # The host heard of every timer exactly once, in-doubt fires included.
        announced_segs = Counter((c[2], c[3], c[5]) for f in fired for c in f.snapshot())
        twice = [(k, n) for k, n in announced_segs.items() if n > 1]
        assert sum(f.total() for f in fired) == N_FAILOVER, (
            [f.total() for f in fired], f"{len(twice)} segments announced more than once, e.g. {twice[:3]}",
            [(h.name, st["failover"]["in_doubt"], st["failover"]["handed_back_total"]) for h, st in zip(hs, stats)])
        assert sum(st["fired_total"] for st in stats) == N_FAILOVER, [st["fired_total"] for st in stats]
        for h, st in zip(hs, stats):
            fo = st["failover"]
            assert fo["server"] == new_primary, (h.name, fo)
            assert fo["in_doubt"]["pending"] == 0 and fo["parked_claims"] == 0, (h.name, fo)
            assert st["dlq_total"] == 0 and st["fire_failures"]["permanent"] == 0, (h.name, st["fire_failures"])
        # Every sweeper saw the loss and the change of server.
        assert all(st["failover"]["server_changes_total"] >= 1 for st in stats), [s["failover"] for s in stats]
        nq.conn.close()
    finally:
        for h in hs:
            assert_clean_stop(h)
