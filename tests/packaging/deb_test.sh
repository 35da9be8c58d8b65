#!/usr/bin/env bash
# deb_test.sh [BUILD_DIR]
#
# Builds the Debian packages (abi/packaging.cmake: libqueen-sweeper1, libqueen-sweeper-dev,
# queen-sweeper-common) in BUILD_DIR (default <repo>/build-deb, configured for Debian's
# layout: prefix /usr, libdir lib/<multiarch>), checks their control fields and contents,
# then installs them with `dpkg -i` into a throwaway root and builds hosts against what
# dpkg put there:
#
#   - the root is a directory under /tmp with a dpkg database of its own (`dpkg --root`):
#     it records as installed only the packages ours depend on (their stanzas copied from
#     this machine's database, whose files are here already), so dpkg checks every Depends
#     for real, and it holds the little a maintainer script needs (/bin/sh, ldconfig and
#     the C library), so the postinst and postrm run, chrooted, and must succeed;
#   - examples/c_host/host.c is compiled against the installed header with pkg-config and
#     with find_package(QueenSweeper), and each binary runs its whole scenario against the
#     test PostgreSQL with the installed libqueen_sweeper.so.1 (dlopen); a small host that
#     links both installed libraries (-lqueen_sweeper -lqueen_ephemeral) runs too;
#   - the packages are purged again and nothing of theirs is left in the root.
#
# The machine's own /usr and dpkg database are never touched: the test fails if either
# gains a file or package of ours. The database: the one in the environment (tests/run's,
# QUEEN_TEST_CONNINFO), else a throwaway one started here with tests/pg.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$src/build-deb}
case "$build" in /*) ;; *) build=$PWD/$build ;; esac
work=$(mktemp -d /tmp/queen-deb.XXXXXX)
pgdir=
cleanup() {
  if [ -n "$pgdir" ]; then "$src/tests/pg" stop "$pgdir"; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
say() { echo "deb_test: $*"; }

version=$(sed -n 's/^project(queen_sweeper VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project version in CMakeLists.txt"
debver=$version-1
arch=$(dpkg --print-architecture)
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=usr/lib/$triplet

# What this machine has of ours before the test, to compare with afterwards.
host_state() {
  dpkg-query -W -f='${binary:Package} ${Status}\n' 'libqueen-sweeper*' 'queen-sweeper-common' 2>/dev/null || true
  ls -d /usr/lib/*/libqueen_* /usr/lib/libqueen_* /usr/include/queen_*.h /usr/share/queen-sweeper 2>/dev/null || true
}
host_before=$(host_state)

