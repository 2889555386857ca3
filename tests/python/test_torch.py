"""riffle.torch: a DataLoader with workers reads every record of the epoch once. Skipped
when torch is not installed (it is not a dependency of the client)."""

import pathlib
import time
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; riffle.torch is untested here")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_serve import Daemon, run  # noqa: E402

import riffle.torch  # noqa: E402

# riffle.torch silences torch's read-only-tensor warning for its own calls; pytest resets
# warning filters around each test, so the tests say the same.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")


def test_workers_and_ranks_split_the_epoch(tmp_path):
    data = tmp_path / "d.npy"
    run("gen", data, "--format", "npy", "--records", 4000, "--record-size", 64)
    d = Daemon({"train": data})
    try:
        seen = []
        for rank in range(2):
            ds = riffle.torch.RiffleDataset(d.socket, "train", 50, seed=1, rank=rank, world=2)
            loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
            for b in loader:
                assert b["offsets"][-1] == len(b["data"])
                seen.append(b["ids"].numpy())
        ids = np.sort(np.concatenate(seen))
        assert np.array_equal(ids, np.arange(4000))
    finally:
        d.stop()


def test_split_numbers_workers_as_ranks():
    # Worker w of rank r in a world of W is rank w * W + r of W * workers: a process's step
    # s (its workers in turn) is global batch s * W + r.
    assert riffle.torch.split(1, 2, 0, 3) == (1, 6)
    assert riffle.torch.split(1, 2, 2, 3) == (5, 6)
    assert riffle.torch.split(0, 1, 1, 2) == (1, 2)


def _records(path):
    """Each record's bytes by id (generated records carry their id in the first 8 bytes)."""
    arr = np.load(path)
    return {int(np.frombuffer(r[:8].tobytes(), "<u8")[0]): r.tobytes() for r in arr}


def _check(batches, records, n):
    """Every record once, each with its own bytes."""
    seen = []
    for ids, offsets, data in batches:
        assert len(offsets) == len(ids) + 1 and offsets[-1] == len(data)
        for i, rid in enumerate(ids):
            assert data[offsets[i] : offsets[i + 1]].tobytes() == records[int(rid)]
        seen.append(ids)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))


