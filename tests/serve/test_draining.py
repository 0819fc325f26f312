"""Draining after SIGTERM (function/serve/draining.py): ``castslice serve`` keeps accepting and
answering for CASTSLICE_DRAIN_SECONDS, not ready and closing every connection after its reply, then
stops accepting and exits. The rolling-restart e2e test (tests/e2e/test_operations_e2e.py) shows
what it is for: no Pod admitted unmutated while a replica restarts behind a Service."""

from __future__ import annotations

import http.client
import signal
import socket
import time
from pathlib import Path

import pytest

from function.contract import DRAIN_SECONDS_ENV, SHUTDOWN_DRAIN_SECONDS
from function.serve.draining import drain_seconds
from tests.support import REVIEWS
from tests.support.audit import Served, wait_for


def test_drain_seconds_default_and_bounds() -> None:
    assert drain_seconds({}) == SHUTDOWN_DRAIN_SECONDS == 5.0
    assert drain_seconds({DRAIN_SECONDS_ENV: ""}) == 5.0
    assert drain_seconds({DRAIN_SECONDS_ENV: "0"}) == 0.0
    assert drain_seconds({DRAIN_SECONDS_ENV: "2.5"}) == 2.5
    for bad in ("-1", "301", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match=rf"{DRAIN_SECONDS_ENV}='{bad}': expected seconds from 0 to 300"):
            drain_seconds({DRAIN_SECONDS_ENV: bad})


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, str | None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path, body, {"content-type": "application/json"} if body else {})
        reply = connection.getresponse()
        reply.read()
        return reply.status, reply.getheader("connection")
    finally:
        connection.close()


def accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_after_sigterm_new_connections_are_answered_not_ready_then_refused(tmp_path: Path) -> None:
    drain = 3.0
    served = Served(tmp_path, env={DRAIN_SECONDS_ENV: str(drain)})
    review = (REVIEWS / "default-slice-inference.json").read_bytes()
    try:
        # Ready once the large-review process is up too (a Service routes to it only then).
        wait_for(lambda: request(served.port, "GET", "/readyz") == (200, None), 60, what="/readyz 200")
        kept = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
        kept.request("POST", "/mutate", review, {"content-type": "application/json"})
        first = kept.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("connection") is None  # kept alive
        started = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        wait_for(lambda: request(served.port, "GET", "/readyz")[0] == 503, 2, what="/readyz 503")
        # Still accepting and answering, each reply closing its connection.
        assert request(served.port, "POST", "/mutate", review) == (200, "close")
        kept.request("POST", "/mutate", review, {"content-type": "application/json"})
        second = kept.getresponse()
        second.read()
        assert (second.status, second.getheader("connection")) == (200, "close")
        assert request(served.port, "GET", "/healthz") == (200, "close")
        assert time.monotonic() - started < drain
        served.process.wait(drain + 10)
        took = time.monotonic() - started
        assert drain <= took < drain + 5, took
        assert not accepting(served.port)
        log = served.stderr_path.read_text()
        assert "SIGTERM: draining for 3 s" in log and "drained: no longer accepting connections" in log
    finally:
        served.kill()


def test_castslice_serve_refuses_a_bad_drain_setting_by_name(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    refused = subprocess.run(
        [sys.executable, "-m", "function.cli", "serve", "--port", "0"],
        env={**os.environ, "HOME": str(tmp_path), DRAIN_SECONDS_ENV: "soon"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert f"castslice serve: {DRAIN_SECONDS_ENV}='soon': expected seconds from 0 to 300" in refused.stderr


def test_a_stop_leaves_no_semaphore_of_the_large_review_process_behind(tmp_path: Path) -> None:
    """The large-review process's pool is let go before the worker exits (which runs no atexit
    hook): multiprocessing's resource tracker then has nothing to clean up, and says nothing."""
    served = Served(tmp_path)
    try:
        wait_for(lambda: request(served.port, "GET", "/readyz")[0] == 200, 20, 0.1, "ready")
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(20)
        time.sleep(1.0)  # the tracker outlives the worker a moment: it reports as it ends
    finally:
        served.kill()
    stderr = served.stderr_path.read_text()
    assert "leaked semaphore" not in stderr and "resource_tracker" not in stderr, stderr[-2000:]
