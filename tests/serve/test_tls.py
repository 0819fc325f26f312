"""`castslice serve` with TLS: it serves HTTPS, and picks up a renewed certificate without restart."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from function.serve.tls import CertificateWatcher

CASTSLICE = str(Path(sys.executable).parent / "castslice")


def write_pair(directory: Path, common_name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    # Write beside and rename: a Secret volume also swaps its files atomically.
    for path, data in (
        (cert_path, cert.public_bytes(serialization.Encoding.PEM)),
        (
            key_path,
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        ),
    ):
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
    return cert_path, key_path


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
