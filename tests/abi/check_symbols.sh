#!/usr/bin/env bash
# Fails when the library exports anything beyond the header's functions, or
# misses one of them, or when the version script and the header disagree.
set -euo pipefail
so=$1 header=$2 map=$3
want=$(grep -oE 'QUEEN_SWEEPER_API [^(]*\b(queen_sweeper_[a-z0-9_]+)\(' "$header" |
       grep -oE 'queen_sweeper_[a-z0-9_]+\($' | tr -d '(' | sort -u)
have=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRWVi]$/ {print $3}' | sed 's/@.*//' |
       grep -vE '^(_init|_fini|_edata|_end|__bss_start|QUEEN_SWEEPER_1)$' | sort -u)
mapped=$(grep -oE 'queen_sweeper_[a-z0-9_]+;' "$map" | tr -d ';' | sort -u)
status=0
if [ "$want" != "$have" ]; then
  echo "exported symbols differ from the header:"; diff <(echo "$want") <(echo "$have") || true; status=1
fi
if [ "$want" != "$mapped" ]; then
  echo "version script differs from the header:"; diff <(echo "$want") <(echo "$mapped") || true; status=1
fi
# Each function is bound to the version node of the minor it appeared in ("Since: 1.1" ->
# QUEEN_SWEEPER_1.1, "Since: 1.0" -> QUEEN_SWEEPER_1), in the script and in the library.
since=$(awk '/Since: [0-9]+\.[0-9]+/ {match($0, /[0-9]+\.[0-9]+/); v = substr($0, RSTART, RLENGTH)}
             /QUEEN_SWEEPER_API/ && match($0, /queen_sweeper_[a-z0-9_]+\(/) {
               n = substr($0, RSTART, RLENGTH - 1); split(v, p, ".");
               print n, (p[2] == "0" ? "QUEEN_SWEEPER_" p[1] : "QUEEN_SWEEPER_" v) }' "$header" | sort -u)
nodes=$(awk '/^QUEEN_SWEEPER_[0-9.]+ *\{/ {node = $1} /queen_sweeper_[a-z0-9_]+;/ {gsub(/[ ;]/, ""); print $0, node}' "$map" |
        sort -u)
bound=$(nm -D --defined-only "$so" | awk '$3 ~ /^queen_sweeper_/ {split($3, p, "@+"); print p[1], p[2]}' | sort -u)
if [ "$since" != "$nodes" ]; then
  echo "version nodes of the script differ from the header's Since: lines:"; diff <(echo "$since") <(echo "$nodes") || true
  status=1
fi
if [ "$since" != "$bound" ]; then
  echo "symbol versions of the library differ from the header's Since: lines:"; diff <(echo "$since") <(echo "$bound") || true
  status=1
fi
n=$(echo "$want" | wc -l)
[ "$status" = 0 ] && echo "exports exactly the header's $n functions"
exit $status
