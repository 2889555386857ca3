"""One process of a job run by torchrun across "nodes" (tests/python/test_torch.py): it
reads from the daemon of its node (`--sockets A,B`: node n's daemon is the n-th), as a
rank of the whole job (torch.distributed, gloo), and writes what it read to `--out`.

With `--stop K` it reads K batches and saves the loader's state (every rank's is the same
global cursor; rank 0's is written); with `--state FILE` it resumes from one."""

import argparse
import json
import os

import numpy as np
import torch.distributed as dist

import riffle.torch

p = argparse.ArgumentParser()
p.add_argument("--sockets", required=True)
p.add_argument("--out", required=True)
p.add_argument("--batch-size", type=int, default=50)
p.add_argument("--stop", type=int)
p.add_argument("--state")
a = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node = int(os.environ["GROUP_RANK"])
sock = a.sockets.split(",")[node]
loader = riffle.torch.loader(sock, "train", a.batch_size, seed=21)
if a.state:
    loader.load_state_dict(json.load(open(a.state)))
ids, steps = [], 0
for b in loader:
    real = len(b["ids"]) - int(b["padding"])
    ids.extend(b["ids"][:real].tolist())
    steps += 1
    if a.stop is not None and steps == a.stop:
        break
state = loader.state_dict()
got = [None] * world
dist.all_gather_object(got, {"rank": rank, "node": node, "ids": ids, "steps": steps, "state": state})
if rank == 0:
    json.dump(got, open(a.out, "w"))
dist.barrier()
dist.destroy_process_group()
