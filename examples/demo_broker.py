#!/usr/bin/env python3
"""A small demo broker: one process, one sweeper (through the queen_sweeper
Python binding), its stats written to a file every 200 ms. Started twice by
examples/demo; see there.

    demo_broker.py --broker-id ID --state-file FILE --fired-file FILE [--conninfo CI]
                   [--lease-ms MS] [--slow-fired-ms MS] [--max-fire-bytes B] [--claim-batch N]
                   [--schedule N --over-ms MS --start-in-ms MS --partitions P
                    --queue Q --scheduled-file FILE --payload-bytes B]

With --schedule, once its sweeper is running it schedules N timers on queue Q,
spread evenly over MS milliseconds starting START milliseconds from now, in
transactions of 256 (queen.log_timers_apply_v1), and after each COMMIT rings its
own sweeper's wake with that transaction's earliest deliverAt. It writes
{txn: deliverAtMs} to --scheduled-file when done.

Every on_fired call is appended to --fired-file as one JSON line
{"tenant", "queue", "partition", "count", "base_offset"} with a single unbuffered
write, before the callback returns: the file survives a SIGKILL, so the driver can
tell which broker announced which segment of the log without trusting a snapshot.
--slow-fired-ms makes on_fired take that long (a host doing real work there); with
a small --max-fire-bytes one claim is fired in many transactions, so the rest of
the claim stays held while the callback runs.

The state file holds {"pid", "broker_id", "scheduled", "fired_msgs", "stats"};
SIGTERM/SIGINT stop the sweeper gracefully.
"""

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings" / "python"))

from queen_sweeper import Sweeper  # noqa: E402

TENANT = "00000000-0000-0000-0000-000000000001"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--state-file", required=True)
    ap.add_argument("--conninfo", default=os.environ.get("QUEEN_TEST_CONNINFO", ""))
    ap.add_argument("--fired-file", required=True)
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--slow-fired-ms", type=int, default=0)
    ap.add_argument("--max-fire-bytes", type=int, default=8 * 1024 * 1024)
    ap.add_argument("--claim-batch", type=int, default=200)
    ap.add_argument("--payload-bytes", type=int, default=0)
    ap.add_argument("--schedule", type=int, default=0)
    ap.add_argument("--over-ms", type=int, default=10000)
    ap.add_argument("--start-in-ms", type=int, default=1500)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--queue", default="demo")
    ap.add_argument("--scheduled-file")
    args = ap.parse_args()

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())

    counters = {"scheduled": 0, "fired_msgs": 0}
    lock = threading.Lock()

    fired_fd = os.open(args.fired_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_fired(tenant, queue, partition, count, base_offset):
        # A real broker would wake its parked consumers of (queue, partition) here.
        line = json.dumps({"tenant": tenant, "queue": queue, "partition": partition,
                           "count": count, "base_offset": base_offset}) + "\n"
        os.write(fired_fd, line.encode())   # one write: whole lines only, kept across SIGKILL
        with lock:
            counters["fired_msgs"] += count
        if args.slow_fired_ms:
            time.sleep(args.slow_fired_ms / 1000)

    def on_log(level, message):
        print(f"[{args.broker_id}] {message}", file=sys.stderr, flush=True)

    # The sweeper connects as a least-privilege role of its own (a member of queen_sweeper
    # only) when one is given; the broker's scheduling keeps its own connection.
    sweeper_ci = os.environ.get("QUEEN_EXAMPLE_SWEEPER_CONNINFO") or args.conninfo
    sw = Sweeper(conninfo=sweeper_ci, broker_id=args.broker_id, apply_schema=True, read_env=False,
                 sweeper_lease_ms=args.lease_ms, sweeper_max_fire_bytes=args.max_fire_bytes,
                 sweeper_claim_batch=args.claim_batch,
                 log_level="warn")
    sw.on_fired(on_fired)
    sw.on_log(on_log)
    sw.start()

    tmp = args.state_file + ".tmp"
    dump_lock = threading.Lock()

    def dump():
        with dump_lock:
            with lock:
                state = {"pid": os.getpid(), "broker_id": args.broker_id, **counters, "at_ms": now_ms()}
            state["stats"] = sw.stats()
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, args.state_file)

    def writer():
        while not done.wait(0.2):
            try:
                dump()
            except Exception:  # noqa: BLE001 - the sweeper is closing under us
                return

    threading.Thread(target=writer, daemon=True).start()

    if args.schedule > 0:
        import psycopg2  # only the scheduling broker needs its own connection

        while sw.stats()["probes_total"] < 1 and not done.is_set():  # schema applied
            time.sleep(0.02)
        db = psycopg2.connect(args.conninfo, application_name=f"demo-{args.broker_id}")
        def payload():
            # Random bytes do not compress, so --max-fire-bytes splits a claim into several
            # fire transactions (the demo's slow host holds the rest of its claim meanwhile).
            return base64.b64encode(os.urandom(args.payload_bytes)).decode() if args.payload_bytes else ""

        first = now_ms() + args.start_in_ms
        deliver = {}
        n = args.schedule
        for start in range(0, n, 256):
            if done.is_set():
                break
            ops, t = [], now_ms()
            for i in range(start, min(start + 256, n)):
                due = first + (args.over_ms * i // max(1, n - 1))
                ops.append({"op": "schedule", "queue": args.queue, "timerKey": f"demo-{first}-{i}",
                            "partition": f"p{i % args.partitions}", "delayMs": max(0, due - t),
                            "txn": f"demo-{first}-{i}", "payload": payload()})
            with db.cursor() as cur:
                cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, NULL, now())",
                            (json.dumps(ops), TENANT))
                results = cur.fetchone()[0]
            db.commit()
            # Only now, after COMMIT, ring the local sweeper: a wake for a transaction that
            # then rolls back teaches the loop that work exists which does not.
            sw.wake(min(r["deliverAtMs"] for r in results))
            for op, r in zip(ops, results):
                deliver[op["txn"]] = r["deliverAtMs"]
            with lock:
                counters["scheduled"] += len(ops)
        db.close()
        if args.scheduled_file:
            with open(args.scheduled_file + ".tmp", "w") as f:
                json.dump(deliver, f)
            os.replace(args.scheduled_file + ".tmp", args.scheduled_file)

    done.wait()
    try:
        sw.stop(5000)
    finally:
        dump()
        sw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
