"""The client side of the `riffle serve` protocol (docs/protocol.md), in pure Python.

A frame is a little-endian u32 length, then a one-byte kind and the body. Control frames
carry JSON; batch notifications carry an 80-byte binary header that locates the batch's
ids, offsets and payload in a shared-memory ring the daemon passed with SCM_RIGHTS.
"""

import array
import collections
import json
import mmap
import os
import re
import socket
import struct
import time

import numpy as np

PROTOCOL_VERSION = 2
# The version of the client and of the engine it ships with (one version: tools/Cargo.toml;
# tests/python/test_package.py checks they agree).
VERSION = "0.1.0"

HELLO, OPEN, OPENED, BATCH, BATCH_INLINE, ACK, END, CLOSE, STATS, STATS_REPLY = range(1, 11)
ERROR = 15

_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<IB")
# slot, flags, epoch, index, records, padding, data_len, ids_at, offsets_at, data_at, ready_ns
_BATCH = struct.Struct("<IIQQQQQQQQQ")
_CHUNK = 1 << 16
_MAX_FDS = 4
_LABEL = np.dtype("<u4")
_U64 = np.dtype("<u8")


class RiffleError(Exception):
    """An error the daemon reported (`code` says which kind), or a protocol failure."""

    def __init__(self, message, code="client", fatal=False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal


class RiffleBusy(RiffleError):
    """The daemon is full for now (`busy`: `--max-clients` connections, or its memory,
    scratch or open files held by other streams): the request fits once they give back, so
    try again later."""


class RiffleShutdown(RiffleError):
    """The daemon is stopping (SIGTERM): resume from `state_dict()` once it is back."""


class RiffleBadRequest(RiffleError, ValueError):
    """The daemon refused a request as malformed or impossible (`bad_request`,
    `unknown_dataset`, `version`; `too_large` is its subclass `RiffleTooLarge`)."""


class RiffleExhausted(RiffleBadRequest):
    """The request needs more than the daemon has (`exhausted`: its `--memory` or free
    scratch is too small for the stream, or a resource ran short); waiting does not help,
    unlike `RiffleBusy`: ask for less, or start the daemon with more."""


class RiffleTooLarge(RiffleExhausted):
    """The request can never fit this daemon (`too_large`), however long it waits: a batch
    larger than a client's ring, a read needing more than a pass may have of `--memory`,
    piles larger than `--scratch-limit` or the scratch filesystem. `asked` and `limit` are
    the numbers (bytes, or open files), from the message's `asked N, limit M`; None when it
    has none. Do not retry: ask for less (smaller batches, another mode), or start the
    daemon with more."""

    def __init__(self, message, code="too_large", fatal=False):
        super().__init__(message, code, fatal)
        m = re.search(r"asked (\d+), limit (\d+)", message)
        self.asked = int(m.group(1)) if m else None
        self.limit = int(m.group(2)) if m else None


_BY_CODE = {
    "busy": RiffleBusy,
    "exhausted": RiffleExhausted,
    "shutdown": RiffleShutdown,
    "bad_request": RiffleBadRequest,
    "unknown_dataset": RiffleBadRequest,
    "too_large": RiffleTooLarge,
    "version": RiffleBadRequest,
}


class RiffleConnectionError(RiffleError, ConnectionError):
    """The connection to the daemon failed or was closed: resume from `state_dict()` on a
    new `Client`."""

    def __init__(self, message):
        super().__init__(message, code="connection", fatal=True)


class RiffleVersionMismatch(RiffleError):
    """The daemon is another version of riffle than this client (one version for both)."""

    def __init__(self, message):
        super().__init__(message, code="version", fatal=True)


class RiffleEngineMissing(RiffleError):
    """The `riffle` command that ships with this package is not there (a package installed
    without its wheel's binary, or for another platform)."""

    def __init__(self, message):
        super().__init__(message, code="engine_missing", fatal=True)


def binary():
    """The path of the `riffle` command installed with this package (the wheel carries it
    beside the client; it is never looked for on PATH), or the one `RIFFLE_BIN` names
    (a development build). `RiffleEngineMissing` when it is not there."""
    from importlib import metadata

    given = os.environ.get("RIFFLE_BIN")
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return os.path.abspath(given)
        raise RiffleEngineMissing(f"RIFFLE_BIN={given} is not an executable file")

    try:
        files = metadata.distribution("riffle").files or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name in ("riffle", "riffle.exe") and len(f.parts) > 1:
            p = os.path.normpath(str(f.locate()))
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
    raise RiffleEngineMissing(
        "no riffle engine binary is installed with this package: install it with "
        "`pip install <riffle checkout>/python` (which builds the engine with maturin), or a "
        "wheel built for this platform")


class RiffleTimeout(RiffleConnectionError):
    """The daemon sent nothing for `receive_timeout` seconds while the client waited on it
    (it is stopped, hung or overloaded): resume from `state_dict()` on a new `Client`."""

    def __init__(self, message):
        super().__init__(message)
        self.code = "timeout"


# How long a client waits on the daemon by default before `RiffleTimeout`: longer than
# anything the daemon does between two frames in a healthy run (admission waits, a join
# window, a two-pass scatter before its first batch), short enough that a stopped daemon
# does not hang a training job for ever.
DEFAULT_RECEIVE_TIMEOUT = 600.0


class Client:
    """A connection to `riffle serve` at the Unix socket `path`.

    `connect_timeout` (seconds) keeps retrying while the daemon is not (yet) there, which is
    what a training job wants while its daemon restarts. `spin_us` > 0 busy-polls the socket
    for up to that long before sleeping when waiting for a batch: lower latency (no wake-up)
    for a core's worth of CPU while waiting. `receive_timeout` (seconds, default 600; None
    waits for ever) is the longest the client waits for the daemon's next frame before it
    raises `RiffleTimeout` (a daemon stopped with SIGSTOP, or hung).
    """

    def __init__(self, path, connect_timeout=0.0, spin_us=0,
                 receive_timeout=DEFAULT_RECEIVE_TIMEOUT, _any_version=False):
        self.path = os.fspath(path)
        self.spin_us = spin_us
        if receive_timeout is not None and not receive_timeout > 0:
            raise ValueError(f"receive_timeout must be positive seconds or None, not {receive_timeout!r}")
        self.receive_timeout = receive_timeout
        deadline = time.monotonic() + connect_timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
                break
            except OSError as e:
                sock.close()
                if time.monotonic() >= deadline:
                    raise RiffleConnectionError(f"{self.path}: cannot connect: {e}") from e
                time.sleep(0.05)
        if receive_timeout is not None:
            # The kernel's receive timeout (SO_RCVTIMEO), not Python's: the socket stays
            # blocking, a non-blocking receive (MSG_DONTWAIT, when spinning) still returns
            # at once, and a blocking one fails with EAGAIN after the timeout.
            secs = min(receive_timeout, 2**31 - 1)
            whole = int(secs)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                            struct.pack("ll", whole, int((secs - whole) * 1e6)))
        self._sock = sock
        self._buf = bytearray()
        self._start = 0
        self._fds = []
        self._acks = []
        self._stream = None
        self._send_json(HELLO, {"version": PROTOCOL_VERSION, "agent": f"riffle-python {VERSION}"})
        kind, body = self._frame()
        if kind == ERROR:
            raise _error(body)
        if kind != HELLO:
            raise RiffleError(f"expected HELLO from the daemon, got kind {kind}", "protocol")
        hello = json.loads(body)
        agent = str(hello.get("agent", ""))
        self.agent = agent
        if agent.startswith("riffle ") and agent != f"riffle {VERSION}" and not _any_version:
            sock.close()
            raise RiffleVersionMismatch(
                f"the daemon at {path} is {agent}, this client is riffle {VERSION}: stop that "
                f"daemon (it may have outlived an upgrade) and start this version's, or "
                f"install riffle=={agent.split(' ', 1)[1]}")
        self.datasets = hello.get("datasets", [])
        self.max_frame = hello.get("max_frame", 0)

    # Context manager and cleanup.
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Closes the connection (and the open stream, if any)."""
        if self._stream is not None:
            self._stream._drop()
            self._stream = None
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def stream(
        self,
        dataset,
        batch_size,
        seed=0,
        epoch=0,
        epochs=1,
        rank=0,
        world=1,
        tail="partial",
        grouping="record",
        transport="shm",
        state=None,
        auto_release=True,
        ring_bytes=None,
        workers=1,
        streams=None,
    ):
        """A stream of batches of `dataset`; it opens when iteration starts.

        `rank` of `world` are this stream's place among the job's streams. With
        `workers` > 1 the streams are DataLoader workers of ranks: `world` counts
        ranks x workers, stream `rank` is worker `rank // (world // workers)` of rank
        `rank % (world // workers)`, the workers of a rank split its batches (worker k
        takes the rank's batches i with i % workers == k), and the tail rule applies to
        the ranks only (one rank read by any number of workers may end partial).

        `state` (from `Stream.state_dict()`) resumes where that stream left off.
        `transport="inline"` carries batches in the socket (copies) for clients that
        cannot map shared memory. With `auto_release=False`, call `batch.release()`
        yourself; the daemon sends nothing more once the ring is full of unreleased
        batches.

        `streams` (world > 1): how many streams of this job this node will open (its
        ranks here, times their DataLoader workers). The job's shared pass then waits for
        that many before its first batch, up to the daemon's `--join-deadline`, so ranks
        that start seconds apart still share one read of the dataset. Left out, a pass
        waits only its `--join-window` (LIRS) or its scatter (two-pass).
        """
        if streams is not None and (isinstance(streams, bool) or int(streams) < 1):
            raise ValueError(f"streams={streams!r}: expected a count of at least 1")
        s = Stream(
            self,
            dict(
                dataset=dataset,
                batch_size=int(batch_size),
                seed=int(seed),
                epoch=int(epoch),
                epochs=int(epochs),
                rank=int(rank),
                world=int(world),
                workers=int(workers),
                tail=tail,
                grouping=grouping,
            ),
            transport,
            auto_release,
            ring_bytes,
        )
        s.streams = None if streams is None else int(streams)
        if state is not None:
            s.load_state_dict(state)
        return s

    def stats(self):
        """The daemon's counters: batches, records, bytes, read_ops, iops, latency
        percentiles (us), ring memory. Asked on a connection of its own while a stream is
        open here."""
        if self._stream is not None and self._stream._open:
            with Client(self.path, receive_timeout=self.receive_timeout) as other:
                return other.stats()
        self._send_json(STATS, {})
        while True:
            kind, body = self._frame()
            if kind == STATS_REPLY:
                return json.loads(body)
            if kind == ERROR:
                raise _error(body)

    # Wire helpers.
    def _send(self, data):
        if self._sock is None:
            raise RiffleConnectionError("the client is closed")
        try:
            self._sock.sendall(data)
        except OSError as e:
            # The daemon may have said why before closing (busy, shutdown): say that.
            said = self._said_before_closing()
            if said is not None:
                raise said from e
            raise RiffleConnectionError(f"{self.path}: send failed: {e}") from e

    def _said_before_closing(self, patience=3.0):
        """An ERROR frame among what the daemon sent before it closed, or None. The daemon
        stops reading before it writes its last word (at shutdown), so this waits for the
        end of the connection, for `patience` seconds at most (the daemon closes every
        connection within 2 s of a shutdown)."""
        deadline = time.monotonic() + patience
        try:
            while True:
                avail = len(self._buf) - self._start
                if avail >= 5:
                    (n,) = _U32.unpack_from(self._buf, self._start)
                    if n == 0:
                        return None
                    if avail >= 4 + n:
                        s = self._start
                        kind = self._buf[s + 4]
                        body = bytes(self._buf[s + 5 : s + 4 + n])
                        self._start = s + 4 + n
                        if kind == ERROR:
                            return _error(body)
                        continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._sock.settimeout(left)
                try:
                    data = self._sock.recv(_CHUNK)
                except OSError:
                    return None
                if not data:
                    return None
                self._buf += data
        except Exception:  # noqa: BLE001 - best effort: the caller reports its own error
            return None
        finally:
            try:
                self._sock.settimeout(None)
            except OSError:
                pass

    def _send_json(self, kind, obj):
        body = json.dumps(obj).encode()
        self._send(_HEAD.pack(len(body) + 1, kind) + body)

    def _fill(self):
        if self._sock is None:
            raise RiffleConnectionError("the client is closed")
        # About to wait for the daemon: the acks held back go out first (they may be what
        # it waits for).
        self._flush_acks()
        got = None
        if self.spin_us:
            # Busy-poll for a while before sleeping: no wake-up latency when the batch
            # comes within the window, at the price of a core while waiting.
            deadline = time.perf_counter() + self.spin_us / 1e6
            while got is None and time.perf_counter() < deadline:
                got = self._recv(socket.MSG_DONTWAIT)
        if got is None:
            got = self._recv(0)
        data, anc = got
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                self._fds.extend(fds)
        if not data:
            raise RiffleConnectionError(f"{self.path}: the daemon closed the connection")
        if self._start and self._start == len(self._buf):
            self._buf.clear()
            self._start = 0
        elif self._start > _CHUNK:
            del self._buf[: self._start]
            self._start = 0
        self._buf += data

    def _buffered(self):
        """Whether bytes of a frame are already here (the next frame may not need a wait)."""
        return len(self._buf) > self._start

    def _recv(self, flags):
        """One recvmsg: (data, ancillary), or None when MSG_DONTWAIT finds nothing."""
        try:
            data, anc, _flags, _addr = self._sock.recvmsg(
                _CHUNK, socket.CMSG_SPACE(_MAX_FDS * 4), flags
            )
        except BlockingIOError:
            if flags:
                return None
            raise RiffleTimeout(
                f"{self.path}: the daemon sent nothing for {self.receive_timeout} s "
                "(receive_timeout): it may be stopped (SIGSTOP), hung or overloaded"
            ) from None
        except OSError as e:
            raise RiffleConnectionError(f"{self.path}: receive failed: {e}") from e
        return data, anc

    def _frame(self):
        """The next frame: (kind, body as bytes)."""
        while True:
            avail = len(self._buf) - self._start
            if avail >= 5:
                (n,) = _U32.unpack_from(self._buf, self._start)
                if n == 0:
                    raise RiffleError("the daemon sent a frame of length 0", "protocol")
                if avail >= 4 + n:
                    s = self._start
                    kind = self._buf[s + 4]
                    body = bytes(self._buf[s + 5 : s + 4 + n])
                    self._start = s + 4 + n
                    return kind, body
                if n > 4 * _CHUNK:
                    return self._big_frame(n)
            self._fill()

    def _big_frame(self, n):
        """A frame too long to gather chunk by chunk: read its body in place."""
        s = self._start
        kind = self._buf[s + 4]
        body = bytearray(n - 1)
        have = bytes(self._buf[s + 5 :])
        body[: len(have)] = have
        self._buf.clear()
        self._start = 0
        view = memoryview(body)
        got = len(have)
        while got < len(body):
            try:
                k = self._sock.recv_into(view[got:])
            except OSError as e:
                raise RiffleConnectionError(f"{self.path}: receive failed: {e}") from e
            if k == 0:
                raise RiffleConnectionError(f"{self.path}: the daemon closed the connection")
            got += k
        return kind, body

    def _queue_ack(self, slot, limit):
        """Holds an ack back until the client would wait anyway (or `limit` are held), so
        a consumer whose batches are already waiting does no syscall per batch and does not
        wake the daemon for each one."""
        self._acks.append(slot)
        if len(self._acks) >= limit:
            self._flush_acks()

    def _flush_acks(self):
        if self._acks:
            n = len(self._acks)
            body = struct.pack(f"<{n}I", *self._acks)
            self._acks = []
            self._send(_HEAD.pack(len(body) + 1, ACK) + body)

    def _take_fd(self):
        if not self._fds:
            raise RiffleError("OPENED came without the ring's descriptor", "protocol")
        return self._fds.pop(0)


def _error(body):
    try:
        e = json.loads(body)
        code = e.get("code", "daemon")
        return _BY_CODE.get(code, RiffleError)(e["message"], code, e.get("fatal", False))
    except (ValueError, KeyError):
        return RiffleError("the daemon sent an unreadable error", "protocol")


class Batch:
    """One batch. `ids` (uint64), `offsets` (uint64, len(ids) + 1) and `data` (uint8) are
    numpy views into the shared ring, valid until the batch is released. `labels` (uint32,
    one per record) when the dataset has labels (`files` over class directories: the index
    of the record's class, ImageFolder's rule), else None."""

    __slots__ = ("ids", "offsets", "data", "labels", "sources", "epoch", "index", "padding", "ready_ns",
                 "_slot", "_stream", "_gen", "_format")

    def __init__(self, ids, offsets, data, epoch, index, padding, ready_ns, slot, stream, gen,
                 labels=None, sources=None):
        self.ids = ids
        self.offsets = offsets
        self.data = data
        self.labels = labels
        # A mixture's: each record's source (an index into the stream's
        # `opened["sources"]`), else None.
        self.sources = sources
        self.epoch = epoch
        self.index = index
        self.padding = padding
        self.ready_ns = ready_ns
        self._slot = slot
        self._stream = stream
        self._gen = gen
        # (format, MDS columns) of the stream's dataset, for `sample`.
        self._format = stream._format if stream is not None else ("", [])

    def __len__(self):
        return len(self.ids)

    def record(self, i):
        """Record i's bytes (a view)."""
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def sample(self, i):
        """Record i of a `tar` (WebDataset) or `mds` (MosaicML Streaming) dataset as a dict:
        a tar sample's members by suffix (`{"jpg": memoryview, "cls": ...}`), an MDS
        sample's columns decoded (see `riffle.formats.mds_sample`). Views, no copies, where
        the value is bytes."""
        from .formats import mds_sample, tar_members
        fmt, columns = self._format
        if fmt == "tar":
            return tar_members(self.record(i))
        if fmt == "mds":
            return mds_sample(self.record(i), columns)
        raise ValueError(f"sample(i) decodes tar and mds records; this dataset is {fmt or 'unknown'}")

    def release(self):
        """Gives the batch's memory back to the daemon; its arrays must not be used after."""
        if self._stream is not None:
            self._stream._ack(self._slot, self._gen)
            self._stream = None

    def __repr__(self):
        return f"<riffle.Batch epoch={self.epoch} index={self.index} records={len(self.ids)} bytes={len(self.data)}>"


_PARAMS = ("dataset", "batch_size", "seed", "epoch", "epochs", "rank", "world", "workers", "tail",
           "grouping")


class Stream:
    """Batches of one (dataset, seed, epochs, batch size, rank, world), in order.

    `state_dict()` says where to resume: the first batch not yet handed out (a batch counts
    as consumed once the iterator has returned it).
    """

    def __init__(self, client, params, transport, auto_release, ring_bytes):
        if transport not in ("shm", "inline"):
            raise ValueError(f"transport {transport!r}: expected 'shm' or 'inline'")
        self._client = client
        self.keep_fd = False
        self.ring_fd = None
        self.params = params
        self.transport = transport
        self.auto_release = auto_release
        self.ring_bytes = ring_bytes
        self.streams = None  # streams of the job this node opens (OPEN's `streams`)
        self.cursor = {"epoch": params["epoch"], "batch": 0}
        # Records of the cursor's epoch consumed by all ranks together (the global cursor).
        self.global_cursor = {"epoch": params["epoch"], "records": 0}
        self._resume = None
        self._resume_global = None
        self._open = False
        self._ended = False
        self._held = None
        self._mm = None
        self._gen = 0  # which opening of the stream; slots of an earlier one are moot
        self._superseded = False
        self.opened = None
        self._format = ("", [])
        # Waits for batches (the data stall on this side): count, total, recent samples.
        self._waits = 0
        self._waited = 0.0
        self._recent = collections.deque(maxlen=8192)

    # Resume.
    def state_dict(self):
        """A small dict (JSON-friendly) that `load_state_dict` or `Client.stream(state=)`
        resumes from, on this daemon or a restarted one: the parameters, this rank's
        cursor, and the global cursor (records of the epoch consumed by all ranks together,
        assuming every rank got as far: ranks step together), which resumes under another
        world or batch size."""
        # In an epoch resumed inside a round, batches are numbered from the resume point:
        # only the global cursor says where that is.
        g = self._resume_global
        inside = (g is not None and self.opened is not None and self.opened.get("start", 0) > 0
                  and self.cursor["epoch"] == g["epoch"])
        return {"version": 1, **self.params, "cursor": None if inside else dict(self.cursor),
                "global": dict(self.global_cursor)}

    def load_state_dict(self, state):
        """Resumes from `state`. Under the same batch size, rank, world and tail it resumes
        at this rank's cursor; under others, at the global cursor (the rest of that epoch
        cut into this job's batches from there). The order's own parameters (dataset,
        seed, grouping) must match."""
        for k in ("dataset", "seed", "grouping"):
            if k in state and state[k] != self.params[k]:
                raise ValueError(
                    f"the state is for {k}={state[k]!r}, this stream has {k}={self.params[k]!r}"
                )
        same = all(state.get(k, self.params[k]) == self.params[k]
                   for k in ("batch_size", "rank", "world", "workers", "tail"))
        if self._open:
            self._drop()
        self._ended = False
        self._superseded = False
        if (same and state.get("cursor") is not None) or "global" not in state:
            for k in _PARAMS:
                if k in state and state[k] != self.params[k]:
                    raise ValueError(
                        f"the state is for {k}={state[k]!r}, this stream has {k}={self.params[k]!r} "
                        "(and holds no global cursor to convert)"
                    )
            c = state["cursor"]
            self.cursor = {"epoch": int(c["epoch"]), "batch": int(c["batch"])}
            self._resume = dict(self.cursor)
            self._resume_global = None
        else:
            g = state["global"]
            self.global_cursor = {"epoch": int(g["epoch"]), "records": int(g["records"])}
            self.cursor = {"epoch": int(g["epoch"]), "batch": 0}
            self._resume = None
            self._resume_global = dict(self.global_cursor)

    # Iteration.
    def __iter__(self):
        return self

    def __next__(self):
        if self._superseded:
            raise RiffleError(
                "this stream was closed when another stream was opened on its Client; "
                "use one Client per concurrent stream"
            )
        if self._ended:
            raise StopIteration
        if not self._open:
            self._start()
        if self.auto_release and self._held is not None:
            self._held.release()
            self._held = None
        c = self._client
        asked = time.monotonic()
        while True:
            kind, body = c._frame()
            if kind == BATCH or kind == BATCH_INLINE:
                waited = time.monotonic() - asked
                self._waits += 1
                self._waited += waited
                self._recent.append(waited)
                break
            if kind == END:
                self._finish()
                raise StopIteration
            if kind == ERROR:
                self._finish()
                raise _error(body)
            if kind == STATS_REPLY:
                continue
            raise RiffleError(f"unexpected frame kind {kind} in a stream", "protocol")
        slot, flags, epoch, index, n, padding, dlen, ids_at, off_at, data_at, ready_ns = (
            _BATCH.unpack_from(body)
        )
        src = self._mm if kind == BATCH else body
        ids = np.frombuffer(src, _U64, n, ids_at)
        offsets = np.frombuffer(src, _U64, n + 1, off_at)
        data = np.frombuffer(src, np.uint8, dlen, data_at)
        # Bit 0: one label (u32) per record, right after the offsets.
        at = off_at + 8 * (n + 1)
        labels = np.frombuffer(src, _LABEL, n, at) if flags & 1 else None
        # Bit 1: one source (u32) per record, after the labels.
        at += 4 * n if flags & 1 else 0
        sources = np.frombuffer(src, _LABEL, n, at) if flags & 2 else None
        b = Batch(ids, offsets, data, epoch, index, padding, ready_ns, slot, self, self._gen, labels,
                  sources)
        self.cursor = {"epoch": epoch, "batch": index + 1}
        o = self.opened
        if o.get("round"):
            # The first epoch of a stream resumed inside a round starts at `start`.
            first = epoch == self.params["epoch"] if self._resume_global is None else \
                epoch == self._resume_global["epoch"]
            start, end = (o["start"], o["start_end"]) if first and o["start"] else (0, o["epoch_end"])
            self.global_cursor = {"epoch": epoch, "records": min(start + (index + 1) * o["round"], end)}
        if self.auto_release:
            self._held = b
        return b

    def stats(self):
        """What this stream waited for its batches: on this side (`batches`, `wait_s`, and
        `wait_us` percentiles over the last 8192 batches: the data stall a training step
        pays) and, under `daemon`, the daemon's view of the same stream (`engine_wait_*`:
        the daemon waited for the engine while this stream had room; `client_wait_*`: its
        batches waited for this client's acks), asked on a connection of its own."""
        recent = sorted(self._recent)

        def pct(q):
            if not recent:
                return 0
            return int(recent[min(len(recent) - 1, int(q * len(recent)))] * 1e6)

        out = {
            "stream": (self.opened or {}).get("stream"),
            "batches": self._waits,
            "wait_s": self._waited,
            "wait_us": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
            "daemon": None,
        }
        if out["stream"] is not None and self._open:
            with Client(self._client.path, receive_timeout=self._client.receive_timeout) as other:
                for w in other.stats().get("stream_waits", []):
                    if w.get("stream") == out["stream"]:
                        out["daemon"] = w
        return out

    def release(self, batch):
        """Same as `batch.release()`."""
        batch.release()

    def close(self):
        """Stops the stream early (the daemon stops reading for it)."""
        self._drop()
        self._ended = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Internals.
    def _start(self):
        c = self._client
        if c._stream is not None and c._stream is not self and c._stream._open:
            # One stream at a time per connection: the older one is closed (and says so if
            # it is used again). Use another Client to read two streams at once.
            old = c._stream
            old._drop()
            old._ended = True
            old._superseded = True
        req = dict(self.params, transport=self.transport)
        if self._resume is not None:
            req["resume"] = self._resume
        elif self._resume_global is not None:
            req["resume_global"] = self._resume_global
        if self.ring_bytes is not None:
            req["ring_bytes"] = int(self.ring_bytes)
        if self.streams is not None:
            req["streams"] = self.streams
        c._send_json(OPEN, req)
        kind, body = c._frame()
        if kind == ERROR:
            self._ended = True
            raise _error(body)
        if kind != OPENED:
            raise RiffleError(f"expected OPENED, got kind {kind}", "protocol")
        self.opened = json.loads(body)
        self._format = (self.opened.get("format", ""), self.opened.get("columns", []))
        if self.opened["transport"] == "shm":
            fd = c._take_fd()
            try:
                # Populated up front where Python offers it (3.10+): no page faults
                # when a batch's arrays are first read.
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self._mm = mmap.mmap(fd, self.opened["ring_bytes"], flags=flags, prot=mmap.PROT_READ)
            finally:
                if self.keep_fd:
                    # Another process of this user maps the ring through /proc/PID/fd
                    # (riffle.torch's DataLoader workers); the owner closes it.
                    self.ring_fd = fd
                else:
                    os.close(fd)
        self._open = True
        self._gen += 1
        c._stream = self

    def _ack(self, slot, gen):
        # Acks for a stream that is over (or was reopened since) are moot: the daemon
        # dropped that ring.
        if self._open and gen == self._gen and self._client._sock is not None:
            self._client._queue_ack(slot, max(1, self.opened["credits"] // 2))

    def _finish(self):
        self._client._acks = []
        self._open = False
        self._ended = True
        self._held = None
        self._unmap()
        if self._client._stream is self:
            self._client._stream = None

    def _unmap(self):
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # numpy views of it are still alive; the mapping goes with the last one.
                pass

    def _drop(self):
        """Closes the stream on the daemon's side, if open, and waits for its END."""
        if not self._open:
            return
        c = self._client
        self._held = None
        c._acks = []
        try:
            if c._sock is not None:
                c._send_json(CLOSE, {})
                while True:
                    kind, body = c._frame()
                    if kind == END:
                        break
                    if kind == ERROR:
                        break
        except RiffleConnectionError:
            pass
        finally:
            self._open = False
            self._unmap()
            if c._stream is self:
                c._stream = None
