#!/usr/bin/env python3
"""Acceptance measurement for `riffle serve`: the same job read in process (`riffle read
--json`) and through the daemon by the Python client over shared memory, alternately.

Reports, per cache state (warm: nothing dropped; cold: `echo 3 > drop_caches` before
every run, root only):

- throughput: records/s of the daemon + Python client over records/s of `riffle read`
  (median of the runs), target >= 0.9;
- hand-off latency per batch, on both sides: from the later of (the engine completing the
  batch: `ready_ns`; the consumer asking for it) to the consumer holding it. In process
  that is `riffle read`'s loop receiving it from the engine's channel
  (`handoff_latency_us` in its --json); through the daemon it is the Python client holding
  numpy views of it in the ring (CLOCK_MONOTONIC, `ready_ns` in the BATCH header), so it
  covers the daemon's connection thread, the socket, waking the client and the client's
  Python. The added latency is the daemon's p99 (p50) minus the in-process p99 (p50),
  medians over the runs: target p99 <= 100 us. Also reported: the batch's age (receipt
  minus `ready_ns`, which includes time spent waiting for a busy client) and the client's
  wait per `next()`.

    python3 bench/serve.py --riffle target/release/riffle --records 400000 --record-size 1K

Writes results/<date>-<host>/serve.{json,md} (or --out DIR).
"""

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402

import riffle  # noqa: E402


@contextlib.contextmanager
def serving(riffle_bin, dataset, *extra, patience=60, log=subprocess.DEVNULL):
    """A `riffle serve` of `dataset` ("NAME=PATH") with `extra` flags, on a socket in a
    temporary directory, for the `with` block: yields the socket's path once the daemon
    takes connections; stops it afterwards. Its stderr goes to `log`."""
    tmp = tempfile.mkdtemp(prefix="rsb")
    sock = os.path.join(tmp, "s.sock")
    daemon = subprocess.Popen([riffle_bin, "serve", "--socket", sock, "--dataset", dataset, *extra],
                              stderr=log)
    try:
        deadline = time.time() + patience
        while True:
            try:
                riffle.Client(sock).close()
                break
            except riffle.RiffleConnectionError:
                if time.time() > deadline or daemon.poll() is not None:
                    raise SystemExit("riffle serve did not come up")
                time.sleep(0.05)
        yield sock
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def pct(xs, q):
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else 0.0


