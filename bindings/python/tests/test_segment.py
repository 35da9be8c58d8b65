"""Segment.*: decode what the sweeper really fired; garbage is Corrupt."""

from __future__ import annotations

import os
import uuid

import pytest

from queen_sweeper import Corrupt, InvalidArgument, Sweeper, decode_segment, txn_hash

from conftest import (
    TENANT,
    FiredRecorder,
    assert_clean_teardown,
    read_log,
    schedule,
    unique,
    wait_for_schema,
)


def test_segment_round_trip_of_a_real_fire(base_config, db):
    recorder = FiredRecorder()
    queue = unique("seg")
    payload = b"\x00payload with a NUL and bytes \xff\xfe" + os.urandom(32)
    with Sweeper(**base_config) as sw:
        sw.on_fired(recorder)
        sw.start()
        wait_for_schema(db)
        schedule(db, queue, "k1", payload, partition="p0", txn="txn-round-trip")
        sw.wake(0)
        (tenant, fired_queue, partition, count, base_offset), = recorder.wait_queue(queue)
        assert uuid.UUID(tenant) == uuid.UUID(TENANT)
        assert (fired_queue, partition, count) == (queue, "p0", 1)
        assert base_offset >= 0
        stats = sw.stats()
        assert stats["fired_total"] >= 1
        assert_clean_teardown(sw)

    segments = read_log(db, tenant, queue, "p0")
    assert [off for off, _ in segments] == [base_offset]
    frames = decode_segment(segments[0][1])
    assert len(frames) == 1
    frame = frames[0]
    assert frame.txn == "txn-round-trip"
    assert frame.payload == payload
    assert isinstance(frame.message_id, uuid.UUID)
    assert frame.encrypted is False
    assert frame.trace_id is None or isinstance(frame.trace_id, uuid.UUID)


def test_segment_garbage_is_corrupt():
    with pytest.raises(Corrupt) as info:
        decode_segment(b"this is not a zstd segment at all")
    assert info.value.code == -74
    assert info.value.message


def test_segment_truncated_is_corrupt():
    with pytest.raises(Corrupt):
        decode_segment(b"\x28\xb5\x2f\xfd")  # a zstd magic number and nothing more


def test_segment_empty_blob_is_refused():
    with pytest.raises((Corrupt, InvalidArgument)):
        decode_segment(b"")


def test_segment_txn_hash_is_16_stable_bytes():
    a = txn_hash("t1")
    assert len(a) == 16
    assert a == txn_hash(b"t1")
    assert a != txn_hash("t2")
    assert len(txn_hash("")) == 16


def test_segment_txn_hash_is_xxh3_128_big_endian():
    # Known vector: XXH3-128 of the empty input is 99aa06d3014798d8 6001c324468d497f.
    assert txn_hash("").hex() == "99aa06d3014798d86001c324468d497f"
    # And an independent computation through the system libxxhash, when present.
    import ctypes
    import ctypes.util

    path = ctypes.util.find_library("xxhash")
    if path is None:
        return

    class Hash128(ctypes.Structure):
        _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]

    xxh3 = ctypes.CDLL(path).XXH3_128bits
    xxh3.restype = Hash128
    xxh3.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    for text in (b"t1", b"a transaction id of some length", bytes(range(256))):
        h = xxh3(text, len(text))
        assert txn_hash(text) == h.high64.to_bytes(8, "big") + h.low64.to_bytes(8, "big")
