#!/usr/bin/env python3
"""One soak broker: a process that loads libqueen_sweeper.so through the Python binding
and runs one sweeper until SIGTERM, writing its stats JSON to a file twice a second.

    broker.py --broker-id ID --stats FILE --conninfo CI [--knob name=value ...]

Knobs are passed straight into the sweeper's JSON configuration (integers when they
parse as integers), so a soak can vary a setting without a new build.
"""

import argparse
import signal
import sys

# tests/kit is on PYTHONPATH: tests/soak/soak imported the kit, which put it there, and this
# child inherits it.
from queenkit import Sweeper, knob, serve, stop_event


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--knob", action="append", type=knob, default=[])
    args = ap.parse_args()

    done = stop_event(signal.SIGTERM, signal.SIGINT)

    def log(level, message):
        print(f"[{args.broker_id} L{level}] {message}", file=sys.stderr, flush=True)

    config = dict(conninfo=args.conninfo, broker_id=args.broker_id, apply_schema=False,
                  read_env=False, log_level="warn")
    config.update(dict(args.knob))
    sw = Sweeper(**config)
    sw.on_log(log)
    sw.start()
    serve(sw, args.stats, done, every=0.5, stop_timeout_ms=15000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
