"""Three epochs through riffle.torch against a `riffle serve` daemon (as `bench peers`
starts it: `--max-clients 4`, the default `--memory`, the dataset's directory as scratch),
one stream per epoch as riffle.torch opens them: prints one JSON line with each epoch's
seconds and the daemon's figures (device bytes, rolled piles) at the end. Used for
docs/report/peers-rolled.md (issue 33): run it inside the memory cgroup to measure.

    python rolled_epochs.py RIFFLE_BIN DATA.npy RECORDS [views|tickets] [LOG]
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))

import riffle  # noqa: E402
import riffle.torch  # noqa: E402
from serve import serving  # noqa: E402  (bench/serve.py)


def main():
    riffle_bin, path, records = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kind = sys.argv[4] if len(sys.argv) > 4 else "views"
    log = open(sys.argv[5] if len(sys.argv) > 5 else os.devnull, "w")
    with serving(riffle_bin, f"peers={path}", "--max-clients", "4", patience=120,
                 log=log) as sock:
        workers = 2 if kind == "tickets" else 0
        it = riffle.torch.loader(sock, "peers", 256, num_workers=workers, seed=1)
        secs, n = [], 0
        t0 = time.perf_counter()
        for e in range(3):
            it.set_epoch(e)
            t = time.perf_counter()
            for b in it:
                n += len(b["ids"]) - int(b["padding"])
            secs.append(time.perf_counter() - t)
        total = time.perf_counter() - t0
        c = riffle.Client(sock)
        st = c.stats()
        c.close()
        print(json.dumps({
            "kind": kind,
            "records": n,
            "epoch_seconds": [round(s, 2) for s in secs],
            "samples_per_s": round(n / total),
            "device_bytes": st["device_bytes"],
            "rolled": {k: v for k, v in st.get("rolled", {}).items() if k != "kept"},
            "resident": {k: st["resident"].get(k) for k in ("bytes", "held")},
        }))
        assert n == 3 * records, n


if __name__ == "__main__":
    main()
