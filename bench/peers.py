"""The page-cache ways of feeding shuffled records, for `riffle bench peers`.

  python3 bench/peers.py memmap DATA.npy SECONDS BATCH SEED
  python3 bench/peers.py buffer DATA.npy SECONDS BATCH SEED BUFFER

memmap: what a PyTorch map-style Dataset over np.load(mmap_mode="r") does: a random
permutation of the rows, each batch gathered row by row through the page cache.
buffer: a tf.data-style shuffle buffer over sequential reads of the memmap.

Runs for SECONDS (or one epoch, whichever ends first) and prints one JSON object:
{"records": N, "bytes": B, "seconds": S}.
"""
import json
import sys
import time

import numpy as np


def memmap_gather(m, seconds, batch, seed):
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(m))
    start = time.perf_counter()
    records = 0
    nbytes = 0
    for i in range(0, len(order), batch):
        rows = [np.array(m[j]) for j in order[i:i + batch]]  # one __getitem__ per record
        b = np.stack(rows)
        records += len(rows)
        nbytes += b.nbytes
        if time.perf_counter() - start > seconds:
            break
    return records, nbytes, time.perf_counter() - start


def shuffle_buffer(m, seconds, batch, seed, size):
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    buf = []
    out = []
    records = 0
    nbytes = 0
    chunk = 256
    for s in range(0, len(m), chunk):
        block = np.array(m[s:s + chunk])  # sequential reads
        for row in block:
            if len(buf) < size:
                buf.append(row)
                continue
            j = rng.integers(len(buf))
            out.append(buf[j])
            buf[j] = row
            if len(out) == batch:
                b = np.stack(out)
                out = []
                records += len(b)
                nbytes += b.nbytes
        if time.perf_counter() - start > seconds:
            break
    return records, nbytes, time.perf_counter() - start


def main():
    kind, path, seconds, batch, seed = sys.argv[1:6]
    m = np.load(path, mmap_mode="r")
    if kind == "memmap":
        r = memmap_gather(m, float(seconds), int(batch), int(seed))
    elif kind == "buffer":
        r = shuffle_buffer(m, float(seconds), int(batch), int(seed), int(sys.argv[6]))
    else:
        sys.exit(f"unknown peer {kind!r}: expected memmap or buffer")
    print(json.dumps({"records": r[0], "bytes": r[1], "seconds": r[2]}))


if __name__ == "__main__":
    main()
