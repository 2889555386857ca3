"""The streaming loaders against riffle on one S3-compatible server, for `riffle bench
object-store` (which runs this script in the peers' virtual environment, one run per
process, from a cold local cache).

  python object_store.py upload DIR s3://BUCKET/PREFIX
      PUT every file of DIR (not recursive) as PREFIX/NAME, through the S3 API (so the
      server keeps each object's ETag). Prints {"objects": N, "bytes": B}.
  python object_store.py cat s3://BUCKET/KEY
      Writes the object to stdout (WebDataset's `pipe:` reader).
  python object_store.py read KIND s3://BUCKET/PREFIX --cache DIR --cache-limit BYTES
                         --records N [--batch-size B] [--workers W] [--epochs E] [--seed S]
      Reads E epochs through a PyTorch DataLoader with the loader's own shuffle and local
      cache. Prints one JSON object as bench/peers.py does, with each epoch's seconds and
      the local cache's peak bytes (sampled every 50 ms), the seconds its open took (its
      dataset and DataLoader made: `open_seconds`) and from the open's start to its first
      batch (`first_batch_since_open_seconds`); `seconds` counts from the first batch asked.

Readers: mds (Mosaic StreamingDataset, remote=, py1e shuffle, cache_limit=), litdata
(LitData StreamingDataset, shuffle=True, max_cache_size=), wds (WebDataset over `pipe:`
URLs, shard shuffle and a 1,000-sample buffer; cache_dir/cache_size). The endpoint and
credentials are the standard AWS variables (AWS_ENDPOINT_URL, ...); Mosaic reads its own
S3_ENDPOINT_URL, set here from it.
"""

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def client():
    import boto3
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                        region_name=os.environ.get("AWS_REGION", "us-east-1"))


def split(url):
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    return bucket, key


def upload(src, url):
    bucket, prefix = split(url)
    s3, n, total = client(), 0, 0
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not os.path.isfile(path) or name.startswith("."):
            continue
        with open(path, "rb") as f:
            body = f.read()
        s3.put_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}", Body=body)
        n, total = n + 1, total + len(body)
    print(json.dumps({"objects": n, "bytes": total}))


def cat(url):
    bucket, key = split(url)
    body = client().get_object(Bucket=bucket, Key=key)["Body"]
    out = sys.stdout.buffer
    for chunk in iter(lambda: body.read(1 << 20), b""):
        out.write(chunk)
    out.flush()


class DiskPeak:
    """The largest size the directory reached, sampled every 50 ms on a thread."""

    def __init__(self, path):
        self.path, self.peak, self.done = path, 0, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def size(self):
        total = 0
        for root, _, files in os.walk(self.path):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_blocks * 512
                except OSError:
                    pass
        return total

    def run(self):
        while not self.done.wait(0.05):
            self.peak = max(self.peak, self.size())

    def stop(self):
        self.done.set()
        self.t.join()
        self.peak = max(self.peak, self.size())
        return self.peak


def loader(a):
    import torch
    from torch.utils.data import DataLoader
    from peers import join

    if a.kind == "mds":
        os.environ.setdefault("S3_ENDPOINT_URL", os.environ["AWS_ENDPOINT_URL"])
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()

        class Mds(StreamingDataset):
            def __getitem__(self, i):
                return super().__getitem__(i)["x"]

        ds = Mds(remote=a.url, local=a.cache, shuffle=True, shuffle_seed=a.seed,
                 batch_size=a.batch_size, cache_limit=a.cache_limit)
        return DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers, collate_fn=join)
    if a.kind == "litdata":
        import litdata
        import litdata.streaming.downloader as dl
        # LitData's chunk downloads go through obstore with client options of its own,
        # which leave out plain HTTP: the loopback server here is plain HTTP (a remote
        # one would be HTTPS and need nothing).
        if os.environ["AWS_ENDPOINT_URL"].startswith("http://"):
            dl._OBSTORE_CLIENT_OPTIONS = {**dl._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}

        class Lit(litdata.StreamingDataset):
            def __getitem__(self, i):
                return super().__getitem__(i)["x"]

        ds = Lit(a.url, cache_dir=a.cache, shuffle=True, seed=a.seed,
                 max_cache_size=a.cache_limit,
                 storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
        return litdata.StreamingDataLoader(ds, batch_size=a.batch_size,
                                           num_workers=a.workers, collate_fn=join)
    if a.kind == "wds":
        import webdataset as wds
        bucket, prefix = split(a.url)
        keys = [o["Key"] for o in client().list_objects_v2(Bucket=bucket, Prefix=prefix)
                .get("Contents", []) if o["Key"].endswith(".tar")]
        me = os.path.abspath(__file__)
        urls = [f"pipe:{sys.executable} {me} cat s3://{bucket}/{k}" for k in sorted(keys)]
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=a.seed, cache_dir=a.cache,
                             cache_size=a.cache_limit, nodesplitter=wds.single_node_only,
                             empty_check=False)
              .shuffle(1000).map(lambda s: s["bin"]))
        return DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers, collate_fn=join)
    raise SystemExit(f"object_store.py: unknown reader {a.kind!r}")


def read(a):
    from peers import epochs
    os.makedirs(a.cache, exist_ok=True)
    peak = DiskPeak(a.cache)
    try:
        # The loader's open (its dataset and DataLoader made: listings, index downloads),
        # reported apart: `seconds` counts from the first batch asked.
        t = time.perf_counter()
        dl = loader(a)
        opened = time.perf_counter() - t
        r = epochs(lambda e: ((b, len(b)) for b in dl), a.records, a.epochs, a.max_seconds)
    finally:
        r_peak = peak.stop()
    r["disk_peak_bytes"] = r_peak
    r["open_seconds"] = opened
    first = r.get("first_batch_s")
    r["first_batch_since_open_seconds"] = None if first is None else opened + first
    return r


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "upload":
        if len(sys.argv) != 4:
            sys.exit("usage: object_store.py upload DIR s3://BUCKET/PREFIX")
        return upload(sys.argv[2], sys.argv[3])
    if len(sys.argv) >= 2 and sys.argv[1] == "cat":
        if len(sys.argv) != 3:
            sys.exit("usage: object_store.py cat s3://BUCKET/KEY")
        return cat(sys.argv[2])
    p = argparse.ArgumentParser(description="Read epochs of an s3:// dataset with one loader.")
    p.add_argument("verb", choices=["read"])
    p.add_argument("kind", choices=["mds", "litdata", "wds"])
    p.add_argument("url")
    p.add_argument("--cache", required=True, help="the loader's local cache directory")
    p.add_argument("--cache-limit", type=int, required=True, help="bytes of local cache")
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=None)
    from peers import report
    report(read, p.parse_args(), exit_now=True)


if __name__ == "__main__":
    main()
