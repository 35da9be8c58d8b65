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
n=$(echo "$want" | wc -l)
[ "$status" = 0 ] && echo "exports exactly the header's $n functions"
exit $status
