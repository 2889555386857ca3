"""This user's node daemon, found or started from a training script with no set-up.

    import riffle
    with riffle.node.client() as c:                  # starts the daemon if none runs
        for b in c.stream(riffle.node.dataset_name("train.npy"), batch_size=256):
            ...

`riffle.torch.loader("/data/train.npy", batch_size=256)` does this for you. There is one
daemon per user and node (`riffle serve --user`), in a private directory:
`$RIFFLE_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/riffle`, else `${TMPDIR:-/tmp}/riffle-UID`
(mode 0700; its socket is mode 0600 and the daemon serves only its own user). Every rank
and DataLoader worker of every job of the user on the node joins it. It opens the
datasets its clients name by absolute path, as the user, and exits after an idle time
(default 300 s with no client), removing its socket and scratch.

When a client starts it, the daemon gets these options (from the `daemon` argument, a
dict, or else the environment):

| option    | environment            | `riffle serve` flag | default                        |
|-----------|------------------------|---------------------|--------------------------------|
| `memory`  | RIFFLE_DAEMON_MEMORY   | --memory            | the machine's budget (a quarter of the available memory, less under a cgroup limit) |
| `idle`    | RIFFLE_DAEMON_IDLE     | --exit-idle         | 300 (seconds)                  |
| `mode`    | RIFFLE_DAEMON_MODE     | --mode              | auto                           |
| `scratch` | RIFFLE_DAEMON_SCRATCH  | --scratch           | beside each dataset            |
| `cache_limit` | RIFFLE_DAEMON_CACHE_LIMIT | --cache-limit | none: an s3:// dataset is staged whole |

An `s3://bucket/prefix/` dataset is opened by the daemon with its own environment (the
`AWS_*` variables and profile it was started with, those of the process that started it)
and its `cache_limit`: staged whole when it fits, else streamed two-pass within it. So
`riffle.torch.loader` refuses an `s3://` dataset when the daemon's object-store variables
(endpoint, region, keys, profile, `RIFFLE_S3_CACHE`) are not this process's
(`check_store_env`): it would read another store's objects in silence.

A daemon already running keeps the options it was started with.
"""

import fcntl
import os
import socket
import stat
import struct
import subprocess
import time
import warnings

from .client import (VERSION, Client, RiffleConnectionError, RiffleError,
                     RiffleVersionMismatch, binary)

SOCKET = "riffle.sock"
START_LOCK = "start.lock"
# Datasets in object storage, named as they are.
S3 = "s3://"
LIFE_LOCK = "daemon.lock"
LOG = "daemon.log"
# Exit status of `riffle serve --user` when another daemon serves the directory.
ALREADY_RUNNING = 3
# How long a starter waits for a daemon another process is starting.
START_WAIT = 120.0
_OPTIONS = {"memory": ("RIFFLE_DAEMON_MEMORY", "--memory"),
            "idle": ("RIFFLE_DAEMON_IDLE", "--exit-idle"),
            "mode": ("RIFFLE_DAEMON_MODE", "--mode"),
            "scratch": ("RIFFLE_DAEMON_SCRATCH", "--scratch"),
            "cache_limit": ("RIFFLE_DAEMON_CACHE_LIMIT", "--cache-limit")}


class RiffleRuntimeDirError(RiffleError):
    """The daemon's private directory cannot be made or is not yours alone: set
    RIFFLE_RUNTIME_DIR to a directory you own (it is made mode 0700)."""

    def __init__(self, message):
        super().__init__(message, code="runtime_dir", fatal=True)


class RiffleDaemonError(RiffleError):
    """The node daemon did not start: the message holds the end of its log."""

    def __init__(self, message):
        super().__init__(message, code="daemon", fatal=True)


def runtime_dir():
    """The directory of this user's node daemon (see the module's doc)."""
    d = os.environ.get("RIFFLE_RUNTIME_DIR")
    if d:
        return d
    x = os.environ.get("XDG_RUNTIME_DIR")
    if x and os.path.isabs(x) and os.path.isdir(x):
        return os.path.join(x, "riffle")
    t = os.environ.get("TMPDIR")
    if not (t and os.path.isabs(t)):
        t = "/tmp"
    return os.path.join(t, f"riffle-{os.geteuid()}")


def socket_path():
    """The node daemon's socket."""
    return os.path.join(runtime_dir(), SOCKET)


def dataset_name(path):
    """The name a dataset path (or `mix:` spec, or `PATH:FORMAT`) has in the daemon: its
    paths made absolute, as the daemon (whose directory is not yours) opens them; an
    `s3://` URL is left as it is."""
    word = os.fspath(path)
    if not isinstance(word, str):
        word = os.fsdecode(word)
    if word.startswith(S3):
        return word
    if word.startswith("mix:"):
        body, size = word[4:], ""
        if ";size=" in body:
            body, size = body.rsplit(";size=", 1)
            size = ";size=" + size
        parts = []
        for src in body.split(","):
            name, sep, rest = src.partition("=")
            if not sep:
                parts.append(src)
                continue
            p, star, weight = rest.rpartition("*")
            if not star:
                p, weight = rest, None
            p = p if p.startswith(S3) else os.path.abspath(p)
            parts.append(f"{name}={p}*{weight}" if weight is not None else f"{name}={p}")
        return "mix:" + ",".join(parts) + size
    return os.path.abspath(word)


