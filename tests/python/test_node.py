"""The node daemon a training script starts by giving a dataset path (issue 31,
deliverables 2-4): one per user and node, started by whichever process comes first (exactly
one however many start at once), serving only its user, leaving once idle with its socket
and scratch. Real daemons (`riffle serve --user`), real processes, a real second user."""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import riffle  # noqa: E402

RIFFLE = os.environ.get("RIFFLE_BIN", str(ROOT / "target" / "debug" / "riffle"))


def gen(path, n, size=64):
    subprocess.run([RIFFLE, "gen", str(path), "--format", "npy", "--records", str(n),
                    "--record-size", str(size)], check=True, capture_output=True, timeout=120)


def daemons(rundir):
    """Pids of the daemons serving `rundir` (not a `--detach` starter on its way out)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"serve" in args and b"--user" in args and os.fsencode(str(rundir)) in args
                and b"--detach" not in args):
            try:
                state = pathlib.Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if state != "Z":
                found.append(int(pid))
    return found


def wait_gone(rundir, limit):
    deadline = time.monotonic() + limit
    while daemons(rundir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not daemons(rundir)


@pytest.fixture
def rundir(monkeypatch):
    d = pathlib.Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp")) / "rt"
    monkeypatch.setenv("RIFFLE_RUNTIME_DIR", str(d))
    monkeypatch.setenv("RIFFLE_BIN", RIFFLE)
    monkeypatch.setenv("RIFFLE_DAEMON_IDLE", "3")
    monkeypatch.setenv("RIFFLE_DAEMON_MODE", "lirs")
    yield d
    for pid in daemons(d):
        os.kill(pid, 15)
    wait_gone(d, 10)
    shutil.rmtree(d.parent, ignore_errors=True)


def read_all(c, name, **kw):
    ids = []
    for b in c.stream(name, batch_size=100, **kw):
        ids.extend(b.ids.tolist())
    return ids


def test_a_path_starts_the_node_daemon_which_serves_it_and_leaves_once_idle(rundir, tmp_path):
    data = tmp_path / "d.npy"
    gen(data, 3000)
    with riffle.node.client() as c:
        ids = read_all(c, riffle.node.dataset_name(data))
        assert sorted(ids) == list(range(3000))
        # Another dataset, by a relative path made absolute for the daemon.
        other = tmp_path / "e.npy"
        gen(other, 500)
        os.chdir(tmp_path)
        assert riffle.node.dataset_name("e.npy") == str(other)
        assert sorted(read_all(c, riffle.node.dataset_name("e.npy"))) == list(range(500))
        names = [d["name"] for d in c.stats()["datasets"]]
        assert names == [str(data), str(other)]
        # What the daemon cannot open is a clear error naming it, and the connection lives.
        with pytest.raises(riffle.RiffleError) as e:
            read_all(c, str(tmp_path / "missing.npy"))
        assert "missing.npy" in str(e.value)
        with pytest.raises(riffle.RiffleBadRequest) as e:
            read_all(c, "relative.npy")
        assert "absolute path" in str(e.value)
    (pid,) = daemons(rundir)
    assert oct(os.stat(rundir).st_mode & 0o777) == "0o700"
    assert oct(os.stat(rundir / "riffle.sock").st_mode & 0o777) == "0o600"
    # Idle for RIFFLE_DAEMON_IDLE=3 s: gone, its socket with it.
    assert wait_gone(rundir, 3 + 10), "the daemon outlived its idle time"
    assert not (rundir / "riffle.sock").exists()
    log = (rundir / "daemon.log").read_text()
    assert "--exit-idle" in log and "left clean" in log, log
    # The next client starts a new one.
    with riffle.node.client() as c:
        assert len(read_all(c, riffle.node.dataset_name(data))) == 3000
    assert daemons(rundir) != [pid]


def test_a_rewritten_dataset_is_opened_again(rundir, tmp_path):
    data = tmp_path / "d.npy"
    gen(data, 1000)
    with riffle.node.client() as c:
        assert len(read_all(c, str(data))) == 1000
        tmp = tmp_path / "new.npy"
        gen(tmp, 1500)
        os.replace(tmp, data)
        time.sleep(1.1)  # kept datasets are looked at again at most once a second
        assert sorted(read_all(c, str(data))) == list(range(1500))


STARTER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import riffle
with riffle.node.client() as c:
    ids = []
    for b in c.stream(riffle.node.dataset_name(sys.argv[2]), batch_size=100, seed=int(sys.argv[3])):
        ids.extend(b.ids.tolist())
print(json.dumps({"n": len(ids), "distinct": len(set(ids))}))
"""