# 1. Build the packages.
say "building the packages in $build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
  -DQUEEN_SWEEPER_TESTS=OFF -DQUEEN_SWEEPER_DEB_RELEASE=1 >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$build" -j2 >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; fail "build"; }
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB) >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log"; fail "cpack -G DEB"; }
runtime=$build/libqueen-sweeper1_${debver}_$arch.deb
dev=$build/libqueen-sweeper-dev_${debver}_$arch.deb
common=$build/queen-sweeper-common_${debver}_all.deb
for deb in "$runtime" "$dev" "$common"; do [ -f "$deb" ] || fail "cpack made no $(basename "$deb")"; done
debs=("$build"/*.deb)
[ ${#debs[@]} = 3 ] || fail "cpack made other packages: ${debs[*]}"

# A tree configured for another prefix refuses to make packages (they would not be Debian's).
other=$work/other-prefix
cmake -S "$src" -B "$other" -DCMAKE_INSTALL_PREFIX=/usr/local -DQUEEN_SWEEPER_TESTS=OFF >/dev/null 2>&1 ||
  fail "configuring a /usr/local tree"
if (cd "$other" && cpack -G DEB -B "$other/out") >"$work/other.log" 2>&1; then
  fail "cpack made packages from a tree configured with prefix /usr/local"
fi
grep -q "CMAKE_INSTALL_PREFIX=/usr" "$work/other.log" || { cat "$work/other.log"; fail "no reason given for the refusal"; }

# 2. Control fields and contents.
field() { dpkg-deb -f "$1" "$2"; }
contents() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./||; s|/$||' | grep -v '^$'; }
for deb in "$runtime" "$dev" "$common"; do
  [ "$(field "$deb" Version)" = "$debver" ] || fail "$(basename "$deb"): Version $(field "$deb" Version), not $debver"
  [ -n "$(field "$deb" Maintainer)" ] || fail "$(basename "$deb"): no Maintainer"
  [ -n "$(field "$deb" Description)" ] || fail "$(basename "$deb"): no Description"
done
[ "$(field "$common" Architecture)" = all ] || fail "queen-sweeper-common is not Architecture: all"
depends=$(field "$runtime" Depends)
for need in libc6 libpq5 libuv1 libzstd1 libxxhash0; do
  echo "$depends" | grep -Eq "(^|, )$need( |,|$)" || fail "libqueen-sweeper1 does not depend on $need: $depends"
done
[ "$(field "$dev" Depends)" = "libqueen-sweeper1 (= $debver)" ] || fail "libqueen-sweeper-dev Depends: $(field "$dev" Depends)"
dpkg-deb -e "$runtime" "$work/ctrl"
grep -qx "libqueen_sweeper 1 libqueen-sweeper1 (>= $debver)" "$work/ctrl/shlibs" || fail "no shlibs line for libqueen_sweeper"
grep -qx "libqueen_ephemeral 1 libqueen-sweeper1 (>= $debver)" "$work/ctrl/shlibs" || fail "no shlibs line for libqueen_ephemeral"
# The runtime package holds only what its SONAMEs name; the rest is in the other two.
bad=$(contents "$runtime" | grep -v -E "^(usr|usr/lib|$libdir|$libdir/libqueen_(sweeper|ephemeral)\.so\.1(\.[0-9.]+)?)$" || true)
[ -z "$bad" ] || fail "libqueen-sweeper1 holds more than the .so.1 files: $bad"
for f in "$libdir/libqueen_sweeper.so.1" "$libdir/libqueen_sweeper.so.$version" "$libdir/libqueen_ephemeral.so.1"; do
  contents "$runtime" | grep -qx "$f" || fail "libqueen-sweeper1 lacks $f"
done
for f in usr/include/queen_sweeper.h usr/include/queen_ephemeral.h "$libdir/libqueen_sweeper.so" \
         "$libdir/libqueen_ephemeral.so" "$libdir/pkgconfig/queen-sweeper.pc" "$libdir/pkgconfig/queen-ephemeral.pc" \
         "$libdir/cmake/QueenSweeper/QueenSweeperConfig.cmake"; do
  contents "$dev" | grep -qx "$f" || fail "libqueen-sweeper-dev lacks $f"
done
contents "$dev" | grep -q '\.so\.1' && fail "libqueen-sweeper-dev holds a versioned library"
for f in usr/share/queen-sweeper/monitoring/queen-sweeper.rules.yml usr/share/queen-sweeper/monitoring/grafana-dashboard.json; do
  contents "$common" | grep -qx "$f" || fail "queen-sweeper-common lacks $f"
done
for f in "$src"/sql/*.sql; do
  contents "$common" | grep -qx "usr/share/queen-sweeper/sql/$(basename "$f")" || fail "queen-sweeper-common lacks sql/$(basename "$f")"
done
say "packages built: $(basename "$runtime"), $(basename "$dev"), $(basename "$common")"

# 3. The throwaway root: a dpkg database of its own, and what maintainer scripts need.
new_root() {
  local r=$1 dep pkg
  mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates" "$r/var/lib/dpkg/triggers" \
    "$r/usr/bin" "$r/usr/sbin" "$r/usr/lib/$triplet" "$r/usr/lib64" "$r/etc/ld.so.conf.d" "$r/tmp"
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$r/$d"; done
  : >"$r/var/lib/dpkg/available"
  : >"$r/var/lib/dpkg/status"
  # Every package our packages depend on, recorded as installed (its files are this
  # machine's; the root only needs dpkg to know of it).
  for dep in $( (field "$runtime" Depends; field "$dev" Depends; field "$common" Depends) |
               tr ',' '\n' | sed 's/(.*//; s/ //g' | grep -v '^libqueen-sweeper' | sort -u); do
    pkg=$(dpkg-query -W -f='${binary:Package}' "$dep") || fail "this machine lacks $dep, a dependency"
    dpkg-query -s "$pkg" >>"$r/var/lib/dpkg/status"
    echo >>"$r/var/lib/dpkg/status"
    : >"$r/var/lib/dpkg/info/$pkg.list"
  done
  # /bin/sh, ldconfig and the C library, for the postinst and postrm (run chrooted).
  cp /bin/dash "$r/usr/bin/dash"
  ln -s dash "$r/usr/bin/sh"
  cp /sbin/ldconfig "$r/usr/sbin/ldconfig"
  cp -L "$(ldd /bin/dash | awk '/libc\.so/ {print $3}')" "$r/usr/lib/$triplet/"
  cp -L /lib64/ld-linux-x86-64.so.2 "$r/usr/lib64/"
  cp /etc/ld.so.conf "$r/etc/"
  cp /etc/ld.so.conf.d/*.conf "$r/etc/ld.so.conf.d/"
}
root=$work/root
new_root "$root"

# A Depends that is not met stops dpkg: the -dev package alone, in a root of its own.
lone=$work/lone
new_root "$lone"
if dpkg --root="$lone" -i "$dev" >"$work/lone.log" 2>&1; then
  fail "dpkg installed libqueen-sweeper-dev without libqueen-sweeper1"
fi
grep -q "depends on libqueen-sweeper1" "$work/lone.log" || { cat "$work/lone.log"; fail "dpkg refused the -dev package for another reason"; }

# 4. dpkg -i, all three.
dpkg --root="$root" -i "$runtime" "$dev" "$common" >"$work/dpkg-i.log" 2>&1 ||
  { cat "$work/dpkg-i.log"; fail "dpkg -i"; }
for p in libqueen-sweeper1 libqueen-sweeper-dev queen-sweeper-common; do
  st=$(dpkg-query --root="$root" -W -f='${Status} ${Version}' "$p")
  [ "$st" = "install ok installed $debver" ] || fail "$p: $st"
done
for so in libqueen_sweeper.so.1 libqueen_ephemeral.so.1; do
  [ -e "$root/$libdir/$so" ] || fail "$libdir/$so not installed"
  readelf -d "$root/$libdir/$so" | grep -q "SONAME.*\[$so\]" || fail "$so has no SONAME $so"
  # The postinst ran ldconfig in the root: its cache knows the library (by /lib or /usr/lib,
  # one directory since /usr was merged).
  ldconfig -r "$root" -p | grep -Eq "^[[:space:]]*$so \(.*=> (/usr)?/lib/$triplet/$so\$" ||
    fail "the root's ld.so.cache lacks $so"
done
say "dpkg -i: the three packages are installed in $root (postinst ran ldconfig there)"

# 5. Hosts against the installed files.
export QUEEN_EXAMPLE_SWEEPER_CONNINFO=${QUEEN_TEST_SWEEPER_CONNINFO:-}
if [ -z "${QUEEN_TEST_CONNINFO:-}" ]; then
  pgdir=$(mktemp -d /tmp/queen-deb-pg.XXXXXX)
  eval "$("$src/tests/pg" start "$pgdir")"
  export QUEEN_EXAMPLE_SWEEPER_CONNINFO=$QUEEN_TEST_SWEEPER_CONNINFO
fi
lib=$root/$libdir
host_src=$src/examples/c_host/host.c
# run_host BINARY LIBRARY LABEL: the example's whole scenario (load, ready, schedule, fire,
# read back, stop), with LIBRARY dlopened; it exits 0 only if every timer fired exactly once.
run_host() {
  local out
  out=$(EXAMPLE_TIMERS=5 "$1" "$2" "$QUEEN_TEST_CONNINFO" 2>&1) || { echo "$out"; fail "$3: the host failed"; }
  echo "$out" | grep -q "^loaded $2: version $version, ABI 1\." || { echo "$out"; fail "$3: did not load $2"; }
  say "$3: $(echo "$out" | head -1)"
}

# pkg-config, with the root's .pc files only.
pc=(env PKG_CONFIG_LIBDIR="$lib/pkgconfig" PKG_CONFIG_PATH= pkg-config)
[ "$("${pc[@]}" --modversion queen-sweeper)" = "$version" ] || fail "pkg-config --modversion queen-sweeper"
[ "$(realpath "$("${pc[@]}" --variable=includedir queen-sweeper)")" = "$(realpath "$root/usr/include")" ] ||
  fail "queen-sweeper.pc's includedir is not the root's"
# shellcheck disable=SC2046 # pkg-config's output is meant to be split into words
cc -std=c99 -Wall -Wextra -Werror "$host_src" -o "$work/host_pc" $("${pc[@]}" --cflags queen-sweeper) \
  $(pkg-config --cflags --libs libpq) -ldl -lpthread || fail "the C host does not build with pkg-config"
run_host "$work/host_pc" "$lib/libqueen_sweeper.so.1" "pkg-config host"

cat >"$work/linked.c" <<'C'
#include <queen_ephemeral.h>
#include <queen_sweeper.h>
#include <stdio.h>
/* Links both installed libraries; each one's major must match its installed header. */
int main(void) {
    if ((queen_sweeper_abi_version() >> 16) != QUEEN_SWEEPER_ABI_MAJOR) return 1;
    if ((queen_ephemeral_abi_version() >> 16) != QUEEN_EPHEMERAL_ABI_MAJOR) return 1;
    printf("%s %s\n", queen_sweeper_version(), queen_ephemeral_version());
    return 0;
}
C
# shellcheck disable=SC2046
cc -std=c99 -Wall -Werror "$work/linked.c" -o "$work/linked_pc" $("${pc[@]}" --cflags --libs queen-sweeper queen-ephemeral) ||
  fail "a host linking both libraries does not build with pkg-config"
out=$(LD_LIBRARY_PATH=$lib "$work/linked_pc") || fail "the linked host does not run"
[ "${out%% *}" = "$version" ] || fail "the linked host reports version '$out'"
ldd_out=$(LD_LIBRARY_PATH=$lib ldd "$work/linked_pc")
echo "$ldd_out" | grep -q "libqueen_sweeper.so.1 => $lib/libqueen_sweeper.so.1" || { echo "$ldd_out"; fail "linked the wrong library"; }
say "pkg-config: a host linking -lqueen_sweeper -lqueen_ephemeral runs ($out)"

# find_package(QueenSweeper) from the root's prefix.
mkdir -p "$work/consumer"
cat >"$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(deb_consumer C)
find_package(QueenSweeper 1 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PQ REQUIRED IMPORTED_TARGET libpq)
find_package(Threads REQUIRED)
# The example host dlopens the library: it takes the target's header, not its link.
add_executable(example_c_host ${HOST_C})
set_target_properties(example_c_host PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON)
target_include_directories(example_c_host PRIVATE
  $<TARGET_PROPERTY:QueenSweeper::queen_sweeper,INTERFACE_INCLUDE_DIRECTORIES>)
target_link_libraries(example_c_host PRIVATE PkgConfig::PQ ${CMAKE_DL_LIBS} Threads::Threads)
add_executable(linked ${LINKED_C})
target_link_libraries(linked PRIVATE QueenSweeper::queen_sweeper QueenSweeper::queen_ephemeral)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/found.txt CONTENT
  "$<TARGET_FILE:QueenSweeper::queen_sweeper>\n${QueenSweeper_DIR}\n")
