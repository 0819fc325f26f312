"""What the end-to-end tests start beside the control plane: ``castslice serve`` with TLS on
loopback, exactly as the Deployment overlay runs it; ``castslice control``; a broker stand-in that
records the CloudEvents they send; and the project's own webhook configurations pointed at the
local server."""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import http.server
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import PREEXEC, free_port, kill_group

from .controlplane import ControlPlane

CASTSLICE = str(Path(sys.executable).parent / "castslice")
READY_SECONDS = 60.0
"""How long a server may take to answer /readyz 200 (a bound against hanging, not a speed)."""


# -- a broker stand-in that records the CloudEvents the webhook sends ----------------------------
class EventLog:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def subjects(self) -> list[str]:
        with self.lock:
            return [e["headers"].get("ce-subject", "") for e in self.events]


def start_event_sink(log: EventLog) -> tuple[str, http.server.ThreadingHTTPServer]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            with log.lock:
                log.events.append({"headers": headers, "body": body})
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", server


# -- the webhook ---------------------------------------------------------------------------------
class ServedWebhook:
    """``castslice serve --tls-cert --tls-key`` on loopback with ``config``, its audit events sent
    to ``sink``; with ``kubeconfig``, its watches read the cluster as that kubeconfig's user."""

    def __init__(
        self,
        plane: ControlPlane,
        name: str,
        config: dict[str, Any],
        sink: str,
        *,
        kubeconfig: Path | None = None,
        workers: int = 1,
        tls: tuple[Path, Path, Path] | None = None,
        port: int | None = None,
        ready: bool = True,
    ) -> None:
        """``tls``: (certificate, key, the CA that issued it) to serve instead of a certificate
        from the test CA (castslice certgen's, in tests/e2e/test_certgen_e2e.py); ``port``: where,
        when a registration already names it; ``ready``: wait for /readyz (else only /healthz: a
        webhook expected never to become ready)."""
        self.name = name
        self.port = port if port is not None else free_port()
        if tls is None:
            issued = plane.issue_cert(
                f"webhook-{name}", "127.0.0.1", ip_addresses=["127.0.0.1"], dns_names=["localhost"]
            )
            tls = (issued.cert, issued.key, plane.ca_cert)
        cert_path, key_path, ca_path = tls
        self.config_path = plane.workdir / f"castslice-{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = plane.workdir / f"castslice-{name}.log"
        env = {
            **os.environ,
            "CASTSLICE_CONFIG": str(self.config_path),
            "K_SINK": sink,
            "HOME": str(plane.workdir),
            "WORKERS": str(workers),
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        command = [CASTSLICE, "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]
        with self.log_path.open("wb") as log:
            # Its own process group (gunicorn and its workers stop together) that dies with pytest.
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=PREEXEC,
            )
        self.url = f"https://127.0.0.1:{self.port}"
        self.context = ssl.create_default_context(cafile=str(ca_path))
        # /readyz answers 200 only once the watches have listed (a worker's own view): with two
        # workers, ask until several answers in a row are ready.
        for _ in range(2 * workers + 1):
            self._wait_ready("/readyz" if ready else "/healthz")

    def _wait_ready(self, path: str = "/readyz") -> None:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"castslice serve ({self.name}) exited: {self.log_path.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(self.url + path, context=self.context, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"castslice serve ({self.name}) not ready: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def metrics(self) -> str:
        """The /metrics of whichever worker answers this new connection."""
        with urllib.request.urlopen(self.url + "/metrics", context=self.context, timeout=5) as answer:
            text: str = answer.read().decode()
        return text

    def admissions(self) -> float:
        """How many admission requests the worker that answers has answered."""
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in self.metrics().splitlines()
            if line.startswith("castslice_admission_requests_total{")
        )

    def admissions_by_worker(self, probes: int = 20) -> list[float]:
        """Admission requests answered, per worker seen: each probe is a new connection, which the
        kernel hands to either worker, so with two workers both totals show up."""
        return sorted({self.admissions() for _ in range(probes)})

    def view_objects(self, index: str) -> float:
        """castslice_view_objects{index} from the /metrics of whichever worker answers."""
        prefix = f'castslice_view_objects{{index="{index}"}} '
        return max(
            (float(line[len(prefix) :]) for line in self.metrics().splitlines() if line.startswith(prefix)),
            default=-1,
        )

    def stop(self) -> None:
        kill_group(self.process, timeout=15)


