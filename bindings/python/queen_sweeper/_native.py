"""The one place that finds libqueen_sweeper.so and declares its prototypes.

Every function of abi/queen_sweeper.h is declared here once, with its argtypes
and restype; the rest of the package calls through the `Native` object and
never touches ctypes.CDLL directly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import threading
from pathlib import Path
from typing import Optional

from .errors import VersionMismatch

# The major this package was written against; a library with another major is refused.
ABI_MAJOR = 1
ABI_MINOR = 1

LIBRARY_ENV = "QUEEN_SWEEPER_LIBRARY"
BUILD_DIR_ENV = "QUEEN_SWEEPER_BUILD_DIR"
LIBRARY_FILE = "libqueen_sweeper.so"
LIBRARY_SONAME = "libqueen_sweeper.so.1"

# bindings/python/queen_sweeper -> the repository root, whose build/ is the default tree.
_REPO_ROOT = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------
# Types of the header, section 2.
# ---------------------------------------------------------------------------

class SweeperHandle(ctypes.Structure):
    """queen_sweeper (opaque)."""


class SegmentHandle(ctypes.Structure):
    """queen_sweeper_segment (opaque)."""


SweeperPtr = ctypes.POINTER(SweeperHandle)
SegmentPtr = ctypes.POINTER(SegmentHandle)

LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
FIRED_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                            ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int64)
WAKE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)


class BackstopResult(ctypes.Structure):
    """queen_sweeper_backstop_result."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("redelivered", ctypes.c_uint64),
        ("exhausted", ctypes.c_uint64),
        ("ttl_dropped", ctypes.c_uint64),
        ("queues_collected", ctypes.c_uint64),
        ("next_expiry_unix_ms", ctypes.c_int64),
    ]


SWEEP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.POINTER(BackstopResult))
ATTACH_WAKER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, WAKE_FN, ctypes.c_void_p)


class Backstop(ctypes.Structure):
    """queen_sweeper_backstop."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("ctx", ctypes.c_void_p),
        ("sweep", SWEEP_FN),
        ("attach_waker", ATTACH_WAKER_FN),
    ]


class FrameStruct(ctypes.Structure):
    """queen_sweeper_frame. Pointers are c_void_p so ctypes never stops at a NUL."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("flags", ctypes.c_uint8),
        ("message_id", ctypes.c_uint8 * 16),
        ("trace_id", ctypes.c_uint8 * 16),
        ("txn", ctypes.c_void_p),
        ("txn_len", ctypes.c_size_t),
        ("producer_sub", ctypes.c_void_p),
        ("producer_sub_len", ctypes.c_size_t),
        ("payload", ctypes.c_void_p),
        ("payload_len", ctypes.c_size_t),
    ]


