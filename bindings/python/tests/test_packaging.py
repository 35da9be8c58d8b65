"""Packaging.*: pip installs the binding from its folder, and an installed copy finds the
library through the environment, pkg-config or the loader, or says where it looked.

Each check runs a fresh interpreter on the installed copy only (PYTHONPATH = the pip
target, no checkout on the path), so nothing is found through the source tree.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from queen_sweeper import _native, ephemeral

PACKAGE_DIR = Path(__file__).resolve().parents[1]          # bindings/python
MODULES = ["__init__.py", "_lifetime.py", "_native.py", "ephemeral.py", "errors.py",
           "segment.py", "sweeper.py", "py.typed"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`pip install --no-build-isolation --no-deps --target` of a copy of bindings/python
    (a copy, so the build leaves nothing behind in the source tree)."""
    work = tmp_path_factory.mktemp("pip")
    src = work / "src"
    shutil.copytree(PACKAGE_DIR, src, ignore=shutil.ignore_patterns(
        "tests", "__pycache__", "build", "*.egg-info"))
    target = work / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--no-index", "--no-cache-dir", "--disable-pip-version-check", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def clean_env(target: Path, **extra: str) -> dict:
    """An environment where the library can only be found the way a test allows."""
    env = {k: v for k, v in os.environ.items()
           if k not in (_native.LIBRARY_ENV, ephemeral.LIBRARY_ENV, _native.BUILD_DIR_ENV,
                        "LD_LIBRARY_PATH", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR")}
    env["PYTHONPATH"] = str(target)
    # An empty directory as pkg-config's only search path: no system .pc file is seen.
    empty = target.parent / "no-pc"
    empty.mkdir(exist_ok=True)
    env["PKG_CONFIG_LIBDIR"] = str(empty)
    env.update(extra)
    return env


def run_python(target: Path, code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, cwd=target.parent, env=env, check=False)


LOAD_BOTH = """
    import queen_sweeper, queen_sweeper._native as n, queen_sweeper.ephemeral as e
    assert queen_sweeper.__file__.startswith({target!r}), queen_sweeper.__file__
    print(n.load().path)
    print(e.load().path)
"""


def write_pc(directory: Path, name: str, libdir: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pc").write_text(
        f"libdir={libdir}\nName: {name}\nDescription: test\nVersion: 1.0.0\n"
        f"Libs: -L${{libdir}} -l{name.replace('-', '_')}\n")


def test_packaging_pip_installs_every_module_and_py_typed(installed):
    pkg = installed / "queen_sweeper"
    for name in MODULES:
        assert (pkg / name).is_file(), f"{name} not installed by pip"
    dist = [d for d in installed.iterdir() if d.name.startswith("queen_sweeper-")]
    assert dist and (dist[0] / "METADATA").read_text().count("Name: queen-sweeper") == 1


def test_packaging_env_variables_name_the_libraries(installed, native):
    eph = ephemeral.load()
    env = clean_env(installed, **{_native.LIBRARY_ENV: native.path,
                                  ephemeral.LIBRARY_ENV: eph.path})
    proc = run_python(installed, LOAD_BOTH.format(target=str(installed)), env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [native.path, eph.path]


def test_packaging_pkg_config_libdir_is_used(installed, native, tmp_path):
    eph = ephemeral.load()
    pcdir = tmp_path / "pc"
    write_pc(pcdir, "queen-sweeper", os.path.dirname(os.path.realpath(native.path)))
    write_pc(pcdir, "queen-ephemeral", os.path.dirname(os.path.realpath(eph.path)))
    env = clean_env(installed, PKG_CONFIG_LIBDIR=str(pcdir))
    proc = run_python(installed, LOAD_BOTH.format(target=str(installed)), env)
    assert proc.returncode == 0, proc.stderr
    sweeper_path, eph_path = proc.stdout.split()
    assert sweeper_path == os.path.join(os.path.dirname(os.path.realpath(native.path)),
                                        _native.LIBRARY_SONAME)
    assert eph_path == os.path.join(os.path.dirname(os.path.realpath(eph.path)),
                                    ephemeral.LIBRARY_SONAME)


def test_packaging_loader_paths_are_the_last_resort(installed, native):
    eph = ephemeral.load()
    dirs = os.pathsep.join([os.path.dirname(os.path.realpath(native.path)),
                            os.path.dirname(os.path.realpath(eph.path))])
    env = clean_env(installed, LD_LIBRARY_PATH=dirs)
    proc = run_python(installed, LOAD_BOTH.format(target=str(installed)), env)
    assert proc.returncode == 0, proc.stderr
    sweeper_path, eph_path = proc.stdout.split()
    # Either find_library's answer or the bare soname: both are names, not paths.
    assert os.path.basename(sweeper_path).startswith("libqueen_sweeper.so")
    assert os.path.basename(eph_path).startswith("libqueen_ephemeral.so")
    assert "/" not in sweeper_path and "/" not in eph_path


def test_packaging_failure_lists_every_place_tried(installed, tmp_path):
    if ctypes.util.find_library("queen_sweeper"):
        pytest.skip("libqueen_sweeper is installed system-wide, so loading cannot fail here")
    pcdir = tmp_path / "pc"
    write_pc(pcdir, "queen-sweeper", str(tmp_path / "nowhere"))
    env = clean_env(installed, PKG_CONFIG_LIBDIR=str(pcdir),
                    **{_native.BUILD_DIR_ENV: str(tmp_path / "no-build")})
    proc = run_python(installed, """
        import queen_sweeper._native as n
        try:
            n.load()
        except OSError as exc:
            print(exc)
        else:
            raise SystemExit("loaded a library that should not be found")
    """, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    for expected in ("cannot load libqueen_sweeper.so", "Set QUEEN_SWEEPER_LIBRARY",
                     "$QUEEN_SWEEPER_LIBRARY: not set",
                     f"build tree: no {tmp_path / 'no-build' / 'libqueen_sweeper.so'}",
                     f"pkg-config queen-sweeper: libdir {tmp_path / 'nowhere'}, but no "
                     "libqueen_sweeper.so.1 there",
                     "ctypes.util.find_library('queen_sweeper')",
                     "libqueen_sweeper.so.1: "):
        assert expected in text, f"{expected!r} missing from:\n{text}"


def test_packaging_missing_pc_file_is_reported(installed, tmp_path):
    found, misses = _native.search(None, "QUEEN_TEST_UNSET_VARIABLE", "libqueen_nothing.so",
                                   "libqueen_nothing.so.1")
    assert found[-1] == "libqueen_nothing.so.1"
    assert any(m.startswith("pkg-config queen-nothing: no queen-nothing.pc") for m in misses), misses
    assert "$QUEEN_TEST_UNSET_VARIABLE: not set" in misses