def _mapping_of(addr):
    """The /proc/self/maps line of the mapping holding address `addr`."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.strip()
    return ""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch")
    data = tmp / "d.npy"
    run("gen", data, "--format", "npy", "--records", 6000, "--record-size", 128)
    d = Daemon({"train": data})
    yield d, data
    d.stop()


def _three_loaders(sock, name, batch, seed):
    """The three ways riffle.torch feeds a loop: the ring's views (no workers), a plain
    DataLoader's workers (their rings), and `loader`'s workers (tickets)."""
    ds = riffle.torch.RiffleDataset(sock, name, batch, seed=seed)
    return [torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0),
            torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2),
            riffle.torch.loader(sock, name, batch, num_workers=2, seed=seed)]


def test_no_workers_gives_views_of_the_ring_valid_until_the_next_batch(served):
    d, data = served
    records = _records(data)
    ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=3)
    got = []
    for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
        # A view of the daemon's ring (its memfd, mapped read-only), not a copy.
        assert "memfd:riffle" in _mapping_of(b["data"].data_ptr()), _mapping_of(b["data"].data_ptr())
        assert b["ids"].dtype == torch.int64 and b["offsets"].dtype == torch.int64
        got.append((b["ids"].numpy().copy(), b["offsets"].numpy().copy(), b["data"].numpy().copy()))
    _check(got, records, 6000)
    # The same order as the daemon's own stream of the job.
    with riffle.Client(d.socket) as c:
        want = [b.ids.copy() for b in c.stream("train", 100, seed=3)]
    assert all(np.array_equal(g[0], w) for g, w in zip(got, want)) and len(got) == len(want)


def test_workers_share_one_pass_and_cross_processes_through_shared_memory(served):
    d, data = served
    records = _records(data)
    ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=4, transform=riffle.torch.fixed(128))
    got = []
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    for b in loader:
        assert b["data"].shape[1] == 128
        # Copied once in a worker, into its ring, which this process maps: no other copy.
        assert "memfd:riffle-handoff" in _mapping_of(b["data"].data_ptr())
        data_bytes = b["data"].reshape(-1).numpy()
        got.append((b["ids"].numpy(), b["offsets"].numpy(), data_bytes))
    # 6000 records, 2 workers x 100 per batch: drop_last of the 2-rank world loses none.
    _check(got, records, 6000)
    # The two workers were ranks of one job: one shared pass, not two.
    with riffle.Client(d.socket) as c:
        st = c.stats()
    assert st["streams_shared"] >= 2, st


def test_workers_reuse_their_ring_once_the_loop_lets_batches_go(served):
    """A loop that drops each batch: a worker ring of a few batches serves the whole
    epoch (every batch a view of it), reused as batches are collected."""
    d, data = served
    records = _records(data)
    ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=8, ring_bytes=64 << 10)
    got = []
    for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        assert "memfd:riffle-handoff" in _mapping_of(b["data"].data_ptr())
        got.append((b["ids"].numpy().copy(), b["offsets"].numpy().copy(), b["data"].numpy().copy()))
    _check(got, records, 6000)


def test_batches_a_loop_keeps_stay_whole_when_worker_rings_fill(served):
    """A loop that keeps every batch of the epoch: once a worker's ring holds all it can,
    it falls back to a fresh shared block per batch instead of waiting (which would never
    end) or reusing what the loop still holds. Every kept batch is checked at the end."""
    d, data = served
    records = _records(data)
    ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=9, ring_bytes=64 << 10)
    kept = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    where = ["memfd:riffle-handoff" in _mapping_of(b["data"].data_ptr()) for b in kept]
    assert any(where) and not all(where), where
    _check([(b["ids"].numpy(), b["offsets"].numpy(), b["data"].numpy()) for b in kept], records, 6000)


def test_loader_copies_or_collates_on_a_background_thread(served):
    d, data = served
    records = _records(data)
    # Default background collate: tensors the loop may keep (copies), in order.
    kept = list(riffle.torch.loader(d.socket, "train", 100, seed=5, background=True))
    assert not any("memfd:riffle" in _mapping_of(b["data"].data_ptr()) for b in kept)
    _check([(b["ids"].numpy(), b["offsets"].numpy(), b["data"].numpy()) for b in kept], records, 6000)
    # A collate of one's own: record sums, computed on the thread.
    sums = list(riffle.torch.loader(
        d.socket, "train", 100, seed=5,
        collate=lambda b: (b["ids"].clone(), b["data"].view(-1, 128).sum(dim=1))))
    assert [int(s[0][0]) for s in sums] == [int(b["ids"][0]) for b in kept]
    # Views without a background thread, and an epoch of the caller's choosing.
    ds = riffle.torch.loader(d.socket, "train", 100, seed=5)
    ds.set_epoch(1)
    first = next(iter(ds))
    assert not np.array_equal(first["ids"].numpy(), kept[0]["ids"].numpy()), "epoch 1 is another order"


def test_a_daemon_error_reaches_the_loop_from_the_background_thread(served):
    d, _ = served
    with pytest.raises(riffle.RiffleBadRequest):
        list(riffle.torch.loader(d.socket, "no-such-dataset", 100, background=True))


def test_loader_with_workers_hands_batches_over_without_copies(served):
    d, data = served
    records = _records(data)
    got = []
    for b in riffle.torch.loader(d.socket, "train", 100, num_workers=2, seed=6):
        # A view of a worker's ring, mapped in this process: no copy crossed processes.
        assert "memfd:riffle" in _mapping_of(b["data"].data_ptr()), _mapping_of(b["data"].data_ptr())
        got.append((b["ids"].numpy().copy(), b["offsets"].numpy().copy(), b["data"].numpy().copy()))
    _check(got, records, 6000)
    # The same batches as the plain DataLoader (copies through shared memory), in order.
    ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=6)
    want = [b["ids"].numpy().copy() for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
    assert len(want) == len(got) and all(np.array_equal(g[0], w) for g, w in zip(got, want))


def test_a_slow_loop_with_workers_and_small_rings_gets_every_batch_whole(served):
    """The loop holds each batch a while and workers run ahead into rings of about three
    batches, which they can refill only once the loop has released their oldest: no
    deadlock, and no batch is overwritten while the loop holds it."""
    d, data = served
    records = _records(data)
    got = []
    # A ring of about three batches: workers soon hold all it can give.
    it = riffle.torch.loader(d.socket, "train", 300, num_workers=2, seed=7, ring_bytes=128 << 10,
                             dataloader={"prefetch_factor": 8})
    for b in it:
        time.sleep(0.002)
        assert "memfd:riffle" in _mapping_of(b["data"].data_ptr())
        got.append((b["ids"].numpy().copy(), b["offsets"].numpy().copy(), b["data"].numpy().copy()))
    _check(got, records, 6000)


def test_the_readme_pytorch_example_runs(served):
    import re

    d, _ = served
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(import torch, riffle\.torch\n.*?)```", readme, re.S).group(1)
    assert '"/tmp/riffle.sock"' in code
    exec(compile(code.replace('"/tmp/riffle.sock"', repr(d.socket)), "README.md", "exec"), {})


def test_labels_of_a_files_tree_reach_the_loop_with_and_without_workers(tmp_path):
    """A files tree's labels (ImageFolder's rule) come with every batch as an int64
    tensor, from the ring (no workers), a worker's ring (a plain DataLoader) and tickets
    (`loader(num_workers=2)`); each equals the label the record's payload carries."""
    tree = tmp_path / "tree"
    run("gen", tree, "--format", "files", "--records", 600, "--record-size", 200, "--labels", 4)
    d = Daemon({"train": f"{tree}:files"})
    try:
        for it in _three_loaders(d.socket, "train", 50, 1):
            seen = []
            for b in it:
                assert b["labels"].dtype == torch.int64 and len(b["labels"]) == len(b["ids"])
                offs, data = b["offsets"].numpy(), b["data"].numpy()
                for i in range(len(b["ids"])):
                    want = int(np.frombuffer(data[offs[i] + 8 : offs[i] + 12].tobytes(), "<u4")[0])
                    assert int(b["labels"][i]) == want
                seen.append(b["ids"].numpy().copy())
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(600))
    finally:
        d.stop()


