"""``castslice control``: the controller process (the composition root of function/control/).

One process = the cluster view's watches (always, so a standby has a warm view), a leader elector
on a ``coordination.k8s.io/v1`` Lease, the runner that starts the reconcilers' workers while this
process leads, and a small HTTP server: ``/healthz`` (the elector loop is alive), ``/readyz`` (the
watches have listed once: a standby is ready too, so a rolling update proceeds; objects the view
could not read are named in its answer) and ``/metrics`` (``castslice_control_*``, the view's
``castslice_view_*``, and the audit stream's ``castslice_audit_*`` of its one recorder, which every
reconciler's events go through). SIGTERM stops leading, releases the Lease, drains the events and
exits, so the other replica takes over within its retry period.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from function.contract import (
    CONTROL_LEASE_NAME,
    CONTROL_PORT,
    HEALTHZ_PATH,
    LOCAL_HOST,
    METRICS_PATH,
    READYZ_PATH,
)
from function.control.fence import Fence, term_user_agent
from function.control.reconciler import Emit, Reconciler
from function.control.runner import Runner
from function.core.config import Config
from function.core.view import merge_specs
from function.kube.client import Api
from function.kube.elector import LEASE_SECONDS, RENEW_DEADLINE, RETRY_SECONDS, LeaderElector, LeaseLock
from function.kube.watch import ClusterWatcher, Transport

if TYPE_CHECKING:
    from function.audit.recorder import AuditRecorder

log = logging.getLogger("castslice.control")

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_LEASE_NAME = CONTROL_LEASE_NAME


@dataclass(frozen=True)
class ControlSettings:
    lease_name: str = DEFAULT_LEASE_NAME
    lease_namespace: str = ""
    identity: str = ""
    lease_seconds: float = LEASE_SECONDS
    renew_deadline: float = RENEW_DEADLINE
    retry_seconds: float = RETRY_SECONDS
    host: str = LOCAL_HOST
    port: int = CONTROL_PORT


def own_namespace(environ: Mapping[str, str]) -> str:
    """POD_NAMESPACE (downward API), else the mounted ServiceAccount's namespace, else default."""
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or "default"
    except OSError:
        return "default"


def own_identity(environ: Mapping[str, str]) -> str:
    """POD_NAME (downward API), else the host name plus the process id (unique on one machine)."""
    return environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def build_reconcilers(config: Config, api: Api, emit: Emit = lambda event: None) -> list[Reconciler]:
    """The enabled reconcilers, writing through ``api``, their events to ``emit`` (the process's
    one recorder; by default nowhere)."""
    from function.control.reconcilers import PLUGINS

    built = (plugin.build(config, api, emit) for plugin in PLUGINS)
    return [reconciler for reconciler in built if reconciler is not None]


