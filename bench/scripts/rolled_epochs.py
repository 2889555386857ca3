"""Three epochs through riffle.torch against a `riffle serve` daemon (as `bench peers`
starts it: `--max-clients 4`, the default `--memory`, the dataset's directory as scratch),
one stream per epoch as riffle.torch opens them: prints one JSON line with each epoch's
seconds and the daemon's figures (device bytes, rolled piles) at the end. Used for
docs/report/peers-rolled.md (issue 33): run it inside the memory cgroup to measure.

    python rolled_epochs.py RIFFLE_BIN DATA.npy RECORDS [views|tickets] [LOG]
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import riffle  # noqa: E402
import riffle.torch  # noqa: E402


def main():
    riffle_bin, path, records = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kind = sys.argv[4] if len(sys.argv) > 4 else "views"
    log = open(sys.argv[5] if len(sys.argv) > 5 else os.devnull, "w")
    tmp = tempfile.mkdtemp(prefix="rroll")
    sock = os.path.join(tmp, "s.sock")
    daemon = subprocess.Popen([riffle_bin, "serve", "--socket", sock, "--dataset",
                               f"peers={path}", "--max-clients", "4"], stderr=log)
    try:
        deadline = time.time() + 120
        while True:
            try:
                riffle.Client(sock).close()
                break
            except riffle.RiffleConnectionError:
                if time.time() > deadline or daemon.poll() is not None:
                    raise SystemExit("riffle serve did not come up")
                time.sleep(0.05)
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
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


if __name__ == "__main__":
    main()
