"""The webhook as a Knative Function: ``function.new()`` served by Knative Functions' Python
middleware (func-python), the way a ``func build`` image runs it.

The served process is what func's scaffolding (``service/main.py``) runs: ``from function import
new`` and ``func_python.http.serve(new)`` on hypercorn, with start(cfg) at start-up, stop() on
SIGTERM, ready()/alive() at /health/readiness and /health/liveness. Also checked: the project
layout ``func create -l python`` makes, and func.yaml.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from function.func import KnativeFunction, new
from tests.support import DATA, decode_reply, load_review
from tests.support.audit import HangingSink, free_port, parse_lines, wait_for
from tests.support.view import FakeApiServer, kubeconfig_for

ROOT = Path(__file__).resolve().parents[2]
REVIEW = "default-slice-inference"

# What func's scaffolding runs (knative/func templates/python/scaffolding/instanced-http).
SCAFFOLD_MAIN = """
import logging
from func_python.http import serve
logging.basicConfig(level=logging.INFO)
from function import new as handler
serve(handler)
"""


class Middleware:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = tmp / "func.stdout"
        self.stderr_path = tmp / "func.stderr"
        main = tmp / "main.py"
        main.write_text(SCAFFOLD_MAIN)
        full_env = {
            k: v for k, v in os.environ.items() if k not in ("K_SINK", "DAPR_HTTP_PORT", "CASTSLICE_CONFIG")
        }
        full_env.update(env, LISTEN_ADDRESS=f"127.0.0.1:{self.port}")
        # cwd is the temporary directory: `function` must come from the installed project.
        self.process = subprocess.Popen(
            [sys.executable, str(main)],
            cwd=tmp,
            env=full_env,
            stdout=self.stdout_path.open("wb"),
            stderr=self.stderr_path.open("wb"),
        )

    def up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"func-python exited: {self.stderr_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/health/readiness", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def hanging() -> Iterator[HangingSink]:
    sink = HangingSink()
    try:
        yield sink
    finally:
        sink.close()


def test_func_python_serves_new_answers_a_review_and_drains_on_sigterm(
    tmp_path: Path, hanging: HangingSink
) -> None:
    # K_SINK reaches the function only through start(cfg); a sink that never answers keeps the
    # event queued, so only stop()'s drain can get it out (to stdout, "shutdown") before exit.
    config = tmp_path / "castslice.yaml"
    config.write_text(yaml.safe_dump({"audit": {"drainSeconds": 1.0, "requestTimeoutSeconds": 30.0}}))
    served = Middleware(tmp_path, {"K_SINK": hanging.url, "CASTSLICE_CONFIG": str(config)})
    try:
        wait_for(served.up, timeout=30, interval=0.1, what="func-python to serve /health/readiness")
        assert httpx.get(f"{served.url}/health/liveness").status_code == 200

        review = load_review(REVIEW)
        answer = httpx.post(f"{served.url}/mutate?timeout=5s", json=review, timeout=10)
        assert answer.status_code == 200, answer.text
        expected = json.loads((DATA / "responses" / "default" / f"{REVIEW}.json").read_text())
        assert decode_reply(answer.json()) == expected
        # The webhook's own routes are served by handle() as well.
        assert httpx.get(f"{served.url}/healthz").json() == {"status": "ok"}
        wait_for(lambda: hanging.accepted >= 1, timeout=10, what="the sender to post to K_SINK")

        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=15) == 0
    finally:
        served.stop()
    lines = parse_lines(served.stdout_path.read_text())
    assert [(line["delivered"], line["reason"]) for line in lines] == [(False, "shutdown")], lines
    assert lines[0]["event"]["data"]["request"]["uid"] == review["request"]["uid"]


def _call(function: KnativeFunction, path: str, method: str = "GET", body: bytes = b"") -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode())],
        "scheme": "http",
        "server": ("127.0.0.1", 8080),
        "root_path": "",
        "http_version": "1.1",
    }
    asyncio.run(function.handle(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_lifecycle_start_ready_stop(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    function = new()
    assert function.ready() == (False, "not started")
    assert function.alive()[0] is True
    assert _call(function, "/healthz")[0] == 503  # no configuration before start(cfg)

    # cfg, not os.environ, names the configuration: a bad file in cfg stops start-up.
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    with pytest.raises(Exception, match="nope"):
        function.start({"CASTSLICE_CONFIG": "/nonexistent/nope.yaml"})

    function.start({})
    assert function.ready() == (True, "ready")
    status, body = _call(function, "/mutate", "POST", json.dumps(load_review(REVIEW)).encode())
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
    function.stop()
    assert function.ready() == (False, "shutting down")
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [e["delivered"] for e in events] == [True]  # stdout sink: the event was written once


def test_project_has_the_func_create_python_layout() -> None:
    # func's scaffolding does `from function import new` and installs `function @ <project>`.
    project = yaml.safe_load((ROOT / "func.yaml").read_text())
    assert project["runtime"] == "python"
    assert project["name"] == "castslice"
    assert (ROOT / "function" / "__init__.py").exists() and (ROOT / "function" / "func.py").exists()
    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == "function"
    from function import new as exported

    assert exported is new


def test_importing_the_package_does_not_build_a_webhook() -> None:
    # `new` is resolved lazily: the CLI and the pure core must not import the servers (and build
    # a webhook from $CASTSLICE_CONFIG) just because func's scaffolding needs `function.new`.
    probe = "import sys, function.cli, function.core.engine; print('function.func' in sys.modules)"
    env = {**os.environ, "CASTSLICE_CONFIG": "/nonexistent/castslice.yaml"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "False"
    import function

    with pytest.raises(AttributeError, match="handle"):
        function.handle  # noqa: B018 - func's scaffolding falls back to `handle`: there is none


def test_under_func_python_a_cluster_reading_mutator_starts_one_set_of_watches(tmp_path: Path) -> None:
    # The configuration reaches the process both ways (environment and cfg): a webhook built at
    # import besides the one start(cfg) builds would list and watch everything twice.
    config = tmp_path / "castslice.yaml"
    config.write_text(yaml.safe_dump({"spot": {"enabled": True, "spotPercentageOfReplicaSet": 50}}))
    watched = {"/api/v1/pods", "/apis/apps/v1/replicasets"}
    with FakeApiServer() as api:
        kubeconfig = kubeconfig_for(api.url, tmp_path / "kubeconfig")
        served = Middleware(tmp_path, {"CASTSLICE_CONFIG": str(config), "KUBECONFIG": str(kubeconfig)})
        try:
            wait_for(served.up, timeout=30, interval=0.1, what="func-python ready (the watches synced)")
            wait_for(lambda: len(api.requests("watch")) >= len(watched), 10, what="the watches")
            review = load_review(REVIEW)
            assert httpx.post(f"{served.url}/mutate", json=review, timeout=10).status_code == 200
            time.sleep(0.5)  # room for a second set to show itself
            lists = Counter(seen.path for seen in api.requests("list"))
            watches = Counter(seen.path for seen in api.requests("watch"))
        finally:
            served.stop()
    assert lists == dict.fromkeys(watched, 1)
    assert watches == dict.fromkeys(watched, 1)


PROBE_IMPORT = """
import gc, sys, threading
import function.func
from function.serve.http_api import WebhookHttp
built = [o for o in gc.get_objects() if isinstance(o, WebhookHttp)]
print(len(built), threading.active_count(), function.func._webhook.built)
"""


def probe(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter, with a configuration that cannot be read (building a
    webhook would raise), ``function`` from the installed project."""
    env = {**os.environ, "CASTSLICE_CONFIG": "/nonexistent/castslice.yaml"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)


def test_importing_the_entry_points_builds_no_webhook_and_starts_no_thread(tmp_path: Path) -> None:
    done = probe(PROBE_IMPORT, tmp_path)
    assert done.stdout.split() == ["0", "1", "None"], done.stderr


PROBE_AUDIT_TARGET = """
import gc, threading
from function.serve.asgi import serving_app
from function.serve.http_api import WebhookHttp
app = serving_app("audit")
print(len([o for o in gc.get_objects() if isinstance(o, WebhookHttp)]), threading.active_count())
"""


def test_the_audit_consumer_target_builds_no_webhook(tmp_path: Path) -> None:
    done = probe(PROBE_AUDIT_TARGET, tmp_path)
    assert done.stdout.split() == ["0", "1"], done.stderr
