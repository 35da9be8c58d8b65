"""A broker of a released version, for test_upgrade.py: runs that release's sweeper (its own
Python binding and library, from PYTHONPATH and QUEEN_SWEEPER_LIBRARY) against the database
named by argv[1] until a line arrives on stdin, then stops it and prints its final stats
(JSON) on stdout. argv[4] "apply": with apply_schema on, as a 1.0.0 broker started with it
would run (its apply of 1.0.0's files must fail on the current schema's guard and change
nothing); otherwise off."""

import json
import sys

from queen_sweeper import Sweeper

config = {"conninfo": sys.argv[1], "broker_id": sys.argv[2], "read_env": False,
          "apply_schema": len(sys.argv) > 4 and sys.argv[4] == "apply",
          "sweeper_max_sleep_ms": 100, "sweeper_lease_ms": int(sys.argv[3]), "log_level": "warn"}
logs = []
with Sweeper(**config) as sw:
    sw.on_log(lambda level, msg: logs.append("%s %s" % (level, msg)))
    sw.start()
    print("started", flush=True)
    sys.stdin.readline()
    stats = sw.stats()
    sw.stop(10000)
print(json.dumps({"stats": stats, "logs": logs[-50:]}), flush=True)
