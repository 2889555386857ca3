"""riffle.torch: a DataLoader with workers reads every record of the epoch once. Skipped
when torch is not installed (it is not a dependency of the client)."""

import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; riffle.torch is untested here")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_serve import Daemon, run  # noqa: E402

import riffle.torch  # noqa: E402


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
    assert riffle.torch.split(1, 2, 0, 3) == (3, 6)
    assert riffle.torch.split(1, 2, 2, 3) == (5, 6)
