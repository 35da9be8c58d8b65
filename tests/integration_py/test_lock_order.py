"""8. Lock order: no deadlock between the sweeper and everything else that writes.

For 30 seconds (QUEEN_FIRE_LOCK_ORDER_SECONDS overrides), from separate connections and
threads: schedules (including replacements of existing keys), reschedules, cancels, plain
pushes (queen.log_push_v1) into the very partitions the timers fire into, and "wire"
transactions that schedule timers and then push into two partitions in one transaction
(the broker-wide order: log_timers, then log_partitions in ascending id); meanwhile two
sweepers with two fire workers each fire everything that falls due.

Zero deadlocks: no client sees SQLSTATE 40P01, no sweeper logs it, and the database's own
pg_stat_database.deadlocks counter does not move. Afterwards the log is consistent: no
transaction id appears twice and no timer is left behind."""

import json
import os
import random
import threading
import time
import uuid

import psycopg2

from queenkit import (TENANT_A, TENANT_B, Queen, assert_clean_stop, op_cancel,
                      op_reschedule, op_schedule, txn_hash, wait_for)

QUEUES = ["lo0", "lo1", "lo2"]
PARTS = [f"p{i}" for i in range(6)]
TENANTS = [TENANT_A, TENANT_B]
KEYSPACE = 300


def _deadlocks(q):
    q.q("SELECT pg_stat_clear_snapshot()")
    return q.one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")


