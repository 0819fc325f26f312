"""The bare review endpoint `castslice serve` answers reviews with (function/serve/asgi.py
``serve_http``, reached through ``serving_app``) against functions-framework's own app serving
function/func.py's ``mutate``: the same bytes for every recorded review and every kind of bad body,
and the body-reading rules (size limits, chunks, a client that leaves) checked on the endpoint."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from function.contract import MAX_BODY_BYTES
from tests.support import DATA, FUNC_SOURCE, REVIEWS, decode_reply
from tests.support.audit import free_port, wait_for

BAD_BODIES = [
    b"",
    b"not json",
    b"[]",
    b'{"kind": "AdmissionReview"}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": 7}',
    b'{"a": NaN}',
    b"[" * 300 + b"]" * 300,
]


def _apps(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(functions-framework's app, the serving app), each over its own load of function/func.py."""
    from functions_framework.aio import create_asgi_app

    from function.serve.asgi import serving_app

    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    plain = create_asgi_app("mutate", str(FUNC_SOURCE))
    served = serving_app("mutate")
    return plain, served


def test_every_recorded_review_gets_the_same_bytes_as_from_functions_framework(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain, served = _apps(monkeypatch)
    with TestClient(plain) as a, TestClient(served) as b:
        for path in sorted(REVIEWS.glob("*.json")):
            body = path.read_bytes()
            expected, got = a.post("/mutate", content=body), b.post("/mutate", content=body)
            assert (got.status_code, got.content) == (expected.status_code, expected.content), path.name
            assert got.headers["content-type"] == "application/json"
            assert got.headers["content-length"] == str(len(got.content))


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_a_bad_body_gets_the_same_400_as_from_functions_framework(
    monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    plain, served = _apps(monkeypatch)
    expected = TestClient(plain).post("/", content=body)
    got = TestClient(served).post("/", content=body)
    assert got.status_code == expected.status_code == 400
    assert got.content == expected.content


def test_everything_but_a_review_is_left_to_functions_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    _, served = _apps(monkeypatch)
    client = TestClient(served)
    assert client.get("/mutate").status_code == 405
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.post("/healthz").status_code == 405
    assert client.post("/nowhere").status_code == 404


# -- the endpoint itself, driven by hand --------------------------------------------------------
ENDPOINT: Any = None


def _call(
    messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]] | None = None, app: Any = None
) -> list[Any]:
    scope = {"type": "http", "method": "POST", "path": "/mutate", "headers": headers or []}
    queue = list(messages)
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run((app or ENDPOINT)(scope, receive, send))
    assert not queue or all(m["type"] == "http.request" for m in queue)
    return sent


