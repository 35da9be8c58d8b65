# Debian packages with CPack (included by the top-level CMakeLists.txt after every install
# rule). Three packages, one per install component:
#
#   libqueen-sweeper1     component runtime  the two shared libraries, by SONAME:
#                                            libqueen_sweeper.so.1*, libqueen_ephemeral.so.1*
#   libqueen-sweeper-dev  component dev      the headers, the unversioned .so links, the .pc
#                                            files and the CMake package (find_package)
#   queen-sweeper-common  component common   architecture-independent: the schema
#                                            (share/queen-sweeper/sql) and the Prometheus
#                                            rules and Grafana dashboard
#                                            (share/queen-sweeper/monitoring)
#
# The runtime package holds nothing but files named by the SONAME, so a later
# libqueen-sweeper2 can be installed beside it; the files every version shares live in the
# -common package, which the runtime package recommends (the library embeds its schema, so
# it runs without it).
#
# Build them from a tree configured for Debian's layout: the install destinations are fixed
# when CMake configures, and GNUInstallDirs picks lib/<multiarch> only for the prefix /usr:
#
#   cmake -S . -B build-deb -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
#         -DQUEEN_SWEEPER_TESTS=OFF
#   cmake --build build-deb -j2
#   (cd build-deb && cpack -G DEB)          # -> build-deb/*.deb
#
# tests/packaging/deb_test.sh does that and installs the result with dpkg -i.

set(QUEEN_SWEEPER_DEB_MAINTAINER "queen-sweeper maintainers <maintainers@queen-sweeper.invalid>"
    CACHE STRING "Maintainer field of the Debian packages (a distributor sets its own)")
set(QUEEN_SWEEPER_DEB_RELEASE "1" CACHE STRING "Debian revision of the packages (the part after the dash)")

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "queen-sweeper")
set(CPACK_PACKAGE_VENDOR "queen-sweeper")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "${QUEEN_SWEEPER_DEB_MAINTAINER}")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
# The packages' prefix is the configured one; the check below (run by cpack) refuses any
# prefix but /usr.
set(CPACK_PACKAGING_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_STRIP_FILES ON)  # as Debian ships libraries; a build from source keeps its symbols
set(CPACK_PROJECT_CONFIG_FILE "${PROJECT_BINARY_DIR}/QueenSweeperCPackOptions.cmake")
file(WRITE "${PROJECT_BINARY_DIR}/QueenSweeperCPackOptions.cmake"
  "# Written by abi/packaging.cmake; cpack reads it before packaging.\n"
  "if(CPACK_GENERATOR STREQUAL \"DEB\" AND NOT CPACK_PACKAGING_INSTALL_PREFIX STREQUAL \"/usr\")\n"
  "  message(FATAL_ERROR \"Debian packages install under /usr: configure a tree of their own with \"\n"
  "    \"-DCMAKE_INSTALL_PREFIX=/usr (this one has \${CPACK_PACKAGING_INSTALL_PREFIX}; abi/packaging.cmake)\")\n"
  "endif()\n")

# One package per component; only these three (an install rule with no component is left out).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING IGNORE)
set(CPACK_COMPONENTS_ALL runtime dev common)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # name_version-release_arch.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE "${QUEEN_SWEEPER_DEB_RELEASE}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${QUEEN_SWEEPER_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(queen_deb_version "${PROJECT_VERSION}-${QUEEN_SWEEPER_DEB_RELEASE}")
# Below, each component's description: its first line is the package's synopsis.

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME "libqueen-sweeper1")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION "libs")
# Depends from what the libraries link (dpkg-shlibdeps): libpq5, libuv1, libzstd1,
# libxxhash0, libstdc++6 and libc6, each with the lowest version that provides the symbols.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# A shlibs file (only a package with shared objects gets one), so that packages built
# against these libraries get their Depends the same way.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "queen-sweeper-common (= ${queen_deb_version})")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "durable-timer sweeper of a PostgreSQL-backed broker (shared libraries)
libqueen_sweeper.so.1 is the background sweeper of a PostgreSQL-backed broker,
loaded by the broker through a stable C ABI: it fires due timers into the log
exactly once, prunes expired KV rows and rolls up usage.
libqueen_ephemeral.so.1 is the in-RAM ephemeral queue engine it can drive.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libqueen-sweeper-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libqueen-sweeper1 (= ${queen_deb_version})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "durable-timer sweeper of a PostgreSQL-backed broker (development files)
The C headers queen_sweeper.h and queen_ephemeral.h, the libraries' unversioned
links, the pkg-config files queen-sweeper.pc and queen-ephemeral.pc, and the
CMake package QueenSweeper (targets QueenSweeper::queen_sweeper and
QueenSweeper::queen_ephemeral).")

set(CPACK_DEBIAN_COMMON_PACKAGE_NAME "queen-sweeper-common")
set(CPACK_DEBIAN_COMMON_PACKAGE_SECTION "database")
set(CPACK_DEBIAN_COMMON_PACKAGE_ARCHITECTURE "all")
set(CPACK_COMPONENT_COMMON_DESCRIPTION
  "durable-timer sweeper of a PostgreSQL-backed broker (schema and monitoring)
The schema the sweeper reads and writes, as the SQL files an operator applies
with psql (/usr/share/queen-sweeper/sql), and the Prometheus alerting rules and
Grafana dashboard for its metrics (/usr/share/queen-sweeper/monitoring).")

include(CPack)
