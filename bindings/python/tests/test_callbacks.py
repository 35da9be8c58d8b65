"""Callbacks.*: on_log and on_fired deliver; an exception inside never reaches C."""

from __future__ import annotations

import logging
import threading

from queen_sweeper import LOG_DEBUG, LOG_ERROR, Sweeper

from conftest import (
    FiredRecorder,
    assert_clean_teardown,
    schedule,
    unique,
    wait_for,
    wait_for_schema,
)


def test_callbacks_log_receives_level_and_text(base_config):
    seen = []
    with Sweeper(**base_config, log_level="debug") as sw:
        sw.on_log(lambda level, message: seen.append((level, message)))
        sw.start()
        wait_for(lambda: seen, 10, what="a log message")
        assert_clean_teardown(sw)
    assert all(LOG_ERROR <= level <= LOG_DEBUG for level, _ in seen)
    assert all(isinstance(message, str) for _, message in seen)


def test_callbacks_log_exception_is_contained(base_config, caplog):
    calls = []

    def explode(level, message):
        calls.append(message)
        raise RuntimeError("boom from the log callback")

    with caplog.at_level(logging.ERROR, logger="queen_sweeper"):
        with Sweeper(**base_config, log_level="debug") as sw:
            sw.on_log(explode)
            sw.start()
            wait_for(lambda: calls, 10, what="a log message")
            assert "state" in sw.stats()
            assert_clean_teardown(sw)
    assert "boom from the log callback" in caplog.text


def test_callbacks_fired_exception_is_contained_and_firing_goes_on(base_config, db, caplog):
    raised = threading.Event()
    recorder = FiredRecorder()
    first, second = unique("cb-q1"), unique("cb-q2")

    def fired(tenant, queue, partition, count, base_offset):
        recorder(tenant, queue, partition, count, base_offset)
        if queue == first:
            raised.set()
            raise ValueError("boom from the fired callback")

    with caplog.at_level(logging.ERROR, logger="queen_sweeper"):
        with Sweeper(**base_config) as sw:
            sw.on_fired(fired)
            sw.start()
            wait_for_schema(db)
            schedule(db, first, "k1", b"one")
            sw.wake(0)
            recorder.wait_queue(first)
            assert raised.is_set()
            schedule(db, second, "k1", b"two")
            sw.wake(0)
            recorder.wait_queue(second)
            assert sw.stats()["fired_total"] >= 2
            assert_clean_teardown(sw)
    assert "boom from the fired callback" in caplog.text


def test_callbacks_removed_with_none(base_config):
    with Sweeper(**base_config) as sw:
        sw.on_log(lambda *a: None)
        sw.on_log(None)
        sw.on_fired(lambda *a: None)
        sw.on_fired(None)
        sw.start()
        assert_clean_teardown(sw)
