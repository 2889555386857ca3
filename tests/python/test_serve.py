"""The Python client (`pip install ./python`) against the real `riffle serve`: the same
batches as `riffle read`, numpy views into shared memory, resume through state_dict (also
across a daemon killed with SIGKILL), ranks, a client killed mid-stream, errors."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import riffle

ROOT = pathlib.Path(__file__).resolve().parents[2]
RIFFLE = os.environ.get("RIFFLE_BIN", str(ROOT / "target" / "debug" / "riffle"))


def run(*args):
    p = subprocess.run([RIFFLE, *map(str, args)], capture_output=True)
    if p.returncode != 0:
        raise AssertionError(f"riffle {args} failed ({p.returncode}): {p.stderr.decode()}")
    return p


class Daemon:
    """`riffle serve` on a short socket path (sun_path holds 108 bytes)."""

    def __init__(self, datasets, *extra, nofile=None):
        self.dir = tempfile.mkdtemp(prefix="rs")
        self.socket = os.path.join(self.dir, "s.sock")
        self.datasets = datasets
        self.extra = extra
        # A hard limit on open files (soft and hard: riffle raises the soft one).
        self.nofile = nofile
        self.proc = None
        self.start()

    def start(self):
        args = [RIFFLE, "serve", "--socket", self.socket, *self.extra]
        if "--mode" not in self.extra:
            # auto would probe the device at start; the Rust tests cover the planner.
            args += ["--mode", "lirs"]
        for name, path in self.datasets.items():
            args += ["--dataset", f"{name}={path}"]
        limit = None
        if self.nofile is not None:
            import resource
            limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=limit)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"riffle serve exited: {self.proc.stderr.read().decode()}")
            try:
                riffle.Client(self.socket).close()
                return
            except riffle.RiffleConnectionError:
                time.sleep(0.02)
        raise AssertionError("riffle serve did not come up")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=10) == 0
        shutil.rmtree(self.dir, ignore_errors=True)

    def stats(self):
        with riffle.Client(self.socket) as c:
            return c.stats()


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "d.npy"
    run("gen", p, "--format", "npy", "--records", 3000, "--record-size", 200)
    return p


@pytest.fixture
def daemon(data):
    d = Daemon({"train": data})
    yield d
    d.stop()


def read_ids(data, tmp_path, *args):
    out = tmp_path / "ids.txt"
    run("read", data, "--ids-out", out, *args)
    return [list(map(int, line.split())) for line in out.read_text().splitlines()]


def framed_records(data):
    out = run("cat", "--framed", data).stdout
    recs, i = [], 0
    while i < len(out):
        n = int.from_bytes(out[i : i + 8], "little")
        recs.append(out[i + 8 : i + 8 + n])
        i += 8 + n
    return recs


def test_batches_equal_riffle_read_and_are_views_into_shared_memory(daemon, data, tmp_path):
    want = read_ids(data, tmp_path, "--batch-size", 128, "--seed", 3, "--epochs", 2)
    records = framed_records(data)
    got = []
    with riffle.Client(daemon.socket) as c:
        assert c.datasets == ["train"]
        for b in c.stream("train", batch_size=128, seed=3, epochs=2):
            assert b.ids.dtype == np.uint64 and b.offsets.dtype == np.uint64
            assert len(b.offsets) == len(b.ids) + 1 and b.offsets[-1] == len(b.data)
            # No copy: read-only views whose memory belongs to the mapped ring.
            assert not b.data.flags.owndata and not b.data.flags.writeable
            assert not b.ids.flags.owndata
            for i in (0, len(b) - 1):
                assert b.record(i).tobytes() == records[int(b.ids[i])]
            got.append(b.ids.tolist())
    assert got == want


def test_inline_transport_gives_the_same_batches(daemon):
    with riffle.Client(daemon.socket) as c:
        shm = [(b.ids.tolist(), b.data.tobytes()) for b in c.stream("train", 100, seed=1)]
        inline = [
            (b.ids.tolist(), b.data.tobytes())
            for b in c.stream("train", 100, seed=1, transport="inline")
        ]
    assert shm == inline
    # Inline batches longer than the client's read chunk are read in place.
    with riffle.Client(daemon.socket) as c:
        big = [(b.ids.tolist(), b.data.tobytes()) for b in c.stream("train", 2000, transport="inline")]
        ref = [(b.ids.tolist(), b.data.tobytes()) for b in c.stream("train", 2000)]
    assert big == ref and len(big[0][1]) == 2000 * 200
    with riffle.Client(daemon.socket, spin_us=500) as c:  # busy-polls before sleeping
        spun = [(b.ids.tolist(), b.data.tobytes()) for b in c.stream("train", 100, seed=1)]
    assert spun == shm


def test_state_dict_resumes_with_nothing_lost_or_repeated(daemon):
    with riffle.Client(daemon.socket) as c:
        full = [b.ids.tolist() for b in c.stream("train", 64, seed=2, epochs=2)]
        s = c.stream("train", 64, seed=2, epochs=2)
        first = []
        for b in s:
            first.append(b.ids.tolist())
            if len(first) == 50:  # past the end of epoch 0 (47 batches)
                break
        state = json.loads(json.dumps(s.state_dict()))
        assert state["cursor"] == {"epoch": 1, "batch": 3}
        s.close()
    with riffle.Client(daemon.socket) as c:
        rest = [b.ids.tolist() for b in c.stream("train", 64, seed=2, epochs=2, state=state)]
        with pytest.raises(ValueError, match="seed"):
            c.stream("train", 64, seed=3, epochs=2, state=state)
    assert first + rest == full


def test_a_global_cursor_resumes_under_another_world_and_batch_size(daemon):
    """World 2 reads 7 batches of 50 a rank (700 records of the epoch) and checkpoints;
    the job resumes from that state under world 4, under one rank with batches of 64, and
    under world 3 with batches of 40 (inside a round of theirs: the rest of the epoch is
    cut into their batches from record 700). Every record is read once, padding aside."""

    def ranks(world, batch, stop=None, state=None):
        out, states = {}, {}

        def reader(r):
            with riffle.Client(daemon.socket) as c:
                s = c.stream("train", batch, seed=5, rank=r, world=world, tail="pad", state=state)
                got = []
                for b in s:
                    got.append((b.ids.copy(), int(b.padding)))
                    if stop and len(got) == stop:
                        break
                states[r] = json.loads(json.dumps(s.state_dict()))
                s.close()
            out[r] = got

        threads = [threading.Thread(target=reader, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out, states

    before, states = ranks(2, 50, stop=7)
    assert states[0]["global"] == {"epoch": 0, "records": 700}, states[0]
    assert states[0]["global"] == states[1]["global"]
    for world, batch in [(4, 50), (1, 64), (3, 40)]:
        after, _ = ranks(world, batch, state=states[0])
        seen = np.zeros(3000, int)
        for v in before.values():
            for ids, _ in v:
                np.add.at(seen, ids.astype(np.int64), 1)
        padding = 0
        for v in after.values():
            for ids, p in v:
                np.add.at(seen, ids.astype(np.int64), 1)
                padding += p
        assert (seen >= 1).all(), (world, batch)
        assert seen.sum() - 3000 == padding, (world, batch, seen.sum(), padding)


def test_the_global_cursor_at_the_end_of_a_padded_epoch_resumes_under_any_world(daemon):
    """Regression (issue 30, D19): the global cursor after a padded epoch was its padded
    length (3,072 of 3,000 records under world 3, batches of 64), which a job under another
    world refused as past the end. It counts records: 3,000, the end under any world."""
    states = {}

    def reader(r):
        with riffle.Client(daemon.socket) as c:
            s = c.stream("train", 64, seed=5, rank=r, world=3, tail="pad", epochs=2)
            for n, _ in enumerate(s, 1):
                if n == 16:  # the end of epoch 0: 48 batches (47 padded up) over 3 ranks
                    break
            states[r] = json.loads(json.dumps(s.state_dict()))
            s.close()

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert states[0]["global"] == {"epoch": 0, "records": 3000}, states[0]
    with riffle.Client(daemon.socket) as c:
        rest = [(b.epoch, len(b.ids)) for b in c.stream("train", 100, seed=5, epochs=2,
                                                         state=states[0])]
    assert {e for e, _ in rest} == {1}
    assert sum(n for _, n in rest) == 3000


def test_four_ranks_receive_an_exact_permutation_of_the_epoch(daemon):
    out = {}

    def reader(rank):
        with riffle.Client(daemon.socket) as c:
            out[rank] = [
                b.ids.copy() for b in c.stream("train", 50, seed=4, epoch=1, rank=rank, world=4,
                                                  tail="drop_last")
            ]

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({len(v) for v in out.values()}) == 1, "every rank gets as many batches"
    ids = np.concatenate([np.concatenate(v) for v in out.values()])
    assert np.array_equal(np.sort(ids), np.arange(3000))


def test_a_daemon_killed_and_restarted_is_resumed_from_the_cursor(data):
    d = Daemon({"train": data})
    try:
        with riffle.Client(d.socket) as c:
            full = [b.ids.tolist() for b in c.stream("train", 100, seed=5, epochs=2)]
        got = []
        state = None
        for kill_after in (7, 25, None):
            with riffle.Client(d.socket, connect_timeout=10) as c:
                s = c.stream("train", 100, seed=5, epochs=2, state=state)
                try:
                    for b in s:
                        got.append(b.ids.tolist())
                        if kill_after is not None and len(got) == kill_after:
                            d.kill()
                except riffle.RiffleConnectionError:
                    pass
                state = s.state_dict()
            if kill_after is not None:
                d.start()  # replaces the socket the killed daemon left behind
        assert got == full
    finally:
        d.stop()


CHILD = """
import sys, time, riffle
c = riffle.Client(sys.argv[1])
for i, b in enumerate(c.stream("train", 16, epochs=100)):
    if i == 3:
        print("reading", flush=True)
    time.sleep(0.01)
