"""Fixtures of the monitoring tests: the fire's integration fixtures (tests/integration_py's
firekit.py: the throwaway database, the schema, sweepers through the Python binding)
re-exported so pytest registers them here too.

Run (as tests/run does; the database from tests/pg):

    eval "$(tests/pg start $(mktemp -d /tmp/pgmon.XXXX))"
    QUEEN_SWEEPER_LIBRARY=<build>/libqueen_sweeper.so PYTHONPATH=bindings/python \
        /usr/bin/python3 -m pytest -q tests/monitoring
    promtool test rules tests/monitoring/queen-sweeper.rules.test.yml
"""

from __future__ import annotations

import sys
from pathlib import Path

_FIREKIT = Path(__file__).resolve().parents[1] / "integration_py"
if str(_FIREKIT) not in sys.path:
    sys.path.insert(0, str(_FIREKIT))

from firekit import (broker_conninfo, conninfo, connections, q, schema,  # noqa: E402,F401
                     sweeper_conninfo, sweepers)
