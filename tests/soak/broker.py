#!/usr/bin/env python3
"""One soak broker: a process that loads libqueen_sweeper.so through the Python binding
and runs one sweeper until SIGTERM, writing its stats JSON to a file twice a second.

    broker.py --broker-id ID --stats FILE --conninfo CI [--knob name=value ...]

Knobs are passed straight into the sweeper's JSON configuration (integers when they
parse as integers), so a soak can vary a setting without a new build.
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


def knob(text):
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        return name, {"true": True, "false": False}.get(value, value)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--knob", action="append", type=knob, default=[])
    args = ap.parse_args()

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())

    def log(level, message):
        print(f"[{args.broker_id} L{level}] {message}", file=sys.stderr, flush=True)

    config = dict(conninfo=args.conninfo, broker_id=args.broker_id, apply_schema=False,
                  read_env=False, log_level="warn")
    config.update(dict(args.knob))
    sw = Sweeper(**config)
    sw.on_log(log)
    sw.start()

    tmp = args.stats + ".tmp"

    def dump():
        with open(tmp, "w") as f:
            json.dump(sw.stats(), f)
        os.replace(tmp, args.stats)

    while not done.wait(0.5):
        dump()
    try:
        sw.stop(15000)
    finally:
        dump()
        sw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