"""


def test_a_client_killed_mid_stream_leaves_the_daemon_serving(daemon):
    child = subprocess.Popen([sys.executable, "-c", CHILD, daemon.socket], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"reading\n"
    assert daemon.stats()["streams_now"] == 1
    child.kill()
    child.wait()
    deadline = time.monotonic() + 10
    while daemon.stats()["streams_now"] != 0:
        assert time.monotonic() < deadline, "the killed client's stream was not released"
        time.sleep(0.02)
    assert daemon.stats()["ring_bytes"] == 0
    with riffle.Client(daemon.socket) as c:
        assert sum(len(b) for b in c.stream("train", 1000)) == 3000


def test_unknown_dataset_and_bad_requests_are_clear_errors(daemon):
    with riffle.Client(daemon.socket) as c:
        with pytest.raises(riffle.RiffleError, match="unknown dataset 'nope'.*serves train") as e:
            next(iter(c.stream("nope", 10)))
        assert e.value.code == "unknown_dataset"
        with pytest.raises(riffle.RiffleError, match="drop_last or pad"):
            next(iter(c.stream("train", 7, world=2)))
        # The connection is still good.
        assert sum(len(b) for b in c.stream("train", 500)) == 3000


def test_a_ring_too_small_for_what_is_held_falls_back_to_copies_exactly(daemon, data, tmp_path):
    # Room for about four batches while the client holds three: the engine is often
    # refused a region in the ring and assembles in its own memory, and the daemon copies
    # those batches in as the client releases; the order and bytes stay exact.
    want = read_ids(data, tmp_path, "--batch-size", 100, "--seed", 4, "--epochs", 3)
    records = framed_records(data)
    before = daemon.stats()
    got, held = [], []
    with riffle.Client(daemon.socket) as c:
        s = c.stream("train", 100, seed=4, epochs=3, auto_release=False, ring_bytes=96 * 1024)
        for b in s:
            assert s.opened["ring_bytes"] == 96 * 1024
            got.append(b.ids.tolist())
            held.append(b)
            if len(held) == 3:
                time.sleep(0.002)  # the engine runs ahead into the ring meanwhile
                old = held.pop(0)
                # Nothing was written over a batch while the client held it.
                for i in range(len(old)):
                    assert old.record(i).tobytes() == records[int(old.ids[i])]
                old.release()
        for b in held:
            b.release()
    assert got == want
    after = daemon.stats()
    batches = after["batches"] - before["batches"]
    in_place = after["batches_in_place"] - before["batches_in_place"]
    assert batches == len(want)
    assert 0 < in_place < batches, (in_place, batches)


def test_explicit_release_and_stats(daemon):
    with riffle.Client(daemon.socket) as c:
        s = c.stream("train", 100, auto_release=False)
        held = [next(s) for _ in range(5)]
        snapshot = [b.ids.copy() for b in held]
        for b, ids in zip(held, snapshot):
            assert np.array_equal(b.ids, ids), "held batches are not overwritten"
            b.release()
        rest = 0
        for b in s:  # unreleased batches would stall the stream once its credits run out
            rest += 1
            b.release()
        assert len(held) + rest == 30
        st = c.stats()
    assert st["records"] >= 3000 and st["batches"] >= 30
    for k in ("read_ops", "iops", "bytes", "batch_latency_us", "ring_bytes"):
        assert k in st
    assert st["batch_latency_us"]["p99"] >= st["batch_latency_us"]["p50"] > 0


def test_the_readme_example_runs(daemon):
    import re

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(import riffle\n.*?)```", readme, re.S).group(1)
    assert '"/tmp/riffle.sock"' in code
    exec(compile(code.replace('"/tmp/riffle.sock"', repr(daemon.socket)), "README.md", "exec"), {})


def test_a_batch_released_after_its_stream_was_reopened_is_harmless(daemon):
    with riffle.Client(daemon.socket) as c:
        s = c.stream("train", 100, auto_release=False)
        old = next(s)
        state = s.state_dict()
        s.load_state_dict(state)  # reopens from batch 1
        b = next(s)
        assert b.index == 1
        old.release()  # a slot of the old ring: not sent to the daemon
        b.release()
        assert sum(1 for x in s if x.release() is None) == 28


def test_a_new_stream_on_a_client_closes_the_old_one(daemon):
    with riffle.Client(daemon.socket) as c:
        for b in c.stream("train", 100):
            break  # abandoned mid-way
        old = c.stream("train", 100, seed=1)
        next(old)
        new = c.stream("train", 100, seed=2)
        assert sum(len(b) for b in new) == 3000
        with pytest.raises(riffle.RiffleError, match="another stream was opened"):
            next(old)


def test_a_full_daemon_says_busy_every_time_not_broken_pipe(data):
    # Regression (issue 15): the daemon wrote `busy` and closed before reading HELLO, so the
    # client's HELLO met a closed socket and 19 of 20 tries raised "Broken pipe".
    d = Daemon({"train": data}, "--max-clients", "1")
    try:
        # The start-up check's own connection may still hold the one slot for a moment.
        deadline = time.monotonic() + 10
        while True:
            try:
                holder = riffle.Client(d.socket)
                break
            except riffle.RiffleBusy:
                assert time.monotonic() < deadline, "the slot never came free"
                time.sleep(0.02)
        with holder:
            kinds = []
            for _ in range(20):
                try:
                    riffle.Client(d.socket).close()
                    kinds.append("connected")
                except riffle.RiffleBusy as e:
                    assert e.code == "busy" and "--max-clients" in e.message, e
                    kinds.append("busy")
                except riffle.RiffleError as e:
                    kinds.append(f"{type(e).__name__}: {e}")
            assert kinds == ["busy"] * 20, kinds
            assert holder.datasets == ["train"]
    finally:
        d.stop()


def test_a_streaming_client_is_told_shutdown_at_sigterm(data):
    d = Daemon({"train": data})
    try:
        c = riffle.Client(d.socket)
        it = iter(c.stream("train", 10, epochs=100))
        next(it)
        d.proc.send_signal(signal.SIGTERM)
        with pytest.raises(riffle.RiffleShutdown) as e:
            for _ in it:
                pass
        assert e.value.code == "shutdown"
        assert d.proc.wait(timeout=10) == 0
    finally:
        d.stop()


def test_bad_requests_raise_a_value_error_kind(daemon):
    with riffle.Client(daemon.socket) as c:
        with pytest.raises(riffle.RiffleBadRequest) as e:
            next(iter(c.stream("nope", 10)))
        assert isinstance(e.value, ValueError) and e.value.code == "unknown_dataset"


def test_each_error_code_raises_its_own_kind():
    # What a program catches for each code the daemon sends (docs/protocol.md).
    def raised(code):
        return riffle.client._error(json.dumps({"code": code, "message": "m", "fatal": False}))

    assert type(raised("busy")) is riffle.RiffleBusy
    assert type(raised("shutdown")) is riffle.RiffleShutdown
    assert type(raised("bad_request")) is riffle.RiffleBadRequest
    # A request too large for the daemon's budget is a bad request of its own kind: not
    # one waiting helps with.
    e = raised("exhausted")
    assert type(e) is riffle.RiffleExhausted and isinstance(e, ValueError)
    assert not isinstance(e, riffle.RiffleBusy) and e.code == "exhausted"
    assert type(raised("engine")) is riffle.RiffleError
    assert type(raised("too_large")) is riffle.RiffleTooLarge


def test_a_request_that_never_fits_raises_riffle_too_large(tmp_path):
    # A pass of 8 MB batches needs more than the quarter of --memory 64M a read may have:
    # the daemon says so at once with its own code (it said `busy`, so a retry loop never
    # ended), and Python raises its own kind, which a retry loop on RiffleBusy lets through.
    p = tmp_path / "big.npy"
    run("gen", p, "--format", "npy", "--records", 20000, "--record-size", 1000)
    d = Daemon({"train": p}, "--memory", "64M", "--max-clients", "4", "--admit-wait", "30")
    try:
        with riffle.Client(d.socket) as c:
            with pytest.raises(riffle.RiffleTooLarge) as e:
                next(iter(c.stream("train", 8192)))
            assert e.value.code == "too_large" and not isinstance(e.value, riffle.RiffleBusy)
            assert isinstance(e.value, riffle.RiffleExhausted)
            assert "asked " in e.value.message and "limit 16777216" in e.value.message
            assert e.value.limit == 16777216 and e.value.asked > e.value.limit
            # The connection stays usable: a request that fits is served.
            assert sum(len(b) for b in c.stream("train", 256)) == 20000
    finally:
        d.stop()


def test_stream_stats_give_the_waits_on_both_sides(daemon):
    with riffle.Client(daemon.socket) as c:
        # Ten epochs: more batches than the credits, so the daemon's side is still open.
        s = c.stream("train", 100, world=2, rank=0, tail="drop_last", epochs=10)
        with riffle.Client(daemon.socket) as c1:
            s1 = c1.stream("train", 100, world=2, rank=1, tail="drop_last", epochs=10)
            n = 0
            for _ in range(5):
                next(s)
                next(s1)
                n += 1
            st = s.stats()
            # The client's side: every batch's wait; the daemon's side of the same stream,
            # a rank of a shared job.
            assert st["batches"] == 5 and st["wait_s"] > 0
            assert st["wait_us"]["max"] >= st["wait_us"]["p50"] > 0
            assert st["stream"] == s.opened["stream"]
            assert s.opened["pass"] == "shared"
            d = st["daemon"]
            assert d is not None, st
            assert d["stream"] == st["stream"], st
            assert d["job"] == s.opened["job"]
            assert d["batches"] >= 5
            for k in ("engine_wait_s", "client_wait_s", "engine_wait_us", "client_wait_us"):
                assert k in d
            rest = sum(1 for _ in s1)
        rest0 = sum(1 for _ in s)
    assert n + rest == n + rest0 == 150


def test_a_weighted_mixture_through_the_daemon(tmp_path):
    """A daemon serving a mixture (`--dataset mix=mix:a=...*0.7,b=...*0.3;size=500`): each
    epoch exactly 350 records of a (of 400: a sample without repeats) and 150 of b (50
    records, each three times), every batch saying each record's source, the same
    batches as `riffle read` of the mixture."""
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    run("gen", a, "--format", "npy", "--records", 400, "--record-size", 32)
    run("gen", b, "--format", "npy", "--records", 50, "--record-size", 32)
    spec = f"mix:a={a}*0.7,b={b}*0.3;size=500"
    d = Daemon({"mix": spec})
    try:
        with riffle.Client(d.socket) as c:
            s = c.stream("mix", 50, seed=3, epochs=2)
            got = []
            for batch in s:
                assert batch.sources is not None
                assert s.opened["sources"] == ["a", "b"]
                src = batch.sources.copy()
                assert ((batch.ids >= 400) == (src == 1)).all()
                got.append((batch.epoch, batch.ids.copy()))
        for epoch in (0, 1):
            ids = np.concatenate([i for e, i in got if e == epoch])
            assert (ids < 400).sum() == 350 and len(np.unique(ids[ids < 400])) == 350
            counts = np.bincount(ids[ids >= 400] - 400, minlength=50)
            assert (counts == 3).all()
        mix = [x for x in d.stats()["datasets"] if x["name"] == "mix"][0]["mixture"]
        assert [(m["name"], m["per_epoch"]) for m in mix] == [("a", 350), ("b", 150)], mix
        want = read_ids(spec, tmp_path, "--batch-size", 50, "--seed", 3, "--epochs", 2,
                        "--mode", "lirs")
        assert [i.tolist() for _, i in got] == want
    finally:
        d.stop()


def test_many_streams_of_a_files_dataset_share_the_open_file_limit(tmp_path):
    """Regression: every stream's reader kept up to its own cap of files open, so a daemon
    serving 32 streams of a dataset of one file per record ran out of descriptors. Under
    `ulimit -n 512`, 24 concurrent streams of a 2,000-file tree each read all 2,000
    records: the readers share one budget (half the limit)."""
    tree = tmp_path / "tree"
    run("gen", tree, "--format", "files", "--records", 2000, "--record-size", 256)
    d = Daemon({"t": f"{tree}:files"}, "--queue-depth", "8", nofile=512)
    try:
        got, errors = [], []

        def reader(i):
            try:
                with riffle.Client(d.socket) as c:
                    got.append(sum(len(b) for b in c.stream("t", 50, seed=i)))
            except Exception as e:  # noqa: BLE001 (the test reports every failure)
                errors.append(repr(e))

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        assert got == [2000] * 24
    finally:
        d.stop()


def test_a_stopped_daemon_gives_a_receive_timeout_not_a_hang(daemon):
    """Regression (issue 29): a daemon stopped with SIGSTOP left its clients blocked for
    ever. A client waits `receive_timeout` seconds for the daemon's next frame, then raises
    `RiffleTimeout` (a `RiffleConnectionError`); the default is generous, None waits on."""
    assert riffle.client.DEFAULT_RECEIVE_TIMEOUT >= 60
    with pytest.raises(ValueError):
        riffle.Client(daemon.socket, receive_timeout=0)
    c = riffle.Client(daemon.socket, receive_timeout=0.5)
    s = c.stream("train", batch_size=16, seed=1)
    it = iter(s)
    next(it)
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(riffle.client.RiffleTimeout) as e:
            # The batches already in the ring come out; then the client waits on the
            # daemon, which does not answer.
            for _ in it:
                pass
        assert "receive_timeout" in str(e.value) and e.value.code == "timeout"
        assert isinstance(e.value, riffle.RiffleConnectionError)
        # A blocking STATS on a fresh connection times out the same way... once connected:
        # the kernel accepts the connection into the backlog, the HELLO goes unanswered.
        with pytest.raises(riffle.client.RiffleTimeout):
            riffle.Client(daemon.socket, receive_timeout=0.5)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    c.close()
    # The daemon, running again, serves a client with no timeout at all.
    with riffle.Client(daemon.socket, receive_timeout=None) as c2:
        assert sum(len(b.ids) for b in c2.stream("train", batch_size=100)) == 3000


def test_ranks_opening_apart_share_the_pass_their_node_says(tmp_path):
    """Issue 29 D1: four two-pass ranks opening apart (a second each), each saying its node
    opens 4 streams, share one pass (one job, no late stream), each getting its share of
    the epoch; a fifth stream of the job coming after the pass began is late: served
    exactly by a pass of its own, counted in the stats and logged."""
    data = tmp_path / "d.npy"
    run("gen", data, "--format", "npy", "--records", 8000, "--record-size", 512)
    d = Daemon({"train": data}, "--mode", "two-pass", "--scratch", str(tmp_path / "scratch"))
    try:
        out = {}
        late = {}

        def reader(rank, world, streams):
            with riffle.Client(d.socket) as c:
                got = []
                for b in c.stream("train", 100, seed=3, rank=rank, world=world, streams=streams):
                    got.append(b.ids.copy())
                out[(rank, world)] = got

        threads = []
        for r in range(4):
            t = threading.Thread(target=reader, args=(r, 4, 4))
            t.start()
            threads.append(t)
            time.sleep(1.0)
        for t in threads:
            t.join()
        s = d.stats()
        assert s["jobs_total"] == 1, s
        assert s["late_streams"] == 0, s
        ids = np.concatenate([np.concatenate(out[(r, 4)]) for r in range(4)])
        assert np.array_equal(np.sort(ids), np.arange(8000))

        # A world of 2 whose node says 1 stream: rank 0 starts the pass alone; rank 1,
        # opened once rank 0 holds its second batch (global batch 2: rank 1's first was
        # decided), is late.
        with riffle.Client(d.socket) as c0:
            s0 = iter(c0.stream("train", 100, seed=3, rank=0, world=2, streams=1))
            first = [next(s0).ids.copy(), next(s0).ids.copy()]
            with riffle.Client(d.socket) as c1:
                late[1] = [b.ids.copy() for b in c1.stream("train", 100, seed=3, rank=1, world=2,
                                                           streams=1)]
            st = d.stats()
            rest = [b.ids.copy() for b in s0]
        ids = np.concatenate(first + rest + late[1])
        assert np.array_equal(np.sort(ids), np.arange(8000)), "both ranks exact"
        assert st["late_streams"] == 1, st
        missed = [j for j in st["jobs"] if j["late_streams"] == 1]
        assert len(missed) == 1 and missed[0]["streams_expected"] == 1, st
        with riffle.Client(d.socket) as c, pytest.raises(ValueError):
            c.stream("train", 100, world=2, streams=0)
    finally:
        d.stop()
    log = d.proc.stderr.read().decode()
    assert "came after its pass began emitting" in log, log
