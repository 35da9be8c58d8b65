"""The owner of one queen_sweeper handle."""

from __future__ import annotations

import ctypes
import datetime as _dt
import json
import logging
import numbers
import threading
from typing import Callable, Optional

from . import _lifetime, _native
from .errors import StateError, check

log = logging.getLogger("queen_sweeper")

LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG = 0, 1, 2, 3
_LOG_LEVEL_NAMES = {LOG_ERROR: "error", LOG_WARN: "warn", LOG_INFO: "info", LOG_DEBUG: "debug"}

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_ONE_MS = _dt.timedelta(milliseconds=1)

def unix_ms(deliver_at) -> int:
    """A datetime (aware, or naive taken as UTC) or integer epoch ms, as epoch ms."""
    if isinstance(deliver_at, _dt.datetime):
        if deliver_at.tzinfo is None or deliver_at.tzinfo.utcoffset(deliver_at) is None:
            deliver_at = deliver_at.replace(tzinfo=_dt.timezone.utc)
        return (deliver_at - _EPOCH) // _ONE_MS
    if isinstance(deliver_at, numbers.Integral) and not isinstance(deliver_at, bool):
        return int(deliver_at)
    raise TypeError(f"deliver_at must be a datetime or integer epoch milliseconds, "
                    f"not {type(deliver_at).__name__}")


def _guarded(what: str, fn: Callable, *args) -> None:
    """Run a host callback; nothing it raises may unwind into C."""
    try:
        fn(*args)
    except BaseException:  # noqa: BLE001 - a C frame is below us
        try:
            log.exception("queen_sweeper: exception in %s callback (ignored)", what)
        except BaseException:  # pragma: no cover - logging itself failed
            pass


def _text(raw: Optional[bytes]) -> str:
    return raw.decode("utf-8", "replace") if raw is not None else ""


def read_snprintf(call, initial: int = 4096) -> str:
    """Call an snprintf-style function with a buffer that grows until the text fits."""
    cap = initial
    while True:
        buf = ctypes.create_string_buffer(cap)
        needed = call(buf, cap)
        if needed < cap:
            return buf.value.decode("utf-8", "replace")
        # The text can grow between two calls; leave some room.
        cap = needed + 1 + needed // 8


