"""One process of a job run by torchrun across "nodes" (tests/python/test_torch.py): it
reads from the daemon of its node (`--sockets A,B`: node n's daemon is the n-th), as a
rank of the whole job (torch.distributed, gloo), and writes what it read to `--out`.

With `--stop K` it reads K batches and saves the loader's state (every rank's is the same
global cursor; rank 0's is written); with `--state FILE` it resumes from one. `--num-workers N` reads through N DataLoader
workers (`--plain`: a plain DataLoader over RiffleDataset instead of `riffle.torch.loader`);
`--with-padding` keeps the padding records among the ids written (and counts them).
`--epochs E` reads E epochs (`set_epoch` before each); what is written is then per epoch:
`ids` a list of E lists, `seconds` each epoch's time from the loader's start to its last
batch (the bench's rates, bench/torchrun_node.py). `--ceiling RECORDS,SIZE` reads no daemon:
a DataLoader whose workers hand over batches that cost nothing to make (one shared tensor of
batch x SIZE bytes and the ids, this rank's share of RECORDS), the Python hand-off's own
ceiling in the same ranks and workers (bench/torchrun_node.py --ceiling)."""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import riffle.torch

p = argparse.ArgumentParser()
p.add_argument("--sockets", help="the nodes' daemons' sockets (all but --ceiling)")
p.add_argument("--out", required=True)
p.add_argument("--batch-size", type=int, default=50)
p.add_argument("--stop", type=int)
p.add_argument("--state")
p.add_argument("--num-workers", type=int, default=0)
p.add_argument("--plain", action="store_true")
p.add_argument("--with-padding", action="store_true")
p.add_argument("--epochs", type=int)
p.add_argument("--ceiling", help="RECORDS,SIZE: batches made of nothing, no daemon")
a = p.parse_args()


class Ceiling(torch.utils.data.IterableDataset):
    """This rank's share of an epoch of `records` records of `size` bytes, in batches that
    cost nothing to make: every batch is one tensor shared by all (made once, in shared
    memory, before the workers fork) and its ids. What a DataLoader then measures is its
    own hand-off: the workers' queue, the tensors' pickling and the rank's loop."""

    def __init__(self, records, size, batch, rank, world):
        per_rank = records // world
        self.first, self.batches, self.batch = rank * per_rank, per_rank // batch, batch
        self.data = torch.zeros(batch, size, dtype=torch.uint8).share_memory_()

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        for i in range(w, self.batches, n):
            a = self.first + i * self.batch
            yield {"ids": torch.arange(a, a + self.batch), "data": self.data, "padding": 0}


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node = int(os.environ["GROUP_RANK"])
sock = a.sockets.split(",")[node] if a.sockets else None
if a.ceiling:
    records, size = (int(x) for x in a.ceiling.split(","))
    loader = torch.utils.data.DataLoader(Ceiling(records, size, a.batch_size, rank, world),
                                         batch_size=None, num_workers=a.num_workers)
elif a.plain:
    loader = torch.utils.data.DataLoader(riffle.torch.RiffleDataset(sock, "train", a.batch_size, seed=21),
                                         batch_size=None, num_workers=a.num_workers)
else:
    loader = riffle.torch.loader(sock, "train", a.batch_size, seed=21, num_workers=a.num_workers)
if a.state:
    loader.load_state_dict(json.load(open(a.state)))
per_epoch, seconds, steps, padding = [], [], 0, 0
for e in range(a.epochs or 1):
    if a.epochs:
        loader.set_epoch(e) if hasattr(loader, "set_epoch") else loader.dataset.set_epoch(e)
    t, ids = time.perf_counter(), []
    for b in loader:
        real = len(b["ids"]) - int(b["padding"])
        padding += int(b["padding"])
        ids.extend(b["ids"][: len(b["ids"]) if a.with_padding else real].tolist())
        steps += 1
        if a.stop is not None and steps == a.stop:
            break
    per_epoch.append(ids)
    seconds.append(time.perf_counter() - t)
ids = per_epoch if a.epochs else per_epoch[0]
state = loader.state_dict() if hasattr(loader, "state_dict") else None
got = [None] * world
dist.all_gather_object(got, {"rank": rank, "node": node, "ids": ids, "steps": steps, "padding": padding,
                         "state": state, "seconds": seconds})
if rank == 0:
    json.dump(got, open(a.out, "w"))
dist.barrier()
dist.destroy_process_group()
