"""Under Patroni: a cluster of two PostgreSQL 15 nodes managed by Patroni with etcd
(tests/patroni/patronikit.py: ttl 10, loop_wait 2, retry_timeout 4, synchronous_mode on,
primary_start_timeout 0), timers scheduled continuously by a broker (the queen_broker role)
and fired by two sweeper processes (the queen_sweeper role): one connects the way an operator
configures it, every host named with target_session_attrs=read-write; the other through
HAProxy routed by Patroni's REST health check (GET /primary).

Three events, one test each, in this order on the same cluster:
  1. kill        the primary's postmaster and its children SIGKILLed; Patroni fails over
  2. switchover  `patronictl switchover --force`; the old primary comes back as a standby
  3. stop        SIGTERM to the primary's Patroni: it stops its PostgreSQL and lets go of
                 the leader key; the replica takes over (the node is started again after)
After each: every timer acknowledged to the broker fired exactly once in the new primary's
log, none lost, none in the DLQ, every fire announced once through on_fired, and the stats'
`failover` object of each sweeper says what happened. One line per event is printed:
  patroni <event>: <N> timers, lost 0, duplicated 0, gap <s> s (kill or switchover -> last
  timer fired), sweeper gap <s> s (new primary writable -> first fire)
where "last timer fired" is the fire of the last timer that was due when the new primary
first accepted a write (the outage's backlog cleared), and "first fire" is the earliest
`failover.resumed_unix_ms` of the two sweepers. Timing never fails a test.
"""

import os
import shutil
import tempfile
import time
import uuid
from collections import Counter

from hakit import LogView, Scheduler, SweeperProc, WritablePoll, connect, pending_on, wait_for
from patronikit import BROKER_ROLE, SWEEPER_ROLE

LEASE_MS = 30_000  # the default: a claim whose answer was lost waits it out


def _start_sweepers(cluster, workdir, knobs=None):
    ways = [("multihost", cluster.conninfo(SWEEPER_ROLE))]
    ways.append(("haproxy", cluster.haproxy_conninfo(SWEEPER_ROLE)))
    return [SweeperProc(workdir, f"ha-{way}-{uuid.uuid4().hex[:6]}", ci, knobs=knobs, way=way) for way, ci in ways]


