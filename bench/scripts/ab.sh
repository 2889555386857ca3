#!/usr/bin/env bash
# A/B of two riffle builds on one command, alternated (A, B, A, B, ...) on a cold cache:
#   bench/scripts/ab.sh RUNS BIN_A BIN_B -- ARGS...
# runs `BIN ARGS` RUNS times per side, dropping the page cache before each run (root), and
# prints each run's wall seconds and the medians and their ratio B/A. The disk here drifts
# several-fold within an hour, so only alternated runs on the same file are compared.
set -euo pipefail
runs=$1 a=$2 b=$3
shift 3
[ "$1" = "--" ] && shift
ta=() tb=()
one() {
  sync
  echo 3 > /proc/sys/vm/drop_caches
  local s e
  s=$(date +%s.%N)
  "$@" > /dev/null 2>&1
  e=$(date +%s.%N)
  echo "$e - $s" | bc
}
for i in $(seq "$runs"); do
  x=$(one "$a" "$@"); ta+=("$x"); echo "A run $i: $x s"
  y=$(one "$b" "$@"); tb+=("$y"); echo "B run $i: $y s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
ma=$(median "${ta[@]}") mb=$(median "${tb[@]}")
echo "median A $ma s, B $mb s, B/A $(echo "scale=3; $mb / $ma" | bc)"
