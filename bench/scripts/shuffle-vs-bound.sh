#!/usr/bin/env bash
# Issue 13 acceptance: riffle shuffle of the 4 GB JSONL with --memory 1G against the I/O
# bound 2*size/seq_read + 2*size/seq_write from `riffle probe` (measured in each round),
# before (the binary of main before this change) and after, alternating, cold cache.
set -euo pipefail
BEFORE=$(realpath "${BEFORE:?set BEFORE to the reference binary}")
AFTER=$(realpath "${AFTER:-target/release/riffle}")
cd "${DATA_DIR:?set DATA_DIR to the directory holding big4g.jsonl}"
IN=big4g.jsonl
SIZE=$(stat -c %s $IN)
ROUNDS=${ROUNDS:-3}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for r in $(seq 1 $ROUNDS); do
  drop
  $AFTER probe . --quick --refresh --json > probe-$r.json 2>/dev/null
  read RD WR < <(python3 -c "import json;p=json.load(open('probe-$r.json'));print(p['seq_read_bps'],p['seq_write_bps'])")
  BOUND=$(python3 -c "print(2*$SIZE/$RD+2*$SIZE/$WR)")
  for who in before after; do
    BIN=$BEFORE; [ $who = after ] && BIN=$AFTER
    rm -f out.jsonl; drop
    S=$(date +%s.%N)
    /usr/bin/time -f "%M" -o rss-$who-$r.txt $BIN shuffle $IN -o out.jsonl --memory 1G --json > rep-$who-$r.json
    E=$(date +%s.%N)
    T=$(python3 -c "print($E-$S)")
    echo "round $r $who: ${T} s, bound ${BOUND} s (read $RD B/s, write $WR B/s), ratio $(python3 -c "print(round($T/$BOUND,3))"), peak RSS $(cat rss-$who-$r.txt) KB"
  done
done
rm -f out.jsonl
