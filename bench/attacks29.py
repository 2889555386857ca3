#!/usr/bin/env python3
"""Issue 29 acceptance, the attacks rerun: each case against a daemon of its own, beside an
honest client reading whole epochs. Per case: whether the honest client got every batch,
its time with the attack against its time alone (median of `--runs`, alternated: alone,
attacked, alone, attacked), the daemon's peak RSS (VmHWM) against `--memory` + 128 MiB,
the daemon's CPU in the second after the attacker left, and whether its log shows a panic
or EMFILE ("Too many open files").

    cargo build --release -p riffle-tools
    python3 bench/attacks29.py --riffle target/release/riffle --dir /work/data

Cases:
- `huge-world`: 12 OPENs of batch 1 over 2^64-1, 10^9 and 2^53 x 256 ranks, tail pad, each
  reading a batch if admitted and leaving (refused at OPEN now).
- `stalled-rank`: a world-2 job whose rank 1 (inline) never reads; the honest client is
  rank 0 (alone: rank 1 reads too). The daemon cuts rank 1 at `--idle-timeout` (5 s here).
- `mixture`: 10 streams of a mixture of 20,000,000 draws, different seeds, each holding
  its first batch, under `--memory 1G`.
- `tree-fds`: 64 streams of a 6,000-file tree at once under `ulimit -n 1024`; the honest
  client is one of them (alone: by itself).
- `accept-fds`: 140 connections held open under `ulimit -n 256` while the honest client
  reads.
Writes a markdown table on stdout.
"""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import riffle  # noqa: E402

MEMORY = 1 << 30


def status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        after = f.read().rsplit(")", 1)[1].split()
    return int(after[11]) + int(after[12])