def test_no_deadlock_under_concurrent_schedule_reschedule_cancel_fire_and_push(
        q, sweepers, connections):
    seconds = float(os.environ.get("QUEEN_FIRE_LOCK_ORDER_SECONDS", "30"))
    # Provision every queue and partition up front, so the pushes and the fire contend on
    # existing partition rows from the first second.
    for t in TENANTS:
        for qu in QUEUES:
            for p in PARTS:
                q.provision(t, qu, p)
    deadlocks_before = _deadlocks(q)

    knobs = dict(sweeper_parallelism=2, sweeper_claim_batch=50, sweeper_max_sleep_ms=50,
                 sweeper_lease_ms=5000, sweeper_max_fire_bytes=16 * 1024)
    hs = [sweepers("lockorder-a", **knobs), sweepers("lockorder-b", **knobs)]
    for h in hs:
        h.start()

    stop = threading.Event()
    lock = threading.Lock()
    counts = {}
    deadlocks = []
    unexpected = []

    def bump(name, n=1):
        with lock:
            counts[name] = counts.get(name, 0) + n

    def guarded(name, body):
        def run():
            conn = connections()
            rng = random.Random(hash(name))
            while not stop.is_set():
                try:
                    body(conn, rng)
                    bump(name)
                except psycopg2.Error as e:
                    try:
                        conn.rollback()
                    except psycopg2.Error:
                        pass
                    if e.pgcode == "40P01":
                        deadlocks.append((name, str(e).strip()))
                    else:
                        unexpected.append((name, e.pgcode, str(e).strip()))
                        return
        return threading.Thread(target=run, name=name)

    def rand_key(rng):
        return rng.choice(TENANTS), rng.choice(QUEUES), f"k{rng.randrange(KEYSPACE):04d}"

    def schedules(conn, rng):
        tenant, queue = rng.choice(TENANTS), rng.choice(QUEUES)
        keys = rng.sample(range(KEYSPACE), 20)
        ops = [op_schedule(queue, f"k{k:04d}", os.urandom(rng.randrange(50, 800)),
                           partition=rng.choice(PARTS), delay_ms=rng.randrange(0, 300),
                           txn=uuid.uuid4().hex) for k in keys]
        res = Queen(conn).apply(ops, tenant)
        bump("scheduled", sum(1 for r in res if r["status"] == "scheduled"))
        bump("schedule too_late", sum(1 for r in res if r["status"] == "too_late"))

    def reschedules(conn, rng):
        tenant, queue, _ = rand_key(rng)
        keys = rng.sample(range(KEYSPACE), 10)
        ops = [op_reschedule(queue, f"k{k:04d}", rng.randrange(0, 200)) for k in keys]
        res = Queen(conn).apply(ops, tenant)
        bump("rescheduled", sum(1 for r in res if r["status"] == "rescheduled"))

    def cancels(conn, rng):
        tenant, queue, _ = rand_key(rng)
        keys = rng.sample(range(KEYSPACE), 10)
        res = Queen(conn).apply([op_cancel(queue, f"k{k:04d}") for k in keys], tenant)
        bump("cancelled", sum(1 for r in res if r["status"] == "cancelled"))
        time.sleep(0.01)

    def push_once(cur, rng, tenant, queue, part):
        n = rng.randrange(1, 5)
        hashes = b"".join(txn_hash(uuid.uuid4().hex) for _ in range(n))
        cur.execute("SELECT queen.log_push_v1(%s::uuid, %s, %s, %s, %s, %s, now())",
                    (tenant, queue, part, n, hashes, os.urandom(200)))
        bump("pushed messages", n)

    def pushes(conn, rng):
        with conn.cursor() as cur:
            push_once(cur, rng, rng.choice(TENANTS), rng.choice(QUEUES), rng.choice(PARTS))

    def wire(conn, rng):
        # One broker transaction: timers first (log_timers), then two partitions in
        # ascending id order (log_partitions): the broker-wide lock order.
        conn.autocommit = False
        try:
            tenant, queue = rng.choice(TENANTS), rng.choice(QUEUES)
            keys = rng.sample(range(KEYSPACE), 5)
            ops = [op_schedule(queue, f"k{k:04d}", b"wire", partition=rng.choice(PARTS),
                               delay_ms=rng.randrange(0, 100), txn=uuid.uuid4().hex)
                   for k in keys]
            with conn.cursor() as cur:
                cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s::uuid, NULL, now())",
                            (json.dumps(ops), tenant))
                cur.fetchall()
                two = sorted(rng.sample(PARTS, 2))
                cur.execute("SELECT p.name FROM queen.log_partitions p JOIN queen.queues q"
                            " ON q.id = p.queue_id WHERE q.tenant_id = %s::uuid AND q.name = %s"
                            " AND p.name = ANY(%s) ORDER BY p.id", (tenant, queue, two))
                for (part,) in cur.fetchall():
                    push_once(cur, rng, tenant, queue, part)
            conn.commit()
        finally:
            conn.autocommit = True

    threads = [guarded("schedule-1", schedules), guarded("schedule-2", schedules),
               guarded("reschedule", reschedules), guarded("cancel", cancels),
               guarded("push-1", pushes), guarded("push-2", pushes), guarded("wire", wire)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        while time.monotonic() - t0 < seconds and not unexpected and not deadlocks:
            time.sleep(0.25)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not unexpected, unexpected[:5]

    wait_for(lambda: q.timers_left() == 0, 30, 0.1, "the sweepers to drain every timer")
    stats = [h.stats() for h in hs]
    logs = "\n".join(h.log_text(400) for h in hs)
    for h in hs:
        assert_clean_stop(h)
    time.sleep(1.0)  # let the statistics collector see every backend's last report
    deadlocks_after = _deadlocks(q)
    print(f"\n[lock order] {seconds:.0f}s: {counts}; sweepers: "
          + "; ".join(f"{h.name}: fired {s['fired_total']} stale {s['stale_total']} "
                      f"dup {s['duplicate_total']} failures {s['fire_failures']}"
                      for h, s in zip(hs, stats))
          + f"; pg deadlocks {deadlocks_before} -> {deadlocks_after}")

    assert not deadlocks, deadlocks[:5]
    assert "40P01" not in logs and "deadlock" not in logs.lower(), logs
    assert deadlocks_after == deadlocks_before, (deadlocks_before, deadlocks_after)
    # Everybody really worked.
    assert sum(s["fired_total"] for s in stats) > 500, [s["fired_total"] for s in stats]
    assert counts.get("pushed messages", 0) > 500, counts
    assert counts.get("cancelled", 0) > 0 and counts.get("rescheduled", 0) > 0, counts
    # No transaction id twice in any queue, nothing left behind.
    total = q.one("SELECT sum(count) FROM queen.log_segments")
    indexed = q.one("SELECT count(*) FROM queen.log_txn_index")
    assert total == indexed, (total, indexed)
    fired = sum(s["fired_total"] for s in stats)
    assert total == fired + counts.get("pushed messages", 0), (total, fired, counts)
