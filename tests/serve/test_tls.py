"""`castslice serve` with TLS: it serves HTTPS, and picks up a renewed certificate without restart."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from function.serve.tls import CertificateWatcher
from tests.support.tls import write_pair

CASTSLICE = str(Path(sys.executable).parent / "castslice")


def test_watcher_reports_a_renewed_pair_once(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "first")
    calls: list[int] = []
    watcher = CertificateWatcher(cert, key, on_change=lambda: calls.append(1))
    assert not watcher.check()
    write_pair(tmp_path, "second")
    assert watcher.check() and calls == [1]
    assert not watcher.check() and calls == [1]


def test_watcher_waits_for_a_pair_that_loads(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "first")
    calls: list[int] = []
    watcher = CertificateWatcher(cert, key, on_change=lambda: calls.append(1))
    other = tmp_path / "other"
    other.mkdir()
    _, other_key = write_pair(other, "other")
    os.replace(other_key, key)  # a key that does not match the certificate (half-updated)
    assert not watcher.check() and calls == []
    write_pair(tmp_path, "third")
    assert watcher.check() and calls == [1]


def served_common_name(port: int) -> str:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    common_name = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common_name[0].value)


def test_serve_over_tls_and_reload_a_renewed_certificate(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "before-renewal")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HOME": str(tmp_path), "CASTSLICE_TLS_RELOAD_SECONDS": "0.3"}
    env.pop("CASTSLICE_CONFIG", None)
    server = subprocess.Popen(
        [
            CASTSLICE,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *("--tls-cert", str(cert)),
            *("--tls-key", str(key)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the finally below ends gunicorn's worker too
    )
    try:
        deadline = time.monotonic() + 30
        name = ""
        while time.monotonic() < deadline and not name:
            try:
                name = served_common_name(port)
            except OSError:
                time.sleep(0.2)
        assert name == "before-renewal"
        write_pair(tmp_path, "after-renewal")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and name != "after-renewal":
            time.sleep(0.3)
            try:
                name = served_common_name(port)
            except OSError:
                continue
        assert name == "after-renewal"
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=15)
