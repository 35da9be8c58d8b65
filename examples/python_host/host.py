#!/usr/bin/env python3
"""example python host: drives libqueen_sweeper.so through the queen_sweeper package.

    PYTHONPATH=bindings/python /usr/bin/python3 examples/python_host/host.py [CONNINFO]

CONNINFO defaults to $QUEEN_TEST_CONNINFO, else the PG* environment. The library is
found by the binding ($QUEEN_SWEEPER_LIBRARY, then the build trees). $EXAMPLE_TIMERS
sets how many timers to schedule (default 20).

The host has its own database connection (psycopg2, Debian's python3-psycopg2); the
sweeper has its own pool. It shows the post-commit wake, that a rolled-back transaction
rings nothing, every fired segment (from on_fired, then read back with log_read_v1 and
decoded), and exits 0 only if every scheduled timer fired exactly once.
"""

import json
import os
import sys
import threading
import time
from base64 import b64encode

import psycopg2

from queen_sweeper import Sweeper, Timeout, decode_segment

TENANT = "00000000-0000-0000-0000-000000000001"
QUEUE = "example-python"
PARTITIONS = 3


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def schedule(cur, tag: str, count: int, base_delay_ms: int, spread_ms: int) -> dict:
    """Schedules timers "<tag>-<i>" in the open transaction; returns {txn: deliverAtMs}."""
    deliver = {}
    for start in range(0, count, 256):
        ops = []
        for i in range(start, min(start + 256, count)):
            delay = base_delay_ms + (spread_ms * i // (count - 1) if count > 1 else 0)
            ops.append({"op": "schedule", "queue": QUEUE, "timerKey": f"{tag}-{i}",
                        "partition": f"p{i % PARTITIONS}", "delayMs": delay, "txn": f"{tag}-{i}",
                        "payload": b64encode(json.dumps({"n": i}).encode()).decode()})
        cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, NULL, now())",
                    (json.dumps(ops), TENANT))
        results = cur.fetchone()[0]
        for op, res in zip(ops, results):
            if res["status"] != "scheduled":
                raise RuntimeError(f"{op['timerKey']}: {res['status']}")
            deliver[op["txn"]] = res["deliverAtMs"]
    return deliver


