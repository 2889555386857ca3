"""The loaders users would pick instead of riffle, each on its own format, for `riffle bench
peers` (which runs this script in its own virtual environment, one run per process, inside
a memory cgroup and from a cold cache).

  python peers.py write KIND DATA.npy OUT_DIR
      Write the `.npy`'s records with KIND's own writer into OUT_DIR (mds: Mosaic's
      MDSWriter; litdata: LitData's optimize; wds: WebDataset's ShardWriter). Prints
      {"seconds": S, "bytes": B}.
  python peers.py read KIND PATH --batch-size B --workers W [--seed S] [--epochs E]
                  [--riffle BIN]
      Read E epochs (1 by default) through a PyTorch DataLoader. Prints one JSON object:
      records and seconds of all of them, epoch_seconds, first_batch_s, and per epoch
      (averaged, or all must hold) labels_per_batch, position_corr, exactly_once.

Readers (KIND for `read`):
  map          map-style Dataset over np.load(mmap_mode="r"), RandomSampler (PATH: .npy)
  mds-py1e     Mosaic StreamingDataset, shuffle_algo="py1e" (its default) (PATH: mds dir)
  mds-naive    Mosaic StreamingDataset, shuffle_algo="naive" (a full shuffle)
  litdata      LitData StreamingDataset(shuffle=True) (PATH: optimize's output dir)
  wds          WebDataset, shard shuffle + a sample buffer of 1,000 (PATH: shard dir)
  riffle-views riffle.torch.loader, num_workers=0: tensors viewing the daemon's ring
  riffle-tickets  riffle.torch.loader with W workers: batches handed over with no copy
  riffle-dataloader  DataLoader(RiffleDataset) with W workers: one copy to shared memory
The riffle readers start `riffle serve` (BIN) on PATH (the .npy) in this process's cgroup.

Every record is a riffle `gen` record: its id (u64) and label (u32) lead its bytes, so the
same decoding scores every loader: distinct labels per batch (10 = shuffled, for the
label-sorted data the suite writes), the correlation of delivery position with id (0 =
shuffled, 1 = in order), and whether every record came exactly once.
"""

import argparse
import glob
import json
import os
import resource
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def records_of(npy):
    m = np.load(npy, mmap_mode="r")
    return m, m.shape[0], int(np.prod(m.shape[1:])) * m.dtype.itemsize


def join(samples):
    """The collate every peer gets: its samples' bytes joined into one uint8 tensor
    [B, record], one copy (as cheap a collate as a user could write)."""
    import torch
    n = len(samples)
    return torch.from_numpy(np.frombuffer(b"".join(samples), np.uint8).reshape(n, -1).copy())


# ---------------------------------------------------------------------------------------
# Writers


def write(kind, npy, out):
    m, n, size = records_of(npy)
    # Shards (chunks) of 64 MiB, each writer's usual size; RIFFLE_PEERS_SHARD sets another
    # (the object-store suite writes 2 MiB, so that a cache of a tenth of its dataset holds
    # the four shards Mosaic asks for at least).
    shard = int(os.environ.get("RIFFLE_PEERS_SHARD", str(1 << 26)))
    t = time.perf_counter()
    if kind == "mds":
        from streaming import MDSWriter
        with MDSWriter(out=out, columns={"x": "bytes"}, compression=None,
                       size_limit=shard) as w:
            for i in range(n):
                w.write({"x": m[i].tobytes()})
    elif kind == "litdata":
        import litdata
        litdata.optimize(fn=_litdata_item, inputs=[(npy, s, min(s + 4096, n)) for s in
                                                    range(0, n, 4096)],
                         output_dir=out, chunk_bytes=shard, num_workers=2,
                         mode="overwrite")
    elif kind == "wds":
        import webdataset as wds
        os.makedirs(out, exist_ok=True)
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=shard,
                             verbose=0) as w:
            for i in range(n):
                w.write({"__key__": f"{i:010d}", "bin": m[i].tobytes()})
    else:
        sys.exit(f"peers.py: unknown writer {kind!r}: expected mds, litdata or wds")
    secs = time.perf_counter() - t
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "**"), recursive=True)
                if os.path.isfile(p))
    print(json.dumps({"seconds": secs, "bytes": total}))


