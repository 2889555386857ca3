"""A PyTorch IterableDataset over `riffle serve` (needs torch).

Each DataLoader worker of each rank opens its own stream with
`rank = rank * num_workers + worker_id` and `world = world * num_workers`, so together they
read every record of the epoch once. Use it with `DataLoader(ds, batch_size=None)`: the
daemon makes the batches.

    ds = riffle.torch.RiffleDataset("/run/riffle.sock", "train", batch_size=256)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in DataLoader(ds, batch_size=None, num_workers=4):
            batch["ids"], batch["offsets"], batch["data"]   # torch tensors
"""

import torch as _torch
from torch.utils.data import IterableDataset, get_worker_info

from .client import Client

__all__ = ["RiffleDataset", "split"]


def split(rank, world, worker_id, num_workers):
    """The (rank, world) a worker streams as: workers of a rank are ranks of their own."""
    return rank * num_workers + worker_id, world * num_workers


class RiffleDataset(IterableDataset):
    """Batches of `dataset` from the daemon at `socket`, split by rank and worker.

    `rank`/`world` default to torch.distributed's when it is initialised, else 0/1. With
    more than one reader in all the tail must be `drop_last` (default then) or `pad`.
    Batches are dicts of tensors: `ids` (int64), `offsets` (int64), `data` (uint8), copied
    out of shared memory so they may cross process boundaries and outlive the next batch.
    """

    def __init__(self, socket, dataset, batch_size, seed=0, epoch=0, rank=None, world=None,
                 tail=None, transport="shm"):
        super().__init__()
        self.socket = socket
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = epoch
        self.rank = rank
        self.world = world
        self.tail = tail
        self.transport = transport

    def set_epoch(self, epoch):
        """The epoch the next iteration reads (each epoch is a fresh order)."""
        self.epoch = epoch

    def _rank_world(self):
        if self.rank is not None and self.world is not None:
            return self.rank, self.world
        dist = _torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = split(*self._rank_world(), wid, nw)
        tail = self.tail or ("partial" if world == 1 else "drop_last")
        with Client(self.socket) as client:
            stream = client.stream(self.dataset, self.batch_size, seed=self.seed,
                                   epoch=self.epoch, rank=rank, world=world, tail=tail,
                                   transport=self.transport)
            for b in stream:
                yield {
                    "ids": _torch.from_numpy(b.ids.astype("int64")),
                    "offsets": _torch.from_numpy(b.offsets.astype("int64")),
                    "data": _torch.from_numpy(b.data.copy()),
                    "epoch": b.epoch,
                    "index": b.index,
                    "padding": b.padding,
                }