def test_a_loader_checkpoint_resumes_exactly_under_other_workers_worlds_and_batch_sizes(served):
    """`loader(...).state_dict()` mid-epoch, then `load_state_dict()` into loaders of
    another shape: 2 workers -> none; one process -> a world of 2 (threads standing for
    ranks) with 3 workers... each time what was read before and after covers the epoch's
    6,000 records once, padding aside."""
    import json
    import threading

    d, _ = served

    def take(it, n=None):
        got = []
        for b in it:
            got.append((b["ids"].numpy().copy(), int(b["padding"])))
            if n is not None and len(got) == n:
                break
        return got

    def check(parts):
        seen = np.zeros(6000, int)
        padding = 0
        for part in parts:
            for ids, p in part:
                np.add.at(seen, ids, 1)
                padding += p
        assert (seen >= 1).all() and seen.sum() - 6000 == padding, (seen.sum(), padding)

    # 2 workers read 5 batches of 100; the rest with no workers, batches of 64.
    it = riffle.torch.loader(d.socket, "train", 100, num_workers=2, seed=12)
    before = take(it, 5)
    state = json.loads(json.dumps(it.state_dict()))
    assert state["global"] == {"epoch": 0, "records": 500}, state
    del it
    rest = riffle.torch.loader(d.socket, "train", 64, seed=12)
    rest.load_state_dict(state)
    check([before, take(rest)])
    assert rest.state_dict()["global"] == {"epoch": 1, "records": 0}

    # One process reads 7 batches of 100; then a world of 2 ranks, with 2 workers each.
    it = riffle.torch.loader(d.socket, "train", 100, seed=13)
    before = take(it, 7)
    state = it.state_dict()
    assert state["global"] == {"epoch": 0, "records": 700}
    out = {}

    def rank(r):
        l = riffle.torch.loader(d.socket, "train", 100, seed=13, rank=r, world=2, num_workers=2)
        l.load_state_dict(state)
        out[r] = take(l)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check([before, out[0], out[1]])


