"""Fixtures of the fire's integration tests: they live in firekit.py (a module name no
other suite uses, so `from firekit import ...` is unambiguous even when several test
folders run in one pytest) and are re-exported here so pytest registers them."""

from firekit import (broker_conninfo, conninfo, connections, q, schema,  # noqa: F401
                     sweeper_conninfo, sweepers)