def main() -> int:
    conninfo = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QUEEN_TEST_CONNINFO", "")
    n = int(os.environ.get("EXAMPLE_TIMERS", "20"))

    fired = []                     # (tenant, partition, count, base_offset, seen_ms)
    fired_lock = threading.Lock()
    fired_msgs = [0]

    def on_fired(tenant, queue, partition, count, base_offset):
        # On the sweeper's thread, after the fire committed: print, note, return.
        seen = now_ms()
        print(f"on_fired: tenant={tenant} queue={queue} partition={partition} "
              f"count={count} base_offset={base_offset}", flush=True)
        if queue != QUEUE:     # the sweeper serves the whole table, not only our queue
            return
        with fired_lock:
            fired.append((tenant, partition, count, base_offset, seen))
            fired_msgs[0] += count

    db = psycopg2.connect(conninfo, application_name="example-python-host")
    ok = True
    # The sweeper may connect as a role of its own holding only the queen_sweeper group
    # role (sql/007_roles.sql): QUEEN_EXAMPLE_SWEEPER_CONNINFO, else the host's conninfo.
    sweeper_ci = os.environ.get("QUEEN_EXAMPLE_SWEEPER_CONNINFO") or conninfo
    with Sweeper(conninfo=sweeper_ci, broker_id="example-python-host", apply_schema=True,
                 log_level="warn") as sw:
        sw.on_fired(on_fired)
        sw.on_log(lambda level, msg: print(f"[sweeper {level}] {msg}", file=sys.stderr))
        sw.start()
        print(f"loaded {sw.library_path}")
        try:
            sw.wait_ready(30)     # the schema is in place and a first probe completed
        except Timeout as exc:
            print(f"the sweeper is not ready: {exc}", file=sys.stderr)
            return 1
        print("sweeper running, schema applied")

        run = f"py-{now_ms()}"
        rb_tag, tag = f"{run}-rolledback", f"{run}-t"

        # A transaction that rolls back rings nothing.
        before = sw.stats()
        with db.cursor() as cur:
            schedule(cur, rb_tag, 5, 100, 100)
        db.rollback()
        # No wake here: the transaction did not commit, so no timer exists.
        after = sw.stats()
        print(f"rolled back 5 timers and did NOT call wake: wakes_total "
              f"{before['wakes_total']} -> {after['wakes_total']}, wake_signals_total "
              f"{before['wake_signals_total']} -> {after['wake_signals_total']}")
        ok &= (before["wakes_total"], before["wake_signals_total"]) == \
              (after["wakes_total"], after["wake_signals_total"])

        # Schedule N timers in one transaction, commit, then wake.
        with db.cursor() as cur:
            deliver = schedule(cur, tag, n, 300, 2000)
        db.commit()
        # The wake comes only now, after COMMIT: a wake for a transaction that then rolls
        # back teaches the loop that work exists which does not.
        earliest = min(deliver.values())
        sw.wake(earliest)
        woke = sw.stats()
        print(f"committed {n} timers, then wake(earliest deliverAt {earliest - now_ms():+d} ms): "
              f"wakes_total {after['wakes_total']} -> {woke['wakes_total']}, wake_signals_total "
              f"{after['wake_signals_total']} -> {woke['wake_signals_total']}")

        deadline = time.monotonic() + 30
        while True:
            with fired_lock:
                got = fired_msgs[0]
            if got >= n:
                break
            if time.monotonic() > deadline:
                print(f"only {got} of {n} timers fired within 30 s", file=sys.stderr)
                ok = False
                break
            time.sleep(0.02)
        time.sleep(0.3)   # room for anything that should not be there (a duplicate) to show up

        # Read each fired segment back and decode it.
        worst = 0
        with fired_lock:
            records = list(fired)
        with db.cursor() as cur:
            for tenant, partition, count, base, seen in records:
                cur.execute("SELECT base_offset, blob, queen.epoch_ms_v1(created_at) "
                            "FROM queen.log_read_v1(%s, %s, %s, %s, 1)",
                            (tenant, QUEUE, partition, base))
                row = cur.fetchone()
                if row is None or row[0] != base:
                    print(f"segment {QUEUE}/{partition}@{base} not found", file=sys.stderr)
                    ok = False
                    continue
                frames = decode_segment(bytes(row[1]))
                print(f"segment {QUEUE}/{partition} offsets {base}..{base + len(frames) - 1}:")
                for fr in frames:
                    if fr.txn not in deliver:
                        print(f"  txn {fr.txn} (not scheduled by this run)")
                        continue
                    late = seen - deliver[fr.txn]
                    worst = max(worst, late)
                    print(f"  txn {fr.txn}  late {late} ms (on_fired - deliverAt; segment stamped "
                          f"{row[2] - deliver[fr.txn]:+d} ms)  payload {fr.payload.decode()}")

            # Verify from the whole log of the queue: exactly once, none rolled back.
            seen_count = {txn: 0 for txn in deliver}
            rb_in_log = 0
            for p in range(PARTITIONS):
                cur.execute("SELECT blob FROM queen.log_read_v1(%s, %s, %s, 0, NULL)",
                            (TENANT, QUEUE, f"p{p}"))
                for (blob,) in cur.fetchall():
                    for fr in decode_segment(bytes(blob)):
                        if fr.txn in seen_count:
                            seen_count[fr.txn] += 1
                        elif fr.txn.startswith(rb_tag + "-"):
                            rb_in_log += 1
            cur.execute("SELECT count(*) FROM queen.log_timers WHERE queue = %s AND timer_key LIKE %s",
                        (QUEUE, run + "-%"))
            left = cur.fetchone()[0]
        db.rollback()

        sw.stop(5000)
        st = sw.stats()
        print(f"stop: ok; state {st['state']}; fired_total {st['fired_total']}, "
              f"stale_total {st['stale_total']}, duplicate_total {st['duplicate_total']}")
    db.close()

    once = sum(1 for c in seen_count.values() if c == 1)
    missing = sum(1 for c in seen_count.values() if c == 0)
    dup = sum(1 for c in seen_count.values() if c > 1)
    ok = ok and once == n and rb_in_log == 0 and left == 0 and st["state"] == "stopped"
    print(f"summary: scheduled {n}, fired exactly once {once}, missing {missing}, duplicated {dup}, "
          f"rolled-back in log {rb_in_log}, left in log_timers {left}, worst lateness {worst} ms "
          f"-> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
