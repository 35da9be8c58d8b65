"""The in-RAM ephemeral queue engine (libqueen_ephemeral.so) and its backstop handing.

    with Ephemeral(lease_ms=5000) as engine, Sweeper(conninfo=...) as sw:
        sw.set_backstop(engine)     # the sweeper runs engine.sweep() once a second
        sw.start()
        engine.push("jobs", "p0", b"hello")
        msg = engine.pop("jobs", "p0", "workers")
        engine.ack("jobs", "p0", "workers", msg.offset, msg.lease_id)

The library is found like libqueen_sweeper.so: the `library=` argument,
$QUEEN_EPHEMERAL_LIBRARY, the build trees (<tree>/plugins/ephemeral/ and <tree>/),
pkg-config's libdir of queen-ephemeral, then the loader's paths.
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

from . import _lifetime, _native
from .errors import Empty, StateError, check
from .sweeper import _guarded, read_snprintf

ABI_MAJOR = 1
ABI_MINOR = 0
LIBRARY_ENV = "QUEEN_EPHEMERAL_LIBRARY"
LIBRARY_FILE = "libqueen_ephemeral.so"
LIBRARY_SONAME = "libqueen_ephemeral.so.1"

INHERIT = -1
OVERFLOW_REJECT = 0
OVERFLOW_DROP_OLDEST = 1
ACK_COMPLETED = 0
ACK_RETRY = 1
ACK_FAILED = 2

_OVERFLOW_NAMES = {"reject": OVERFLOW_REJECT, "drop_oldest": OVERFLOW_DROP_OLDEST}
_OUTCOME_NAMES = {"completed": ACK_COMPLETED, "retry": ACK_RETRY, "failed": ACK_FAILED}


# ---------------------------------------------------------------------------
# Types of queen_ephemeral.h, section 2.
# ---------------------------------------------------------------------------

class EngineHandle(ctypes.Structure):
    """queen_ephemeral (opaque)."""


EnginePtr = ctypes.POINTER(EngineHandle)


class ConfigStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("max_bytes", ctypes.c_uint64),
        ("max_messages", ctypes.c_uint64),
        ("queue_max_bytes", ctypes.c_uint64),
        ("queue_max_messages", ctypes.c_uint64),
        ("overflow", ctypes.c_int32),
        ("lease_ms", ctypes.c_uint32),
        ("max_retries", ctypes.c_uint32),
        ("ttl_ms", ctypes.c_uint64),
        ("idle_gc_ms", ctypes.c_uint64),
        ("max_payload_bytes", ctypes.c_uint64),
        ("max_queues", ctypes.c_uint32),
        ("max_groups", ctypes.c_uint32),
    ]


class QueueOptionsStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("max_bytes", ctypes.c_int64),
        ("max_messages", ctypes.c_int64),
        ("overflow", ctypes.c_int64),
        ("lease_ms", ctypes.c_int64),
        ("max_retries", ctypes.c_int64),
        ("ttl_ms", ctypes.c_int64),
    ]


class MessageStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("offset", ctypes.c_int64),
        ("lease_id", ctypes.c_uint64),
        ("attempt", ctypes.c_uint32),
        ("lease_expires_unix_ms", ctypes.c_int64),
        ("pushed_unix_ms", ctypes.c_int64),
        ("payload", ctypes.c_void_p),
        ("payload_len", ctypes.c_size_t),
    ]


class SweepResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("redelivered", ctypes.c_uint64),
        ("exhausted", ctypes.c_uint64),
        ("ttl_dropped", ctypes.c_uint64),
        ("queues_collected", ctypes.c_uint64),
        ("next_expiry_unix_ms", ctypes.c_int64),
    ]


class QueueInfoStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("declared", ctypes.c_int32),
        ("partitions", ctypes.c_uint32),
        ("groups", ctypes.c_uint32),
        ("messages", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("in_flight", ctypes.c_uint64),
        ("next_expiry_unix_ms", ctypes.c_int64),
    ]


WAKE_FN = _native.WAKE_FN

_PROTOTYPES = [
    ("queen_ephemeral_abi_version", ctypes.c_uint32, []),
    ("queen_ephemeral_version", ctypes.c_char_p, []),
    ("queen_ephemeral_config_init", None, [ctypes.POINTER(ConfigStruct)]),
    ("queen_ephemeral_create", ctypes.c_int,
     [ctypes.POINTER(ConfigStruct), ctypes.POINTER(EnginePtr)]),
    ("queen_ephemeral_destroy", None, [ctypes.POINTER(EnginePtr)]),
    ("queen_ephemeral_queue_options_init", None, [ctypes.POINTER(QueueOptionsStruct)]),
    ("queen_ephemeral_declare", ctypes.c_int,
     [EnginePtr, ctypes.c_char_p, ctypes.POINTER(QueueOptionsStruct)]),
    ("queen_ephemeral_push", ctypes.c_int,
     [EnginePtr, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
      ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]),
    ("queen_ephemeral_pop", ctypes.c_int,
     [EnginePtr, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32,
      ctypes.c_int64, ctypes.POINTER(MessageStruct)]),
    ("queen_ephemeral_ack", ctypes.c_int,
     [EnginePtr, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64,
      ctypes.c_uint64, ctypes.c_int, ctypes.c_int64]),
    ("queen_ephemeral_sweep", ctypes.c_int,
     [EnginePtr, ctypes.c_int64, ctypes.POINTER(SweepResultStruct)]),
    ("queen_ephemeral_attach_waker", ctypes.c_int, [EnginePtr, WAKE_FN, ctypes.c_void_p]),
    ("queen_ephemeral_last_error", ctypes.c_char_p, []),
    ("queen_ephemeral_stats", ctypes.c_int64, [EnginePtr, ctypes.c_char_p, ctypes.c_size_t]),
    ("queen_ephemeral_queue_info", ctypes.c_int,
     [EnginePtr, ctypes.c_char_p, ctypes.POINTER(QueueInfoStruct)]),
    ("queen_ephemeral_message_free", None, [ctypes.POINTER(MessageStruct)]),
    ("queen_ephemeral_backstop", ctypes.c_int,
     [EnginePtr, ctypes.POINTER(_native.Backstop), ctypes.c_size_t]),
]


class EphemeralNative(_native.LoadedLibrary):
    """A loaded libqueen_ephemeral."""

    PREFIX = "queen_ephemeral_"
    ABI = (ABI_MAJOR, ABI_MINOR)
    PROTOTYPES = _PROTOTYPES


def load(library=None) -> EphemeralNative:
    """The EphemeralNative for `library` (a path), or for the first one found."""
    return _native.load_cached(EphemeralNative, library, LIBRARY_ENV, LIBRARY_FILE, LIBRARY_SONAME,
                               sub_dirs=("plugins/ephemeral", ""))


# ---------------------------------------------------------------------------
# The owner.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    """One delivery: settle it with ack(offset=..., lease_id=...)."""

    offset: int
    lease_id: int
    attempt: int
    lease_expires_unix_ms: int
    pushed_unix_ms: int
    payload: bytes


@dataclass(frozen=True)
class SweepResult:
    redelivered: int
    exhausted: int
    ttl_dropped: int
    queues_collected: int
    next_expiry_unix_ms: int  # -1 for none


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _name(value: str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _code(value, names: dict, what: str) -> int:
    if isinstance(value, str):
        try:
            return names[value]
        except KeyError:
            raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(names)}") from None
    return int(value)


class Ephemeral:
    """One engine. Keyword arguments set queen_ephemeral_config fields by name
    (max_bytes, max_messages, queue_max_bytes, queue_max_messages, overflow
    ("reject" / "drop_oldest"), lease_ms, max_retries, ttl_ms, idle_gc_ms,
    max_payload_bytes, max_queues, max_groups); the rest keep the defaults.
    Calls that need a clock take `now` (unix ms) and default to the wall clock.
    """

    def __init__(self, library=None, **config):
        self._native = library if isinstance(library, EphemeralNative) else load(library)
        self._lock = threading.RLock()
        self._handle = EnginePtr()
        self._waker = None
        # Sweepers holding this engine as their backstop (see Sweeper.set_backstop).
        self._holders = weakref.WeakSet()
        cfg = ConfigStruct()
        self._native.config_init(ctypes.byref(cfg))
        known = {name for name, _ in ConfigStruct._fields_} - {"struct_size"}
        for key, value in config.items():
            if key not in known:
                raise TypeError(f"unknown ephemeral config field {key!r}; known: {sorted(known)}")
            if key == "overflow":
                value = _code(value, _OVERFLOW_NAMES, "overflow policy")
            setattr(cfg, key, int(value))
        check(self._native, self._native.create(ctypes.byref(cfg), ctypes.byref(self._handle)))
        _lifetime.engines.add(self)

    def _live(self):
        if not self._handle:
            raise StateError(-16, "the ephemeral engine is closed")
        return self._handle

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Destroy the engine and everything it holds. Idempotent.

        Refused (StateError) while a sweeper using it as its backstop is
        running: the engine must outlive that sweeper's stop.
        """
        with self._lock:
            if not self._handle:
                return
            running = [sw for sw in list(self._holders) if sw.running]
            if running:
                raise StateError(-16, "the ephemeral engine is the backstop of a running "
                                      "sweeper: stop the sweeper before closing the engine")
            self._native.destroy(ctypes.byref(self._handle))
            self._handle = EnginePtr()
            self._waker = None
            _lifetime.engines.discard(self)

    @property
    def closed(self) -> bool:
        return not self._handle

    def __enter__(self) -> "Ephemeral":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None):
                self.close()
        except BaseException:  # pragma: no cover - never raise from __del__
            pass

    # -- control -----------------------------------------------------------

    def declare(self, queue: str, **options) -> None:
        """Declare a queue (kept forever); options override the engine defaults:
        max_bytes, max_messages, overflow, lease_ms, max_retries, ttl_ms."""
        opts = QueueOptionsStruct()
        self._native.queue_options_init(ctypes.byref(opts))
        known = {name for name, _ in QueueOptionsStruct._fields_} - {"struct_size"}
        for key, value in options.items():
            if key not in known:
                raise TypeError(f"unknown queue option {key!r}; known: {sorted(known)}")
            if key == "overflow":
                value = _code(value, _OVERFLOW_NAMES, "overflow policy")
            setattr(opts, key, int(value))
        check(self._native, self._native.declare(self._live(), _name(queue), ctypes.byref(opts)))

    def push(self, queue: str, partition: str, payload: bytes, now: Optional[int] = None) -> int:
        """Append a message; returns its offset in the ring."""
        data = bytes(payload)
        offset = ctypes.c_int64(-1)
        check(self._native, self._native.push(
            self._live(), _name(queue), _name(partition), data, len(data),
            now_ms() if now is None else int(now), ctypes.byref(offset)))
        return offset.value

    def pop(self, queue: str, partition: str, group: str, lease_ms: int = 0,
            now: Optional[int] = None) -> Optional[Message]:
        """Lease the next message for a group, or None when nothing is visible."""
        raw = MessageStruct()
        raw.struct_size = ctypes.sizeof(MessageStruct)
        try:
            check(self._native, self._native.pop(
                self._live(), _name(queue), _name(partition), _name(group), int(lease_ms),
                now_ms() if now is None else int(now), ctypes.byref(raw)))
        except Empty:
            return None
        try:
            payload = ctypes.string_at(raw.payload, raw.payload_len) if raw.payload_len else b""
            return Message(raw.offset, raw.lease_id, raw.attempt, raw.lease_expires_unix_ms,
                           raw.pushed_unix_ms, payload)
        finally:
            self._native.message_free(ctypes.byref(raw))

    def ack(self, queue: str, partition: str, group: str, offset: int = -1, lease_id: int = 0,
            outcome="completed", now: Optional[int] = None) -> None:
        """Settle a delivery: outcome "completed", "retry" or "failed" (or ACK_*)."""
        check(self._native, self._native.ack(
            self._live(), _name(queue), _name(partition), _name(group), int(offset),
            int(lease_id), _code(outcome, _OUTCOME_NAMES, "ack outcome"),
            now_ms() if now is None else int(now)))

    def sweep(self, now: Optional[int] = None) -> SweepResult:
        """One backstop pass over every queue (what the sweeper runs once a second)."""
        out = SweepResultStruct()
        out.struct_size = ctypes.sizeof(SweepResultStruct)
        check(self._native, self._native.sweep(
            self._live(), now_ms() if now is None else int(now), ctypes.byref(out)))
        return SweepResult(out.redelivered, out.exhausted, out.ttl_dropped, out.queues_collected,
                           out.next_expiry_unix_ms)

    def attach_waker(self, fn: Optional[Callable[[int], None]]) -> None:
        """Call fn(at_unix_ms) when the engine arms an earlier lease or ttl; None detaches.

        Only for an engine not handed to a sweeper (the sweeper attaches its own).
        """
        with self._lock:
            if fn is None:
                check(self._native, self._native.attach_waker(self._live(), WAKE_FN(), None))
                self._waker = None
                return

            def trampoline(_ctx, at_unix_ms):
                _guarded("ephemeral waker", fn, int(at_unix_ms))

            c_fn = WAKE_FN(trampoline)
            check(self._native, self._native.attach_waker(self._live(), c_fn, None))
            self._waker = c_fn

    # -- introspection -----------------------------------------------------

    def stats(self) -> dict:
        handle = self._live()
        return json.loads(read_snprintf(lambda buf, cap: check(
            self._native, self._native.stats(handle, buf, cap))))

    def queue_info(self, queue: str) -> dict:
        """A queue's shape; NotFound if it does not exist."""
        out = QueueInfoStruct()
        out.struct_size = ctypes.sizeof(QueueInfoStruct)
        check(self._native, self._native.queue_info(self._live(), _name(queue),
                                                    ctypes.byref(out)))
        return {name: (bool(getattr(out, name)) if name == "declared" else int(getattr(out, name)))
                for name, _ in QueueInfoStruct._fields_ if name != "struct_size"}

    # -- backstop handing ----------------------------------------------------

    def _backstop_provider(self) -> _native.Backstop:
        """A queen_sweeper_backstop filled by the engine, for Sweeper.set_backstop()."""
        provider = _native.Backstop()
        check(self._native, self._native.backstop(self._live(), ctypes.byref(provider),
                                                  ctypes.sizeof(_native.Backstop)))
        return provider

    @property
    def library_path(self) -> str:
        return self._native.path
