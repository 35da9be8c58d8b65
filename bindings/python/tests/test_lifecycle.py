"""Lifecycle.*: start, stop, close, context manager, wake, stats, metrics."""

from __future__ import annotations

import datetime as dt
import gc

import pytest

from queen_sweeper import StateError, Sweeper, unix_ms

from conftest import assert_clean_teardown, wait_for


def test_lifecycle_start_stop_close_are_idempotent(base_config):
    sw = Sweeper(**base_config)
    sw.start()
    with pytest.raises(StateError):
        sw.start()
    assert_clean_teardown(sw)
    sw.stop()  # after close: still a no-op
    with pytest.raises(StateError):
        sw.start()
    with pytest.raises(StateError):
        sw.stats()


def test_lifecycle_stop_before_start_is_ok(base_config):
    sw = Sweeper(**base_config)
    sw.stop()
    sw.close()
    assert sw.closed


def test_lifecycle_setters_after_start_are_state_errors(base_config):
    with Sweeper(**base_config) as sw:
        sw.start()
        with pytest.raises(StateError):
            sw.on_log(lambda level, message: None)
        with pytest.raises(StateError):
            sw.on_fired(lambda *args: None)
        assert_clean_teardown(sw)


def test_lifecycle_context_manager_closes(base_config):
    with Sweeper(**base_config) as sw:
        sw.start()
        assert not sw.closed
    assert sw.closed


def test_lifecycle_del_is_a_safety_net(base_config):
    sw = Sweeper(**base_config)
    sw.start()
    del sw
    gc.collect()


def test_lifecycle_wake_accepts_datetime_and_int(base_config):
    with Sweeper(**base_config) as sw:
        sw.start()
        before = sw.stats()["wakes_total"]
        now = dt.datetime.now(dt.timezone.utc)
        sw.wake(now)                                   # aware
        sw.wake(now.replace(tzinfo=None))              # naive, taken as UTC
        sw.wake(unix_ms(now) - 1000)                   # int epoch ms
        sw.wake(now - dt.timedelta(hours=1))
        wait_for(lambda: sw.stats()["wakes_total"] >= before + 4, 5, what="wakes_total")
        stats = sw.stats()
        assert stats["wake_signals_total"] >= 1
        assert stats["wake_signals_total"] <= stats["wakes_total"]
        with pytest.raises(TypeError):
            sw.wake("tomorrow")
        with pytest.raises(TypeError):
            sw.wake(True)
        assert_clean_teardown(sw)
    sw.wake(0)  # harmless after close


def test_lifecycle_naive_datetime_is_utc():
    aware = dt.datetime(2030, 5, 6, 7, 8, 9, 123000, tzinfo=dt.timezone.utc)
    assert unix_ms(aware.replace(tzinfo=None)) == unix_ms(aware) == 1904281689123
    plus2 = aware.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert unix_ms(plus2) == unix_ms(aware)


def test_lifecycle_stats_has_the_contract_keys(base_config):
    with Sweeper(**base_config) as sw:
        stats = sw.stats()
        for key in ("state", "fired_total", "wakes_total", "wake_signals_total"):
            assert key in stats, key
        sw.start()
        stats = sw.stats()
        for key in ("state", "cycles_total", "fired_total", "wakes_total",
                    "wake_signals_total"):
            assert key in stats, key
        assert isinstance(stats["state"], str)
        assert_clean_teardown(sw)


def test_lifecycle_metrics_is_prometheus_text(base_config):
    with Sweeper(**base_config) as sw:
        sw.start()
        text = sw.metrics()
        assert isinstance(text, str) and text
        assert any(line.startswith("queen_") for line in text.splitlines())
        assert_clean_teardown(sw)


def test_lifecycle_database_down_is_not_a_start_failure():
    with Sweeper(read_env=False, conninfo="host=127.0.0.1 port=1 connect_timeout=1") as sw:
        sw.start()
        assert "state" in sw.stats()
        assert_clean_teardown(sw)
