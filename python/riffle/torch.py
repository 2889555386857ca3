"""PyTorch over `riffle serve` (needs torch).

Two ways to feed a training loop, both reading every record of the epoch once (a process
of a one-rank job gets every record exactly once, the last batch partial; under torchrun
every rank takes as many steps, the last round padded by default):

- `loader(...)`, or `DataLoader(RiffleDataset(...), batch_size=None, num_workers=0)`: no
  worker processes. The daemon already reads in parallel; its batches arrive in shared
  memory and are handed over as tensors that *view* that memory (no copy). A batch is
  valid until the next one is asked for: copy (`.clone()`) what you keep longer, or let
  `pin_memory=True` copy it into pinned memory. This is the fast path.
- `DataLoader(RiffleDataset(...), batch_size=None, num_workers=N)`: the N workers of a
  process split that process's (rank's) batches, taking them in turn (worker k the
  rank's batches i with i % N == k), so the DataLoader, taking its workers' batches in
  turn, yields the rank's batches in order; the daemon reads the epoch once for every
  worker of every rank (one shared pass). Only ranks get padding or drop-last. A worker
  copies each batch once, into a shared ring of its
  own that the training process maps once; the DataLoader carries only where the batch
  lies, and the batch's place in the ring is reused when the last tensor viewing it is
  gone (a batch kept for good only makes the worker fall back to a fresh shared block
  per batch). Use it when the per-batch work you do in `transform` needs more than one
  core, or when the loop is built around a plain DataLoader.

    import riffle.torch
    for batch in riffle.torch.loader("/data/train.npy", batch_size=256):
        ...   # this user's node daemon, started if none runs (see riffle.node)

    ds = riffle.torch.RiffleDataset("/run/riffle.sock", "train", batch_size=256)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):
            batch["ids"], batch["offsets"], batch["data"]   # torch tensors
"""

import collections as _collections
import mmap as _mmap
import os as _os
import queue as _queue
import select as _select
import struct as _struct
import threading as _threading
import uuid as _uuid
import weakref as _weakref
import warnings as _warnings

import numpy as _np
import torch as _torch
from torch.utils.data import IterableDataset, get_worker_info

from . import node as _node
from .client import Client

__all__ = ["RiffleDataset", "loader", "split", "fixed"]


def node_streams(world, num_workers):
    """How many streams of a job this node opens (OPEN's `streams`): torchrun's
    LOCAL_WORLD_SIZE (its ranks on this node) times `num_workers` (each worker streams);
    `None` (the daemon waits as it would without) when the job is one stream, or when
    LOCAL_WORLD_SIZE is not set and the world has several ranks: launched some other way,
    nothing says how many of them run on this node, and guessing too many would hold the
    job's pass until the daemon's --join-deadline."""
    if world <= 1:
        return None
    local = _os.environ.get("LOCAL_WORLD_SIZE")
    if local is None:
        return num_workers if world == num_workers else None
    try:
        local = int(local)
    except ValueError:
        return None
    return local * num_workers if local >= 1 else None


def split(rank, world, worker_id, num_workers):
    """The (rank, world) of streams a worker opens as (with `workers=num_workers`): stream
    `worker_id * world + rank` of `world * num_workers`, which the daemon reads as worker
    `worker_id` of rank `rank`. The workers of a rank split its batches, numbered so that
    the job's processes, taking their workers' batches in turn as a DataLoader does,
    consume the epoch's global batches in order: a process's step `s` is global batch
    `s * world + rank`, so after `m` steps of every process (ranks step together) the job
    has consumed exactly the epoch's first `m * world` batches, which a global cursor
    (`state_dict()`) records. The tail rule is the ranks': a process's workers together
    get its batches, their counts differing by at most one."""
    return worker_id * world + rank, world * num_workers