# (name, restype, argtypes): the header's functions, in the header's order.
_PROTOTYPES = [
    ("queen_sweeper_abi_version", ctypes.c_uint32, []),
    ("queen_sweeper_version", ctypes.c_char_p, []),
    ("queen_sweeper_create", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(SweeperPtr)]),
    ("queen_sweeper_set_log_callback", ctypes.c_int, [SweeperPtr, LOG_FN, ctypes.c_void_p]),
    ("queen_sweeper_set_fired_callback", ctypes.c_int, [SweeperPtr, FIRED_FN, ctypes.c_void_p]),
    ("queen_sweeper_set_backstop", ctypes.c_int, [SweeperPtr, ctypes.POINTER(Backstop)]),
    ("queen_sweeper_start", ctypes.c_int, [SweeperPtr]),
    ("queen_sweeper_stop", ctypes.c_int, [SweeperPtr, ctypes.c_uint32]),
    ("queen_sweeper_destroy", None, [ctypes.POINTER(SweeperPtr)]),
    ("queen_sweeper_wake", None, [SweeperPtr, ctypes.c_int64]),
    ("queen_sweeper_last_error", ctypes.c_char_p, []),
    ("queen_sweeper_stats", ctypes.c_int64, [SweeperPtr, ctypes.c_char_p, ctypes.c_size_t]),
    ("queen_sweeper_metrics", ctypes.c_int64, [SweeperPtr, ctypes.c_char_p, ctypes.c_size_t]),
    ("queen_sweeper_segment_decode", ctypes.c_int,
     [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(SegmentPtr)]),
    ("queen_sweeper_segment_count", ctypes.c_size_t, [SegmentPtr]),
    ("queen_sweeper_segment_frame", ctypes.c_int,
     [SegmentPtr, ctypes.c_size_t, ctypes.POINTER(FrameStruct)]),
    ("queen_sweeper_segment_free", None, [ctypes.POINTER(SegmentPtr)]),
    ("queen_sweeper_txn_hash", ctypes.c_int,
     [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint8 * 16)]),
    ("queen_sweeper_get_api", ctypes.c_void_p, [ctypes.c_uint32]),
    # Since ABI 1.1.
    ("queen_sweeper_wait_ready", ctypes.c_int, [SweeperPtr, ctypes.c_uint32]),
    ("queen_sweeper_status_name", ctypes.c_char_p, [ctypes.c_int]),
]


# ---------------------------------------------------------------------------
# Finding a library.
# ---------------------------------------------------------------------------

def build_dirs(env_name: str = BUILD_DIR_ENV) -> list[Path]:
    """Build trees to search: every entry of $QUEEN_SWEEPER_BUILD_DIR, then <repo>/build
    when this package is imported from a checkout (not from an installed copy)."""
    dirs = [Path(p) for p in os.environ.get(env_name, "").split(os.pathsep) if p]
    if _REPO_ROOT_OK:
        dirs.append(_REPO_ROOT / "build")
    return dirs


# <repo>/build only means something when this file sits in bindings/python/queen_sweeper.
_REPO_ROOT_OK = Path(__file__).resolve().parent.parent.parent.name == "bindings"