def _prepare(d):
    """Makes `d` (0700) if missing and checks it is the user's alone."""
    if len(os.path.join(d, SOCKET).encode()) > 107:
        raise RiffleRuntimeDirError(
            f"{d}: the socket path would pass the 107 bytes a Unix socket may have: set "
            f"RIFFLE_RUNTIME_DIR to a shorter directory")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise RiffleRuntimeDirError(
            f"{d}: cannot make the riffle daemon's directory ({e.strerror}): set "
            f"RIFFLE_RUNTIME_DIR to a directory you can write") from e
    st = os.lstat(d)
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != os.geteuid():
        why = f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    elif st.st_mode & 0o077:
        why = f"is open to others (mode {st.st_mode & 0o777:o}; it must be 700)"
    if not why:
        # Whoever may rename entries of the parent could swap the directory after this
        # check: the parent must be yours or root's, and sticky if others may write it.
        parent = os.path.dirname(os.path.abspath(d))
        p = os.stat(parent)
        if p.st_uid not in (os.geteuid(), 0):
            why = f"is in {parent}, which belongs to uid {p.st_uid}"
        elif p.st_mode & 0o022 and not p.st_mode & stat.S_ISVTX:
            why = f"is in {parent}, which others may write and is not sticky (mode {p.st_mode & 0o7777:o})"
    if why:
        raise RiffleRuntimeDirError(
            f"{d}: {why}: the riffle daemon's socket needs a directory only you can enter; "
            f"remove it, or set RIFFLE_RUNTIME_DIR to another")


def _args(daemon):
    """The `riffle serve` flags of the options (see the module's doc)."""
    daemon = dict(daemon or {})
    unknown = set(daemon) - set(_OPTIONS)
    if unknown:
        raise ValueError(f"unknown daemon options {sorted(unknown)}: known are {sorted(_OPTIONS)}")
    args = []
    for key, (env, flag) in _OPTIONS.items():
        v = daemon.get(key, os.environ.get(env))
        if v not in (None, ""):
            args += [flag, str(v)]
    return args


# What the daemon opens an s3:// dataset with: the endpoint, region, keys and profile
# (riffle's S3Config reads these), and where it caches. Keys are compared, never shown.
_STORE_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "AWS_REGION",
               "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
               "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_ACCESS_KEY_ID",
               "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP",
               "RIFFLE_S3_CACHE")
_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def check_store_env(name, d=None):
    """Refuses a dataset naming `s3://` (`name` as `dataset_name` gives it) that the node
    daemon would open with another object-store environment than this process's: the
    daemon reads objects with the `AWS_*` variables it was started with, so a job whose
    endpoint, region, keys or profile differ would be served another store's objects (or
    another account's) in silence. Nothing is checked where the daemon's environment
    cannot be read (another process's /proc hidden)."""
    if S3 not in name:
        return
    d = d or runtime_dir()
    pid, _ = _holder(d)
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            raw = f.read()
    except (TypeError, ValueError, OSError):
        return
    theirs = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            theirs[os.fsdecode(k)] = os.fsdecode(v)
    differ = [k for k in _STORE_VARS if theirs.get(k) != os.environ.get(k)]
    if not differ:
        return
    said = []
    for k in differ:
        if k in _SECRETS:
            said.append(f"{k} differs")
        else:
            said.append(f"{k} is {theirs.get(k, '(unset)')!r} there and "
                        f"{os.environ.get(k, '(unset)')!r} here")
    raise RiffleDaemonError(
        f"the node daemon (pid {pid}) opens s3:// datasets with the object-store "
        f"environment it was started with, which is not this process's: {'; '.join(said)}. "
        f"Stop it (`riffle serve --user --stop`) once its jobs are done, or give this job a "
        f"daemon of its own (RIFFLE_RUNTIME_DIR set to another directory)")


def _holder(d):
    try:
        with open(os.path.join(d, LIFE_LOCK), "rb") as f:
            pid, _, version = f.read(256).decode(errors="replace").strip().partition(" ")
        return pid, version
    except OSError:
        return None, None


