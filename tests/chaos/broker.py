#!/usr/bin/env python3
"""One chaos broker: a process that loads libqueen_sweeper.so through the Python
binding, runs one sweeper and does nothing else until it is killed.

    broker.py --broker-id ID --stats FILE [--lease-ms 3000] [--conninfo CI]

Every 200 ms it writes the sweeper's stats JSON to FILE (write + rename, so a
reader never sees half a file). SIGTERM or SIGINT stops the sweeper gracefully
(claims released); SIGKILL is what the chaos suite mostly sends.
"""

import argparse
import os
import signal
import sys

# tests/kit is on PYTHONPATH: the test that starts this process imported the kit, which put
# it there, and the child inherits it.
from queenkit import Sweeper, serve, stop_event


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--lease-ms", type=int, default=3000)
    # The queen_sweeper role by default (tests/pg exports it): a broker's sweeper needs no more.
    ap.add_argument("--conninfo", default=os.environ.get("QUEEN_TEST_SWEEPER_CONNINFO", ""))
    # Off by default: the test applies the schema as the superuser, and the sweeper role may
    # not run DDL.
    ap.add_argument("--apply-schema", action="store_true")
    args = ap.parse_args()

    done = stop_event(signal.SIGTERM, signal.SIGINT)

    def log(level, message):
        print(f"[{args.broker_id} sweeper {level}] {message}", file=sys.stderr, flush=True)

    sw = Sweeper(conninfo=args.conninfo, broker_id=args.broker_id, apply_schema=args.apply_schema,
                 read_env=False, sweeper_lease_ms=args.lease_ms, log_level="warn")
    sw.on_log(log)
    sw.start()
    print(f"{args.broker_id}: started, pid {os.getpid()}", flush=True)
    serve(sw, args.stats, done, every=0.2, stop_timeout_ms=10000)
    print(f"{args.broker_id}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