def _remove_workdir(workdir):
    """The sweepers' files (stats, fired calls, logs): kept with QUEEN_PATRONI_KEEP."""
    if os.environ.get("QUEEN_PATRONI_KEEP"):
        print(f"[patroni] sweeper files kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _announced(sweepers, queue):
    return sum(s.announced(queue) for s in sweepers)


def _dump(cluster, sweepers):
    for s in sweepers:
        st = s.stats() or {}
        print(f"[{s.broker_id}] db_state {st.get('db_state')} ({st.get('db_last_error')}), "
              f"failover {st.get('failover')}\n{s.log_text(20)}")
    print(cluster.tail_logs(15))


def _settle(sweepers, queue, want, timeout=30):
    """Waits until the announcements reach `want` and then stop changing for a second."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = _announced(sweepers, queue)
        if n != last:
            last, since = n, time.monotonic()
        elif n >= want and time.monotonic() - since >= 1.0:
            return n
        time.sleep(0.1)
    return _announced(sweepers, queue)


def _check_exactly_once(log, acked, in_doubt):
    """Every acknowledged timer once; each in-doubt batch all or nothing; nothing else.
    The keys that are in the log (acknowledged plus the in-doubt batches that committed)."""
    dupes = [k for k, n in log.count.items() if n != 1]
    assert not dupes, f"{len(dupes)} timers in the log more than once, e.g. {dupes[:5]}"
    lost = [k for k in acked if k not in log.count]
    assert not lost, f"{len(lost)} acknowledged timers never fired, e.g. {sorted(lost)[:5]}"
    committed = set(acked)
    for batch in in_doubt:
        present = sum(1 for k in batch if k in log.count)
        assert present in (0, len(batch)), f"an in-doubt schedule call half committed: {present}/{len(batch)}"
        if present:
            committed.update(batch)
    extra = set(log.count) - committed
    assert not extra, f"{len(extra)} timers in the log nobody scheduled, e.g. {sorted(extra)[:5]}"
    assert log.dlq == 0, f"{log.dlq} timers in the DLQ"
    assert log.pending == 0, f"{log.pending} timers still in queen.log_timers"
    return committed


def _announced_segments(sweepers, queue):
    segs = Counter()
    for s in sweepers:
        for c in s.fired():
            if c[2] == queue:
                segs[(c[3], int(c[5]), int(c[4]))] += 1
    return segs


def _run_event(cluster, event, trigger, restore=None):
    cluster.wait_healthy(120, sync=True)
    old = cluster.leader()
    candidates = cluster.replicas(old)
    queue = f"ha-{event}-{uuid.uuid4().hex[:8]}"
    workdir = tempfile.mkdtemp(prefix=f"queen-patroni-{event}-")
    sched = Scheduler(cluster.conninfo(BROKER_ROLE), queue)
    sweepers = _start_sweepers(cluster, workdir)
    stats = []
    try:
        sched.start()
        wait_for(lambda: _announced(sweepers, queue) >= 300 and all(s.stats() for s in sweepers), 60, 0.05,
                 "both sweepers firing")
        time.sleep(2.0)  # steady state: both sweepers have fired on the old primary
        before = {s.broker_id: s.stats()["failover"] for s in sweepers}
        poll = WritablePoll(candidates)
        t_event = time.time()
        poll.start()
        detail = trigger(old)
        writable_at = poll.wait()
        assert writable_at is not None, "no other node accepted a write within 120 s of the event\n" + cluster.tail_logs()
        new = poll.node
        # Timers keep coming due for a while after the new primary took over.
        time.sleep(max(0.0, writable_at + 4.0 - time.time()))
        sched.stop()
        assert not sched.is_alive()
        try:
            wait_for(lambda: pending_on(new.conninfo(), queue) == 0, LEASE_MS / 1000 + 60, 0.1,
                     "every scheduled timer fired on the new primary")
        except AssertionError:
            _dump(cluster, sweepers)
            raise
        expected_min = len(sched.acked)
        _settle(sweepers, queue, expected_min)
        stats = [s.stop() for s in sweepers]
        assert all(st is not None for st in stats), "a sweeper did not stop cleanly: " + str(
            [s.p.returncode for s in sweepers])
        if restore is not None:
            restore(old)

        assert cluster.leader() is new, (cluster.leader(), new)
        nconn = connect(new.conninfo())
        try:
            log = LogView(nconn, queue)
        finally:
            nconn.close()
        committed = _check_exactly_once(log, sched.acked, sched.in_doubt)
        n = len(committed)
        announced = _announced(sweepers, queue)
        duplicated = announced - n
        # Every fire in the log announced once, and nothing else announced.
        ann_segs = _announced_segments(sweepers, queue)
        assert ann_segs == log.segments, (
            f"on_fired calls and the log's segments differ: announced-not-logged "
            f"{list((ann_segs - log.segments).items())[:5]}, logged-not-announced "
            f"{list((log.segments - ann_segs).items())[:5]}")
        assert duplicated == 0, f"{duplicated} timers announced more than once"
        assert sum(st["fired_total"] for st in stats) == n, [st["fired_total"] for st in stats]

        for s, st in zip(sweepers, stats):
            fo, fo0 = st["failover"], before[s.broker_id]
            assert fo["server"] == new.address, (s.broker_id, fo["server"], new.address)
            assert fo["lost_total"] > fo0["lost_total"], (s.broker_id, "no loss recorded", fo)
            assert fo["server_changes_total"] > fo0["server_changes_total"], (s.broker_id, "no server change", fo)
            assert fo["last_lost_unix_ms"] >= int(t_event * 1000) - 50, (s.broker_id, fo, t_event)
            # Through HAProxy a connection may also be cut after the new primary was found (a
            # health check that failed once too often marks it down): the last loss may be there.
            assert fo["lost_server"] in ((old.address,) if s.way == "multihost" else (old.address, new.address)), (
                s.broker_id, fo["lost_server"], old.address)
            assert fo["reconnected_unix_ms"] >= fo["last_lost_unix_ms"], (s.broker_id, fo)
            assert fo["in_doubt"]["pending"] == 0 and fo["parked_claims"] == 0, (s.broker_id, fo)
            assert st["dlq_total"] == 0 and st["fire_failures"]["permanent"] == 0, (s.broker_id, st["fire_failures"])
            assert st["state"] == "stopped" and st["teardown_clean"], (s.broker_id, st["state"])

        # The figures.
        backlog_due = [k for k in committed if k in sched.acked and sched.acked[k] <= writable_at * 1000]
        last_fire = max(log.fired_at[k] for k in backlog_due)
        # A sweeper may never resume: the other one may fire every timer left before it is back.
        resumed = [st["failover"]["resumed_unix_ms"] for st in stats
                   if st["failover"]["resumed_unix_ms"] > int(t_event * 1000)]
        assert resumed, "no sweeper fired after the event"
        first_fire = min(resumed) / 1000.0
        gap = last_fire - t_event
        sweeper_gap = first_fire - writable_at
        print(f"\npatroni {event}: {n} timers, lost 0, duplicated 0, gap {gap:.1f} s ({event_word(event)} -> last "
              f"timer fired), sweeper gap {sweeper_gap:.2f} s (new primary writable -> first fire)")
        def since(ms):
            return f"+{ms / 1000 - writable_at:.2f} s" if ms > t_event * 1000 else "never"

        per = ", ".join(
            f"{s.way}: resumed {since(st['failover']['resumed_unix_ms'])} "
            f"(lost {st['failover']['lost_total'] - before[s.broker_id]['lost_total']}, "
            f"read-only {st['failover']['read_only_total']}, handed back {st['failover']['handed_back_total']}, "
            f"in doubt {st['failover']['in_doubt']['fires_total']}/fired {st['failover']['in_doubt']['fired_total']}, "
            f"reconnected {since(st['failover']['reconnected_unix_ms'])})"
            for s, st in zip(sweepers, stats))
        print(f"[patroni {event}] {old.name} -> {new.name}: writable {writable_at - t_event:.2f} s after the "
              f"{event_word(event)}{detail or ''}; {len(sched.in_doubt)} schedule calls in doubt; {per}")
        return stats
    finally:
        if sched.is_alive():
            sched.stop()
        for s in sweepers:
            s.kill()
        _remove_workdir(workdir)


def event_word(event):
    return {"kill": "kill", "switchover": "switchover", "stop": "stop"}[event]


def test_primary_postmaster_killed(cluster):
    def trigger(old):
        old.kill_postmaster()
        return ""

    _run_event(cluster, "kill", trigger)


def test_switchover(cluster):
    def trigger(old):
        t0 = time.time()
        cluster.switchover()
        return f" (patronictl returned in {time.time() - t0:.1f} s)"

    _run_event(cluster, "switchover", trigger)
    # The old primary is back, as a streaming standby of the new one.
    cluster.wait_healthy(120, sync=True)


def test_primary_patroni_stopped(cluster):
    def trigger(old):
        took = old.stop_patroni()
        return f" (Patroni and its PostgreSQL gone in {took:.1f} s)"

    def restore(old):
        old.start_patroni()

    _run_event(cluster, "stop", trigger, restore)
    cluster.wait_healthy(120, sync=True)
