#!/usr/bin/env bash
# Installs into a temporary prefix and builds two tiny hosts against the result:
# one with pkg-config, one with find_package(QueenSweeper). Both must run.
set -euo pipefail
build=$1
prefix=$(mktemp -d /tmp/queen-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libqueen_sweeper.so.1' | head -1)")
test -f "$prefix/include/queen_sweeper.h"
test -n "$(find "$prefix" -name queen-sweeper.pc)"
test -n "$(find "$prefix" -name QueenSweeperConfig.cmake)"
test -n "$(find "$prefix" -path '*queen-sweeper/sql/*' -name '*.sql')"
cat >"$prefix/host.c" <<'C'
#include <queen_sweeper.h>
#include <stdio.h>
int main(void) {
    if ((queen_sweeper_abi_version() >> 16) != QUEEN_SWEEPER_ABI_MAJOR) return 1;
    printf("linked against queen-sweeper %s\n", queen_sweeper_version());
    return 0;
}
C
export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name queen-sweeper.pc | head -1)")
cc -std=c99 "$prefix/host.c" -o "$prefix/host_pc" $(pkg-config --cflags --libs queen-sweeper)
LD_LIBRARY_PATH=$libdir "$prefix/host_pc"
mkdir -p "$prefix/consumer"
cat >"$prefix/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(QueenSweeper 1 REQUIRED)
add_executable(host_cmake ../host.c)
target_link_libraries(host_cmake PRIVATE QueenSweeper::queen_sweeper)
CM
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer/build" >/dev/null
LD_LIBRARY_PATH=$libdir "$prefix/consumer/build/host_cmake"
echo "install: pkg-config and find_package hosts both built and ran"
