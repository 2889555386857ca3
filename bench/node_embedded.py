#!/usr/bin/env python3
"""The node daemon a dataset path starts against a daemon started by hand (issue 31):
`riffle.torch.loader(PATH, ...)` against `riffle.torch.loader(SOCKET, "train", ...)`, the
same dataset, batch size, workers, mode and memory. Runs alternate (hand, path, path,
hand, ...), each on a cold cache (as root: drop_caches); the path's run includes starting
its daemon (it leaves between runs: `--exit-idle 1`), as a training script meets it.
Prints each run and the medians, and the ratio path / hand in samples/s.

    python3 bench/node_embedded.py --records 200000 --record-size 4096 --runs 3

Needs torch and the riffle package (`pip install ./python`, or RIFFLE_BIN and
PYTHONPATH=python for a development build)."""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import riffle  # noqa: E402
import riffle.torch  # noqa: E402


def drop_caches():
    os.sync()
    if os.geteuid() == 0:
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(1)  # the last run's freed scratch settles


def epoch(source, name, a, daemon=None):
    t = time.perf_counter()
    kw = {"daemon": daemon} if daemon is not None else {}
    it = (riffle.torch.loader(source, batch_size=a.batch_size, num_workers=a.workers, **kw)
          if name is None else
          riffle.torch.loader(source, name, batch_size=a.batch_size, num_workers=a.workers))
    n = 0
    for b in it:
        n += len(b["ids"])
    return n / (time.perf_counter() - t), n


def gone(rundir, limit=30):
    deadline = time.monotonic() + limit
    while (rundir / "riffle.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200000)
    p.add_argument("--record-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--memory", default="2G")
    p.add_argument("--mode", default="auto")
    p.add_argument("--dir", help="where the dataset goes (default: a temporary directory)")
    a = p.parse_args()
    exe = riffle.binary()
    work = pathlib.Path(tempfile.mkdtemp(prefix="riffle-node-bench-", dir=a.dir))
    rundir = work / "rt"
    os.environ["RIFFLE_RUNTIME_DIR"] = str(rundir)
    data = work / "train.npy"
    hand = None
    try:
        subprocess.run([exe, "gen", str(data), "--format", "npy", "--records", str(a.records),
                        "--record-size", str(a.record_size)], check=True, capture_output=True)
        sock = str(work / "hand.sock")
        hand = subprocess.Popen([exe, "serve", "--socket", sock, "--dataset", f"train={data}",
                                 "--memory", a.memory, "--mode", a.mode],
                                stderr=subprocess.DEVNULL)
        riffle.Client(sock, connect_timeout=30).close()
        daemon = {"memory": a.memory, "mode": a.mode, "idle": 1}
        rates = {"hand": [], "path": []}
        for r in range(a.runs):
            # ABBA: neither side always runs after the other's scratch was freed.
            for side in ("hand", "path") if r % 2 == 0 else ("path", "hand"):
                drop_caches()
                if side == "hand":
                    rate, n = epoch(sock, "train", a)
                else:
                    rate, n = epoch(str(data), None, a, daemon)
                    gone(rundir)
                assert n >= a.records, (side, n)
                rates[side].append(rate)
                print(f"run {r + 1} {side:4s} {rate:12,.0f} samples/s", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"median hand {med['hand']:,.0f}  path {med['path']:,.0f}  "
              f"path/hand {med['path'] / med['hand']:.3f}x "
              f"({a.records} x {a.record_size} B, batch {a.batch_size}, workers {a.workers}, "
              f"mode {a.mode}, memory {a.memory})")
    finally:
        if hand is not None:
            hand.terminate()
            hand.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