@pytest.fixture
def endpoint_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENDPOINT: the serving app, whose reviews go to the bare endpoint."""
    monkeypatch.setattr(sys.modules[__name__], "ENDPOINT", _apps(monkeypatch)[1])


def _reply(sent: list[Any]) -> tuple[int, bytes]:
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], sent[1]["body"]


def test_a_body_in_several_chunks_is_joined(endpoint_loaded: None) -> None:
    body = (REVIEWS / "default-slice-inference.json").read_bytes()
    thirds = [body[: len(body) // 3], body[len(body) // 3 : 2 * len(body) // 3], body[2 * len(body) // 3 :]]
    messages = [{"type": "http.request", "body": part, "more_body": True} for part in thirds]
    messages[-1]["more_body"] = False
    status, reply = _reply(_call(messages))
    assert status == 200
    assert json.loads(reply)["response"]["patchType"] == "JSONPatch"


def test_a_declared_length_over_the_limit_is_413_without_reading(endpoint_loaded: None) -> None:
    sent = _call([], [(b"content-length", str(MAX_BODY_BYTES + 1).encode())])
    status, reply = _reply(sent)
    assert status == 413
    assert str(MAX_BODY_BYTES) in json.loads(reply)["error"]


def test_a_declared_length_at_the_limit_is_read(endpoint_loaded: None) -> None:
    sent = _call(
        [{"type": "http.request", "body": b"[]", "more_body": False}],
        [(b"content-length", str(MAX_BODY_BYTES).encode())],
    )
    assert _reply(sent)[0] == 400  # read and parsed: a JSON array is not a review


@pytest.mark.parametrize("split", [False, True])
def test_a_body_over_the_limit_is_413(endpoint_loaded: None, split: bool) -> None:
    big = b" " * (MAX_BODY_BYTES + 1)
    if split:
        messages = [
            {"type": "http.request", "body": big[:1000], "more_body": True},
            {"type": "http.request", "body": big[1000:], "more_body": False},
        ]
    else:
        messages = [{"type": "http.request", "body": big, "more_body": False}]
    assert _reply(_call(messages))[0] == 413


def test_a_body_of_exactly_the_limit_in_chunks_is_read(endpoint_loaded: None) -> None:
    review = (REVIEWS / "default-not-opted-in.json").read_bytes()
    body = review + b" " * (MAX_BODY_BYTES - len(review))
    messages = [
        {"type": "http.request", "body": body[:100], "more_body": True},
        {"type": "http.request", "body": body[100:], "more_body": False},
    ]
    assert _reply(_call(messages))[0] == 200


@pytest.mark.parametrize("after_chunks", [0, 1])
def test_a_client_that_leaves_gets_a_408_nobody_reads(endpoint_loaded: None, after_chunks: int) -> None:
    chunk = {"type": "http.request", "body": b"{", "more_body": True}
    messages: list[dict[str, Any]] = [chunk] * after_chunks
    messages.append({"type": "http.disconnect"})
    assert _reply(_call(messages)) == (408, b"")


def test_extra_reply_headers_are_sent() -> None:
    from function.serve.asgi import serve_http
    from function.serve.http_api import HttpReply

    class Allowing:
        async def answer(self, method: str, path: str, body: bytes | None) -> HttpReply:
            return HttpReply(405, b"{}", "application/json", {"Allow": "POST"})

    endpoint = functools.partial(serve_http, Allowing())
    sent = _call([{"type": "http.request", "body": b"", "more_body": False}], app=endpoint)
    assert (b"allow", b"POST") in sent[0]["headers"]
    assert (b"content-length", b"2") in sent[0]["headers"]


def test_the_handler_the_serving_app_gives_the_protocol_answers_with_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under CastSliceWorker small reviews are answered by the protocol with the serving app's
    ``reviews`` (function/serve/protocol.py): it must give the bytes functions-framework's app gives."""
    plain, served = _apps(monkeypatch)
    with TestClient(plain) as client:
        for path in [*sorted(REVIEWS.glob("*.json"))[:8], None]:
            body = path.read_bytes() if path is not None else b"not json"
            expected = client.post("/mutate", content=body)
            reply = served.reviews.handle("POST", "/mutate", body)
            assert (reply.status, reply.body) == (expected.status_code, expected.content)
            assert reply.content_type == expected.headers["content-type"]


def test_the_functions_framework_cli_serves_func_py_mutate(tmp_path: Any) -> None:
    """``functions-framework --source function/func.py --target mutate --asgi``: its webhook is
    built on the first request, from the environment, and answers as the served app does."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("CASTSLICE_CONFIG", "K_SINK", "DAPR_HTTP_PORT")}
    env.update(HOME=str(tmp_path), WORKERS="1")
    command = ["functions-framework", "--source", str(FUNC_SOURCE), "--target", "mutate", "--asgi"]
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("wb"),
        start_new_session=True,  # gunicorn forks a worker: the whole group is ended below
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert server.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=60, interval=0.2, what="functions-framework to serve")
        review = (REVIEWS / "default-slice-inference.json").read_bytes()
        answer = httpx.post(f"{url}/mutate", content=review, timeout=10)
        expected = json.loads((DATA / "responses" / "default" / "default-slice-inference.json").read_text())
        assert answer.status_code == 200 and decode_reply(answer.json()) == expected
        assert httpx.post(f"{url}/mutate", content=b"not json", timeout=10).status_code == 400
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