class Sweeper:
    """One sweeper: keyword configuration in, start, wake, stats, stop, close.

    Keyword arguments become the JSON configuration object handed to
    queen_sweeper_create (lower-case knob names: sweeper_min_sleep_ms,
    conninfo, broker_id, apply_schema, read_env, ...). `library` is an explicit
    path to libqueen_sweeper.so; without it the library is searched for.
    """

    def __init__(self, library=None, **config):
        self._native = library if isinstance(library, _native.Native) else _native.load(library)
        # _lock serialises the lifecycle calls; _handle_lock is held only briefly,
        # by the calls C allows concurrently with everything but destroy (wake,
        # stats, metrics), so that destroy never runs under them.
        self._lock = threading.RLock()
        self._handle_lock = threading.Lock()
        self._handle = _native.SweeperPtr()
        self._started = False
        self._stopped = False
        # Every object C may still call or read: kept until the handle is destroyed.
        self._keepalive: dict[str, object] = {}
        self.config = dict(config)
        text = json.dumps(self.config).encode("utf-8")
        check(self._native, self._native.create(text, ctypes.byref(self._handle)))
        _lifetime.sweepers.add(self)

    # -- lifecycle ---------------------------------------------------------

    def _live_handle(self):
        if not self._handle:
            raise StateError(-16, "the sweeper is closed")
        return self._handle

    def on_log(self, fn: Optional[Callable[[int, str], None]]) -> None:
        """Set fn(level, message) as the log callback (before start); None removes it."""
        with self._lock:
            handle = self._live_handle()
            if fn is None:
                check(self._native, self._native.set_log_callback(handle, _native.LOG_FN(), None))
                self._keepalive.pop("log", None)
                return

            def trampoline(_user, level, message):
                _guarded("log", fn, level, _text(message))

            c_fn = _native.LOG_FN(trampoline)
            check(self._native, self._native.set_log_callback(handle, c_fn, None))
            self._keepalive["log"] = c_fn

    def on_fired(self, fn: Optional[Callable[[str, str, str, int, int], None]]) -> None:
        """Set fn(tenant, queue, partition, count, base_offset), run after every fire commit."""
        with self._lock:
            handle = self._live_handle()
            if fn is None:
                check(self._native,
                      self._native.set_fired_callback(handle, _native.FIRED_FN(), None))
                self._keepalive.pop("fired", None)
                return

            def trampoline(_user, tenant, queue, partition, count, base_offset):
                _guarded("fired", fn, _text(tenant), _text(queue), _text(partition),
                         int(count), int(base_offset))

            c_fn = _native.FIRED_FN(trampoline)
            check(self._native, self._native.set_fired_callback(handle, c_fn, None))
            self._keepalive["fired"] = c_fn

    def set_backstop(self, engine) -> None:
        """Hand an ephemeral engine (anything with `_backstop_provider()`) to the sweeper.

        The engine is kept alive by this sweeper until close(), because the
        sweeper calls it until its stop. None removes the provider.
        """
        with self._lock:
            handle = self._live_handle()
            if engine is None:
                check(self._native, self._native.set_backstop(handle, None))
                self._keepalive.pop("backstop", None)
                return
            provider = engine._backstop_provider()
            check(self._native, self._native.set_backstop(handle, ctypes.byref(provider)))
            self._keepalive["backstop"] = (engine, provider)
            holders = getattr(engine, "_holders", None)
            if holders is not None:
                holders.add(self)

    def start(self) -> None:
        """Spawn the sweeper's loop thread; a database that is down is not a failure."""
        with self._lock:
            check(self._native, self._native.start(self._live_handle()))
            self._started = True
            self._stopped = False

    def stop(self, timeout_ms: int = 5000) -> None:
        """Stop gracefully; raises Timeout if the graceful part overran (still stopped)."""
        with self._lock:
            if not self._handle:
                return
            try:
                check(self._native, self._native.stop(self._handle, int(timeout_ms)))
            finally:
                # OK or ETIMEDOUT: either way the thread is joined.
                self._stopped = True

    def close(self) -> None:
        """Stop if needed and destroy the handle. Idempotent."""
        with self._lock:
            if not self._handle:
                return
            try:
                self._native.stop(self._handle, 5000)
            finally:
                with self._handle_lock:
                    self._native.destroy(ctypes.byref(self._handle))
                    self._handle = _native.SweeperPtr()
                self._keepalive.clear()
                _lifetime.sweepers.discard(self)

    @property
    def running(self) -> bool:
        """Started and not yet stopped: it may still call its callbacks and backstop."""
        return bool(self._handle) and self._started and not self._stopped

    @property
    def closed(self) -> bool:
        return not self._handle

    def __enter__(self) -> "Sweeper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # Safety net only: a host should close() (or use `with`).
        try:
            if getattr(self, "_handle", None):
                self.close()
        except BaseException:  # pragma: no cover - never raise from __del__
            pass

    # -- control and introspection ----------------------------------------

    def wake(self, deliver_at) -> None:
        """Ring the sweeper for a timer due at deliver_at (after the scheduling commit).

        Harmless on a closed sweeper, like the C call on a stopped one.
        """
        at = unix_ms(deliver_at)
        with self._handle_lock:
            if self._handle:
                self._native.wake(self._handle, at)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the sweeper is ready: its schema step succeeded (the apply, or
        the version check) and a first probe completed.

        Raises Timeout (with the reason it is not ready, e.g. a failed schema apply)
        when `timeout` seconds pass first, and StateError when the sweeper is not
        started, disabled by configuration, or stopped. The GIL is released while
        waiting (ctypes), and close() waits for this call to return.
        """
        timeout_ms = max(0, min(int(timeout * 1000), 0xFFFFFFFF))
        with self._handle_lock:
            handle = self._live_handle()
            check(self._native, self._native.wait_ready(handle, timeout_ms))

    @property
    def ready(self) -> bool:
        """True once the sweeper is ready (see wait_ready); never blocks."""
        return bool(self.stats().get("ready"))

    def stats(self) -> dict:
        """The sweeper's JSON snapshot as a dict."""
        with self._handle_lock:
            handle = self._live_handle()
            text = read_snprintf(lambda buf, cap: check(
                self._native, self._native.stats(handle, buf, cap)))
        return json.loads(text)

    def metrics(self) -> str:
        """The same figures as Prometheus text exposition."""
        with self._handle_lock:
            handle = self._live_handle()
            return read_snprintf(lambda buf, cap: check(
                self._native, self._native.metrics(handle, buf, cap)))

    @property
    def library_path(self) -> str:
        return self._native.path


def abi_version(library=None) -> tuple[int, int]:
    """(major, minor) of the loaded library."""
    native = _native.load(library)
    return native.abi_major, native.abi_minor


def version(library=None) -> str:
    """The library's release version string."""
    return _text(_native.load(library).version())


def status_name(status: int, library=None) -> str:
    """The symbolic name of a status code, e.g. "QUEEN_SWEEPER_ETIMEDOUT"."""
    return _text(_native.load(library).status_name(int(status)))
