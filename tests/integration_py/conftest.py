"""Fixtures of the fire's integration tests: they live in firekit.py (a module name no
other suite uses, so `from firekit import ...` is unambiguous even when several test
folders run in one pytest) and are re-exported here so pytest registers them."""

from firekit import conninfo, connections, q, schema, sweepers  # noqa: F401
