"""Library.*: finding the library, its version, the major check, the api table."""

from __future__ import annotations

import ctypes
import os

import pytest

import queen_sweeper
from queen_sweeper import _native


def test_library_loads_with_major_one(native):
    major, minor = queen_sweeper.abi_version()
    assert major == 1
    assert minor >= 0
    assert native.abi_version() == (major << 16) | minor
    assert queen_sweeper.version()


def test_library_explicit_path_wins(native, monkeypatch):
    monkeypatch.setenv(_native.LIBRARY_ENV, "/nonexistent/libqueen_sweeper.so")
    assert _native.load(native.path) is native


def test_library_env_path_is_used_and_a_bad_one_is_an_error(monkeypatch):
    monkeypatch.setenv(_native.LIBRARY_ENV, "/nonexistent/libqueen_sweeper.so")
    with pytest.raises(OSError, match="QUEEN_SWEEPER_LIBRARY"):
        _native.open_library(None, _native.LIBRARY_ENV, _native.LIBRARY_FILE,
                             _native.LIBRARY_SONAME)


def test_library_build_dir_env_is_searched(native, monkeypatch, tmp_path):
    monkeypatch.delenv(_native.LIBRARY_ENV, raising=False)
    monkeypatch.setenv(_native.BUILD_DIR_ENV,
                       os.pathsep.join([str(tmp_path), os.path.dirname(native.path)]))
    found = _native.candidate_paths(None, _native.LIBRARY_ENV, _native.LIBRARY_FILE,
                                    _native.LIBRARY_SONAME)
    assert found[0] == os.path.join(os.path.dirname(native.path), _native.LIBRARY_FILE)


def test_library_other_major_is_refused_naming_both_versions():
    class FakeFn:
        def __init__(self, value):
            self.value = value

        def __call__(self, *args):
            return self.value

    class FakeLibrary:
        def __getattr__(self, name):
            fn = FakeFn((2 << 16) | 3 if name == "queen_sweeper_abi_version" else 0)
            setattr(self, name, fn)
            return fn

    with pytest.raises(queen_sweeper.VersionMismatch) as info:
        _native.Native(FakeLibrary(), "/fake/libqueen_sweeper.so")
    text = str(info.value)
    assert "2.3" in text and "1." in text


def test_library_get_api_table_matches_the_major(native):
    table = native.get_api(1)
    assert table
    assert ctypes.c_size_t.from_address(table).value > 0
    assert ctypes.c_uint32.from_address(table + ctypes.sizeof(ctypes.c_size_t)).value == 1
    assert not native.get_api(2)
    message = native.last_error_text()
    assert "2" in message and "1" in message


def test_library_last_error_is_never_null(native):
    assert isinstance(native.last_error_text(), str)
