#!/usr/bin/env python3
"""riffle through PyTorch against riffle in process (issue 19): one epoch of label-sorted
records read by `riffle read` (in process), and by `riffle.torch.RiffleDataset` over
`riffle serve` in a DataLoader with num_workers=0 (tensors viewing the shared ring) and
num_workers=2 (the process's workers splitting its batches in one shared pass, batches handed
over in shared memory),
alternated run by run, cold cache (root) or warm.

Reports per side: samples/s (median), the ratio to in-process `riffle read`, the time to
the first batch (from asking to holding it), distinct labels per batch (10 = shuffled),
and checks every record arrives exactly once: as many ids as records, all distinct, no
padding (issue 29: a process's workers once padded the epoch as if they were ranks). Targets: ratio >= 0.9 for both DataLoader
settings.

Needs torch in the interpreter that runs it (it is not installed for you: `python3 -m
pip install torch` in a virtual environment of your own, or see README); without it the
bench says so and exits with status 2.

    python3 bench/torch_loader.py --riffle target/release/riffle --records 400000 --record-size 4K

Writes results/<date>-<host>/torch-loader.{json,md} (or --out DIR).
"""

import argparse
import datetime
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

try:
    import torch
except ImportError:
    print("torch_loader: skipped: torch is not installed in this interpreter "
          f"({sys.executable}); install it with `{sys.executable} -m pip install torch` "
          "(a few GB) in a virtual environment, then run this again", file=sys.stderr)
    sys.exit(2)

import numpy as np  # noqa: E402

import riffle.torch  # noqa: E402
from serve import drop_caches, serving  # noqa: E402  (bench/serve.py, beside this script)