def _cursor(stream, b, wid, nw):
    """The global cursor after batch `b` of a worker `wid` of `nw` (every process of the
    job having taken as many steps): `{"epoch", "records"}`, from what OPENED says."""
    o = stream.opened or {}
    rnd = o.get("round", 0)
    if not rnd:
        return None
    g = stream._resume_global
    first = g["epoch"] if g is not None else stream.params["epoch"]
    if b.epoch == first and o.get("start", 0):
        start, end = o["start"], o["start_end"]
    else:
        start, end = 0, o["epoch_end"]
    step = int(b.index) * nw + wid
    return {"epoch": int(b.epoch), "records": int(min(start + (step + 1) * (rnd // nw), end))}


# torch warns, for every tensor made over read-only memory, that it cannot mark the tensor
# read-only. The ring is read-only to clients (writing to it faults), which the docs say;
# the warning is silenced for this module's calls only, once (a catch_warnings per batch
# cost more than the rest of the hand-over).
_warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                         category=UserWarning, module=r"riffle\.torch")


def _view(array):
    """A tensor over a read-only numpy array's memory (the daemon's ring)."""
    return _torch.from_numpy(array)


def _shared_copy(b):
    """The batch copied once into one shared-memory block: (ids, offsets, data) tensors
    over it, which a DataLoader worker hands to the training process as a descriptor."""
    n, m = len(b.ids), len(b.data)
    head = 8 * (2 * n + 1)
    storage = _torch.UntypedStorage._new_shared(head + m)
    block = _torch.empty(0, dtype=_torch.uint8).set_(storage)
    arr = block.numpy()
    _np.copyto(arr[: 8 * n].view(_np.uint64), b.ids)
    _np.copyto(arr[8 * n : head].view(_np.uint64), b.offsets)
    _np.copyto(arr[head:], b.data)
    ids = block[: 8 * n].view(_torch.int64)
    offsets = block[8 * n : head].view(_torch.int64)
    return ids, offsets, block[head:]


def _labels(labels):
    """A batch's labels as an int64 tensor (a copy: 8 bytes a record), or None."""
    return None if labels is None else _torch.from_numpy(labels.astype(_np.int64))


def _as_dict(b, ids, offsets, data, meta=None):
    out = {
        "ids": ids,
        "offsets": offsets,
        "data": data,
        "epoch": b.epoch,
        "index": b.index,
        "padding": b.padding,
    }
    if b.labels is not None:
        out["labels"] = _labels(b.labels)
    if meta:
        out.update({k: _torch.from_numpy(v) if isinstance(v, _np.ndarray) else v
                    for k, v in meta.items()})
    return out


# Zero-copy hand-over from DataLoader workers (used by `loader(..., num_workers=N)`).
#
# A worker does not copy a batch out of its stream's ring: it sends the training process
# a ticket (where the batch lies in the ring, and which ring), and the training process
# maps the ring itself, once per stream, read-only through /proc/<worker>/fd/<ring fd>.
# The worker holds each batch (no ack to the daemon) until the training process has moved
# past it, which the training process says by writing, in a page the worker shares with
# it, the first sequence number it still uses, before it asks for its next batch. While a
# worker waits for the daemon it keeps giving back what the page says: the daemon's ring
# (reclaimed oldest first) or its credits may be waiting for exactly that. The training
# process only ever waits for a batch after releasing every earlier one, so neither waits
# on the other for good.

_RELEASE = _struct.Struct("<Q")
_maps = {}  # token -> (numpy uint8 view of the ring, the release page)
_worker_fds = []  # this worker's previous stream's descriptors, kept for late tickets


def _proc_open(pid, fd, flags):
    try:
        return _os.open(f"/proc/{pid}/fd/{fd}", flags)
    except OSError as e:
        raise RuntimeError(
            f"riffle.torch: cannot open DataLoader worker {pid}'s descriptor {fd} through "
            f"/proc ({e}); use loader(..., tickets=False) where /proc is not shared") from e


def _from_ticket(token, pid, ring_fd, ring_bytes, ctl_fd, seq, epoch, index, padding, n, dlen,
                 ids_at, off_at, data_at, labels=None, meta=None):
    """In the training process: the ticket's batch as tensors viewing the worker's ring."""
    m = _maps.get(token)
    if m is None:
        fd = _proc_open(pid, ring_fd, _os.O_RDONLY)
        try:
            ring = _mmap.mmap(fd, ring_bytes, flags=_mmap.MAP_SHARED, prot=_mmap.PROT_READ)
        finally:
            _os.close(fd)
        fd = _proc_open(pid, ctl_fd, _os.O_RDWR)
        try:
            ctl = _mmap.mmap(fd, _RELEASE.size)
        finally:
            _os.close(fd)
        m = _maps[token] = (_np.frombuffer(ring, _np.uint8), ctl)
    arr = m[0]
    out = {
        "ids": _view(arr[ids_at : ids_at + 8 * n].view(_np.int64)),
        "offsets": _view(arr[off_at : off_at + 8 * (n + 1)].view(_np.int64)),
        "data": _view(arr[data_at : data_at + dlen]),
        "epoch": epoch,
        "index": index,
        "padding": padding,
        "_riffle": (token, seq),
    }
    if labels is not None:
        out["labels"] = _labels(labels)
    if meta:
        out.update({k: _torch.from_numpy(v) if isinstance(v, _np.ndarray) else v
                    for k, v in meta.items()})
    return out


class _Ticket:
    """A batch left in a ring a worker shares (the daemon's, or the worker's own): pickled
    as `make(*args)`, which the training process runs to view it as tensors."""

    __slots__ = ("make", "args")

    def __init__(self, make, *args):
        self.make, self.args = make, args

    def __reduce__(self):
        return (self.make, self.args)


def _release(batch):
    """In the training process: the worker of `batch` may give it (and every earlier batch
    of its stream) back to the daemon."""
    t = batch.get("_riffle") if isinstance(batch, dict) else None
    m = _maps.get(t[0]) if t else None
    if m is not None:
        ctl = m[1]
        if _RELEASE.unpack_from(ctl)[0] < t[1] + 1:
            _RELEASE.pack_into(ctl, 0, t[1] + 1)


def _forget_rings(tokens):
    """Unmaps the release pages of the rings of `tokens` (one loader's: loaders of other
    threads keep theirs); the rings go with the last view of them."""
    for t in tokens:
        m = _maps.pop(t, None)
        if m is not None:
            m[1].close()


def _give_back(held, state):
    """In a worker: acknowledges the batches the training process has moved past."""
    done = _RELEASE.unpack_from(state["ctl"])[0]
    while held and held[0][0] < done:
        held.popleft()[1].release()


def _tickets(stream, b, held, state, meta=None):
    """In a worker: a ticket for batch `b`, held until the training process releases it."""
    _give_back(held, state)
    seq = state["seq"]
    state["seq"] += 1
    base = state["base"]
    held.append((seq, b))
    return _Ticket(_from_ticket, state["token"], _os.getpid(), stream.ring_fd, stream.opened["ring_bytes"],
                   state["ctl_fd"], seq, b.epoch, b.index, b.padding, len(b.ids), len(b.data),
                   b.ids.ctypes.data - base, b.offsets.ctypes.data - base, b.data.ctypes.data - base,
                   None if b.labels is None else b.labels.copy(), meta)


# Hand-over from a plain DataLoader's workers (`DataLoader(RiffleDataset(...),
# num_workers=N)`), where nothing tells a worker when the training process is done with a
# batch. A worker copies each batch once into a shared ring of its own (a memfd, mapped
# once by the training process through /proc) and sends a ticket naming where it lies.
# In the training process every batch is one numpy block over the ring, under all its
# tensors; when the block is collected (the last tensor viewing it is gone) a finalizer
# marks its sequence number released, and the first sequence number still in use is
# written to a page the worker shares. The worker reuses ring space up to there. If the
# ring has no room (the loop keeps batches, or DataLoader holds many), the batch goes in
# a fresh shared block instead: slower, never blocked, never overwritten.


class _WorkerRing:
    """In a DataLoader worker: the ring it copies batches into (made at its first batch,
    kept for the worker's life, so a persistent worker reuses it every epoch)."""

    def __init__(self, size):
        self.size = size
        self.fd = _os.memfd_create("riffle-handoff")
        _os.ftruncate(self.fd, size)
        self.mm = _mmap.mmap(self.fd, size)
        self.arr = _np.frombuffer(self.mm, _np.uint8)
        self.ctl_fd = _os.memfd_create("riffle-release")
        _os.ftruncate(self.ctl_fd, _RELEASE.size)
        self.ctl = _mmap.mmap(self.ctl_fd, _RELEASE.size)
        self.token = _uuid.uuid4().hex
        self.pid = _os.getpid()
        self.seq = 0
        self.head = 0
        self.live = _collections.deque()  # (seq, start) of batches not yet released
        self.fallbacks = 0

    def _alloc(self, need):
        done = _RELEASE.unpack_from(self.ctl)[0]
        while self.live and self.live[0][0] < done:
            self.live.popleft()
        if not self.live:
            self.head = 0
            return 0 if need <= self.size else None
        tail = self.live[0][1]
        if self.head > tail:  # free: [head, size) and [0, tail)
            if self.head + need <= self.size:
                return self.head
            return 0 if need <= tail else None
        return self.head if self.head + need <= tail else None

    def put(self, b, view=None, meta=None):
        """A ticket for batch `b` copied into the ring, or None when it has no room.
        `view`, a `_Reshape`, is applied where the ticket is unpickled."""
        n, dlen = len(b.ids), len(b.data)
        need = (8 * (2 * n + 1) + dlen + 63) & ~63
        at = self._alloc(need)
        if at is None:
            self.fallbacks += 1
            return None
        a = self.arr
        _np.copyto(a[at : at + 8 * n].view(_np.uint64), b.ids)
        _np.copyto(a[at + 8 * n : at + 8 * (2 * n + 1)].view(_np.uint64), b.offsets)
        _np.copyto(a[at + 8 * (2 * n + 1) : at + 8 * (2 * n + 1) + dlen], b.data)
        seq = self.seq
        self.seq += 1
        self.live.append((seq, at))
        self.head = at + need
        return _Ticket(_from_handoff, self.token, self.pid, self.fd, self.size, self.ctl_fd, seq, b.epoch,
                        b.index, b.padding, n, dlen, at, view,
                        None if b.labels is None else b.labels.copy(), meta)


_worker_ring = None


def _ring_for(b, size=None):
    """This worker's ring, made at its first batch: `size` bytes (the dataset's
    `ring_bytes`), else room for about five batches of this size (16 to 256 MiB: the
    DataLoader holds `prefetch_factor` per worker, the loop one; more only falls back to
    fresh blocks, it never waits)."""
    global _worker_ring
    if _worker_ring is None or _worker_ring.pid != _os.getpid():
        per = 8 * (2 * len(b.ids) + 1) + len(b.data)
        _worker_ring = _WorkerRing(size or min(max(5 * per, 16 << 20), 256 << 20))
    return _worker_ring


class _RingState:
    """In the training process: one worker ring's mapping and its releases. It lives as
    long as a batch of it does (each batch's finalizer holds it); then the mapping goes."""

    def __init__(self, pid, ring_fd, size, ctl_fd):
        fd = _proc_open(pid, ring_fd, _os.O_RDONLY)
        try:
            self.mm = _mmap.mmap(fd, size, flags=_mmap.MAP_SHARED, prot=_mmap.PROT_READ)
        finally:
            _os.close(fd)
        fd = _proc_open(pid, ctl_fd, _os.O_RDWR)
        try:
            self.ctl = _mmap.mmap(fd, _RELEASE.size)
        finally:
            _os.close(fd)
        self.first = _RELEASE.unpack_from(self.ctl)[0]  # first sequence number in use
        self.released = set()
        self.lock = _threading.Lock()

    def release(self, seq):
        with self.lock:
            self.released.add(seq)
            first = self.first
            while first in self.released:
                self.released.remove(first)
                first += 1
            if first != self.first:
                self.first = first
                _RELEASE.pack_into(self.ctl, 0, first)


_rings = _weakref.WeakValueDictionary()  # token -> _RingState


def _from_handoff(token, pid, ring_fd, size, ctl_fd, seq, epoch, index, padding, n, dlen, at,
                  view=None, labels=None, meta=None):
    """In the training process: the batch as tensors over one block of the worker's ring,
    released to the worker when the block is collected."""
    state = _rings.get(token)
    if state is None:
        state = _rings[token] = _RingState(pid, ring_fd, size, ctl_fd)
    head = 8 * (2 * n + 1)
    block = _np.frombuffer(state.mm, _np.uint8, count=head + dlen, offset=at)
    _weakref.finalize(block, state.release, seq)
    out = {
        "ids": _view(block[: 8 * n].view(_np.int64)),
        "offsets": _view(block[8 * n : head].view(_np.int64)),
        "data": _view(block[head:]),
        "epoch": epoch,
        "index": index,
        "padding": padding,
    }
    if labels is not None:
        out["labels"] = _labels(labels)
    if meta:
        out.update({k: _torch.from_numpy(v) if isinstance(v, _np.ndarray) else v
                    for k, v in meta.items()})
    return view(out) if view is not None else out


class _Reshape:
    """`fixed`'s transform: picklable, and a view, so it may run on either side of a
    worker's hand-over."""

    def __init__(self, record_size):
        self.record_size = record_size

    def __call__(self, batch):
        batch["data"] = batch["data"].view(-1, self.record_size)
        return batch


def fixed(record_size):
    """A `transform` for fixed-size records: `data` as a (records, record_size) uint8
    tensor (a view, no copy)."""
    return _Reshape(record_size)


class RiffleDataset(IterableDataset):
    """Batches of `dataset` from the daemon at `socket`, split by rank and worker.

    `rank`/`world` default to torch.distributed's when it is initialised, else 0/1. A
    DataLoader's workers split their process's batches. With one rank the last batch may
    be partial (the default then): every record exactly once. With more than one rank the
    tail must be `pad` (the default then, as DistributedSampler's: the last round of
    batches is filled from the epoch's start, and `batch["padding"]` says how many of a
    batch's last records are such repeats) or `drop_last`, so that every rank takes as
    many steps.
    Batches are dicts: `ids` and `offsets` (int64 tensors), `data` (uint8 tensor: record
    i is `data[offsets[i]:offsets[i+1]]`), `epoch`, `index`, `padding`, and `labels`
    (int64 tensor) when the dataset has labels (`files` over class directories).

    In the training process (`num_workers=0`) the tensors view the daemon's shared ring
    and are valid until the next batch (`copy=True` copies them out). In a DataLoader
    worker they are copied once into the worker's shared ring, which the training process
    maps once; they stay valid as long as they are referenced. `transform(batch) ->
    anything` runs on each batch where it is made (in the worker, with workers: the batch
    then goes through a fresh shared block, as the transform's result may keep it; the
    views `fixed` makes are the exception, made where the batch arrives). `ring_bytes`
    asks the daemon for a ring of that size, and sizes a worker's ring the same.
    """

    def __init__(self, socket, dataset=None, batch_size=None, seed=0, epoch=0, rank=None,
                 world=None, tail=None, transport="shm", grouping="record", copy=False,
                 transform=None, ring_bytes=None, daemon=None):
        super().__init__()
        socket, dataset, batch_size = _where(socket, dataset, batch_size, daemon)
        # The epoch and a global resume point live in shared memory: DataLoader workers
        # that persist across epochs (`persistent_workers=True`) keep their own copy of
        # this object, and must still see `set_epoch` and `load_state_dict` made in the
        # training process. [epoch, resume epoch (-1: none), resume records]
        self._shared = _torch.tensor([0, -1, 0], dtype=_torch.int64).share_memory_()
        self.socket = socket
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = epoch
        self.rank = rank
        self.world = world
        self.tail = tail
        self.transport = transport
        self.grouping = grouping
        self.copy = copy
        self.transform = transform
        self.ring_bytes = ring_bytes
        # The node daemon's options, when `socket` is None (a dataset path was given).
        self.daemon = daemon
        # Set by `loader()`, which releases each batch when the next one is asked for.
        self.tickets = False
        # A global cursor to resume from (`loader(...).load_state_dict`): see `_shared`.
        # This process's stream (its cursor is after the batch it made last), and a state
        # to resume from (`state_dict`/`load_state_dict`, what torchdata's
        # StatefulDataLoader calls in each worker).
        self._stream = None
        self._resume_state = None

    def __getstate__(self):
        # Sent to DataLoader workers: without this process's stream (a connection).
        state = self.__dict__.copy()
        state["_stream"] = None
        return state

    def state_dict(self):
        """This process's position (in a DataLoader worker, that worker's): its stream's
        `state_dict()` after the batch it made last. torchdata's `StatefulDataLoader`
        keeps one per worker and hands each back to its worker on resume, which resumes
        exactly under the same world and `num_workers`; to resume under others, use
        `riffle.torch.loader(...).state_dict()` (a global cursor)."""
        return {"stream": None if self._stream is None else self._stream.state_dict()}

    def load_state_dict(self, state):
        """Resumes this process's stream from `state` (from `state_dict`) at its next
        iteration."""
        self._resume_state = state.get("stream") if state else None

    @property
    def epoch(self):
        """The epoch the next iteration reads."""
        return int(self._shared[0])

    @epoch.setter
    def epoch(self, epoch):
        self._shared[0] = int(epoch)

    @property
    def _resume_global(self):
        e = int(self._shared[1])
        return None if e < 0 else {"epoch": e, "records": int(self._shared[2])}

    @_resume_global.setter
    def _resume_global(self, g):
        if g is None:
            self._shared[1] = -1
        else:
            self._shared[2] = int(g["records"])
            self._shared[1] = int(g["epoch"])

    def set_epoch(self, epoch):
        """The epoch the next iteration reads (each epoch is a fresh order); seen by
        DataLoader workers too, persistent ones included."""
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
        ranks = self._rank_world()
        rank, world = split(*ranks, wid, nw)
        # Like DistributedSampler: the last round is padded from the epoch's start (the
        # padding records are the batch's last `padding`), so no record is left out. The
        # rule is the ranks': this process's workers split its batches.
        tail = self.tail or ("partial" if ranks[1] == 1 else "pad")
        in_worker = info is not None
        tickets = in_worker and self.tickets and self.transform is None and self.transport == "shm"
        # A global cursor to resume from (load_state_dict), for the epoch it is in.
        g = self._resume_global
        state = None
        if g is not None and g["epoch"] == self.epoch and g["records"] > 0:
            state = {"dataset": self.dataset, "seed": self.seed, "grouping": self.grouping,
                     "cursor": None, "global": dict(g)}
        elif self._resume_state is not None:
            # A worker's own state (StatefulDataLoader): the same world and workers.
            st, self._resume_state = self._resume_state, None
            for k, v in (("rank", rank), ("world", world), ("workers", nw),
                         ("batch_size", self.batch_size)):
                if st.get(k, 1 if k == "workers" else None) != v:
                    raise ValueError(
                        f"riffle.torch: this worker's saved state has {k}={st.get(k)}, the "
                        f"worker now has {k}={v}: a StatefulDataLoader resumes under the same "
                        "world and num_workers; riffle.torch.loader(...).state_dict() resumes "
                        "under others")
            state = st
        with self._client() as client:
            stream = client.stream(self.dataset, self.batch_size, seed=self.seed,
                                   epoch=self.epoch, rank=rank, world=world, workers=nw,
                                   tail=tail,
                                   grouping=self.grouping, transport=self.transport,
                                   auto_release=not tickets, ring_bytes=self.ring_bytes,
                                   state=state, streams=node_streams(world, nw))
            self._stream = stream
            if tickets:
                yield from self._iter_tickets(stream, wid, nw)
                return
            for b in stream:
                meta = {"cursor": _cursor(stream, b, wid, nw)}
                if b.sources is not None:
                    meta["sources"] = b.sources.astype(_np.int64)
                if in_worker:
                    view = isinstance(self.transform, _Reshape)
                    t = None
                    if self.transform is None or view:
                        t = _ring_for(b, self.ring_bytes).put(b, self.transform, meta)
                    if t is not None:
                        yield t
                        continue
                    out = _as_dict(b, *_shared_copy(b), meta)
                elif self.copy:
                    out = _as_dict(b, _torch.from_numpy(b.ids.astype(_np.int64)),
                                   _torch.from_numpy(b.offsets.astype(_np.int64)),
                                   _torch.from_numpy(b.data.copy()), meta)
                else:
                    out = _as_dict(b, _view(b.ids.view(_np.int64)),
                                   _view(b.offsets.view(_np.int64)), _view(b.data), meta)
                yield self.transform(out) if self.transform is not None else out


    def _client(self):
        """A client of the daemon at `socket`, or of the node daemon (started if it is
        gone: it leaves once idle) when the dataset was given by path."""
        if self.socket is not None:
            return Client(self.socket)
        return _node.client(self.daemon)

    def _iter_tickets(self, stream, wid, nw):
        global _worker_fds
        for fd in _worker_fds:  # the previous stream's: its epoch is over
            _os.close(fd)
        _worker_fds = []
        stream.keep_fd = True
        ctl_fd = _os.memfd_create("riffle-release")
        _os.ftruncate(ctl_fd, _RELEASE.size)
        _worker_fds.append(ctl_fd)
        state = {"ctl": _mmap.mmap(ctl_fd, _RELEASE.size), "ctl_fd": ctl_fd, "seq": 0,
                 "token": _uuid.uuid4().hex, "base": None}
        held = _collections.deque()
        client = stream._client
        poller = None
        while True:
            # While the daemon's next batch is not here, give back what the training
            # process has moved past: its ring may be waiting for exactly that (regions
            # are reclaimed oldest first), and the training process waits for this batch.
            while held and not client._buffered():
                if poller is None:
                    poller = _select.poll()
                    poller.register(client._sock, _select.POLLIN)
                _give_back(held, state)
                client._flush_acks()
                if poller.poll(2):
                    break
            try:
                b = next(stream)
            except StopIteration:
                break
            if state["base"] is None:
                _worker_fds.append(stream.ring_fd)
                state["base"] = _np.frombuffer(stream._mm, _np.uint8).ctypes.data
            meta = {"cursor": _cursor(stream, b, wid, nw)}
            if b.sources is not None:
                meta["sources"] = b.sources.astype(_np.int64)
            yield _tickets(stream, b, held, state, meta)
        # The stream is over: the daemon has let go of the ring, whose memory lives on in
        # the training process's mapping of it.


class _Background:
    """Runs a dataset's iterator on a thread, `collate` and pinning there, `depth`
    batches ahead; the batches it yields are the collate's (which must not keep views
    of the ring: the ring's batch is released as soon as it has run)."""

    _END = object()

    def __init__(self, ds, collate, pin_memory, depth):
        if pin_memory and not _torch.cuda.is_available():
            _warnings.warn("pin_memory is set but no accelerator is available: not pinning")
            pin_memory = False
        self.ds, self.collate, self.pin, self.depth = ds, collate, pin_memory, depth
        # The global cursor after the batch last yielded (its collate may drop it).
        self.cursor = None

    def set_epoch(self, epoch):
        """The epoch the next iteration reads."""
        self.ds.set_epoch(epoch)

    def __iter__(self):
        q = _queue.Queue(maxsize=max(1, self.depth))
        stop = _threading.Event()

        def put(item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except _queue.Full:
                    pass
            return False

        def work():
            it = iter(self.ds)
            try:
                for b in it:
                    c = b.get("cursor") if isinstance(b, dict) else None
                    out = self.collate(b) if self.collate is not None else b
                    if self.pin:
                        out = _pin(out)
                    if not put((c, out)):
                        return
                put(self._END)
            except BaseException as e:  # handed to the consumer, raised there
                put(e)
            finally:
                it.close()

        t = _threading.Thread(target=work, name="riffle-loader", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.cursor, out = item
                yield out
        finally:
            stop.set()
            t.join()


def _pin(x):
    if isinstance(x, _torch.Tensor):
        return x.pin_memory()
    if isinstance(x, dict):
        return {k: _pin(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_pin(v) for v in x)
    return x


def _copied(b):
    return {k: (v.clone() if isinstance(v, _torch.Tensor) else v) for k, v in b.items()}


class _WorkerLoader:
    """A DataLoader over workers whose batches stay in the daemon's rings (tickets): each
    batch is released to its worker when the next one is asked for."""

    def __init__(self, ds, num_workers, pin_memory, **dl):
        self.ds = ds
        self.dl = _torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers,
                                               pin_memory=pin_memory, **dl)

    def set_epoch(self, epoch):
        """The epoch the next iteration reads."""
        self.ds.set_epoch(epoch)

    def __iter__(self):
        it = iter(self.dl)
        tokens = set()
        try:
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    return
                t = b.get("_riffle") if isinstance(b, dict) else None
                if t is not None:
                    tokens.add(t[0])
                yield b
                # Asked for the next one: this one goes back to its worker first (which
                # may need it back to make the next).
                _release(b)
                del b
        finally:
            _forget_rings(tokens)


class _Stateful:
    """`loader()`'s batches, and where the loop is: `state_dict()` gives a global cursor
    (the epoch, and the records of its sequence the whole job has consumed, every process
    having taken as many batches), which `load_state_dict()` resumes from exactly under
    any world size, `num_workers` or batch size: the rest of that epoch is cut into the new
    job's batches from there."""

    def __init__(self, inner, ds):
        self.inner, self.ds = inner, ds
        self._cursor = None
        self._done = False

    def set_epoch(self, epoch):
        """The epoch the next iteration reads."""
        self.ds.set_epoch(epoch)
        self._cursor, self._done = None, False

    def __iter__(self):
        self._cursor, self._done = None, False
        for b in self.inner:
            c = b.get("cursor") if isinstance(b, dict) else getattr(self.inner, "cursor", None)
            if c is not None:
                self._cursor = c
            yield b
        self._done = True
        self.ds._resume_global = None

    def state_dict(self):
        """A small JSON-friendly dict: the global cursor after the last batch the loop
        took (the next epoch's start once an epoch is done)."""
        ds = self.ds
        if self._done:
            at = {"epoch": ds.epoch + 1, "records": 0}
        elif self._cursor is not None:
            at = dict(self._cursor)
        elif ds._resume_global is not None:
            at = dict(ds._resume_global)
        else:
            at = {"epoch": ds.epoch, "records": 0}
        return {"version": 1, "dataset": ds.dataset, "seed": ds.seed, "grouping": ds.grouping,
                "global": at}

    def load_state_dict(self, state):
        """The next iteration resumes at `state`'s global cursor (the dataset, seed and
        grouping must match: they decide the order)."""
        ds = self.ds
        for k in ("dataset", "seed", "grouping"):
            if k in state and state[k] != getattr(ds, k):
                raise ValueError(f"the state is for {k}={state[k]!r}, this loader has "
                                 f"{k}={getattr(ds, k)!r}")
        g = state["global"]
        ds.epoch = int(g["epoch"])
        ds._resume_global = ({"epoch": int(g["epoch"]), "records": int(g["records"])}
                             if int(g["records"]) > 0 else None)
        self._cursor, self._done = None, False


def _where(socket, dataset, batch_size, daemon):
    """(socket, dataset name, batch size) from the arguments given: a socket and a dataset
    name, or a dataset path alone (then `socket` is None: the node daemon serves it, found
    or started now, in this process, so that DataLoader workers find it running)."""
    if batch_size is None and dataset is not None and not isinstance(dataset, (str, _os.PathLike)):
        dataset, batch_size = None, dataset
    if batch_size is None:
        raise TypeError("batch_size is required")
    if dataset is None:
        name = _node.dataset_name(socket)
        _node.client(daemon).close()
        _node.check_store_env(name)
        return None, name, batch_size
    if daemon is not None:
        raise ValueError("daemon options are for a dataset given by path (the node daemon), "
                         "not for a daemon at a socket")
    return socket, dataset, batch_size


def loader(socket, dataset=None, batch_size=None, num_workers=0, collate=None,
           pin_memory=False, background=None, depth=2, tickets=True, dataloader=None,
           **kwargs):
    """Batches of a dataset for a training loop: dicts of tensors as `RiffleDataset`'s,
    each valid until the next one is asked for (`.clone()` what you keep).

    `loader("/data/train.npy", batch_size=256)`: the dataset by path (a file, directory,
    glob, `PATH:FORMAT`, or a `mix:` spec), served by this user's node daemon, which is
    started if none runs (one per user and node, shared by every rank, worker and job;
    it leaves once idle: see `riffle.node`, and `daemon={"memory": "8G", ...}` for the
    options it starts with). `loader(socket, "train", batch_size=256)`: the dataset
    `train` of the daemon at `socket` (`riffle serve --socket ...`).

    `num_workers=0`: no worker processes. Without `collate` or `pin_memory` (and
    `background` not set), batches are the ring's views, made on the calling thread. With
    either, a background thread takes each batch from the ring, runs `collate(batch)`
    (default: a copy of the batch's tensors) and pins the result, `depth` batches ahead.

    `num_workers=N`: a DataLoader of N workers, which split this process's batches (one
    shared pass in the daemon for every worker of every rank).
    A worker hands each batch over without copying it (`tickets`): the training process
    maps the worker's ring and views the batch there, and the batch goes back to the
    daemon when the next one is asked for. `dataloader` holds more DataLoader arguments
    (`prefetch_factor`, `persistent_workers`, ...). Other arguments are `RiffleDataset`'s.

    The result has `set_epoch`, and `state_dict()`/`load_state_dict()`: a global cursor
    that resumes exactly under another world size, `num_workers` or batch size (each batch
    dict carries it as `batch["cursor"]`).
    """
    ds = RiffleDataset(socket, dataset, batch_size, **kwargs)
    if num_workers > 0:
        ds.tickets = tickets
        return _Stateful(_WorkerLoader(ds, num_workers, pin_memory, **(dataloader or {})), ds)
    if background is None:
        background = collate is not None or pin_memory
    if not background:
        return _Stateful(ds, ds)
    return _Stateful(_Background(ds, collate if collate is not None else _copied, pin_memory,
                                 depth), ds)
