"""Python bindings (ctypes, standard library only) of libqueen_sweeper.so, ABI v1.

    from queen_sweeper import Sweeper
    with Sweeper(conninfo="host=... dbname=...", apply_schema=True) as sw:
        sw.on_fired(lambda tenant, queue, partition, count, base_offset: ...)
        sw.start()
        ...                      # after each commit that scheduled a timer:
        sw.wake(deliver_at)      # a datetime or epoch milliseconds
        print(sw.stats()["fired_total"])

The library is found, in order: the `library=` argument, $QUEEN_SWEEPER_LIBRARY,
the build trees ($QUEEN_SWEEPER_BUILD_DIR, then <repo>/build from a checkout),
`pkg-config --variable=libdir queen-sweeper`, then the loader's paths
(ctypes.util.find_library, libqueen_sweeper.so.1). A failure lists every place tried.
"""

from .ephemeral import Ephemeral, Message, SweepResult
from .errors import (
    Corrupt,
    Empty,
    Full,
    InternalError,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    QueenSweeperError,
    Stale,
    StateError,
    Timeout,
    VersionMismatch,
)
from .segment import Frame, decode_segment, txn_hash
from .sweeper import (
    LOG_DEBUG,
    LOG_ERROR,
    LOG_INFO,
    LOG_WARN,
    Sweeper,
    abi_version,
    status_name,
    unix_ms,
    version,
)

__all__ = [
    "Ephemeral", "Message", "SweepResult", "Empty", "Full", "NotFound", "Stale",
    "Corrupt", "InternalError", "InvalidArgument", "OutOfMemory", "QueenSweeperError",
    "StateError", "Timeout", "VersionMismatch",
    "Frame", "decode_segment", "txn_hash",
    "LOG_DEBUG", "LOG_ERROR", "LOG_INFO", "LOG_WARN", "Sweeper", "abi_version", "unix_ms",
    "version", "status_name",
]
