#!/usr/bin/env bash
# Issue 13: each bullet reproduced with a binary ($1), printing one line per case.
# Usage: repro13.sh BINARY WORKDIR
set -u
R=$1; W=$2
rm -rf "$W"; mkdir -p "$W"; cd "$W"
$R gen --format lines --records 100000 --record-size 60 a.txt >/dev/null 2>&1
N=$(wc -l < a.txt)
say() { printf '%-58s %s\n' "$1" "$2"; }
# 1. planted symlinks at the temporary names (the old names carry the next pids)
echo precious > victim
plant() { python3 -c "
import os,sys
for p in range(2, int(open('/proc/sys/kernel/pid_max').read())):
    n=sys.argv[1] % p
    if not os.path.lexists(n): os.symlink(sys.argv[2], n)
" "$1" "$W/victim"; }
plant "g.txt.tmp%d"; ln -s "$W/victim" .g.txt.riffle-tmp-planted 2>/dev/null
RIFFLE_TEST_TEMP_SUFFIX=planted $R gen --format lines --records 10 --record-size 10 g.txt >/dev/null 2>&1
say "gen: planted link at the temp name" "victim=$(head -c 20 victim | tr -d '\n') g.txt=$(stat -c %F g.txt)"
echo precious > victim
plant ".o1.txt.riffle-tmp-%d"; ln -sf "$W/victim" .o1.txt.riffle-tmp-planted
RIFFLE_TEST_TEMP_SUFFIX=planted $R shuffle a.txt -o o1.txt >/dev/null 2>&1
say "shuffle: planted link at the temp name" "victim=$(head -c 20 victim | tr -d '\n') o1.txt=$(stat -c %F o1.txt)"
echo precious > victim
plant "a.txt.ridx.tmp%d-0"; ln -sf "$W/victim" .a.txt.ridx.riffle-tmp-planted
RIFFLE_TEST_TEMP_SUFFIX=planted $R index a.txt >/dev/null 2>&1
say "index: planted link at the sidecar temp name" "victim=$(head -c 20 victim | tr -d '\n') ridx=$(stat -c %F a.txt.ridx)"
echo precious > victim; mkdir -p pr
plant "pr/.riffle-probe-%d.tmp"; ln -sf "$W/victim" pr/.riffle-probe.riffle-tmp-planted
RIFFLE_TEST_TEMP_SUFFIX=planted XDG_CACHE_HOME=$W/cache $R probe pr --quick --region 16M --point-time 0.05 --refresh >/dev/null 2>&1
say "probe: planted link at the scratch name" "victim=$(head -c 20 victim | tr -d '\n')"
find . pr -maxdepth 1 -type l -delete; rm -f a.txt.ridx
# 2. pipes and FIFOs
$R shuffle <(cat a.txt) -o p1.txt >/dev/null 2>&1; say "shuffle <(cat a.txt): lines of $N" "exit $? lines=$(wc -l < p1.txt 2>/dev/null)"
cat a.txt | $R shuffle /dev/stdin -o p2.txt >/dev/null 2>&1; say "cat a.txt | shuffle /dev/stdin: lines of $N" "lines=$(wc -l < p2.txt 2>/dev/null)"
$R shuffle a.txt <(cat a.txt) -o p3.txt >/dev/null 2>&1; say "shuffle a.txt <(cat a.txt): lines of $((2*N))" "lines=$(wc -l < p3.txt 2>/dev/null)"
mkfifo ff.txt
S=$(date +%s.%N); timeout 10 $R read ff.txt --batch-size 8 >/dev/null 2>err.txt; rc=$?; E=$(date +%s.%N)
say "read FIFO (no writer)" "exit $rc after $(python3 -c "print(round($E-$S,2))") s: $(head -c 90 err.txt)"
S=$(date +%s.%N); timeout 10 $R index ff.txt >/dev/null 2>err.txt; rc=$?; E=$(date +%s.%N)
say "index FIFO (no writer)" "exit $rc after $(python3 -c "print(round($E-$S,2))") s"
rm -f ff.txt p1.txt p2.txt p3.txt
# 3. scratch lifecycle
$R gen --format lines --records 2000000 --record-size 100 big.txt >/dev/null 2>&1
mkdir -p o
left() { local l; l=$(ls -d o/.riffle* o/.*riffle-tmp* .riffle* riffle-piles-* .*riffle-tmp* 2>/dev/null); [ -z "$l" ] && { echo 0; return; }; du -sbc $l | tail -1 | cut -f1; }
sig() { python3 -c "import subprocess,signal,time,sys; p=subprocess.Popen(sys.argv[3:],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL); time.sleep(float(sys.argv[2])); p.send_signal(getattr(signal,sys.argv[1])); print(p.wait())" "$@"; }
rc=$(sig SIGINT 1.2 $R shuffle big.txt -o o/out.txt --memory 8M)
say "shuffle: SIGINT mid-run" "exit $rc, scratch left $(left) B"
sig SIGKILL 1.2 $R shuffle big.txt -o o/out.txt --memory 8M >/dev/null
say "shuffle: SIGKILL mid-run" "scratch left $(left) B"
$R shuffle big.txt -o o/out.txt --memory 8M >/dev/null 2>err.txt
say "shuffle: rerun after SIGKILL" "scratch left $(left) B; notice: $(grep -o 'removed.*reclaimed)' err.txt | head -c 60)"
rc=$(sig SIGTERM 1.5 $R read big.txt --mode two-pass --batch-size 256 --epochs 3 --memory 64M)
say "read two-pass: SIGTERM mid-run" "exit $rc, scratch left $(left) B"
sig SIGKILL 1.5 $R read big.txt --mode two-pass --batch-size 256 --epochs 3 --memory 64M >/dev/null
say "read two-pass: SIGKILL mid-run" "scratch left $(left) B"
$R read big.txt --mode two-pass --batch-size 256 --epochs 1 --memory 64M >/dev/null 2>err.txt
say "read two-pass: rerun after SIGKILL" "scratch left $(left) B; notice: $(grep -o 'removed.*reclaimed)' err.txt | head -c 60)"
$R read a.txt --mode two-pass --batch-size 256 --memory 64M --scratch scr >/dev/null 2>&1
say "read two-pass --scratch scr (did not exist)" "scr exists after: $([ -e scr ] && echo yes || echo no)"
rm -rf o scr .riffle* riffle-piles-* big.txt big.txt.ridx
# 4. split re-run with fewer parts
$R shuffle a.txt -o p.jsonl --split-lines 10000 >/dev/null 2>&1
$R shuffle a.txt -o p.jsonl --split-lines 40000 >/dev/null 2>&1
say "split 10 parts then 3: lines in p.jsonl.* (of $N)" "$(cat p.jsonl.* | wc -l) in $(ls p.jsonl.* | wc -l) files"
rm -f p.jsonl.*
# 5. stale index: same size, mtime put back
$R index a.txt >/dev/null 2>&1
M=$(stat -c %y a.txt)
python3 - <<'PY'
import os
b=open('a.txt','rb').read()
# same size, different cut points: move every newline of the first 10 lines by one byte
lines=b.split(b'\n')
new=b'\n'.join([lines[0]+b'x']+[lines[1][:-1]]+lines[2:])
assert len(new)==len(b)
f=open('a.txt','r+b'); f.write(new); f.close()
PY
touch -d "$M" a.txt
$R cat a.txt --newline 2>err.txt > cat.txt
say "rewrite, same size, old mtime: riffle cat == the file" "$(cmp -s cat.txt a.txt && echo same || echo DIFFERENT) $(grep -o 'rebuil[a-z]*' err.txt | head -1)"
$R gen --format lines --records 100000 --record-size 60 a.txt >/dev/null 2>&1; rm -f a.txt.ridx
# 6. arithmetic
$R gen --format npy --records 10000 --record-size 16 d.npy >/dev/null 2>&1
$R read d.npy --batch-size 100 --epoch 18446744073709551615 --epochs 2 --json > j.txt 2>err.txt; rc=$?
say "read --epoch 2^64-1 --epochs 2" "exit $rc records=$(python3 -c "import json;print(json.load(open('j.txt'))['records'])" 2>/dev/null) $(head -c 60 err.txt)"
$R read d.npy --batch-size 100 --world 2 --resume 0:60 --json > j.txt 2>err.txt; rc=$?
say "read --world 2 --resume 0:60 (50 batches per rank)" "exit $rc records=$(python3 -c "import json;print(json.load(open('j.txt'))['records'])" 2>/dev/null) $(head -c 60 err.txt)"
tot=0; for r in 0 1 2 3; do n=$($R read d.npy --batch-size 100 --world 4 --rank $r --resume 0:20@2 --json 2>/dev/null | python3 -c "import json,sys;print(json.load(sys.stdin)['records'])" 2>/dev/null || echo refused); tot="$tot+$n"; done
say "world-2 cursor 0:20 (4000 records) under world 4" "@2 form: $tot"
tot=0; for r in 0 1 2 3; do n=$($R read d.npy --batch-size 100 --world 4 --rank $r --resume 0:20 --json 2>/dev/null | python3 -c "import json,sys;print(json.load(sys.stdin)['records'])"); tot=$((tot+n)); done
say "plain 0:20 under world 4 (6000 remain)" "records read $tot"
# 7. policies
mkdir -p dz; cp a.txt dz/1.txt; : > dz/2.txt
$R read dz --batch-size 100 >/dev/null 2>err.txt; r1=$?; $R index dz >/dev/null 2>&1; r2=$?; $R shuffle dz/1.txt dz/2.txt -o z.txt >/dev/null 2>&1; r3=$?
say "dir with a 0-byte file: read/index/shuffle exit" "$r1/$r2/$r3"
cp a.txt $'\xff.txt'; $R shuffle $'\xff.txt' -o u.txt >/dev/null 2>&1; say "shuffle of a non-UTF-8 path" "exit $?"