def in_process(a, data):
    out = subprocess.run(
        [a.riffle, "read", str(data), "--batch-size", str(a.batch_size), "--seed", "1",
         "--queue-depth", str(a.queue_depth), "--mode", a.mode, "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    r = json.loads(out)
    return {
        "records_per_s": r["records_per_s"],
        "bytes_per_s": r["bytes_per_s"],
        "seconds": r["seconds"],
        "records": r["records"],
        "batch_latency_us": r["batch_latency_us"],
        "handoff_latency_us": r["handoff_latency_us"],
        "backend": r["backend"],
        "mode": r["mode"],
        "direct": r["direct"],
    }


def busy(us):
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def through_daemon(a, sock, compute_us=0, spin_us=0):
    handoff_us, wait_us, age_us = [], [], []
    records = 0
    nbytes = 0
    with riffle.Client(sock, spin_us=spin_us) as c:
        stream = c.stream("bench", batch_size=a.batch_size, seed=1)
        it = iter(stream)
        t0 = time.perf_counter()
        while True:
            asked_ns = time.monotonic_ns()
            try:
                b = next(it)
            except StopIteration:
                break
            now_ns = time.monotonic_ns()
            # From when both the engine had completed the batch and the client was asking
            # for it, to when the client holds its views. A batch that waited in the ring
            # for a busy client waited for the client, not for the daemon.
            handoff_us.append((now_ns - max(b.ready_ns, asked_ns)) / 1000.0)
            age_us.append((now_ns - b.ready_ns) / 1000.0)
            wait_us.append((now_ns - asked_ns) / 1000.0)
            records += len(b.ids)
            nbytes += len(b.data)
            if a.touch:
                int(b.data[::4096].sum())
            if compute_us:
                busy(compute_us)  # a training step on the CPU
        secs = time.perf_counter() - t0
        st = c.stats()
    return {
        "records_per_s": records / secs,
        "bytes_per_s": nbytes / secs,
        "seconds": secs,
        "records": records,
        "handoff_latency_us": {"p50": pct(handoff_us, 50), "p99": pct(handoff_us, 99),
                               "max": max(handoff_us)},
        "mode": stream.opened["mode"],
        "batches_in_place": st["batches_in_place"],
        "batches": st["batches"],
        "batch_age_us": {"p50": pct(age_us, 50), "p99": pct(age_us, 99), "max": max(age_us)},
        "next_wait_us": {"p50": pct(wait_us, 50), "p99": pct(wait_us, 99), "max": max(wait_us)},
        "daemon_send_latency_us": st["send_latency_us"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--riffle", default=str(ROOT / "target" / "release" / "riffle"))
    p.add_argument("--data", help="an existing dataset (default: generate one)")
    p.add_argument("--dir", default=str(ROOT / "target" / "bench-serve"),
                   help="where a generated dataset goes (a real disk)")
    p.add_argument("--records", type=int, default=400_000)
    p.add_argument("--record-size", default="1K")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--queue-depth", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="runs per side and cache state")
    p.add_argument("--mode", default="auto", help="auto (the planner's choice), lirs or two-pass, on both sides")
    p.add_argument("--cache", default="warm,cold", help="warm, cold or both")
    p.add_argument("--touch", action="store_true", help="read one byte per page of each batch")
    p.add_argument("--compute-us", type=float, default=0,
                   help="also run the daemon side with this much busy CPU work per batch "
                        "(a training step): the batch is then waiting in the ring when asked for")
    p.add_argument("--spin-us", type=float, default=0,
                   help="also run the daemon side with a client that busy-polls this long "
                        "before sleeping (riffle.Client(spin_us=...))")
    p.add_argument("--out", help="report directory (default results/<date>-<host>)")
    a = p.parse_args()

    if a.data:
        data = pathlib.Path(a.data)
    else:
        d = pathlib.Path(a.dir)
        d.mkdir(parents=True, exist_ok=True)
        data = d / f"bench-{a.records}-{a.record_size}.npy"
        if not data.exists():
            subprocess.run([a.riffle, "gen", str(data), "--format", "npy", "--records",
                            str(a.records), "--record-size", a.record_size], check=True)

    with serving(a.riffle, f"bench={data}", "--queue-depth", str(a.queue_depth), "--mode", a.mode) as sock:
        report = {"data": str(data), "records": a.records, "record_size": a.record_size, "mode": a.mode,
                  "batch_size": a.batch_size, "queue_depth": a.queue_depth, "runs": a.runs,
                  "host": socket.gethostname(), "touch": a.touch, "results": {}}
        for cache in [c for c in a.cache.split(",") if c]:
            if cache == "cold" and os.geteuid() != 0:
                print("cold: skipped (dropping the page cache needs root)")
                continue
            sides = ["in_process", "daemon"] + (["daemon_spin"] if a.spin_us else [])
            rows = {side: [] for side in sides}
            for i in range(a.runs):
                for side in sides:
                    if cache == "cold":
                        drop_caches()
                    if side == "in_process":
                        r = in_process(a, data)
                    else:
                        r = through_daemon(a, sock, spin_us=a.spin_us if side == "daemon_spin" else 0)
                    r["loadavg_1m"] = os.getloadavg()[0]  # other work on the machine
                    rows[side].append(r)
                    h = r["handoff_latency_us"]
                    print(f"{cache} run {i} {side:11}: {r['records_per_s']:,.0f} records/s, "
                          f"hand-off p50 {h['p50']:.1f} us, p99 {h['p99']:.1f} us"
                          + (f" ({r['mode']}, {r['batches_in_place']}/{r['batches']} batches "
                             f"assembled in the ring so far)" if side != "in_process" else ""),
                          flush=True)

            def med(side, key, q):
                return statistics.median(r[key][q] for r in rows[side])

            ip = statistics.median(r["records_per_s"] for r in rows["in_process"])
            dm = statistics.median(r["records_per_s"] for r in rows["daemon"])
            summary = {
                "in_process_records_per_s": ip,
                "daemon_records_per_s": dm,
                "throughput_ratio": dm / ip,
                "in_process_handoff_p50_us": med("in_process", "handoff_latency_us", "p50"),
                "in_process_handoff_p99_us": med("in_process", "handoff_latency_us", "p99"),
                "daemon_handoff_p50_us": med("daemon", "handoff_latency_us", "p50"),
                "daemon_handoff_p99_us": med("daemon", "handoff_latency_us", "p99"),
                "daemon_handoff_p99_us_worst": max(r["handoff_latency_us"]["p99"] for r in rows["daemon"]),
                "in_process_batch_p99_us": med("in_process", "batch_latency_us", "p99"),
                "runs": rows,
            }
            summary["added_p50_us"] = summary["daemon_handoff_p50_us"] - summary["in_process_handoff_p50_us"]
            summary["added_p99_us"] = summary["daemon_handoff_p99_us"] - summary["in_process_handoff_p99_us"]
            if a.spin_us:
                sp = rows["daemon_spin"]
                summary["spin"] = {
                    "spin_us": a.spin_us,
                    "daemon_records_per_s": statistics.median(r["records_per_s"] for r in sp),
                    "throughput_ratio": statistics.median(r["records_per_s"] for r in sp) / ip,
                    "daemon_handoff_p99_us": med("daemon_spin", "handoff_latency_us", "p99"),
                    "added_p99_us": med("daemon_spin", "handoff_latency_us", "p99")
                    - summary["in_process_handoff_p99_us"],
                }
            report["results"][cache] = summary
            print(f"{cache}: ratio {dm / ip:.3f} (daemon {dm:,.0f} / in-process {ip:,.0f} records/s); "
                  f"hand-off p99 daemon {summary['daemon_handoff_p99_us']:.1f} us "
                  f"(worst run {summary['daemon_handoff_p99_us_worst']:.1f}) vs in-process "
                  f"{summary['in_process_handoff_p99_us']:.1f} us: added p99 {summary['added_p99_us']:.1f} us, "
                  f"p50 {summary['added_p50_us']:.1f} us")
        if a.compute_us:
            r = through_daemon(a, sock, a.compute_us)
            report["results"]["compute_bound"] = {"compute_us": a.compute_us, **r}
            print(f"compute-bound ({a.compute_us:.0f} us per batch): {r['records_per_s']:,.0f} records/s, "
                  f"hand-off p50 {r['handoff_latency_us']['p50']:.1f} us, "
                  f"p99 {r['handoff_latency_us']['p99']:.1f} us (the batch was waiting in the ring)")

    out = pathlib.Path(a.out) if a.out else (
        ROOT / "results" / f"{datetime.date.today()}-{socket.gethostname()}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    loads = [r["loadavg_1m"] for c in report["results"].values() for side in c.get("runs", {}).values()
             for r in side] or [os.getloadavg()[0]]
    lines = ["# riffle serve vs in-process read", "",
             f"{data}, batch {a.batch_size}, QD {a.queue_depth}, {a.runs} runs per side (median); "
             f"1-minute load average during the runs {min(loads):.1f} to {max(loads):.1f}", "",
             "Hand-off latency: from the engine completing a batch (or the consumer asking, if later) "
             "to the consumer holding it; in process `riffle read`'s loop, through the daemon the "
             "Python client's numpy views. Added = daemon minus in-process (medians of the runs' "
             "percentiles).", "",
             "| cache | in-process records/s | daemon + Python records/s | ratio "
             "| hand-off p99 in-process us | hand-off p99 daemon us | added p50 us | added p99 us |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for cache, s in report["results"].items():
        if cache == "compute_bound":
            lines.append(f"| compute-bound ({s['compute_us']:.0f} us/batch) | | {s['records_per_s']:,.0f} | "
                         f"| | {s['handoff_latency_us']['p99']:.1f} | | |")
            continue
        lines.append(f"| {cache} | {s['in_process_records_per_s']:,.0f} | {s['daemon_records_per_s']:,.0f} "
                     f"| {s['throughput_ratio']:.3f} | {s['in_process_handoff_p99_us']:.1f} "
                     f"| {s['daemon_handoff_p99_us']:.1f} | {s['added_p50_us']:.1f} "
                     f"| {s['added_p99_us']:.1f} |")
        if "spin" in s:
            sp = s["spin"]
            lines.append(f"| {cache}, client spin {sp['spin_us']:.0f} us | | {sp['daemon_records_per_s']:,.0f} "
                         f"| {sp['throughput_ratio']:.3f} | | {sp['daemon_handoff_p99_us']:.1f} | "
                         f"| {sp['added_p99_us']:.1f} |")
    (out / "serve.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'serve.json'} and serve.md")


if __name__ == "__main__":
    main()
