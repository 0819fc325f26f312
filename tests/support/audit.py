"""Helpers for the audit tests, and a hanging sink for the benchmark.

Loopback servers that play a sink (recording, failing, hanging), a port nobody listens on, a
``castslice serve`` subprocess, and a bounded poll. Run as a script to get a hanging sink for the
benchmark (or any manual run):

    python -m tests.support.audit hang --port 18099 &
    K_SINK=http://127.0.0.1:18099 castslice serve --port 8080

The hanging sink accepts every connection, reads the request and never answers, so each delivery
attempt waits for ``audit.requestTimeoutSeconds``; the webhook's own latency must not change.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from cloudevents.http import CloudEvent

from function.admission.facts import audit_facts
from function.admission.review import Admission
from function.admission.wire import parse_review
from function.audit.events import build_event
from function.contract import DRAIN_SECONDS_ENV
from function.core.config import Config
from function.core.engine import Engine
from tests.support import load_review

ROOT = Path(__file__).resolve().parents[2]


def wait_for(
    condition: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll until ``condition()`` is truthy; its value, or AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def refused_url() -> str:
    """A loopback URL where nothing listens: every connection is refused at once."""
    return f"http://127.0.0.1:{free_port()}/"


# -- sinks on loopback --------------------------------------------------------------------------------
class RecordingSink:
    """An HTTP sink that records every POST and answers with ``statuses`` in turn (the last repeats)."""

    def __init__(
        self,
        statuses: Sequence[int] = (202,),
        headers: dict[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.statuses = list(statuses)
        self.extra_headers = headers or {}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a broker ingress does

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with sink._lock:
                    sink.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                    status = sink.statuses[min(len(sink.requests) - 1, len(sink.statuses) - 1)]
                self.send_response(status)
                for key, value in sink.extra_headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        if tls is not None:  # (certificate, key): serve HTTPS as https://localhost:<port>/
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.url = f"https://localhost:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def ids(self) -> list[str]:
        with self._lock:
            return [r["headers"].get("ce-id", "") for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HangingSink:
    """Accepts connections and reads requests, never answers (a broker that is up but stuck)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.listener = socket.create_server((host, port))
        self.port: int = self.listener.getsockname()[1]
        self.url = f"http://{host}:{self.port}/"
        self.connections: list[socket.socket] = []
        self.accepted = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self.connections.append(connection)  # kept open, never answered
            threading.Thread(target=self._swallow, args=(connection,), daemon=True).start()

    @staticmethod
    def _swallow(connection: socket.socket) -> None:
        try:
            while connection.recv(65536):
                pass
        except OSError:
            return

    def close(self) -> None:
        self._stopped.set()
        self.listener.close()
        for connection in self.connections:
            connection.close()


@contextmanager
def hanging_sink() -> Iterator[HangingSink]:
    """``with hanging_sink() as sink: ... K_SINK=sink.url ...`` (usable from the benchmark)."""
    sink = HangingSink()
    try:
        yield sink
    finally:
        sink.close()


# -- castslice serve as a subprocess ------------------------------------------------------------------
class Served:
    """``castslice serve`` (gunicorn + uvicorn worker, as in the Procfile) on a free loopback port."""

    def __init__(
        self,
        tmp: Path,
        target: str = "mutate",
        env: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = tmp / f"{target}-{self.port}.stdout"
        self.stderr_path = tmp / f"{target}-{self.port}.stderr"
        # No drain after SIGTERM unless a test asks for one (tests/serve/test_draining.py): the
        # audit tests time the shutdown after it.
        full_env = {**os.environ, "HOME": str(tmp), "WORKERS": "1", DRAIN_SECONDS_ENV: "0", **(env or {})}
        for key in ("K_SINK", "K_CE_OVERRIDES", "DAPR_HTTP_PORT"):
            if env is None or key not in env:
                full_env.pop(key, None)
        if config is not None:
            config_path = tmp / f"config-{self.port}.yaml"
            config_path.write_text(yaml.safe_dump(config))
            full_env["CASTSLICE_CONFIG"] = str(config_path)
        else:
            full_env.pop("CASTSLICE_CONFIG", None)
        command = [
            sys.executable,
            "-m",
            "function.cli",
            "serve",
            "--target",
            target,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        # Its own session (and process group): gunicorn forks a worker, and killing only the
        # master would leave that worker behind. kill() ends the whole group.
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=full_env,
            stdout=self.stdout_path.open("wb"),
            stderr=self.stderr_path.open("wb"),
            start_new_session=True,
        )
        wait_for(self._listening, 20, 0.05, f"castslice serve --target {target} to listen")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"castslice serve exited: {self.stderr_path.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stdout_lines(self) -> list[dict[str, Any]]:
        return parse_lines(self.stdout_path.read_text())

    def terminate(self, timeout: float = 20) -> float:
        """SIGTERM to the server, as Kubernetes sends; how long it took to exit (its group is then
        killed, so nothing it started outlives it)."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout)
        took = time.monotonic() - started
        self.kill()
        return took

    def group(self) -> list[int]:
        """The live processes of the server's session: the server and whatever it forked."""
        return session_members(self.process.pid)

    def kill(self, timeout: float = 10) -> None:
        """SIGKILL the whole process group and wait until none of it is left."""
        with suppress(ProcessLookupError):  # the group is already gone
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout)
        what = f"the processes of session {self.process.pid} to end"
        wait_for(lambda: not self.group(), timeout, 0.02, what)


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``session``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after its ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session:
            members.append(int(entry.name))
    return members


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@contextmanager
def served_consumer(tmp: Path) -> Iterator[Served]:
    """The reference audit consumer (``castslice serve --target audit``) on a SQLite file in
    ``tmp``; on exit its whole process group is killed and gone (the tests' ``consumer`` fixture)."""
    served = Served(tmp, "audit", env={"CASTSLICE_AUDIT_DB": str(tmp / "audit.sqlite3")})
    try:
        yield served
    finally:
        served.kill()


# -- decision events of recorded reviews, at known times -----------------------------------------
START = datetime(2025, 6, 1, 10, 0, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 8


def event_for(name: str, number: int, minutes: int = 0, namespace: str | None = None) -> CloudEvent:
    """The decision event of the recorded review ``name`` (optionally moved to ``namespace``), with
    id ev-<number>, decided ``minutes`` after START."""
    document = load_review(name)
    if namespace is not None:
        document["request"]["namespace"] = namespace
        document["request"]["object"]["metadata"]["namespace"] = namespace
    review = parse_review(json.dumps(document).encode())
    decision = Admission(Engine(Config())).review(review).decision
    assert decision is not None
    return build_event(
        audit_facts(review, decision),
        decision,
        event_id=f"ev-{number}",
        decided_at=START + timedelta(minutes=minutes),
        source="/castslice/webhook",
        config_digest=DIGEST,
    )


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The audit lines of a stdout text (every line must be a JSON object: stdout is for events)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    top = argparse.ArgumentParser(prog="python -m tests.support.audit")
    sub = top.add_subparsers(dest="command", required=True)
    hang = sub.add_parser("hang", help="serve a sink that accepts and never answers, until interrupted")
    hang.add_argument("--host", default="127.0.0.1")
    hang.add_argument("--port", type=int, default=0)
    args = top.parse_args(argv)
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # before the threads start: they inherit it
    sink = HangingSink(args.host, args.port)
    print(sink.url, flush=True)
    try:
        signal.sigwait(stop_signals)
    finally:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