def test_starters_at_the_same_moment_get_exactly_one_daemon(rundir, tmp_path):
    """Eight processes on two datasets start at once with no daemon running: one daemon
    comes up, and serves them all."""
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    gen(a, 2000)
    gen(b, 3000)
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, str(ROOT / "python"),
                               str(a if i % 2 else b), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    seen = set()
    while any(p.poll() is None for p in procs):
        seen.update(daemons(rundir))
        time.sleep(0.02)
    for i, p in enumerate(procs):
        out, err = p.communicate()
        assert p.returncode == 0, err
        r = json.loads(out)
        want = 2000 if i % 2 else 3000
        assert r == {"n": want, "distinct": want}, r
    seen.update(daemons(rundir))
    assert len(seen) == 1, f"daemons seen: {seen}"
    log = (rundir / "daemon.log").read_text()
    assert log.count("listening on") == 1, log


def test_another_user_cannot_use_the_daemon(rundir, tmp_path):
    """The socket's directory keeps other users out (EACCES); a socket opened to them by
    hand is still refused by the daemon, which checks the peer's uid (SO_PEERCRED)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user (uid 65534)")
    data = tmp_path / "d.npy"
    gen(data, 100)
    with riffle.node.client() as c:
        assert len(read_all(c, str(data))) == 100
        sock = str(rundir / "riffle.sock")

        def as_nobody():
            """Connects as uid 65534 (a forked child that drops root), says HELLO, and
            tells what happened."""
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                    s = socket.socket(socket.AF_UNIX)
                    try:
                        s.connect(sock)
                    except OSError as e:
                        out = f"refused {e.errno}"
                    else:
                        try:
                            s.sendall(b'\x0e\x00\x00\x00\x01{"version":2}')
                        except BrokenPipeError:
                            pass  # it said its word and closed: read it
                        out = "answer " + s.recv(4096)[5:].decode(errors="replace")
                    os.write(w, out.encode())
                finally:
                    os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                out = f.read()
            os.waitpid(pid, 0)
            return out

        import errno
        assert as_nobody().split() == ["refused", str(errno.EACCES)]
        # Opened up by hand (as root): the daemon itself refuses the stranger.
        os.chmod(rundir.parent, 0o711)
        os.chmod(rundir, 0o711)
        os.chmod(sock, 0o666)
        out = as_nobody()
        assert out.startswith("answer") and '"permission"' in out and "only its own user" in out, out
        assert c.stats()["refused_strangers"] == 1


@pytest.mark.parametrize("kind", ["theirs", "link", "open", "unsticky-parent"])
def test_a_runtime_dir_a_neighbour_made_is_refused(rundir, tmp_path, kind):
    """In a shared TMPDIR the name may be taken first: a directory of another user, a
    link, or one open to others is never used; nor one in a directory others may write
    that is not sticky."""
    if kind == "theirs" and os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user")
    if kind == "theirs":
        os.mkdir(rundir, 0o700)
        os.chown(rundir, 65534, 65534)
    elif kind == "link":
        os.symlink(tmp_path, rundir)
    elif kind == "unsticky-parent":
        # Anyone could rename the directory away and put a link in its place.
        os.chmod(rundir.parent, 0o777)
    else:
        os.mkdir(rundir, 0o700)
        os.chmod(rundir, 0o777)
    with pytest.raises(riffle.RiffleRuntimeDirError) as e:
        riffle.node.client()
    assert str(rundir) in str(e.value) and "RIFFLE_RUNTIME_DIR" in str(e.value)
    assert not daemons(rundir)


OLD_DAEMON = """
import fcntl, json, os, socket, struct, sys
sock, clients = sys.argv[1], int(sys.argv[2])
lock = open(os.path.join(os.path.dirname(sock), "daemon.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
lock.write(f"{os.getpid()} riffle 0.0.9\\n"); lock.flush()
srv = socket.socket(socket.AF_UNIX); srv.bind(sock); srv.listen(8)
print("ready", flush=True)

def frame(conn):
    head = conn.recv(5, socket.MSG_WAITALL)
    if len(head) < 5:
        return None, None
    n, kind = struct.unpack("<IB", head)
    return kind, conn.recv(n - 1, socket.MSG_WAITALL) if n > 1 else b""

def send(conn, kind, obj):
    body = json.dumps(obj).encode()
    conn.sendall(struct.pack("<IB", len(body) + 1, kind) + body)

while True:
    conn, _ = srv.accept()
    with conn:
        kind, _ = frame(conn)
        send(conn, 1, {"version": 2, "agent": "riffle 0.0.9", "datasets": []})
        while True:
            kind, _ = frame(conn)
            if kind is None:
                break
            if kind == 9:
                send(conn, 10, {"clients": clients})
"""


@pytest.mark.parametrize("others", [True, False])
def test_a_daemon_of_another_version_is_replaced_when_idle_else_named(rundir, tmp_path, others):
    """After an upgrade the old version's node daemon may still run: when nobody else
    uses it, it is stopped (SIGTERM to the pid holding its lock) and this version's
    starts; when it serves other clients, a RiffleVersionMismatch says how to stop it."""
    os.makedirs(rundir, 0o700)
    old = subprocess.Popen([sys.executable, "-c", OLD_DAEMON, str(rundir / "riffle.sock"),
                            "2" if others else "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert old.stdout.readline().strip() == "ready"
        if others:
            with pytest.raises(riffle.RiffleVersionMismatch) as e:
                riffle.node.client()
            msg = str(e.value)
            assert "riffle 0.0.9" in msg and f"kill {old.pid}" in msg, msg
            assert old.poll() is None, "a daemon serving others was stopped"
        else:
            with pytest.warns(UserWarning, match=f"stopped the idle node daemon of riffle 0.0.9 \\(pid {old.pid}\\)"):
                with riffle.node.client() as c:
                    assert c.agent == f"riffle {riffle.VERSION}"
            assert old.wait(timeout=10) == -15
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()


def test_a_daemon_that_cannot_start_says_why(rundir):
    with pytest.raises(riffle.RiffleDaemonError) as e:
        riffle.node.client(daemon={"memory": "lots"})
    assert "--memory" in str(e.value) and "lots" in str(e.value), str(e.value)
    with pytest.raises(ValueError):
        riffle.node.client(daemon={"memroy": "1G"})


def test_mixture_paths_are_made_absolute(tmp_path):
    os.chdir(tmp_path)
    name = riffle.node.dataset_name("mix:a=x.npy*1,b=/d/y.npy*2;size=100")
    assert name == f"mix:a={tmp_path}/x.npy*1,b=/d/y.npy*2;size=100"
    assert riffle.node.dataset_name("t.bin:fixed:4K") == f"{tmp_path}/t.bin:fixed:4K"
    # An s3:// URL is named as it is, alone or in a mixture.
    assert riffle.node.dataset_name("s3://b/p/") == "s3://b/p/"
    name = riffle.node.dataset_name("mix:a=s3://b/p/*1,b=y.npy*2")
    assert name == f"mix:a=s3://b/p/*1,b={tmp_path}/y.npy*2"


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A real S3-compatible server (s3s-fs, as tests/s3.rs runs it) serving the bucket
    `data` from a directory, and this process's AWS environment pointed at it (the node
    daemon it starts inherits it): yields the bucket's directory."""
    got = subprocess.run([str(ROOT / "scripts" / "s3-server")], capture_output=True,
                         text=True, timeout=1200)
    if got.returncode != 0:
        pytest.skip(f"s3s-fs cannot be installed: {(got.stderr.strip().splitlines() or ['?'])[-1]}")
    root = tmp_path / "s3"
    (root / "data").mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([got.stdout.strip(), "--host", "127.0.0.1", "--port", str(port),
                               "--access-key", "riffle", "--secret-key", "riffle-secret",
                               str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "s3s-fs did not start"
            time.sleep(0.05)
    none = tmp_path / "no-aws-profile"
    for k, v in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "riffle",
                 "AWS_SECRET_ACCESS_KEY": "riffle-secret", "AWS_REGION": "us-east-1",
                 "AWS_SHARED_CREDENTIALS_FILE": str(none), "AWS_CONFIG_FILE": str(none),
                 "RIFFLE_S3_CACHE": str(tmp_path / "s3-cache")}.items():
        monkeypatch.setenv(k, v)
    for k in ["AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3"]:
        monkeypatch.delenv(k, raising=False)
    yield root / "data"
    server.kill()
    server.wait()


def test_the_node_daemon_serves_an_s3_url_like_the_same_files(rundir, tmp_path, s3):
    """riffle.node with an s3:// URL: the daemon opens it with its environment and
    cache_limit (staged whole here, as it fits), and gives the batches of the same files."""
    local = tmp_path / "shards"
    local.mkdir()
    (s3 / "t").mkdir()
    for i in range(2):
        gen(local / f"shard-{i}.npy", 1000 + 500 * i)
        shutil.copy(local / f"shard-{i}.npy", s3 / "t" / f"shard-{i}.npy")
    with riffle.node.client(daemon={"cache_limit": "64M"}) as c:
        want = read_all(c, riffle.node.dataset_name(local), seed=3)
        got = read_all(c, riffle.node.dataset_name("s3://data/t/"), seed=3)
        assert sorted(want) == list(range(2500))
        assert got == want
        names = [d["name"] for d in c.stats()["datasets"]]
        assert "s3://data/t/" in names, names


def test_an_s3_dataset_is_refused_where_the_daemon_has_another_store_environment(
        rundir, tmp_path, s3, monkeypatch):
    """The node daemon opens s3:// datasets with the environment it was started with: a job
    whose endpoint or keys differ would have been served the other store's objects in
    silence. riffle.torch.loader checks (`check_store_env`) and refuses, naming the
    variables (never a key's value); the same environment, or a local path, passes."""
    with riffle.node.client() as c:
        c.stats()
    riffle.node.check_store_env("s3://data/t/")
    riffle.node.check_store_env(str(tmp_path / "x.npy"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret")
    with pytest.raises(riffle.RiffleDaemonError) as e:
        riffle.node.check_store_env("s3://data/t/")
    said = str(e.value)
    assert "AWS_ENDPOINT_URL is 'http://127.0.0.1:" in said and "'http://127.0.0.1:1' here" in said
    assert "AWS_SECRET_ACCESS_KEY differs" in said
    assert "another-secret" not in said and "riffle-secret" not in said
    with pytest.raises(riffle.RiffleDaemonError):
        riffle.node.check_store_env(f"mix:a=s3://data/t/*1,b={tmp_path}/y.npy*1")
    riffle.node.check_store_env(str(tmp_path / "x.npy"))


def test_torchrun_with_a_dataset_path_needs_no_set_up(rundir, tmp_path, monkeypatch):
    """Acceptance (issue 31): examples/train.py, 9 lines that give riffle.torch.loader a
    path, under torchrun with 4 ranks of 2 DataLoader workers, with no daemon running: one
    daemon comes up (two-pass, so it has scratch), every rank takes the same steps, the
    ranks' records together are the epoch, and the daemon leaves within its idle time,
    its socket and scratch removed."""
    pytest.importorskip("torch", reason="torch is not installed: riffle.torch is not tested here")
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH: the job cannot be started")
    monkeypatch.setenv("RIFFLE_DAEMON_MODE", "two-pass")
    # Long enough that torchrun's teardown (seconds after the ranks hung up) leaves the
    # daemon there for the stats below; a daemon gone by then would be started afresh.
    monkeypatch.setenv("RIFFLE_DAEMON_IDLE", "15")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "python"))
    n = 20000
    data = tmp_path / "train.npy"
    gen(data, n)
    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = subprocess.Popen([torchrun, "--nproc-per-node", "4", "--master-port", str(port),
                            str(ROOT / "examples" / "train.py"), str(data), str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, scratch = set(), set()
    while job.poll() is None:
        seen.update(daemons(rundir))
        scratch.update(p.name for p in tmp_path.iterdir() if p.name.startswith(".riffle"))
        time.sleep(0.05)
    text = job.communicate()[0]
    assert job.returncode == 0, text[-3000:]
    with riffle.node.client() as c:
        st = c.stats()
    assert scratch, "the two-pass daemon made no scratch beside the dataset"
    assert len(seen) == 1, f"daemons seen: {seen}"
    import torch
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(4)]
    assert len({r["steps"] for r in ranks}) == 1, [r["steps"] for r in ranks]
    ids = np.concatenate([np.asarray(r["ids"], dtype=np.int64) for r in ranks])
    assert np.array_equal(np.sort(ids), np.arange(n)), "the union is the epoch, once"
    assert st["jobs_total"] == 1 and st["late_streams"] == 0, st["jobs"]
    assert wait_gone(rundir, 15 + 10), "the daemon outlived its idle time"
    assert not (rundir / "riffle.sock").exists()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".riffle")]
    assert left == [], left


def test_a_runtime_dir_that_cannot_be_made_says_what_to_do(monkeypatch):
    monkeypatch.setenv("RIFFLE_RUNTIME_DIR", "/proc/riffle-cannot-be-here")
    with pytest.raises(riffle.RiffleRuntimeDirError) as e:
        riffle.node.client()
    assert "cannot make" in str(e.value) and "RIFFLE_RUNTIME_DIR" in str(e.value), str(e.value)


def test_a_killed_daemon_is_replaced_by_the_next_client(rundir, tmp_path):
    """SIGKILL leaves its socket behind (nobody listens there): the next client starts a
    new daemon, which replaces the stale socket."""
    data = tmp_path / "d.npy"
    gen(data, 500)
    with riffle.node.client() as c:
        assert len(read_all(c, str(data))) == 500
    (pid,) = daemons(rundir)
    os.kill(pid, 9)
    assert wait_gone(rundir, 10)
    assert (rundir / "riffle.sock").exists(), "SIGKILL left no socket: nothing tested"
    with riffle.node.client() as c:
        assert len(read_all(c, str(data))) == 500
    assert daemons(rundir) not in ([], [pid])


def test_a_short_visit_counts_as_activity(rundir, monkeypatch):
    """Idleness counts from the last connection however short it was (a STATS-only
    visit that came and went between two looks of the daemon was missed: it left 12 s
    into a 20 s idle time after the visit)."""
    monkeypatch.setenv("RIFFLE_DAEMON_IDLE", "4")
    riffle.node.client().close()
    (pid,) = daemons(rundir)
    time.sleep(3)
    with riffle.node.client() as c:
        c.stats()
    time.sleep(2.5)
    assert daemons(rundir) == [pid], "the daemon left 2.5 s after a visit, with 4 s idle time"
    assert wait_gone(rundir, 4 + 10)


@pytest.mark.parametrize("limit,clients", [(128, 16), (64, 5)])
def test_a_daemon_started_under_a_low_open_file_limit_fits_it(rundir, tmp_path, limit, clients,
                                                               monkeypatch):
    """A training process under `ulimit -n 128` (or 64) starts the daemon, which inherits
    the limit: it serves fewer clients at once rather than refusing to start (it exited
    1, "--max-clients 64 may hold 192 open files", before), and keeps enough for a read
    (at 64, connections took so many that a two-pass read, 29 files, was too_large)."""
    import resource
    monkeypatch.setenv("RIFFLE_DAEMON_MODE", "two-pass")
    data = tmp_path / "d.npy"
    gen(data, 2000)
    script = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport riffle\n"
              "with riffle.node.client() as c:\n"
              "    print(sum(len(b) for b in c.stream(sys.argv[2], batch_size=100, world=2, rank=0)))\n")

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    r = subprocess.run([sys.executable, "-c", script, str(ROOT / "python"), str(data)],
                       preexec_fn=low, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1000"]
    log = (rundir / "daemon.log").read_text()
    assert f"{clients} clients at most" in log, log


def test_status_and_stop_from_the_command_line(rundir, tmp_path):
    data = tmp_path / "d.npy"
    gen(data, 300)
    cmd = [RIFFLE, "serve", "--user", "--runtime-dir", str(rundir)]
    r = subprocess.run(cmd + ["--status", "--json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and json.loads(r.stdout)["running"] is False, r
    with riffle.node.client() as c:
        assert len(read_all(c, str(data))) == 300
        r = subprocess.run(cmd + ["--status", "--json"], capture_output=True, text=True, timeout=30)
        s = json.loads(r.stdout)
        assert r.returncode == 0 and s["running"] and s["datasets"] == [str(data)], s
        (pid,) = daemons(rundir)
        assert s["daemon"] == f"pid {pid}, riffle {riffle.VERSION}"
    r = subprocess.run(cmd + ["--stop"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"pid {pid}" in r.stdout, r
    assert not daemons(rundir) and not (rundir / "riffle.sock").exists()
    r = subprocess.run(cmd + ["--stop"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no riffle node daemon runs" in r.stdout, r


def test_a_starter_that_meets_a_daemon_on_its_way_out_starts_a_new_one(rundir):
    """A daemon stopping (SIGTERM: it lets its socket go before its lock) when a starter
    comes: the starter's daemon exits 3 (the directory is held), and the starter starts
    one again once the old one is gone, instead of waiting out its 120 s for a socket."""
    os.makedirs(rundir, 0o700)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time\n"
         "f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "f.write('1 riffle 0.0.0\\n'); f.flush(); print('held', flush=True); time.sleep(1.5)\n",
         str(rundir / "daemon.lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    t = time.monotonic()
    with riffle.node.client() as c:
        assert c.agent == f"riffle {riffle.VERSION}"
    assert holder.wait(timeout=10) == 0
    assert time.monotonic() - t < 60, "the starter waited for the socket of a daemon that was gone"


def test_a_socket_a_neighbour_serves_is_never_used(rundir, tmp_path):
    """A neighbour who made the runtime directory first and listens on its socket gets no
    client: the fast path (a connect before any directory check) took it for the node
    daemon before, sending it the dataset's path and taking its batches. The client now
    checks the serving process's uid (SO_PEERCRED)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a neighbour as another user (uid 65534)")
    os.chmod(rundir.parent, 0o711)
    os.mkdir(rundir, 0o755)
    os.chown(rundir, 65534, 65534)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            srv = socket.socket(socket.AF_UNIX)
            srv.bind(str(rundir / "riffle.sock"))
            srv.listen(4)
            os.write(w, b"ready")
            while True:
                conn, _ = srv.accept()
                conn.recv(4096)
                body = b'{"version": %d, "agent": "riffle %s", "datasets": []}' % (
                    riffle.PROTOCOL_VERSION, riffle.VERSION.encode())
                conn.sendall(len(body + b"x").to_bytes(4, "little") + bytes([1]) + body)
                conn.recv(4096)
                conn.close()
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 5) == b"ready"
        with pytest.raises(riffle.RiffleRuntimeDirError) as e:
            riffle.node.client()
        assert "uid 65534" in str(e.value) and "not by yours" in str(e.value), str(e.value)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)


def test_status_into_a_closed_pipe_ends_quietly(rundir, tmp_path):
    """`riffle serve --user --status | head -0`: the reader has gone, so the command ends
    with 141 as coreutils do, no panic (println! panicked on EPIPE before)."""
    with riffle.node.client():
        r, w = os.pipe()
        os.close(r)
        p = subprocess.run([RIFFLE, "serve", "--user", "--runtime-dir", str(rundir), "--status"],
                           stdout=w, stderr=subprocess.PIPE, text=True, timeout=30)
        os.close(w)
    assert p.returncode == 141 and "panicked" not in p.stderr, (p.returncode, p.stderr)