# -- the controller ----------------------------------------------------------------------------
class ServedController:
    """``castslice control`` with ``config``, leading through a Lease in ``lease_namespace``, as
    the admin or, with ``kubeconfig``, as that kubeconfig's user; ``extra`` arguments (faster
    election timings)."""

    def __init__(
        self,
        plane: ControlPlane,
        name: str,
        config: Path,
        sink: str,
        lease_namespace: str,
        *,
        kubeconfig: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = plane.workdir / f"castslice-control-{name}.log"
        env = {
            **os.environ,
            "CASTSLICE_CONFIG": str(config),
            "KUBECONFIG": str(kubeconfig or plane.kubeconfig),
            "HOME": str(plane.workdir),
            "K_SINK": sink,
        }
        command = [CASTSLICE, "control", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--lease-namespace", lease_namespace, "--identity", name, *extra]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=PREEXEC,
            )

    def metric(self, name: str) -> float | None:
        """A sample of /metrics (the first with that name), or None when the process does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except (OSError, http.client.HTTPException):  # a process stopping mid-reply: IncompleteRead
            return None
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def leading(self) -> bool:
        return self.metric("castslice_control_is_leader") == 1.0

    def answers(self, path: str) -> bool:
        """Whether ``path`` answers 200 (``/readyz``: the controller is ready)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                kill_group(self.process)


def pointed_at(
    configuration: dict[str, Any], name: str, url: str, ca: bytes, route: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A copy of a rendered webhook configuration of the project's (mutating or validating) named
    ``name``, each hook calling ``url`` with the test CA as caBundle (no cert-manager here) and
    named after ``name``; ``route``, a namespaceSelector expression, sends only the namespaces it
    selects to this server (several servers share one apiserver)."""
    configuration = copy.deepcopy(configuration)
    configuration["metadata"] = {"name": name}
    for hook in configuration["webhooks"]:
        path = hook["clientConfig"].get("path") or "/" + hook["clientConfig"]["url"].split("/", 3)[3]
        hook["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca).decode()}
        hook["name"] = f"{name}.castslice.castops.io"
        if route is not None:
            hook["namespaceSelector"]["matchExpressions"].append(route)
    return configuration


# -- several servers behind one address --------------------------------------------------------
class ServiceProxy:
    """One address in front of several servers, as a Service is in front of its Pods: each new TCP
    connection goes to the next endpoint in turn (TLS passes through; every server's certificate
    names 127.0.0.1), as kube-proxy balances per connection. Endpoints come and go (``add``,
    ``remove_later``: an endpoint leaves a while after its Pod is told to terminate); a connection
    with no endpoint, or one whose endpoint refuses it, is closed and counted."""

    def __init__(self, endpoints: Iterable[int] = ()) -> None:
        self.endpoints: list[int] = list(endpoints)
        self.lock = threading.Lock()
        self.turn = 0
        self.connections: dict[int, int] = {}
        self.refused = 0
        self.no_endpoint = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, port: int) -> None:
        with self.lock:
            self.endpoints.append(port)

    def remove_later(self, port: int, lag: float) -> None:
        def remove() -> None:
            with self.lock:
                self.endpoints.remove(port)

        threading.Timer(lag, remove).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                if not self.endpoints:
                    self.no_endpoint += 1
                    client.close()
                    continue
                port = self.endpoints[self.turn % len(self.endpoints)]
                self.turn += 1
                self.connections[port] = self.connections.get(port, 0) + 1
            try:
                upstream = socket.create_connection(("127.0.0.1", port))
            except OSError:
                with self.lock:
                    self.refused += 1
                client.close()
                continue
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        self.listener.close()


class TwoBehindOne:
    """Two single-worker servers (each its own view and ledger) behind one address."""

    def __init__(self, name: str, servers: list[ServedWebhook]) -> None:
        self.name = name
        self.servers = servers
        self.proxy = ServiceProxy([server.port for server in servers])
        self.url = f"https://127.0.0.1:{self.proxy.port}"

    def admissions_by_worker(self) -> list[float]:
        return [server.admissions_by_worker(1)[0] for server in self.servers]

    def stop(self) -> None:
        self.proxy.stop()
        for server in self.servers:
            server.stop()


class DelayProxy:
    """A TCP proxy in front of the apiserver that can be made slow: what a client sends goes through
    at once, what the apiserver answers is held ``delay`` seconds (set at any time; it applies to
    the bytes read from then on) before it reaches the client, in order. A renewal that reached
    the apiserver is then acknowledged too late: the client cannot know it renewed."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self._sockets += [client, upstream]
            threading.Thread(target=ServiceProxy._pump, args=(client, upstream), daemon=True).start()
            held: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=self._hold, args=(upstream, held), daemon=True).start()
            threading.Thread(target=self._release, args=(held, client), daemon=True).start()

    def _hold(self, source: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while data := source.recv(65536):
                held.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        held.put((time.monotonic() + self.delay, b""))

    @staticmethod
    def _release(held: queue.Queue[tuple[float, bytes]], target: socket.socket) -> None:
        while True:
            due, data = held.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)
                return
            try:
                target.sendall(data)
            except OSError:
                return

    def stop(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