def test_two_daemons_for_two_nodes_under_torchrun_and_an_elastic_resume(tmp_path):
    """Many nodes without a coordinator: two daemons on this machine stand for two nodes,
    torchrun starts ranks 0-3 on node 0 and 4-7 on node 1 (gloo), each reading from its
    node's daemon. One epoch: equal steps on every rank, the union exactly the epoch. Then
    the job stops mid-epoch, and resumes with 6 ranks (3 per node) from the checkpoint:
    before and after together read every record once (padding aside)."""
    import json
    import shutil
    import socket
    import subprocess

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH: the multi-node job cannot be started")
    data = tmp_path / "d.npy"
    n = 4000
    run("gen", data, "--format", "npy", "--records", n, "--record-size", 64)
    daemons = [Daemon({"train": data}), Daemon({"train": data})]
    sockets = ",".join(d.socket for d in daemons)
    script = pathlib.Path(__file__).parent / "torchrun_job.py"

    def job(per_node, out, *extra):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen(
            [torchrun, "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node",
             str(per_node), "--master_addr", "127.0.0.1", "--master_port", str(port), str(script),
             "--sockets", sockets, "--out", str(out), *map(str, extra)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for node in (0, 1)]
        for p in procs:
            text = p.communicate(timeout=240)[0].decode()
            assert p.returncode == 0, text[-3000:]
        return json.loads(out.read_text())

    try:
        full = job(4, tmp_path / "full.json")
        assert [r["node"] for r in full] == [0] * 4 + [1] * 4
        assert len({r["steps"] for r in full}) == 1, [r["steps"] for r in full]
        ids = np.concatenate([r["ids"] for r in full])
        assert np.array_equal(np.sort(ids), np.arange(n)), "the epoch once over 8 ranks"

        before = job(4, tmp_path / "before.json", "--stop", 3)
        states = {json.dumps(r["state"], sort_keys=True) for r in before}
        assert len(states) == 1, states
        state = before[0]["state"]
        assert state["global"] == {"epoch": 0, "records": 3 * 8 * 50}, state
        (tmp_path / "state.json").write_text(json.dumps(state))
        after = job(3, tmp_path / "after.json", "--state", tmp_path / "state.json")
        assert len(after) == 6 and len({r["steps"] for r in after}) == 1
        seen = np.zeros(n, int)
        for r in before + after:
            np.add.at(seen, np.asarray(r["ids"], dtype=np.int64), 1)
        assert (seen == 1).all(), (seen.min(), seen.max())
    finally:
        for d in daemons:
            d.stop()


def test_torchdata_stateful_dataloader_resumes_each_worker_where_it_was(served):
    """torchdata's StatefulDataLoader over RiffleDataset with 2 workers: a state taken
    after 7 batches resumes a new StatefulDataLoader (same world and workers) so that
    before and after together read the epoch once; each worker's position comes from
    RiffleDataset.state_dict() in that worker."""
    sdl = pytest.importorskip(
        "torchdata.stateful_dataloader",
        reason="torchdata is not installed: StatefulDataLoader is not tested here")

    d, _ = served
    ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=14)
    it = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2)
    before = []
    for b in it:
        before.append(b["ids"].numpy().copy())
        if len(before) == 7:
            break
    state = it.state_dict()
    del it
    ds2 = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=14)
    it2 = sdl.StatefulDataLoader(ds2, batch_size=None, num_workers=2)
    it2.load_state_dict(state)
    after = [b["ids"].numpy().copy() for b in it2]
    ids = np.concatenate(before + after)
    assert np.array_equal(np.sort(ids), np.arange(6000)), (len(before), len(after))


def test_set_epoch_reaches_persistent_workers(served):
    """Regression: with `persistent_workers=True` the workers keep their own copy of the
    dataset, and `set_epoch` in the training process did not reach them: every epoch
    repeated epoch 0's order. Each epoch now reads as with fresh workers."""
    d, _ = served

    def epochs(persistent):
        ds = riffle.torch.RiffleDataset(d.socket, "train", 100, seed=15)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         persistent_workers=persistent)
        out = []
        for e in range(3):
            ds.set_epoch(e)
            out.append([(int(b["epoch"]), b["ids"].numpy().copy()) for b in dl])
        return out

    fresh, kept = epochs(False), epochs(True)
    for e in range(3):
        assert [x[0] for x in kept[e]] == [e] * len(kept[e])
        assert len(kept[e]) == len(fresh[e])
        assert all(np.array_equal(a[1], b[1]) for a, b in zip(kept[e], fresh[e])), e
    assert not np.array_equal(kept[0][0][1], kept[1][0][1]), "epoch 1 is another order"


