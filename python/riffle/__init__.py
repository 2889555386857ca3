"""Client of the riffle batch-feeder daemon (`riffle serve`).

    import riffle
    with riffle.Client("/run/riffle.sock") as client:
        for batch in client.stream("train", batch_size=256, seed=0, epoch=0):
            batch.ids, batch.offsets, batch.data   # numpy views into shared memory

`riffle.node.client()` connects to this user's node daemon, starting it if none runs
(`riffle.torch.loader("/data/train.npy", batch_size=256)` does so for a dataset path).
`riffle.torch` adapts a stream to a PyTorch IterableDataset (when torch is installed).
"""

from .client import (
    PROTOCOL_VERSION,
    VERSION,
    Batch,
    Client,
    RiffleBadRequest,
    RiffleBusy,
    RiffleConnectionError,
    RiffleEngineMissing,
    RiffleError,
    RiffleExhausted,
    RiffleShutdown,
    RiffleTimeout,
    RiffleTooLarge,
    RiffleVersionMismatch,
    Stream,
    binary,
)
from .formats import mds_sample, tar_members
from . import node
from .node import RiffleDaemonError, RiffleRuntimeDirError

__all__ = [
    "PROTOCOL_VERSION",
    "VERSION",
    "Batch",
    "Client",
    "RiffleBadRequest",
    "RiffleBusy",
    "RiffleConnectionError",
    "RiffleDaemonError",
    "RiffleEngineMissing",
    "RiffleError",
    "RiffleExhausted",
    "RiffleRuntimeDirError",
    "RiffleShutdown",
    "RiffleTimeout",
    "RiffleTooLarge",
    "RiffleVersionMismatch",
    "Stream",
    "binary",
    "mds_sample",
    "node",
    "tar_members",
]
__version__ = VERSION
