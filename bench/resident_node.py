#!/usr/bin/env python3
"""Issue 33 deliverable 3: a dataset held resident by `riffle serve` against the in-process
resident read, alternately.

Per run:
- in process: `riffle read DATA --mode resident --memory 3G --epochs 3 --json`: the later
  epochs' records/s (median of epochs 2 and 3) and the device bytes;
- through a fresh daemon (`riffle serve --mode resident --memory 4G`): N clients (separate
  processes, the Python client over shared memory or, with `--client rust`, the engine's
  Rust client, neither touching the payload; each its own job: seed i), started
  together, each reading 3 epochs; per client the records/s over epochs 2-3 (from its first
  batch of epoch 2 to its last), and the daemon's device bytes (its stats' `device_bytes`
  and the kernel's read_bytes of the daemon).

    python3 bench/resident_node.py --riffle target/release/riffle --data /path/d.npy

Prints one JSON object per run and a summary of medians.
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import statistics
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
    return 0


def in_process(a):
    out = subprocess.run(
        [a.riffle, "read", a.data, "--mode", "resident", "--memory", "3G", "--epochs", "3",
         "--batch-size", str(a.batch), "--json"],
        check=True, capture_output=True, text=True).stdout
    try:
        r = json.loads(out)
    except json.JSONDecodeError:
        r = json.loads(out.strip().splitlines()[-1])
    later = statistics.median(r["epoch_seconds"][1:])
    return {"side": "in-process", "records": r["records"] // 3,
            "first_epoch_s": r["epoch_seconds"][0], "later_epoch_s": later,
            "later_records_per_s": r["records"] / 3 / later,
            "device_bytes": r["device_bytes"]}


def client(sock, seed, batch, q):
    c = riffle.Client(sock, connect_timeout=30)
    t0 = time.monotonic()
    first_later = None
    later_records = 0
    records = 0
    for b in c.stream("train", batch, seed=seed, epochs=3):
        n = len(b.ids)
        records += n
        if b.epoch >= 1:
            if first_later is None:
                first_later = time.monotonic()
            else:
                later_records += n
    end = time.monotonic()
    c.close()
    q.put({"seed": seed, "records": records, "seconds": end - t0,
           "later_records_per_s": later_records / max(end - first_later, 1e-9)})


def rust_client(a, sock, seed, q):
    out = subprocess.run([a.rust_client, sock, str(seed), str(a.batch)], check=True,
                         capture_output=True, text=True).stdout
    q.put(json.loads(out))


def daemon(a, n):
    tmp = tempfile.mkdtemp(prefix="rrn")
    sock = os.path.join(tmp, "s.sock")
    d = subprocess.Popen([a.riffle, "serve", "--socket", sock, "--dataset", f"train={a.data}",
                          "--mode", "resident", "--memory", "4G"],
                         stderr=open(os.path.join(tmp, "log"), "w"))
    try:
        deadline = time.time() + 60
        while not os.path.exists(sock):
            if time.time() > deadline or d.poll() is not None:
                raise SystemExit(open(os.path.join(tmp, "log")).read())
            time.sleep(0.05)
        time.sleep(0.2)
        before = read_bytes(d.pid)
        q = multiprocessing.Queue()
        if a.client == "rust":
            ps = [multiprocessing.Process(target=rust_client, args=(a, sock, 1 + i, q))
                  for i in range(n)]
        else:
            ps = [multiprocessing.Process(target=client, args=(sock, 1 + i, a.batch, q))
                  for i in range(n)]
        for p in ps:
            p.start()
        got = [q.get() for _ in ps]
        for p in ps:
            p.join()
        time.sleep(0.5)
        with riffle.Client(sock) as c:
            s = c.stats()
        rates = [g["later_records_per_s"] for g in got]
        return {"side": f"daemon x{n}", "clients": got,
                "later_records_per_s_median": statistics.median(rates),
                "later_records_per_s_sum": sum(rates),
                "device_bytes": s["device_bytes"],
                "kernel_read_bytes": read_bytes(d.pid) - before,
                "held": s["resident"]["held"],
                "fallbacks": s["resident"]["fallbacks"]}
    finally:
        d.terminate()
        d.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--riffle", default=str(ROOT / "target/release/riffle"))
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--clients", default="2,4")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--client", choices=["python", "rust"], default="python",
                   help="rust: target/release/examples/resident_client (cargo build --release "
                        "-p riffle-bench --example resident_client)")
    p.add_argument("--rust-client", default=str(ROOT / "target/release/examples/resident_client"))
    a = p.parse_args()
    ns = [int(x) for x in a.clients.split(",")]
    runs = {"in-process": []}
    for n in ns:
        runs[f"daemon x{n}"] = []
    for i in range(a.runs):
        sides = [lambda: in_process(a)] + [lambda n=n: daemon(a, n) for n in ns]
        # Alternate the order run to run.
        if i % 2:
            sides.reverse()
        for side in sides:
            r = side()
            print(json.dumps(r), flush=True)
            runs[r["side"]].append(r)
    ip = statistics.median(r["later_records_per_s"] for r in runs["in-process"])
    print(f"in-process resident, later epochs: {ip:,.0f} records/s (median of {a.runs}); "
          f"device bytes {runs['in-process'][0]['device_bytes']:,}")
    for n in ns:
        rs = runs[f"daemon x{n}"]
        med = statistics.median(r["later_records_per_s_median"] for r in rs)
        tot = statistics.median(r["later_records_per_s_sum"] for r in rs)
        dev = statistics.median(r["device_bytes"] for r in rs)
        kern = statistics.median(r["kernel_read_bytes"] for r in rs)
        print(f"daemon, {n} clients: per client {med:,.0f} records/s ({med / ip:.2f}x in "
              f"process), all {tot:,.0f}; device bytes {dev:,.0f} (kernel {kern:,.0f})")


if __name__ == "__main__":
    main()