def _litdata_item(job):
    # A generator: LitData writes each yielded item as one sample.
    npy, start, end = job
    m = np.load(npy, mmap_mode="r")
    for i in range(start, end):
        yield {"x": m[i].tobytes()}


# ---------------------------------------------------------------------------------------
# Readers: each returns an iterable of (uint8 tensor [B, record], real records in it)


class MapStyle:
    """A PyTorch map-style Dataset over a memmapped .npy, as a user writes one."""

    def __init__(self, npy):
        self.npy = npy
        self.m = None
        self.n = np.load(npy, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.m is None:  # opened in each worker
            self.m = np.load(self.npy, mmap_mode="r")
        return self.m[i].tobytes()


def peer_loader(kind, path, batch, workers, seed):
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    g = torch.Generator()
    g.manual_seed(seed)
    if kind == "map":
        ds = MapStyle(path)
        return DataLoader(ds, batch_size=batch, sampler=RandomSampler(ds, generator=g),
                          num_workers=workers, collate_fn=join)
    if kind in ("mds-py1e", "mds-naive"):
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()

        class Mds(StreamingDataset):
            def __getitem__(self, i):
                return super().__getitem__(i)["x"]

        ds = Mds(local=path, shuffle=True, shuffle_algo=kind.split("-")[1], shuffle_seed=seed,
                 batch_size=batch)
        return DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=join)
    if kind == "litdata":
        import litdata

        class Lit(litdata.StreamingDataset):
            def __getitem__(self, i):
                return super().__getitem__(i)["x"]

        ds = Lit(path, shuffle=True, seed=seed)
        return litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers,
                                           collate_fn=join)
    if kind == "wds":
        import webdataset as wds
        shards = sorted(glob.glob(os.path.join(path, "shard-*.tar")))
        ds = (wds.WebDataset(shards, shardshuffle=len(shards), seed=seed,
                             nodesplitter=wds.single_node_only, empty_check=False)
              .shuffle(1000).map(lambda s: s["bin"]))
        return DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=join)
    raise SystemExit(f"peers.py: unknown reader {kind!r}")


def riffle_batches(it):
    for b in it:
        n = len(b["ids"]) - int(b["padding"])
        # Fixed-size records: the batch's bytes as [B, record], a view.
        yield b["data"].view(len(b["ids"]), -1)[:n], n


def read(a):
    import torch  # noqa: F401  (fail here, with the reason, if torch is missing)

    if a.kind.startswith("riffle-"):
        sys.path.insert(0, HERE)
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import riffle.torch
        from serve import serving
        # One training job: a ring share of --memory / 4 per client (the default of 64
        # clients would give 100 KiB records' batches too small a share).
        memory = ["--memory", a.riffle_memory] if a.riffle_memory else []
        with serving(a.riffle, f"peers={a.path}", *memory,
                     "--max-clients", "4", patience=120) as sock:
            if a.kind == "riffle-views":
                it = riffle.torch.loader(sock, "peers", a.batch_size, seed=a.seed)
                ds = it
            elif a.kind == "riffle-tickets":
                it = riffle.torch.loader(sock, "peers", a.batch_size, num_workers=a.workers,
                                         seed=a.seed)
                ds = it
            elif a.kind == "riffle-dataloader":
                ds = riffle.torch.RiffleDataset(sock, "peers", a.batch_size, seed=a.seed)
                it = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=a.workers)
            else:
                raise SystemExit(f"peers.py: unknown reader {a.kind!r}")

            def one(e):
                ds.set_epoch(e)
                return riffle_batches(it)
            return epochs(one, a.records, a.epochs, a.max_seconds)
    dl = peer_loader(a.kind, a.path, a.batch_size, a.workers, a.seed)
    # Each pass over a DataLoader is its next epoch (a new permutation of its sampler's
    # generator; Mosaic and LitData count epochs themselves).
    return epochs(lambda e: ((b, len(b)) for b in dl), a.records, a.epochs, a.max_seconds)