def _lock_free(d):
    """Whether no daemon holds the directory's daemon lock."""
    try:
        fd = os.open(os.path.join(d, LIFE_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _connect(sock, kw):
    """A client of the daemon at `sock`; None when nobody listens there (a daemon gone, or
    leaving); a `RiffleVersionMismatch` (returned, not raised) from a daemon of another
    version. A socket served by a process of another user is refused
    (`RiffleRuntimeDirError`): a neighbour who made the directory first must not be sent
    your datasets' paths, nor feed you batches."""
    try:
        c = Client(sock, **kw)
    except RiffleVersionMismatch as e:
        c = e
    except (RiffleConnectionError, OSError):
        return None
    peer = c if isinstance(c, Client) else None
    if peer is not None:
        _, uid, _ = struct.unpack("3i", peer._sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.geteuid():
            peer.close()
            raise RiffleRuntimeDirError(
                f"{sock} is served by a process of uid {uid}, not by yours (uid "
                f"{os.geteuid()}): not using it; remove {os.path.dirname(sock)} if it is "
                f"not yours, or set RIFFLE_RUNTIME_DIR to a directory of your own")
    return c


def _mismatch(e, d):
    """The error for a daemon of another version that could not be retired, saying how
    to stop it."""
    pid, version = _holder(d)
    how = f"`riffle serve --user --stop` (or `kill {pid}`)" if pid else "stop it"
    return RiffleVersionMismatch(
        f"{e} (a node daemon of {version or 'another version'} still runs, pid {pid or '?'}, "
        f"serving other clients: it leaves on its own once idle; to start this version's now, "
        f"{how}, or set RIFFLE_RUNTIME_DIR to keep the two apart)")


def _retire(d, sock):
    """Stops the node daemon of another version (after an upgrade) when nobody but this
    process uses it (`riffle serve --user --stop`: SIGTERM to the process of this user
    holding its lock, then a wait until the lock is free). False when it serves other
    clients, or would not go."""
    try:
        with Client(sock, _any_version=True) as c:
            agent = c.agent
            # This connection is one; the ones this process just closed may take a moment
            # to leave the daemon's count.
            for _ in range(10):
                if c.stats().get("clients", 2) <= 1:
                    break
                time.sleep(0.05)
            else:
                return False
    except (RiffleError, OSError):
        return False
    pid, _ = _holder(d)
    r = subprocess.run([binary(), "serve", "--user", "--runtime-dir", d, "--stop"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not _lock_free(d):
        return False
    warnings.warn(f"riffle: stopped the idle node daemon of {agent} (pid {pid}) to start "
                  f"riffle {VERSION}'s")
    return True


def client(daemon=None, **kw):
    """A `Client` of this user's node daemon, started first if none runs (exactly one
    comes up however many processes ask at once). A node daemon of another version that
    nobody else uses (left by an upgrade) is stopped and replaced; one that serves others
    is a `RiffleVersionMismatch` saying how to stop it. `daemon` holds the options a
    daemon started here gets (see the module's doc); `kw` are `Client`'s."""
    d = runtime_dir()
    sock = os.path.join(d, SOCKET)
    c = _connect(sock, kw)
    if isinstance(c, Client):
        return c
    _prepare(d)
    try:
        lock = os.open(os.path.join(d, START_LOCK),
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise RiffleRuntimeDirError(f"{d}: cannot open {START_LOCK}: {e.strerror}") from e
    try:
        # One starter at a time; a daemon leaving for idleness holds it too, until it is
        # gone, so what is found under it stays.
        fcntl.flock(lock, fcntl.LOCK_EX)
        c = _connect(sock, kw)
        if isinstance(c, Client):
            return c
        if isinstance(c, RiffleVersionMismatch) and not _retire(d, sock):
            raise _mismatch(c, d)
        return _start(d, sock, daemon, kw)
    finally:
        os.close(lock)


def _start(d, sock, daemon, kw):
    """Starts the daemon (`riffle serve --user --detach`) and connects to it. When another
    holds the directory (started by hand, or one that is stopping), waits for its socket,
    and starts again once it is gone."""
    deadline = time.monotonic() + START_WAIT
    while True:
        _spawn(d, daemon)
        while True:
            c = _connect(sock, kw)
            if isinstance(c, Client):
                return c
            if isinstance(c, RiffleVersionMismatch):
                raise _mismatch(c, d)
            if time.monotonic() > deadline:
                pid, _ = _holder(d)
                raise RiffleDaemonError(
                    f"a riffle daemon (pid {pid or '?'}) holds {d} but does not answer at "
                    f"{sock} after {START_WAIT:.0f} s: see {os.path.join(d, LOG)}")
            if _lock_free(d):
                break  # the one that held it is gone without a socket: start one
            time.sleep(0.05)


def _spawn(d, daemon):
    """Runs `riffle serve --user --detach`: returns once a daemon listens, or another
    holds the directory (exit 3)."""
    cmd = [binary(), "serve", "--user", "--runtime-dir", d, "--detach"] + _args(daemon)
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=START_WAIT + 10)
    except subprocess.TimeoutExpired as e:
        raise RiffleDaemonError(f"the riffle daemon did not start within {START_WAIT:.0f} s "
                                f"(see {os.path.join(d, LOG)})") from e
    if r.returncode not in (0, ALREADY_RUNNING):
        raise RiffleDaemonError(
            f"the riffle daemon did not start (`{' '.join(cmd)}` exited {r.returncode}):\n"
            f"{r.stderr.strip()}")
