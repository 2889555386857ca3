#!/usr/bin/env python3
"""Issue 29 acceptance: one node of a torchrun job, `--nproc` ranks x `--workers` DataLoader
workers each (LOCAL_WORLD_SIZE set by torchrun), reading one two-pass epoch from one
`riffle serve`. Checks that the job had one pass (the daemon's stats: jobs started, late
streams), that every rank took as many steps, and that the union of the ranks' records is
exactly the epoch (every record, the padding being repeats of the epoch's first records);
reports the bytes the daemon read (read_bytes of /proc/<daemon>/io) against the dataset's
size, with the page cache dropped first (root).

    cargo build --release -p riffle-tools
    python3 bench/torchrun_node.py --riffle target/release/riffle --dir /work/data

Issue 33 (a resident dataset shared by the node's ranks and workers, over epochs):

    python3 bench/torchrun_node.py --data /work/data/d.npy --mode resident --memory 4G \
        --epochs 3 [--nproc 1 --workers 2: one rank alone, the Python hand-off's ceiling]

With `--ceiling` (and `--epochs`), no daemon: the same ranks and workers read batches that
cost nothing to make (one shared tensor of the same batch shape, and ids), so the figures
are the Python hand-off's own ceiling in that topology (DataLoader workers, torch's
tensor pickling, the ranks' loop), measured the same way, to hold riffle's rates against:

    python3 bench/torchrun_node.py --data /work/data/d.npy --ceiling --epochs 3

With `--epochs`, each rank's samples/s per epoch (its records over its epoch's time) and
the node's (all ranks' records over the slowest rank's time), every record once per epoch,
the daemon's device bytes against the dataset, and the CPU seconds of the daemon and of the
ranks (torchrun and every process under it) over the job are reported: where the two cores
went.

Needs torch (torchrun) in this interpreter; says so and exits 2 without it.
"""

import argparse
import collections
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import riffle  # noqa: E402


