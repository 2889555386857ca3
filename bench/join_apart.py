#!/usr/bin/env python3
"""Issue 29 deliverable 1, acceptance: the ranks of one two-pass job opening seconds apart
share one pass. Bytes the daemon reads per epoch (read_bytes of /proc/<daemon>/io: the
scatter's reads of the dataset and the pile pass's reads of its piles), with the page cache
dropped before every run (root), for:

- `together`: 8 ranks (world 8) opening at the same moment (the baseline);
- `apart`: the same 8 ranks opening at random moments within `--spread` seconds (each
  rank's start uniform in [0, spread], in random rank order; with `--gaps`, each rank
  opens uniform [0, spread] after the one before), each saying `streams=8` (the node
  opens 8 streams of the job), `--runs` runs;
- `apart-no-streams` (with `--before`): the same, without `streams`: what the daemon did
  before deliverable 1 (a pass per rank that comes after the first batch).

Target: apart / together <= 1.1. Only bytes are compared (other engineers build on this
machine at the same time, so times are not). Each run also checks every rank got its share
of the epoch (records) and reads the daemon's stats: jobs started and late streams.

    cargo build --release -p riffle-tools
    python3 bench/join_apart.py --riffle target/release/riffle --dir /work/data

Writes a markdown table on stdout and the rows as JSON to --json (optional).
"""

import argparse
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import riffle  # noqa: E402


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise SystemExit(f"no read_bytes in /proc/{pid}/io")


def start_daemon(a, data, scratch, sock):
    d = subprocess.Popen(
        [a.riffle, "serve", "--socket", sock, "--dataset", f"train={data}:fixed:{a.record_size}",
         "--mode", "two-pass", "--scratch", scratch, *a.serve_arg],
        stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while True:
        try:
            riffle.Client(sock).close()
            return d
        except riffle.RiffleConnectionError:
            if time.time() > deadline or d.poll() is not None:
                raise SystemExit("riffle serve did not come up: " + (d.stderr.read() or ""))
            time.sleep(0.05)


def rank_reads(sock, rank, world, batch_size, streams, at, t0, out):
    """Rank `rank`: waits until `at` seconds after t0, then reads its whole stream."""
    time.sleep(max(0.0, t0 + at - time.time()))
    records = 0
    with riffle.Client(sock) as c:
        for b in c.stream("train", batch_size, seed=1, rank=rank, world=world, tail="pad",
                          streams=streams):
            records += len(b.ids)
    out[rank] = records


def one_run(a, data, size, kind, rng):
    tmp = tempfile.mkdtemp(prefix="rja", dir=a.dir)
    sock = os.path.join(tmp, "s.sock")
    scratch = os.path.join(tmp, "scratch")
    daemon = start_daemon(a, data, scratch, sock)
    try:
        if a.drop:
            drop_caches()
        if kind == "together":
            starts = [0.0] * a.world
        elif a.gaps:
            gaps = [0.0] + [rng.uniform(0, a.spread) for _ in range(a.world - 1)]
            starts = [sum(gaps[: i + 1]) for i in range(a.world)]
            rng.shuffle(starts)
        else:
            starts = sorted(rng.uniform(0, a.spread) for _ in range(a.world))
            rng.shuffle(starts)
        streams = None if kind == "apart-no-streams" else a.world
        before = read_bytes(daemon.pid)
        got = [0] * a.world
        t0 = time.time() + 0.2
        threads = [threading.Thread(target=rank_reads,
                                    args=(sock, r, a.world, a.batch_size, streams, starts[r], t0, got))
                   for r in range(a.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        read = read_bytes(daemon.pid) - before
        with riffle.Client(sock) as c:
            st = c.stats()
    finally:
        daemon.terminate()
        try:
            err = daemon.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            daemon.kill()
            err = daemon.communicate()[1]
        shutil.rmtree(tmp, ignore_errors=True)
    late_lines = [ln for ln in err.splitlines() if "came after its pass began" in ln]
    return {
        "kind": kind,
        "starts_s": sorted(round(s, 2) for s in starts),
        "read_bytes": read,
        "x_dataset": read / size,
        "records": sum(got),
        "jobs_total": st["jobs_total"],
        "late_streams": st.get("late_streams"),
        "late_log_lines": len(late_lines),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--riffle", default=str(ROOT / "target/release/riffle"))
    p.add_argument("--dir", default="/work/data", help="where the dataset and scratch go")
    p.add_argument("--records", type=int, default=102_400, help="records of the dataset (400 MiB at 4 KiB)")
    p.add_argument("--record-size", type=int, default=4096)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--spread", type=float, default=10.0, help="seconds within which the ranks open")
    p.add_argument("--gaps", action="store_true",
                   help="each rank opens 0..spread s after the one before (up to 7 x spread in all)")
    p.add_argument("--before", action="store_true", help="also one run without `streams`")
    p.add_argument("--no-drop", dest="drop", action="store_false", help="keep the page cache")
    p.add_argument("--seed", type=int, default=29)
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--serve-arg", action="append", default=[], help="extra `riffle serve` argument")
    a = p.parse_args()
    if a.drop and os.geteuid() != 0:
        raise SystemExit("dropping the page cache needs root (or pass --no-drop)")
    d = pathlib.Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    data = d / f"join-{a.records}-{a.record_size}.bin"
    if not data.exists():
        subprocess.run([a.riffle, "gen", str(data), "--format", "fixed", "--records", str(a.records),
                        "--record-size", str(a.record_size)], check=True)
    size = data.stat().st_size
    rng = random.Random(a.seed)
    kinds = ["together"] + ["apart"] * a.runs + (["apart-no-streams"] if a.before else [])
    rows = []
    for kind in kinds:
        r = one_run(a, data, size, kind, rng)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    base = rows[0]["read_bytes"]
    print(f"dataset {data} ({size / 2**20:.0f} MiB), world {a.world}, two-pass, batch {a.batch_size}, "
          f"ranks opening {'0-' + format(a.spread, 'g') + ' s after each other' if a.gaps else 'within ' + format(a.spread, 'g') + ' s'}, caches {'dropped' if a.drop else 'kept'}\n")
    print("| run | rank starts (s) | daemon read_bytes | x dataset | x together | jobs | late | records |")
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {r['kind']} {i if r['kind'] == 'apart' else ''} | {' '.join(f'{s:g}' for s in r['starts_s'])} "
              f"| {r['read_bytes'] / 2**20:,.0f} MiB | {r['x_dataset']:.2f} | {r['read_bytes'] / base:.3f} "
              f"| {r['jobs_total']} | {r['late_streams']} | {r['records']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"dataset_bytes": size, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
