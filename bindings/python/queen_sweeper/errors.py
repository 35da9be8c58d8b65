"""Exceptions carrying the library's status code and its own last-error text."""

from __future__ import annotations

OK = 0
EINVAL = -22
ENOMEM = -12
ESTATE = -16
ETIMEDOUT = -110
ECORRUPT = -74
EVERSION = -95
EINTERNAL = -5
# Codes only the ephemeral engine returns.
ENOENT = -2
EAGAIN = -11
EFULL = -28
ESTALE = -116


class QueenSweeperError(Exception):
    """A failing call: `code` is the negative status, `message` the library's last error."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} (code {self.code})" if self.message else f"code {self.code}"


class InvalidArgument(QueenSweeperError, ValueError):
    """EINVAL: a bad argument or configuration; the message names the key."""


class StateError(QueenSweeperError):
    """ESTATE: the call is not valid in the sweeper's current state."""


class Timeout(QueenSweeperError, TimeoutError):
    """ETIMEDOUT: stop could not finish gracefully in time (the sweeper is still stopped)."""


class Corrupt(QueenSweeperError):
    """ECORRUPT: a segment blob is corrupt or truncated."""


class VersionMismatch(QueenSweeperError):
    """EVERSION, or a loaded library whose ABI major differs from the bindings'."""


class OutOfMemory(QueenSweeperError, MemoryError):
    """ENOMEM."""


class InternalError(QueenSweeperError):
    """EINTERNAL or any code these bindings do not know."""


class NotFound(QueenSweeperError, LookupError):
    """ENOENT (ephemeral engine): no such queue, partition, group or open delivery."""


class Empty(QueenSweeperError):
    """EAGAIN (ephemeral engine): nothing visible to pop."""


class Full(QueenSweeperError):
    """EFULL (ephemeral engine): a bound rejected the call; the message names it."""


class Stale(QueenSweeperError):
    """ESTALE (ephemeral engine): the lease was superseded by a later delivery."""


_BY_CODE = {
    EINVAL: InvalidArgument,
    ESTATE: StateError,
    ETIMEDOUT: Timeout,
    ECORRUPT: Corrupt,
    EVERSION: VersionMismatch,
    ENOMEM: OutOfMemory,
    EINTERNAL: InternalError,
    ENOENT: NotFound,
    EAGAIN: Empty,
    EFULL: Full,
    ESTALE: Stale,
}


def error_for(code: int, message: str) -> QueenSweeperError:
    """The exception instance for a status code."""
    return _BY_CODE.get(code, InternalError)(code, message)


def check(native, code: int) -> int:
    """Raise the matching exception for a negative status; return it otherwise."""
    if code < 0:
        raise error_for(code, native.last_error_text())
    return code