def read_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise SystemExit(f"no read_bytes in /proc/{pid}/io")


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--riffle", default=str(ROOT / "target/release/riffle"))
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the dataset is made")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", default="two-pass")
    p.add_argument("--plain", action="store_true", help="a plain DataLoader, not riffle.torch.loader")
    p.add_argument("--data", help="an existing .npy to read (not removed) instead of one made")
    p.add_argument("--epochs", type=int, help="epochs each rank reads (set_epoch before each)")
    p.add_argument("--memory", help="the daemon's --memory")
    p.add_argument("--ceiling", action="store_true",
                   help="no daemon: batches that cost nothing, the hand-off's own ceiling")
    a = p.parse_args()
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        print("torchrun_node: torch is not installed here (no torchrun): nothing measured",
              file=sys.stderr)
        sys.exit(2)
    work = pathlib.Path(tempfile.mkdtemp(dir=a.dir, prefix="torchrun-node-"))
    try:
        if a.data:
            data = pathlib.Path(a.data).resolve()
            got = json.loads(subprocess.run(
                [a.riffle, "index", str(data), "--json"], check=True, capture_output=True,
                text=True).stdout)
            a.records, a.record_size = int(got["records"]), int(got["record_bytes"]["max"])
        else:
            data = work / "d.npy"
            subprocess.run([a.riffle, "gen", str(data), "--format", "npy", "--records",
                            str(a.records), "--record-size", str(a.record_size)], check=True,
                           stdout=subprocess.DEVNULL)
        if a.ceiling:
            sys.exit(ceiling(a, torchrun, work))
        sock = str(work / "s.sock")
        scratch = work / "scratch"
        scratch.mkdir()
        d = subprocess.Popen([a.riffle, "serve", "--socket", sock, "--dataset", f"train={data}",
                              "--mode", a.mode, "--scratch", str(scratch)]
                             + (["--memory", a.memory] if a.memory else []),
                             stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 60
            while True:
                try:
                    riffle.Client(sock).close()
                    break
                except riffle.RiffleConnectionError:
                    if time.time() > deadline or d.poll() is not None:
                        raise SystemExit("riffle serve did not come up")
                    time.sleep(0.05)
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            before = read_bytes(d.pid)
            daemon_cpu = cpu_seconds(d.pid)
            import resource
            job_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
            job_cpu = job_cpu.ru_utime + job_cpu.ru_stime
            out = work / "out.json"
            cmd = [torchrun, "--nnodes", "1", "--nproc_per_node", str(a.nproc),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                   str(ROOT / "tests/python/torchrun_job.py"), "--sockets", sock, "--out",
                   str(out), "--batch-size", str(a.batch_size), "--num-workers",
                   str(a.workers), "--with-padding"] + (["--plain"] if a.plain else []) \
                + (["--epochs", str(a.epochs)] if a.epochs else [])
            t = time.time()
            subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
            took = time.time() - t
            read = read_bytes(d.pid) - before
            daemon_cpu = cpu_seconds(d.pid) - daemon_cpu
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            job_cpu = used.ru_utime + used.ru_stime - job_cpu
            with riffle.Client(sock) as c:
                st = c.stats()
        finally:
            d.terminate()
            d.wait()
        got = json.load(open(out))
        if a.epochs:
            cpu = {"daemon_cpu_s": round(daemon_cpu, 2), "ranks_cpu_s": round(job_cpu, 2)}
            sys.exit(report_epochs(a, got, st, read, data.stat().st_size, took, cpu))
        steps = sorted({g["steps"] for g in got})
        ids = collections.Counter(i for g in got for i in g["ids"])
        padding = sum(g["padding"] for g in got)
        every = set(ids) == set(range(a.records))
        repeats = sum(ids.values()) - len(ids)
        size = data.stat().st_size
        row = {
            "ranks": a.nproc, "workers": a.workers, "mode": a.mode,
            "loader": "DataLoader" if a.plain else "riffle.torch.loader",
            "steps_per_rank": steps, "every_record": every, "repeats": repeats,
            "padding": padding, "jobs_total": st["jobs_total"],
            "late_streams": st.get("late_streams"), "read_bytes": read,
            "x_dataset": round(read / size, 3), "seconds": round(took, 2),
        }
        print(json.dumps(row))
        ok = len(steps) == 1 and every and repeats == padding and st["jobs_total"] == 1
        sys.exit(0 if ok else 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ceiling(a, torchrun, work):
    """Runs the job over batches that cost nothing (no daemon) and prints each epoch's
    rates; returns the exit status."""
    out = work / "out.json"
    cmd = [torchrun, "--nnodes", "1", "--nproc_per_node", str(a.nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()),
           str(ROOT / "tests/python/torchrun_job.py"), "--out", str(out), "--batch-size",
           str(a.batch_size), "--num-workers", str(a.workers), "--with-padding",
           "--ceiling", f"{a.records},{a.record_size}", "--epochs", str(a.epochs or 1)]
    t = time.time()
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    took = time.time() - t
    got = json.load(open(out))
    epochs = []
    for e in range(a.epochs or 1):
        secs = [g["seconds"][e] for g in got]
        recs = [len(g["ids"][e]) for g in got]
        epochs.append({
            "epoch": e,
            "rank_samples_per_s": [round(r / s) for r, s in zip(recs, secs)],
            "node_samples_per_s": round(sum(recs) / max(secs)),
            "slowest_rank_s": round(max(secs), 3),
        })
    print(json.dumps({"ranks": a.nproc, "workers": a.workers, "loader": "ceiling (DataLoader, "
                      "batches that cost nothing)", "record_size": a.record_size,
                      "epochs": epochs, "seconds": round(took, 2)}))
    return 0


def report_epochs(a, got, st, read, size, took, cpu):
    """Prints the per-epoch rates of a multi-epoch job; returns the exit status (0 when
    every epoch had every record, the job one pass per epoch... and the device read the
    dataset at most 1.1 times)."""
    ok = True
    epochs = []
    for e in range(a.epochs):
        ids = collections.Counter(i for g in got for i in g["ids"][e])
        every = set(ids) == set(range(a.records))
        ok &= every
        secs = [g["seconds"][e] for g in got]
        recs = [len(g["ids"][e]) for g in got]
        epochs.append({
            "epoch": e, "every_record": every,
            "rank_samples_per_s": [round(r / s) for r, s in zip(recs, secs)],
            "node_samples_per_s": round(sum(recs) / max(secs)),
            "slowest_rank_s": round(max(secs), 3),
        })
    row = {
        "ranks": a.nproc, "workers": a.workers, "mode": a.mode, "memory": a.memory,
        "loader": "DataLoader" if a.plain else "riffle.torch.loader",
        "epochs": epochs, "jobs_total": st["jobs_total"], "resident": st.get("resident"),
        "read_bytes": read, "x_dataset": round(read / size, 3), "seconds": round(took, 2),
        **cpu,
    }
    print(json.dumps(row))
    return 0 if ok and read <= 1.1 * size else 1


if __name__ == "__main__":
    main()