def test_a_mixture_through_pytorch_says_each_records_source(tmp_path):
    """A mixture served by the daemon through riffle.torch, with and without workers:
    `batch["sources"]` (int64) names each record's source; per epoch the counts are exact."""
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    run("gen", a, "--format", "npy", "--records", 300, "--record-size", 32)
    run("gen", b, "--format", "npy", "--records", 100, "--record-size", 32)
    d = Daemon({"mix": f"mix:a={a}*0.5,b={b}*0.5;size=400"})
    try:
        for it in _three_loaders(d.socket, "mix", 50, 2):
            ids, srcs = [], []
            for batch in it:
                assert batch["sources"].dtype == torch.int64
                ids.append(batch["ids"].numpy().copy())
                srcs.append(batch["sources"].numpy().copy())
            ids, srcs = np.concatenate(ids), np.concatenate(srcs)
            assert np.array_equal(srcs, (ids >= 300).astype(np.int64))
            assert (srcs == 0).sum() == 200 and (srcs == 1).sum() == 200
    finally:
        d.stop()


def test_the_readme_checkpoint_example_runs_and_resumes_exactly(served, tmp_path, monkeypatch):
    import re

    d, _ = served
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(import torch, riffle\.torch  # checkpoint\n.*?)```", readme,
                     re.S).group(1)
    monkeypatch.chdir(tmp_path)
    ns = {}
    exec(compile(code.replace('"/tmp/riffle.sock"', repr(d.socket)), "README.md", "exec"), ns)
    state = torch.load(tmp_path / "ckpt.pt")
    assert state["global"] == {"epoch": 0, "records": 11 * 256}, state
    rest = torch.cat(ns["rest"]).numpy()
    assert len(rest) == 6000 - 11 * 256 and len(np.unique(rest)) == len(rest)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_workers_of_one_process_read_every_record_exactly_once(tmp_path):
    """Regression (issue 29 deliverable 2): the DataLoader workers of one process split
    that process's batches. 4,010 records in batches of 200 with 2 workers used to be a
    world of 2 streams, padded to 22 batches (4,400 ids, 390 repeats); now both a plain
    DataLoader over RiffleDataset and `loader(num_workers=2)` give the one process every
    record exactly once, in the batches (and the order) it gets without workers, the last
    one partial, and a global cursor at the epoch's end."""
    data = tmp_path / "d.npy"
    n, size = 4010, 200
    run("gen", data, "--format", "npy", "--records", n, "--record-size", 64)
    d = Daemon({"train": data})
    try:
        ds = riffle.torch.RiffleDataset(d.socket, "train", size, seed=3)
        alone = [b["ids"].numpy().copy()
                 for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)]
        assert [len(x) for x in alone] == [size] * 20 + [10]
        loaders = {
            "DataLoader": torch.utils.data.DataLoader(
                riffle.torch.RiffleDataset(d.socket, "train", size, seed=3), batch_size=None,
                num_workers=2),
            "loader": riffle.torch.loader(d.socket, "train", size, num_workers=2, seed=3),
        }
        for name, it in loaders.items():
            got, padding, cursor = [], 0, None
            for b in it:
                got.append(b["ids"].numpy().copy())
                padding += int(b["padding"])
                cursor = b.get("cursor", cursor)
            ids = np.concatenate(got)
            assert len(ids) == n and padding == 0, (name, len(ids), padding)
            assert np.array_equal(np.sort(ids), np.arange(n)), name
            assert [len(x) for x in got] == [size] * 20 + [10], name
            # The process's batches in order: the same as without workers.
            assert all(np.array_equal(a, b) for a, b in zip(got, alone)), name
            assert cursor == {"epoch": 0, "records": n}, (name, cursor)
        assert loaders["loader"].state_dict()["global"] == {"epoch": 1, "records": 0}
        # A checkpoint of 2 workers after 5 batches resumes under 3 workers: before and
        # after together are the epoch exactly once, the rest in the same batches.
        it = riffle.torch.loader(d.socket, "train", size, num_workers=2, seed=3)
        before = []
        for b in it:
            before.append(b["ids"].numpy().copy())
            if len(before) == 5:
                break
        state = it.state_dict()
        assert state["global"] == {"epoch": 0, "records": 5 * size}, state
        del it
        rest = riffle.torch.loader(d.socket, "train", size, num_workers=3, seed=3)
        rest.load_state_dict(state)
        after = [b["ids"].numpy().copy() for b in rest]
        assert all(np.array_equal(a, b) for a, b in zip(before + after, alone))
        assert len(before + after) == len(alone)
    finally:
        d.stop()


