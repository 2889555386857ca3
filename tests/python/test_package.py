"""The Python package carries the engine (issue 31, deliverable 1): `pip install ./python`
builds the `riffle` command with maturin and installs it beside the client; the client and
the engine have one version, checked at HELLO."""

import pathlib
import re
import socket
import struct
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import riffle  # noqa: E402


def test_one_version_for_the_client_and_the_engine():
    cargo = (ROOT / "Cargo.toml").read_text()
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', cargo, re.M | re.S)
    assert m, "no [workspace.package] version in Cargo.toml"
    assert riffle.VERSION == m.group(1) == riffle.__version__
    py = (ROOT / "python" / "pyproject.toml").read_text()
    # The wheel's version is the engine's (maturin reads it from Cargo.toml).
    assert 'dynamic = ["version"]' in py and "\nversion =" not in py


def test_the_installed_package_carries_its_engine(monkeypatch):
    # The package's own, not a development build RIFFLE_BIN names.
    monkeypatch.delenv("RIFFLE_BIN", raising=False)
    try:
        path = riffle.binary()
    except riffle.RiffleEngineMissing as e:
        pytest.skip(f"the riffle package is not installed with pip here: {e}")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"riffle {riffle.VERSION}", out.stdout


def test_a_daemon_of_another_version_is_a_clear_error(tmp_path):
    """A daemon that outlived an upgrade says so at HELLO, with what to do."""
    path = str(tmp_path / "old.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def old_daemon():
        conn, _ = srv.accept()
        with conn:
            n = struct.unpack("<I", conn.recv(4))[0]
            conn.recv(n)
            body = b'{"version": %d, "agent": "riffle 0.0.9", "datasets": []}' % riffle.PROTOCOL_VERSION
            conn.sendall(struct.pack("<I", len(body) + 1) + bytes([1]) + body)
            conn.recv(1)

    t = threading.Thread(target=old_daemon, daemon=True)
    t.start()
    with pytest.raises(riffle.RiffleVersionMismatch) as e:
        riffle.Client(path)
    msg = str(e.value)
    assert "riffle 0.0.9" in msg and f"riffle {riffle.VERSION}" in msg and "stop that daemon" in msg
    srv.close()
