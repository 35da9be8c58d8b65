"""Config.*: a bad configuration is refused with InvalidArgument naming the key."""

from __future__ import annotations

import ctypes

import pytest

from queen_sweeper import InvalidArgument, Sweeper, _native


def refused(**config):
    with pytest.raises(InvalidArgument) as info:
        Sweeper(**config)
    assert info.value.code == -22
    return info.value.message


def test_config_unknown_key_is_named():
    message = refused(read_env=False, sweeper_min_sleep_mss=5)
    assert "sweeper_min_sleep_mss" in message


def test_config_wrong_type_is_named():
    message = refused(read_env=False, sweeper_min_sleep_ms="fast")
    assert "sweeper_min_sleep_ms" in message


def test_config_out_of_range_is_named():
    message = refused(read_env=False, sweeper_parallelism=9)
    assert "sweeper_parallelism" in message


def test_config_malformed_boolean_is_named():
    message = refused(read_env=False, apply_schema="maybe")
    assert "apply_schema" in message


def test_config_malformed_boolean_in_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("QUEEN_SWEEPER", "maybe")
    message = refused(read_env=True)
    assert "QUEEN_SWEEPER" in message


def test_config_environment_ignored_when_read_env_false(monkeypatch):
    monkeypatch.setenv("QUEEN_SWEEPER", "maybe")
    Sweeper(read_env=False).close()


def test_config_invalid_json_is_refused(native):
    out = _native.SweeperPtr()
    assert native.create(b"{not json", ctypes.byref(out)) == -22
    assert not out
    assert native.last_error_text()


def test_config_error_message_is_the_library_text():
    with pytest.raises(InvalidArgument) as info:
        Sweeper(read_env=False, no_such_knob=1)
    assert "no_such_knob" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_config_valid_keys_create_without_a_database():
    with Sweeper(read_env=False, sweeper_min_sleep_ms=5, sweeper_parallelism=1,
                 apply_schema=False, conninfo="host=127.0.0.1 port=1") as sw:
        assert not sw.closed
    assert sw.closed
