"""Ephemeral.*: the in-RAM engine through its own library, and as the sweeper's backstop."""

from __future__ import annotations

import pytest

from queen_sweeper import (
    Ephemeral,
    Full,
    InvalidArgument,
    NotFound,
    StateError,
    Sweeper,
)
from queen_sweeper import ephemeral as eph

from conftest import assert_clean_teardown, wait_for

T0 = 1_700_000_000_000


def test_ephemeral_loads_with_major_one():
    native = eph.load()
    assert native.abi_major == 1
    assert native.version()


def test_ephemeral_push_pop_ack():
    with Ephemeral() as engine:
        engine.push("q", "p0", b"one", now=T0)
        first = engine.push("q", "p0", b"two", now=T0)
        msg = engine.pop("q", "p0", "g", now=T0)
        assert msg.payload == b"one"
        assert msg.attempt == 1 and msg.lease_id != 0
        engine.ack("q", "p0", "g", msg.offset, msg.lease_id, now=T0)
        msg2 = engine.pop("q", "p0", "g", now=T0)
        assert msg2.payload == b"two" and msg2.offset == first
        engine.ack("q", "p0", "g", msg2.offset, msg2.lease_id, outcome="completed", now=T0)
        assert engine.pop("q", "p0", "g", now=T0) is None
        stats = engine.stats()
        assert stats["pushed_total"] == 2
        assert stats["acked_total"] == 2
    assert engine.closed
    engine.close()


def test_ephemeral_lease_expiry_is_swept():
    with Ephemeral(lease_ms=1000, max_retries=3) as engine:
        engine.push("q", "p0", b"x", now=T0)
        msg = engine.pop("q", "p0", "g", now=T0)
        assert engine.pop("q", "p0", "g", now=T0) is None
        result = engine.sweep(now=T0 + 5000)
        assert result.redelivered == 1
        again = engine.pop("q", "p0", "g", now=T0 + 5000)
        assert again.offset == msg.offset and again.attempt == 2


def test_ephemeral_late_ack_after_collection_is_refused():
    # Offsets survive the collection of an idle queue: a consumer whose lease
    # lapsed and who acks by offset alone must not settle the message that a
    # recreated queue pushed since (issue 18).
    with Ephemeral(lease_ms=100, idle_gc_ms=1000) as engine:
        engine.push("q", "p0", b"first", now=T0)
        stalled = engine.pop("q", "p0", "g", now=T0)
        again = engine.pop("q", "p0", "g", now=T0 + 100)
        engine.ack("q", "p0", "g", again.offset, again.lease_id, now=T0 + 100)
        assert engine.sweep(now=T0 + 1100).queues_collected == 1
        offset = engine.push("q", "p0", b"second", now=T0 + 1200)
        assert offset > stalled.offset
        fresh = engine.pop("q", "p0", "g", lease_ms=5000, now=T0 + 1300)
        with pytest.raises(NotFound):
            engine.ack("q", "p0", "g", stalled.offset, 0, outcome="retry", now=T0 + 1400)
        assert engine.pop("q", "p0", "g", now=T0 + 1500) is None
        engine.ack("q", "p0", "g", fresh.offset, fresh.lease_id, now=T0 + 1600)


def test_ephemeral_errors_carry_the_message():
    with Ephemeral(queue_max_messages=1) as engine:
        engine.push("q", "p0", b"x", now=T0)
        with pytest.raises(Full) as info:
            engine.push("q", "p0", b"y", now=T0)
        assert "queue_max_messages" in info.value.message
        with pytest.raises(NotFound):
            engine.queue_info("no-such-queue")
        with pytest.raises(NotFound):
            engine.ack("q", "p0", "nobody", 0, 0, now=T0)
        with pytest.raises(InvalidArgument):
            engine.push("", "p0", b"x", now=T0)
    with pytest.raises(InvalidArgument) as info:
        Ephemeral(lease_ms=0)
    assert "lease_ms" in info.value.message
    with pytest.raises(TypeError):
        Ephemeral(no_such_field=1)


def test_ephemeral_declare_and_queue_info():
    with Ephemeral() as engine:
        engine.declare("d", ttl_ms=1000, overflow="drop_oldest")
        engine.push("d", "p0", b"abc", now=T0)
        info = engine.queue_info("d")
        assert info["declared"] is True
        assert info["messages"] == 1 and info["bytes"] == 3
        assert engine.sweep(now=T0 + 2000).ttl_dropped == 1


def test_ephemeral_waker_is_called():
    seen = []
    with Ephemeral(lease_ms=1000) as engine:
        engine.attach_waker(seen.append)
        engine.push("q", "p0", b"x", now=T0)
        engine.pop("q", "p0", "g", now=T0)
        engine.attach_waker(None)
    assert seen and seen[0] == T0 + 1000


def test_ephemeral_backstop_handed_to_a_sweeper(base_config):
    engine = Ephemeral(lease_ms=100)
    engine.push("bq", "p0", b"x")
    engine.pop("bq", "p0", "g")
    with Sweeper(**base_config) as sw:
        sw.set_backstop(engine)
        sw.start()
        with pytest.raises(StateError):
            engine.close()  # still the backstop of a running sweeper
        # The sweeper's once-a-second backstop redelivers the lapsed lease.
        wait_for(lambda: engine.stats()["redelivered_total"] >= 1, 10,
                 what="the sweeper's backstop to redeliver")
        assert_clean_teardown(sw)
    engine.close()
    assert engine.closed
