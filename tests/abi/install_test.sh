#!/usr/bin/env bash
# install_test.sh BUILD_DIR
#
# Installs both libraries (libqueen_sweeper.so and libqueen_ephemeral.so) and
# builds small C hosts against the result, with pkg-config and with
# find_package(QueenSweeper). It does so in two libdir layouts - BUILD_DIR's own
# (normally lib) and Debian's multiarch lib/<triplet> - and with the install
# prefix given as an absolute and as a relative path; finally it moves an
# installed tree and checks that the .pc files still resolve (they are
# relocatable). Every host must compile, link and run.
#
# The multiarch layout needs its own configured tree (install destinations are
# fixed at configure time). Compiling it again would only reproduce the same
# binaries, so that tree borrows BUILD_DIR's libraries and runs its own install
# rules, .pc files and CMake package files: exactly the parts under test.
set -euo pipefail
build=$(cd "${1:?usage: install_test.sh BUILD_DIR}" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/queen-install.XXXXXX)
trap 'rm -rf "$work"' EXIT

fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }

cat >"$work/host.c" <<'C'
#include <queen_ephemeral.h>
#include <queen_sweeper.h>
#include <stdio.h>
/* Links against both libraries and checks that each one's major matches its header. */
int main(void) {
    if ((queen_sweeper_abi_version() >> 16) != QUEEN_SWEEPER_ABI_MAJOR) return 1;
    if ((queen_ephemeral_abi_version() >> 16) != QUEEN_EPHEMERAL_ABI_MAJOR) return 1;
    printf("queen-sweeper %s, queen-ephemeral %s\n", queen_sweeper_version(),
           queen_ephemeral_version());
    return 0;
}
C
mkdir -p "$work/consumer"
cat >"$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(QueenSweeper 1 REQUIRED)
add_executable(host_cmake ${HOST_C})
target_link_libraries(host_cmake PRIVATE QueenSweeper::queen_sweeper QueenSweeper::queen_ephemeral)
CM

# check PREFIX LIBDIR LABEL: the installed tree under PREFIX (absolute) with
# libraries in PREFIX/LIBDIR is complete, and hosts build against it both ways.
check() {
  local prefix=$1 libdir=$2 label=$3
  local lib=$prefix/$libdir
  for so in libqueen_sweeper.so.1 libqueen_ephemeral.so.1; do
    [ -e "$lib/$so" ] || fail "$label: $lib/$so not installed"
    readelf -d "$lib/$so" | grep -q "SONAME.*\[$so\]" || fail "$label: $so has no SONAME $so"
  done
  for h in queen_sweeper.h queen_ephemeral.h; do
    [ -f "$prefix/include/$h" ] || fail "$label: include/$h not installed"
  done
  for pc in queen-sweeper queen-ephemeral; do
    [ -f "$lib/pkgconfig/$pc.pc" ] || fail "$label: $libdir/pkgconfig/$pc.pc not installed"
  done
  [ -f "$lib/cmake/QueenSweeper/QueenSweeperConfig.cmake" ] || fail "$label: CMake package not installed"
  [ -n "$(find "$prefix/share/queen-sweeper/sql" -name '*.sql')" ] || fail "$label: SQL files not installed"
  for f in queen-sweeper.rules.yml grafana-dashboard.json; do
    [ -f "$prefix/share/queen-sweeper/monitoring/$f" ] || fail "$label: share/queen-sweeper/monitoring/$f not installed"
  done

  # pkg-config: only this tree's .pc files, and the paths they name must be the real ones.
  local pc_env=(env PKG_CONFIG_LIBDIR="$lib/pkgconfig" PKG_CONFIG_PATH=)
  for pc in queen-sweeper queen-ephemeral; do
    local got_lib got_inc
    got_lib=$("${pc_env[@]}" pkg-config --variable=libdir "$pc")
    got_inc=$("${pc_env[@]}" pkg-config --variable=includedir "$pc")
    [ -d "$got_lib" ] && [ "$(realpath "$got_lib")" = "$(realpath "$lib")" ] ||
      fail "$label: $pc.pc libdir '$got_lib' is not $lib"
    [ -d "$got_inc" ] && [ "$(realpath "$got_inc")" = "$(realpath "$prefix/include")" ] ||
      fail "$label: $pc.pc includedir '$got_inc' is not $prefix/include"
  done
  # shellcheck disable=SC2046 # pkg-config's output is meant to be split into words
  cc -std=c99 -Wall -Werror "$work/host.c" -o "$work/host_pc" \
    $("${pc_env[@]}" pkg-config --cflags --libs queen-sweeper queen-ephemeral) ||
    fail "$label: the pkg-config host does not build"
  LD_LIBRARY_PATH=$lib "$work/host_pc" >/dev/null || fail "$label: the pkg-config host does not run"

  rm -rf "$work/consumer/build"
  cmake -S "$work/consumer" -B "$work/consumer/build" -DHOST_C="$work/host.c" \
    -DCMAKE_PREFIX_PATH="$prefix" >"$work/consumer.log" 2>&1 ||
    { cat "$work/consumer.log"; fail "$label: find_package(QueenSweeper) fails"; }
  cmake --build "$work/consumer/build" >"$work/consumer.log" 2>&1 ||
    { cat "$work/consumer.log"; fail "$label: the find_package host does not build"; }
  LD_LIBRARY_PATH=$lib "$work/consumer/build/host_cmake" >/dev/null ||
    fail "$label: the find_package host does not run"
  echo "install ok: $label (pkg-config and find_package hosts built and ran)"
}

# install_both TREE LIBDIR NAME: install TREE with an absolute and with a relative
# --prefix, and check both.
install_both() {
  local tree=$1 libdir=$2 name=$3
  cmake --install "$tree" --prefix "$work/$name-abs" >/dev/null
  check "$work/$name-abs" "$libdir" "libdir $libdir, absolute prefix"
  (cd "$work" && cmake --install "$tree" --prefix "$name-rel" >/dev/null)
  [ -d "$work/$name-rel" ] || fail "a relative --prefix did not install under the current directory"
  check "$work/$name-rel" "$libdir" "libdir $libdir, relative prefix"
}

# 1. BUILD_DIR as configured.
libdir1=$(cache CMAKE_INSTALL_LIBDIR)
install_both "$build" "${libdir1:-lib}" one

# 2. The multiarch layout, from a second configuration of the same sources.
triplet=$(gcc -print-multiarch 2>/dev/null || true)
libdir2=lib/${triplet:-x86_64-linux-gnu}
tree2=$work/tree-multiarch
cmake -S "$src" -B "$tree2" -DCMAKE_BUILD_TYPE="$(cache CMAKE_BUILD_TYPE)" -DQUEEN_SWEEPER_TESTS=OFF \
  -DCMAKE_INSTALL_LIBDIR="$libdir2" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configuring with CMAKE_INSTALL_LIBDIR=$libdir2"; }
cp -P "$build"/libqueen_sweeper.so* "$tree2/"
mkdir -p "$tree2/plugins/ephemeral"
cp -P "$build"/plugins/ephemeral/libqueen_ephemeral.so* "$tree2/plugins/ephemeral/"
install_both "$tree2" "$libdir2" two

# 3. Relocatable: a tree moved after installation still resolves.
mv "$work/two-abs" "$work/moved"
check "$work/moved" "$libdir2" "libdir $libdir2, tree moved after install"
echo "install: all layouts passed"