def test_two_ranks_of_two_workers_under_torchrun_take_equal_steps(tmp_path):
    """Regression (issue 29 deliverable 2): under torchrun (one node, 2 ranks) each rank's
    2 DataLoader workers split its batches, and only the ranks pad: 4,010 records in
    batches of 50 are 81 batches, padded to 82 over 2 ranks, 41 steps each, 4,100 ids in
    all (every record, the 90 repeats being the epoch's first records). Workers counted
    as ranks padded over 4 streams: 84 batches, 42 steps, 4,200 ids. Both a plain
    DataLoader over RiffleDataset and `loader(num_workers=2)`."""
    import json
    import shutil
    import socket
    import subprocess

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH: the job cannot be started")
    n = 4010
    data = tmp_path / "d.npy"
    run("gen", data, "--format", "npy", "--records", n, "--record-size", 64)
    d = Daemon({"train": data})
    script = pathlib.Path(__file__).parent / "torchrun_job.py"
    try:
        for plain in (False, True):
            out = tmp_path / f"out{int(plain)}.json"
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            p = subprocess.run(
                [torchrun, "--nnodes", "1", "--nproc_per_node", "2", "--master_addr",
                 "127.0.0.1", "--master_port", str(port), str(script), "--sockets", d.socket,
                 "--out", str(out), "--num-workers", "2", "--with-padding",
                 *(["--plain"] if plain else [])],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
            assert p.returncode == 0, p.stdout.decode()[-3000:]
            ranks = json.loads(out.read_text())
            assert [r["steps"] for r in ranks] == [41, 41], (plain, [r["steps"] for r in ranks])
            seen = np.zeros(n, int)
            for r in ranks:
                np.add.at(seen, np.asarray(r["ids"], dtype=np.int64), 1)
            assert seen.sum() == 82 * 50, (plain, seen.sum())
            assert (seen >= 1).all() and (seen <= 2).all(), plain
            padded = sum(r["padding"] for r in ranks)
            assert padded == 82 * 50 - n, (plain, padded)
    finally:
        d.stop()


def test_node_streams_come_from_local_world_size_and_workers(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    # 4 ranks here, 2 workers each: a world of 8 ranks x 2 workers streams as 16.
    assert riffle.torch.node_streams(16, 2) == 8
    assert riffle.torch.node_streams(4, 1) == 4
    assert riffle.torch.node_streams(1, 1) is None
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    # One process (no torchrun): its workers are the job's streams.
    assert riffle.torch.node_streams(2, 2) == 2
    # Several ranks, no torchrun: nothing says how many run here.
    assert riffle.torch.node_streams(4, 2) is None


def test_ranks_of_a_torchrun_node_opening_apart_share_one_pass(tmp_path, monkeypatch):
    """Under torchrun (LOCAL_WORLD_SIZE) the ranks of a node say how many streams the node
    opens, so two ranks starting a second apart share one two-pass pass."""
    import threading

    data = tmp_path / "d.npy"
    run("gen", data, "--format", "npy", "--records", 4000, "--record-size", 256)
    d = Daemon({"train": data}, "--mode", "two-pass", "--scratch", str(tmp_path / "scratch"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    try:
        seen = {}

        def rank(r):
            ds = riffle.torch.RiffleDataset(d.socket, "train", 50, seed=2, rank=r, world=2)
            seen[r] = [b["ids"].numpy().copy() for b in torch.utils.data.DataLoader(ds, batch_size=None)]

        threads = []
        for r in range(2):
            t = threading.Thread(target=rank, args=(r,))
            t.start()
            threads.append(t)
            time.sleep(1.0)
        for t in threads:
            t.join()
        ids = np.sort(np.concatenate(seen[0] + seen[1]))
        assert np.array_equal(ids, np.arange(4000))
        st = d.stats()
        assert st["jobs_total"] == 1, st
        assert st["late_streams"] == 0, st
    finally:
        d.stop()
