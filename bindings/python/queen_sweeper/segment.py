"""Reading what was fired: the segment codec and the transaction-id hash."""

from __future__ import annotations

import ctypes
import uuid
from dataclasses import dataclass
from typing import Optional

from . import _native
from .errors import check

FLAG_TRACE_ID = 1
FLAG_PRODUCER_SUB = 2
FLAG_ENCRYPTED = 4


@dataclass(frozen=True)
class Frame:
    """One message of a packed segment."""

    flags: int
    message_id: uuid.UUID
    trace_id: Optional[uuid.UUID]  # None unless flags & FLAG_TRACE_ID
    txn: str
    producer_sub: Optional[str]    # None unless flags & FLAG_PRODUCER_SUB
    encrypted: bool
    payload: bytes


def _bytes_at(address: Optional[int], length: int) -> bytes:
    if not length:
        return b""
    return ctypes.string_at(address, length)


def _frame_from(raw: _native.FrameStruct) -> Frame:
    flags = int(raw.flags)
    sub = None
    if flags & FLAG_PRODUCER_SUB:
        sub = _bytes_at(raw.producer_sub, raw.producer_sub_len).decode("utf-8", "replace")
    return Frame(
        flags=flags,
        message_id=uuid.UUID(bytes=bytes(raw.message_id)),
        trace_id=uuid.UUID(bytes=bytes(raw.trace_id)) if flags & FLAG_TRACE_ID else None,
        txn=_bytes_at(raw.txn, raw.txn_len).decode("utf-8", "replace"),
        producer_sub=sub,
        encrypted=bool(flags & FLAG_ENCRYPTED),
        payload=_bytes_at(raw.payload, raw.payload_len),
    )


def decode_segment(blob: bytes, library=None) -> list[Frame]:
    """Decode a queen.log_segments.blob into its frames; Corrupt on a bad blob."""
    native = library if isinstance(library, _native.Native) else _native.load(library)
    data = bytes(blob)
    seg = _native.SegmentPtr()
    check(native, native.segment_decode(data, len(data), ctypes.byref(seg)))
    try:
        frames = []
        for index in range(native.segment_count(seg)):
            raw = _native.FrameStruct()
            raw.struct_size = ctypes.sizeof(_native.FrameStruct)
            check(native, native.segment_frame(seg, index, ctypes.byref(raw)))
            # Copied out before the segment (which owns the pointers) is freed.
            frames.append(_frame_from(raw))
        return frames
    finally:
        native.segment_free(ctypes.byref(seg))


def txn_hash(txn, library=None) -> bytes:
    """xxh3-128 of the txn bytes, 16 bytes big-endian, as stored in queen.log_txns.hashes."""
    native = library if isinstance(library, _native.Native) else _native.load(library)
    data = txn.encode("utf-8") if isinstance(txn, str) else bytes(txn)
    out = (ctypes.c_uint8 * 16)()
    check(native, native.txn_hash(data, len(data), ctypes.byref(out)))
    return bytes(out)
