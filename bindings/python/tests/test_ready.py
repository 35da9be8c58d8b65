"""Readiness and status names through the Python binding (ABI 1.1)."""

from __future__ import annotations

import pytest

import queen_sweeper
from queen_sweeper import StateError, Sweeper, Timeout, status_name


def test_status_name_names_the_codes():
    assert status_name(0) == "QUEEN_SWEEPER_OK"
    assert status_name(-110) == "QUEEN_SWEEPER_ETIMEDOUT"
    assert status_name(-16) == "QUEEN_SWEEPER_ESTATE"
    assert status_name(12345) == "QUEEN_SWEEPER_UNKNOWN"
    assert queen_sweeper.abi_version() >= (1, 1)


def test_wait_ready_returns_once_schema_and_probe_are_done(base_config):
    with Sweeper(**base_config) as sw:
        with pytest.raises(StateError, match="not started"):
            sw.wait_ready(0.01)
        assert sw.stats()["ready"] is False
        sw.start()
        sw.wait_ready(60)
        st = sw.stats()
        assert st["ready"] is True and st["ready_reason"] is None, st
        assert st["probes_total"] >= 1
        assert sw.ready
        sw.wait_ready(0)  # latched: a second call returns at once
        sw.stop()
        with pytest.raises(StateError, match="stopped"):
            sw.wait_ready(0.01)


def test_wait_ready_times_out_with_the_reason(conninfo):
    # A database that does not exist: the probe never completes, the reason says why.
    bad = conninfo + " dbname=queen_no_such_database"
    with Sweeper(conninfo=bad, read_env=False, log_stderr=False, connect_timeout_ms=1000) as sw:
        sw.start()
        with pytest.raises(Timeout) as exc:
            sw.wait_ready(1.5)
        assert "not ready after 1500 ms" in str(exc.value), exc.value
        st = sw.stats()
        assert st["ready"] is False and st["ready_reason"], st