def pkg_config_libdir(package: str) -> tuple[Optional[str], str]:
    """`pkg-config --variable=libdir PACKAGE`: (the directory or None, what happened)."""
    try:
        proc = subprocess.run(["pkg-config", "--print-errors", "--variable=libdir", package],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"pkg-config could not run ({exc})"
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else f"exit {proc.returncode}"
        return None, f"no {package}.pc on the pkg-config path ({why})"
    libdir = proc.stdout.strip()
    if not libdir:
        return None, f"{package}.pc names no libdir"
    return libdir, f"libdir {libdir}"


def search(explicit, env_name: str, file_name: str, soname: str,
           sub_dirs: tuple[str, ...] = ("",)) -> tuple[list[str], list[str]]:
    """Where to look, in order, and why other places were passed over.

    Returns (candidates, misses). The order: `explicit`, then $env_name (either one is
    taken as given: a missing file there is an error, not a reason to fall back
    silently), then the build trees, then pkg-config's libdir for the library's .pc file
    (queen-sweeper.pc for libqueen_sweeper.so), then the dynamic loader's own paths
    (ctypes.util.find_library, then the bare soname).
    """
    if explicit:
        return [os.fspath(explicit)], []
    from_env = os.environ.get(env_name)
    if from_env:
        return [from_env], []
    found: list[str] = []
    misses: list[str] = [f"${env_name}: not set"]
    for tree in build_dirs():
        for sub in sub_dirs:
            path = tree / sub / file_name if sub else tree / file_name
            if path.is_file():
                found.append(str(path))
            else:
                misses.append(f"build tree: no {path}")
    stem = file_name[3:].split(".so")[0]          # libqueen_sweeper.so -> queen_sweeper
    package = stem.replace("_", "-")               # -> queen-sweeper (the .pc file's name)
    libdir, note = pkg_config_libdir(package)
    if libdir:
        hits = [str(Path(libdir) / name) for name in (soname, file_name)
                if (Path(libdir) / name).exists()]
        if hits:
            found.append(hits[0])
        else:
            misses.append(f"pkg-config {package}: {note}, but no {soname} there")
    else:
        misses.append(f"pkg-config {package}: {note}")
    system = ctypes.util.find_library(stem)
    if system:
        found.append(system)
    else:
        misses.append(f"ctypes.util.find_library({stem!r}): not in the loader's cache")
    found.append(soname)                           # LD_LIBRARY_PATH, rpath, ld.so.cache
    return found, misses


def candidate_paths(explicit, env_name: str, file_name: str, soname: str,
                    sub_dirs: tuple[str, ...] = ("",)) -> list[str]:
    """The places `search` would try to load, in order."""
    return search(explicit, env_name, file_name, soname, sub_dirs)[0]


def open_library(explicit, env_name: str, file_name: str, soname: str,
                 sub_dirs: tuple[str, ...] = ("",)) -> tuple[ctypes.CDLL, str]:
    """dlopen the first candidate that loads; the error lists every place looked at."""
    candidates, tried = search(explicit, env_name, file_name, soname, sub_dirs)
    for path in candidates:
        try:
            return ctypes.CDLL(path), path
        except OSError as exc:
            tried.append(f"{path}: {exc}")
    package = file_name[3:].split(".so")[0].replace("_", "-")
    raise OSError(
        f"cannot load {file_name}. Set {env_name} to the library's path, or install it where "
        f"pkg-config finds {package}.pc (PKG_CONFIG_PATH) or where the loader looks "
        f"(ldconfig, LD_LIBRARY_PATH), or set {BUILD_DIR_ENV} to a build directory. "
        "Tried:\n  " + "\n  ".join(tried))


class LoadedLibrary:
    """A loaded shared library: its prototypes declared once, reachable without the
    prefix (lib.create for queen_sweeper_create), and its ABI major checked."""

    PREFIX = ""
    ABI = (0, 0)
    PROTOTYPES: list = []

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self.cdll = cdll
        self.path = path
        for name, restype, argtypes in self.PROTOTYPES:
            fn = getattr(cdll, name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name[len(self.PREFIX):], fn)
        packed = self.abi_version()
        self.abi_major, self.abi_minor = packed >> 16, packed & 0xFFFF
        major, minor = self.ABI
        if self.abi_major != major:
            raise VersionMismatch(
                -95,
                f"{path} implements {self.PREFIX.rstrip('_')} ABI {self.abi_major}.{self.abi_minor}, "
                f"but these bindings need ABI {major}.x (built against {major}.{minor})")

    def last_error_text(self) -> str:
        raw = self.last_error()
        return raw.decode("utf-8", "replace") if raw else ""


class Native(LoadedLibrary):
    """A loaded libqueen_sweeper."""

    PREFIX = "queen_sweeper_"
    ABI = (ABI_MAJOR, ABI_MINOR)
    PROTOTYPES = _PROTOTYPES


_cache: dict[tuple, LoadedLibrary] = {}
_cache_lock = threading.Lock()


def load_cached(cls, library, env_name: str, file_name: str, soname: str,
                sub_dirs: tuple[str, ...] = ("",)):
    """The `cls` for `library` (a path), or for the first library found; one per class and
    path, so every owner shares the prototypes declared once."""
    with _cache_lock:
        key = (cls, os.fspath(library) if library else "")
        native = _cache.get(key)
        if native is None:
            cdll, path = open_library(library, env_name, file_name, soname, sub_dirs)
            native = _cache.get((cls, path)) or cls(cdll, path)
            _cache[key] = _cache[(cls, path)] = native
        return native


def load(library=None) -> Native:
    """The Native for `library` (a path), or for the first library found."""
    return load_cached(Native, library, LIBRARY_ENV, LIBRARY_FILE, LIBRARY_SONAME)