class Daemon:
    def __init__(self, a, work, datasets, extra=(), nofile=None):
        self.sock = str(work / f"s{time.monotonic_ns()}.sock")
        self.log = open(work / f"log{time.monotonic_ns()}.txt", "w+")
        cmd = [a.riffle, "serve", "--socket", self.sock, "--memory", str(MEMORY),
               "--mode", "lirs", *extra]
        for name, spec in datasets.items():
            cmd += ["--dataset", f"{name}={spec}"]
        if nofile:
            cmd = ["prlimit", f"--nofile={nofile}", "--"] + cmd
        self.p = subprocess.Popen(cmd, stderr=self.log, stdout=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                riffle.Client(self.sock).close()
                break
            except (riffle.RiffleConnectionError, riffle.RiffleBusy):
                if time.time() > deadline or self.p.poll() is not None:
                    raise SystemExit("riffle serve did not come up: " + self.text())
                time.sleep(0.05)

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.p.terminate()
        self.p.wait()


def honest_epoch(sock, dataset, batch, seed, rank=0, world=1):
    """Reads a whole epoch; (seconds, batches, records, expected batches)."""
    t = time.time()
    n = recs = 0
    with riffle.Client(sock, connect_timeout=60) as c:
        s = c.stream(dataset, batch, seed=seed, rank=rank, world=world,
                     tail="pad" if world > 1 else "partial")
        for b in s:
            n += 1
            recs += len(b.ids)
        want = s.opened["batches_per_epoch"] if hasattr(s, "opened") and s.opened else n
    return time.time() - t, n, recs, want


def attack_huge_world(sock, dataset, stop):
    worlds = [2**64 - 1, 10**9, 2**53 * 256]
    for i in range(12):
        try:
            with riffle.Client(sock) as c:
                for b in c.stream(dataset, 1, seed=1000 + i, rank=i % 7,
                                  world=worlds[i % 3], tail="pad"):
                    break
        except riffle.RiffleError:
            pass


def attack_stalled_rank(sock, dataset, stop, seed):
    import socket as so
    import json
    import struct
    s = so.socket(so.AF_UNIX)
    s.connect(sock)

    def frame(kind, body):
        b = json.dumps(body).encode()
        return struct.pack("<I", len(b) + 1) + bytes([kind]) + b
    s.sendall(frame(1, {"version": riffle.PROTOCOL_VERSION}))
    s.sendall(frame(3, {"dataset": dataset, "batch_size": 256, "seed": seed, "rank": 1,
                        "world": 2, "tail": "pad", "transport": "inline"}))
    stop.wait()
    s.close()


def attack_hold(sock, dataset, n, stop, seed0):
    """n streams of different seeds, each holding its first batch until `stop`."""
    held = []
    for i in range(n):
        try:
            c = riffle.Client(sock, connect_timeout=30)
            s = iter(c.stream(dataset, 256, seed=seed0 + i))
            next(s)
            held.append((c, s))
        except riffle.RiffleError as e:
            held.append(e)
    stop.wait()
    for h in held:
        if not isinstance(h, Exception):
            h[0].close()
    return held


def attack_connections(sock, n, stop, answered):
    """n connections held open (no HELLO) until `stop`; counts in `answered` those the
    daemon answered (a `busy` frame or a close) within 10 s instead of leaving hanging."""
    import socket as so
    conns = []
    for _ in range(n):
        try:
            s = so.socket(so.AF_UNIX)
            s.connect(sock)
            conns.append(s)
        except OSError:
            break
    got = 0
    for s in conns[64:]:
        s.settimeout(10)
        try:
            s.recv(4096)
            got += 1
        except OSError:
            pass
    answered.append((len(conns), got))
    stop.wait()
    for s in conns:
        s.close()


def run_case(a, name, daemon, honest, attack):
    """Alternates alone / attacked runs; returns the row."""
    alone, attacked, ok = [], [], True
    cpu_after = None
    for r in range(a.runs):
        t, n, _, want = honest(r, False)
        alone.append(t)
        ok &= n == want
        stop = threading.Event()
        th = threading.Thread(target=attack, args=(stop, r), daemon=True)
        th.start()
        time.sleep(0.5)
        t, n, _, want = honest(r, True)
        attacked.append(t)
        ok &= n == want
        stop.set()
        th.join(timeout=120)
        time.sleep(1.0)
        c0 = cpu_ticks(daemon.p.pid)
        time.sleep(1.0)
        cpu_after = cpu_ticks(daemon.p.pid) - c0
    log = daemon.text()
    return {
        "case": name, "every_batch": ok,
        "alone_s": statistics.median(alone), "attacked_s": statistics.median(attacked),
        "ratio": statistics.median(attacked) / statistics.median(alone),
        "peak_rss_mib": status(daemon.p.pid, "VmHWM") / 2**20,
        "cpu_ticks_1s_after": cpu_after,
        "panic": "panic" in log, "emfile": "Too many open files" in log or "EMFILE" in log,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--riffle", default=str(ROOT / "target/release/riffle"))
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cases", default="huge-world,stalled-rank,mixture,tree-fds,accept-fds")
    a = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(dir=a.dir, prefix="attacks29-"))
    rows = []
    try:
        npy = work / "d.npy"
        subprocess.run([a.riffle, "gen", str(npy), "--format", "npy", "--records", "400000",
                        "--record-size", "512"], check=True, stdout=subprocess.DEVNULL)
        cases = a.cases.split(",")
        if "huge-world" in cases:
            d = Daemon(a, work, {"train": str(npy)})
            try:
                rows.append(run_case(
                    a, "huge world (12 OPENs, batch 1, world 2^64-1 / 1e9 / 2^53x256, pad)", d,
                    lambda r, _: honest_epoch(d.sock, "train", 256, r),
                    lambda stop, r: attack_huge_world(d.sock, "train", stop)))
            finally:
                d.stop()
        if "stalled-rank" in cases:
            d = Daemon(a, work, {"train": str(npy)}, ["--idle-timeout", "5"])
            try:
                def honest(r, attacked):
                    seed = 2 * r + attacked + 100
                    if attacked:
                        return honest_epoch(d.sock, "train", 256, seed, 0, 2)
                    out = {}
                    t1 = threading.Thread(target=lambda: out.update(
                        one=honest_epoch(d.sock, "train", 256, seed, 1, 2)))
                    t1.start()
                    res = honest_epoch(d.sock, "train", 256, seed, 0, 2)
                    t1.join()
                    return res
                rows.append(run_case(
                    a, "a non-reading inline rank 1 of a world-2 job (--idle-timeout 5)", d, honest,
                    lambda stop, r: attack_stalled_rank(d.sock, "train", stop, 2 * r + 1 + 100)))
            finally:
                d.stop()
        if "mixture" in cases:
            other = work / "o.npy"
            subprocess.run([a.riffle, "gen", str(other), "--format", "npy", "--records",
                            "100000", "--record-size", "256"], check=True,
                           stdout=subprocess.DEVNULL)
            d = Daemon(a, work, {"train": str(npy),
                                 "mix": f"mix:a={npy}*0.5,b={other}*0.5;size=20000000"},
                       ["--admit-wait", "10"])
            try:
                rows.append(run_case(
                    a, "10 mixture streams (size=20000000), --memory 1G", d,
                    lambda r, _: honest_epoch(d.sock, "train", 256, r),
                    lambda stop, r: attack_hold(d.sock, "mix", 10, stop, 100 * r)))
            finally:
                d.stop()
        if "tree-fds" in cases:
            tree = work / "tree"
            subprocess.run([a.riffle, "gen", str(tree), "--format", "files", "--records",
                            "6000", "--record-size", "4096"], check=True,
                           stdout=subprocess.DEVNULL)
            d = Daemon(a, work, {"tree": f"{tree}:files"}, ["--max-clients", "80"], nofile=1024)
            try:
                def many(stop, r):
                    res = []
                    ths = [threading.Thread(target=lambda i=i: res.append(
                        honest_epoch(d.sock, "tree", 64, 1000 * r + i))) for i in range(63)]
                    for t in ths:
                        t.start()
                    for t in ths:
                        t.join()
                    bad = [x for x in res if x[1] != x[3]]
                    if len(res) != 63 or bad:
                        print(f"tree-fds: {63 - len(res)} streams failed, {len(bad)} short",
                              file=sys.stderr)
                rows.append(run_case(
                    a, "64 streams of a 6,000-file tree, ulimit -n 1024", d,
                    lambda r, _: honest_epoch(d.sock, "tree", 64, 7 + r), many))
            finally:
                d.stop()
        if "accept-fds" in cases:
            d = Daemon(a, work, {"train": str(npy)}, nofile=256)
            answered = []
            try:
                def honest_first(r, attacked):
                    # Connected before the attack: then 140 connections beside it.
                    t = time.time()
                    n = 0
                    with riffle.Client(d.sock, connect_timeout=60) as c:
                        stop = threading.Event()
                        th = threading.Thread(target=attack_connections,
                                              args=(d.sock, 140, stop, answered))
                        if attacked:
                            th.start()
                            time.sleep(0.5)
                        s = c.stream("train", 256, seed=r)
                        for _ in s:
                            n += 1
                        stop.set()
                        if attacked:
                            th.join()
                    return time.time() - t, n, 0, s.opened["batches_per_epoch"]
                rows.append(run_case(
                    a, "140 connections past --max-clients 64, ulimit -n 256", d, honest_first,
                    lambda stop, r: None))
                print(f"accept-fds: (connections made, of those past 64 answered) {answered}",
                      file=sys.stderr)
            finally:
                d.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| case | every batch | alone s | attacked s | ratio | peak RSS MiB | CPU ticks 1 s after | panic | EMFILE |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['every_batch']} | {r['alone_s']:.2f} | {r['attacked_s']:.2f} | "
              f"{r['ratio']:.2f} | {r['peak_rss_mib']:.0f} | {r['cpu_ticks_1s_after']} | "
              f"{r['panic']} | {r['emfile']} |")


if __name__ == "__main__":
    main()