CM
cmake -S "$work/consumer" -B "$work/consumer/build" -DHOST_C="$host_src" -DLINKED_C="$work/linked.c" \
  -DCMAKE_PREFIX_PATH="$root/usr" >"$work/consumer.log" 2>&1 ||
  { cat "$work/consumer.log"; fail "find_package(QueenSweeper) fails on the installed files"; }
cmake --build "$work/consumer/build" >>"$work/consumer.log" 2>&1 ||
  { cat "$work/consumer.log"; fail "the find_package hosts do not build"; }
found_lib=$(sed -n 1p "$work/consumer/build/found.txt")
found_dir=$(sed -n 2p "$work/consumer/build/found.txt")
[ "$(realpath "$found_dir")" = "$(realpath "$lib/cmake/QueenSweeper")" ] || fail "find_package found $found_dir"
[ "$(realpath "$found_lib")" = "$(realpath "$lib/libqueen_sweeper.so.1")" ] || fail "the target's library is $found_lib"
run_host "$work/consumer/build/example_c_host" "$found_lib" "find_package host"
out=$(LD_LIBRARY_PATH=$lib "$work/consumer/build/linked") || fail "the find_package linked host does not run"
[ "${out%% *}" = "$version" ] || fail "the find_package linked host reports version '$out'"
say "find_package(QueenSweeper 1): found in $found_dir; both hosts ran"

# 6. Purge: nothing of ours is left in the root, and its ld.so.cache forgets the libraries.
dpkg --root="$root" --purge libqueen-sweeper-dev queen-sweeper-common libqueen-sweeper1 >"$work/purge.log" 2>&1 ||
  { cat "$work/purge.log"; fail "dpkg --purge"; }
left=$(cd "$root" && find usr -name 'libqueen_*' -o -name 'queen_*.h' -o -name 'queen-sweeper*' -o -name QueenSweeper)
[ -z "$left" ] || fail "left after the purge: $left"
ldconfig -r "$root" -p | grep -q libqueen_ && fail "the root's ld.so.cache still lists our libraries after the purge"

# 7. The machine itself is as it was.
[ "$(host_state)" = "$host_before" ] || fail "this machine's packages or /usr changed: before [$host_before] after [$(host_state)]"
say "dpkg --purge left nothing; this machine's /usr and dpkg database are unchanged"
echo "deb_test: all passed"