def in_process(a, data):
    out = subprocess.run(
        [a.riffle, "read", str(data), "--batch-size", str(a.batch_size), "--seed", "1",
         "--mode", a.mode, "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    r = json.loads(out)
    return {"samples_per_s": r["records"] / r["seconds"], "first_batch_s": r["first_batch_seconds"],
            "records": r["records"], "mode": r["mode"], "lead_batches": r.get("lead_batches", 0),
            "labels_per_batch": None, "exactly_once": None}


def through_torch(a, sock, how, n):
    """One epoch through PyTorch: `how` is ("dataloader", workers) for
    DataLoader(RiffleDataset) or ("loader", workers) for riffle.torch.loader."""
    kind, workers = how
    if kind == "dataloader":
        ds = riffle.torch.RiffleDataset(sock, "bench", a.batch_size, seed=1)
        it = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    else:
        it = riffle.torch.loader(sock, "bench", a.batch_size, num_workers=workers, seed=1)
    kept, labels, sampled, batches, records, padding = [], 0, 0, 0, 0, 0
    t = time.monotonic()
    first = None
    for b in it:
        if first is None:
            first = time.monotonic() - t
        ids = b["ids"].numpy()
        padding += int(b["padding"])
        kept.append(ids.copy())
        if batches % 8 == 0:
            # Each generated record carries its label in bytes 8..12 (every 8th batch).
            offs = b["offsets"].numpy()[:-1]
            data = b["data"].numpy()
            lab = data[offs[:, None] + np.arange(8, 12)].view("<u4").ravel()
            labels += len(np.unique(lab))
            sampled += 1
        batches += 1
        records += len(ids)
    secs = time.monotonic() - t
    seen = np.bincount(np.concatenate(kept).astype(np.int64), minlength=n)
    return {"samples_per_s": records / secs, "first_batch_s": first, "records": records,
            "labels_per_batch": labels / max(sampled, 1),
            "padding": padding,
            "exactly_once": bool(records == n and len(seen) == n and (seen == 1).all())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--riffle", default=str(ROOT / "target" / "release" / "riffle"))
    p.add_argument("--dir", default=str(ROOT / "target" / "bench-torch"),
                   help="where the dataset is made (a real disk)")
    p.add_argument("--records", type=int, default=400_000)
    p.add_argument("--record-size", default="4K")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--runs", type=int, default=3, help="runs per side (alternated)")
    p.add_argument("--mode", default="auto", help="auto, lirs or two-pass, on every side")
    p.add_argument("--out", help="report directory (default results/<date>-<host>)")
    a = p.parse_args()

    d = pathlib.Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    data = d / f"torch-{a.records}-{a.record_size}-sorted.npy"
    if not data.exists():
        subprocess.run([a.riffle, "gen", str(data), "--format", "npy", "--records", str(a.records),
                        "--record-size", a.record_size, "--sorted", "--labels", "10"], check=True)
    cold = os.geteuid() == 0
    with serving(a.riffle, f"bench={data}", "--mode", a.mode, "--memory", "2G", patience=120) as sock:
        sides = {"riffle read (in process)": None,
                 "DataLoader(RiffleDataset), num_workers=0 (ring views)": ("dataloader", 0),
                 "riffle.torch.loader, num_workers=2 (ring views, no copy)": ("loader", 2),
                 "DataLoader(RiffleDataset), num_workers=2 (one copy into the worker's shared ring)": ("dataloader", 2)}
        rows = {s: [] for s in sides}
        for i in range(a.runs):
            for side, workers in sides.items():
                if cold:
                    drop_caches()
                r = in_process(a, data) if workers is None else through_torch(a, sock, workers, a.records)
                rows[side].append(r)
                print(f"run {i} {side}: {r['samples_per_s']:,.0f} samples/s, first batch "
                      f"{r['first_batch_s']:.3f} s" + ("" if r["exactly_once"] is None else
                                                      f", every record once: {r['exactly_once']}"),
                      flush=True)

    ref = statistics.median(r["samples_per_s"] for r in rows["riffle read (in process)"])
    summary = []
    for side, rs in rows.items():
        sps = statistics.median(r["samples_per_s"] for r in rs)
        lab = [r["labels_per_batch"] for r in rs if r["labels_per_batch"] is not None]
        summary.append({
            "side": side, "samples_per_s": sps, "ratio": sps / ref,
            "first_batch_s": statistics.median(r["first_batch_s"] for r in rs),
            "labels_per_batch": statistics.median(lab) if lab else None,
            "exactly_once": all(r["exactly_once"] for r in rs) if lab else None,
            "runs": [round(r["samples_per_s"]) for r in rs],
        })
    now = datetime.date.today().isoformat()
    out = pathlib.Path(a.out) if a.out else ROOT / "results" / f"{now}-{socket.gethostname()}"
    out.mkdir(parents=True, exist_ok=True)
    report = {"data": str(data), "records": a.records, "record_size": a.record_size, "mode": a.mode,
              "batch_size": a.batch_size, "cold_cache": cold, "torch": torch.__version__,
              "summary": summary, "runs": rows}
    (out / "torch-loader.json").write_text(json.dumps(report, indent=2))
    md = [f"# riffle through PyTorch ({now}, {socket.gethostname()})", "",
          f"{a.records} label-sorted records of {a.record_size} (`.npy`), batch {a.batch_size}, mode "
          f"{a.mode}, {'cold' if cold else 'warm'} cache, {a.runs} alternated runs per side "
          f"(median), torch {torch.__version__}.", "",
          "| loader | samples/s | ratio to in-process | first batch (s) | labels per batch | every record once | runs |",
          "|---|---:|---:|---:|---:|---|---|"]
    for s in summary:
        lab = "" if s["labels_per_batch"] is None else f"{s['labels_per_batch']:.1f}"
        once = "" if s["exactly_once"] is None else str(s["exactly_once"])
        md.append(f"| {s['side']} | {s['samples_per_s']:,.0f} | {s['ratio']:.2f} | "
                  f"{s['first_batch_s']:.3f} | {lab} | {once} | {s['runs']} |")
    (out / "torch-loader.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
