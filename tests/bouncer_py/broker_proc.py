#!/usr/bin/env python3
"""One broker process of the many-brokers test: one sweeper, stats JSON written to a file
every 200 ms (write + rename), a graceful stop on SIGTERM.

    broker_proc.py --broker-id ID --stats FILE --conninfo CI [--knob KEY=INT ...]
"""

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bindings" / "python"))

from queen_sweeper import Sweeper  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--knob", action="append", default=[], metavar="KEY=INT",
                    help="an integer configuration key, e.g. sweeper_claim_batch_max=200")
    args = ap.parse_args()
    knobs = {k: int(v) for k, v in (x.split("=", 1) for x in args.knob)}
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    sw = Sweeper(conninfo=args.conninfo, broker_id=args.broker_id, apply_schema=False, read_env=False,
                 log_level="warn", **knobs)
    sw.on_log(lambda level, msg: print(f"[{args.broker_id} {level}] {msg}", file=sys.stderr, flush=True))
    sw.start()
    tmp = args.stats + ".tmp"

    def dump():
        with open(tmp, "w") as f:
            json.dump(sw.stats(), f)
        os.replace(tmp, args.stats)

    while not done.wait(0.2):
        dump()
    try:
        sw.stop(10000)
    finally:
        dump()
        sw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