def epochs(batches_of, n, count, max_seconds=None):
    """`count` epochs, each `batches_of(e)`, within `max_seconds` in all: the records and
    seconds of all of them, each epoch's seconds, and the shuffle's quality and
    every-record-once of each epoch (all must hold)."""
    runs, t = [], time.perf_counter()
    for e in range(count):
        left = None if max_seconds is None else max_seconds - (time.perf_counter() - t)
        r = epoch(batches_of(e), n, left)
        runs.append(r)
        if r["partial"]:
            break
    out = dict(runs[0])
    out["records"] = sum(r["records"] for r in runs)
    out["seconds"] = sum(r["seconds"] for r in runs)
    out["cpu_seconds"] = sum(r["cpu_seconds"] for r in runs)
    out["epoch_seconds"] = [r["seconds"] for r in runs]
    out["partial"] = any(r["partial"] for r in runs)
    out["labels_per_batch"] = sum(r["labels_per_batch"] for r in runs) / len(runs)
    corr = [r["position_corr"] for r in runs if r["position_corr"] is not None]
    out["position_corr"] = max(corr, key=abs) if corr else None
    once = [r["exactly_once"] for r in runs]
    out["exactly_once"] = None if None in once else all(once)
    out["missing"] = sum(r["missing"] for r in runs)
    out["repeated"] = sum(r["repeated"] for r in runs)
    return out


def tree_cpu():
    """CPU seconds (user + system) of this process, its live descendants (DataLoader
    workers, the daemon) and the children it has reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        cpu[int(d)] = (int(fields[11]) + int(fields[12])) / tick
    me = os.getpid()

    def mine(pid):
        while pid in parent and pid > 1:
            if pid == me:
                return True
            pid = parent[pid]
        return False

    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (sum(c for p, c in cpu.items() if mine(p))
            + reaped.ru_utime + reaped.ru_stime)


def epoch(batches, n, max_seconds=None):
    """One epoch of `batches`, or as much of it as `max_seconds` allows (then `partial`:
    the rate and the shuffle's quality are of what was read; every-record-once is not
    known)."""
    ids, labels_seen, nbatches, records = [], 0, 0, 0
    cpu0 = tree_cpu()
    t = time.perf_counter()
    first = None
    partial = False
    for x, real in batches:
        if first is None:
            first = time.perf_counter() - t
        head = x[:real, :12].numpy()
        b_ids = head[:, :8].copy().view("<u8").ravel()
        b_labels = head[:, 8:12].copy().view("<u4").ravel()
        ids.append(b_ids)
        if real:
            labels_seen += len(np.unique(b_labels))
            nbatches += 1
        records += real
        if max_seconds is not None and time.perf_counter() - t > max_seconds and records < n:
            partial = True
            break
    secs = time.perf_counter() - t
    cpu = tree_cpu() - cpu0
    order = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    counts = np.bincount(order, minlength=n) if len(order) else np.zeros(n, np.int64)
    corr = float(np.corrcoef(np.arange(len(order)), order)[0, 1]) if len(order) > 1 else None
    return {"records": records, "seconds": secs, "first_batch_s": first, "cpu_seconds": cpu,
            "labels_per_batch": labels_seen / max(nbatches, 1), "position_corr": corr,
            "exactly_once": None if partial else bool(len(counts) == n and (counts == 1).all()),
            "partial": partial,
            "missing": int((counts[:n] == 0).sum()), "repeated": int((counts > 1).sum())}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "write":
        if len(sys.argv) != 5:
            sys.exit("usage: peers.py write KIND DATA.npy OUT_DIR")
        write(*sys.argv[2:5])
        return
    p = argparse.ArgumentParser(description="Read epochs with one loader.")
    p.add_argument("verb", choices=["read"])
    p.add_argument("kind")
    p.add_argument("path")
    p.add_argument("--records", type=int, required=True, help="records in the dataset")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--riffle", default=os.path.join(HERE, "..", "target", "release", "riffle"))
    p.add_argument("--riffle-memory", default=None,
                   help="riffle serve's --memory (default: the daemon's, from the machine)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to read (samples/s over all)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop a loader this slow after this long and report the rate so far")
    report(read, p.parse_args())


def report(read_with, a, exit_now=False):
    """Runs `read_with(a)` and prints its result as one JSON line, or the error and exit 1.
    Not through the interpreter's exit after an error, a partial run or `exit_now`: a
    DataLoader left mid-epoch would be joined there, worker by worker (the bench ends the
    process group)."""
    try:
        r = read_with(a)
    except BaseException as e:  # noqa: B036  (the reason goes to the bench, then out)
        import traceback
        traceback.print_exc()
        print(f"{type(e).__module__}.{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    print(json.dumps(r), flush=True)
    if exit_now or r.get("partial"):
        os._exit(0)


if __name__ == "__main__":
    main()
