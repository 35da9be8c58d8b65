#!/usr/bin/python3
"""One sweeper process of the Patroni suite, as a broker host runs it: one Sweeper through
the Python binding, logged in as the least-privilege role the conninfo names.

    sweeper_proc.py --broker-id ID --conninfo CI --out PREFIX [--knob KEY=INT ...]

writes PREFIX.stats.json (the stats JSON, every 100 ms, write + rename), PREFIX.fired.jsonl
(one line per on_fired call: [unix seconds, tenant, queue, partition, count, base_offset],
flushed at once) and PREFIX.log (the sweeper's log lines, with the unix time). SIGTERM stops
it gracefully (10 s), writes the final stats and exits 0.
"""

import argparse
import json
import sys
import threading
import time

# tests/kit is on PYTHONPATH: the suite's own process put it there (importing the kit), and
# this process inherits it.
from queenkit import Sweeper, knob, serve, stop_event


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-id", required=True)
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--knob", action="append", type=knob, default=[], metavar="KEY=INT")
    args = ap.parse_args()
    knobs = dict(args.knob)
    done = stop_event()

    fired_f = open(args.out + ".fired.jsonl", "a", buffering=1)
    log_f = open(args.out + ".log", "a", buffering=1)
    lock = threading.Lock()

    def on_fired(tenant, queue, partition, count, base_offset):
        line = json.dumps([time.time(), tenant, queue, partition, count, base_offset])
        with lock:
            fired_f.write(line + "\n")

    def on_log(level, msg):
        with lock:
            log_f.write(f"{time.time():.3f} L{level} {msg}\n")

    sw = Sweeper(conninfo=args.conninfo, broker_id=args.broker_id, apply_schema=False, read_env=False,
                 log_level="info", **knobs)
    sw.on_log(on_log)
    sw.on_fired(on_fired)
    sw.start()
    try:
        serve(sw, args.out + ".stats.json", done, every=0.1, stop_timeout_ms=10000)
    finally:
        fired_f.close()
        log_f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