class Controller:
    """The pieces of one controller process, wired; ``start`` / ``stop`` for tests and the CLI."""

    def __init__(
        self,
        reconcilers: Sequence[Reconciler],
        api: Api,
        transport: Transport,
        settings: ControlSettings,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        registry: CollectorRegistry | None = None,
        audit: AuditRecorder | None = None,
        fence: Fence | None = None,
    ) -> None:
        """``registry``: the process's metrics (the audit recorder's among them), served on
        /metrics; ``audit``: the recorder the reconcilers' events go through, drained at stop;
        ``fence``: the Api the reconcilers were built with (its writes bound to the term of the
        worker that makes them)."""
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.audit = audit
        self.runner: Runner
        specs = merge_specs(spec for reconciler in reconcilers for spec in reconciler.watches)
        self.watcher = ClusterWatcher(
            specs, transport, registry=self.registry, freeze_gc=True, listener=self._changed
        )
        self.runner = Runner(
            reconcilers,
            self.watcher.snapshot,
            self.registry,
            lambda indices, timeout: self.watcher.wait_synced(timeout, indices),
            now=now,
            fence=fence,
        )
        self.elector = LeaderElector(
            LeaseLock(api, settings.lease_namespace, settings.lease_name),
            settings.identity,
            on_started=self.runner.start_leading,
            on_stopped=self.runner.stop_leading,
            lease_seconds=settings.lease_seconds,
            renew_deadline=settings.renew_deadline,
            retry_seconds=settings.retry_seconds,
        )
        self._elector_thread: threading.Thread | None = None
        self._server: ThreadingHTTPServer | None = None
        self._server_thread: threading.Thread | None = None

    def _changed(self, index: str, old: Any, new: Any) -> None:
        self.runner.changed(index, old, new)

    # -- health -----------------------------------------------------------------------------------
    def healthy(self) -> bool:
        """The elector loop runs (a hung loop would neither lead nor hand over)."""
        thread = self._elector_thread
        if thread is None or not thread.is_alive():
            return False
        stale = time.monotonic() - self.elector.last_loop
        return stale < 3 * self.settings.lease_seconds

    def ready(self) -> bool:
        return self.watcher.synced()

    def readiness(self) -> tuple[bool, str]:
        """Ready or not, and what the answer says: objects the view could not read and left out
        are named (still ready: one object does not stop the rest)."""
        ok = self.ready()
        lines = ["ok" if ok else "cluster view not synced"]
        for index, objects in sorted(self.watcher.unreadable().items()):
            for name, why in sorted(objects.items()):
                lines.append(f"unreadable, left out of the view: {index} {name}: {why}")
        return ok, "\n".join(lines) + "\n"

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    # -- life -------------------------------------------------------------------------------------
    def start(self, serve_http: bool = True) -> None:
        self.watcher.start()
        if serve_http:
            self._server = ThreadingHTTPServer((self.settings.host, self.settings.port), _handler(self))
            self._server.daemon_threads = True
            self._server_thread = threading.Thread(
                target=self._server.serve_forever, name="castslice-control-http", daemon=True
            )
            self._server_thread.start()
        self._elector_thread = threading.Thread(
            target=self.elector.run, name="castslice-control-elector", daemon=True
        )
        self._elector_thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server is not None else 0

    def stop(self, timeout: float = 10.0) -> None:
        """Stop leading (the workers first), release the Lease, then stop watching and serving."""
        self.elector.stop()
        if self._elector_thread is not None:
            self._elector_thread.join(timeout)
        self.watcher.stop()
        if self.audit is not None:
            self.audit.close(timeout)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _handler(controller: Controller) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == METRICS_PATH:
                self._reply(200, controller.metrics_text(), CONTENT_TYPE_LATEST)
            elif path == HEALTHZ_PATH:
                ok = controller.healthy()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"elector not running\n")
            elif path == READYZ_PATH:
                ok, detail = controller.readiness()
                self._reply(200 if ok else 503, detail.encode())
            else:
                self._reply(404, b"not found\n")

        def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def run_control(config: Config, settings: ControlSettings, environ: Mapping[str, str] | None = None) -> int:
    """Run until SIGTERM or SIGINT; then hand the Lease over and return 0."""
    from function.audit.recorder import build_recorder
    from function.kube.client import KubeClient, kube_client

    environ = os.environ if environ is None else environ
    client = kube_client(environ, user_agent=f"castslice-control/{settings.identity}")
    registry = CollectorRegistry()
    audit = build_recorder(config, environ, registry)  # one per process, counted on /metrics
    # The reconcilers write through the fence: each write in the term it was started in, with a
    # client whose User-Agent names the term (the apiserver's audit log then says who wrote what).
    fence = Fence(client, lambda term: KubeClient(client.configuration, term_user_agent(term)))
    reconcilers = build_reconcilers(config, fence, audit.emit)
    controller = Controller(
        reconcilers, client, client, settings, registry=registry, audit=audit, fence=fence
    )
    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("control: signal %d, handing over", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "control: %s competing for lease %s/%s with reconcilers %s; serving on %s:%d",
        settings.identity,
        settings.lease_namespace,
        settings.lease_name,
        [r.name for r in reconcilers] or "(none)",
        settings.host,
        settings.port,
    )
    controller.start()
    while not stopping.wait(1.0):
        pass
    controller.stop()
    return 0
