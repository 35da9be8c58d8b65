#!/usr/bin/env python3
"""One broker process of the many-brokers test: one sweeper, stats JSON written to a file
every 200 ms (write + rename), a graceful stop on SIGTERM.

    broker_proc.py --broker-id ID --stats FILE --conninfo CI [--knob KEY=INT ...]
"""

import argparse
import sys

# tests/kit is on PYTHONPATH: the test that starts this process imported the kit, which put
# it there, and the child inherits it.
from queenkit import Sweeper, knob, serve, stop_event


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--knob", action="append", type=knob, default=[], metavar="KEY=INT",
                    help="an integer configuration key, e.g. sweeper_claim_batch_max=200")
    args = ap.parse_args()
    knobs = dict(args.knob)
    done = stop_event()
    sw = Sweeper(conninfo=args.conninfo, broker_id=args.broker_id, apply_schema=False, read_env=False,
                 log_level="warn", **knobs)
    sw.on_log(lambda level, msg: print(f"[{args.broker_id} {level}] {msg}", file=sys.stderr, flush=True))
    sw.start()
    serve(sw, args.stats, done, every=0.2, stop_timeout_ms=10000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
