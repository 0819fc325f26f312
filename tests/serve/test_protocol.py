"""The server's connection rules (function/serve/protocol.py): header size, header and body read times,
idle keep-alive, and a shutdown that answers every request received or closes cleanly (a FIN,
never a reset). Run on a real uvicorn server on loopback, with the time limits made short."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from function.contract import MAX_HEADER_BYTES
from function.serve import protocol as hardened
from tests.support import REVIEWS
from tests.support.audit import Served

SHORT = 0.5


class EchoApp:
    """Answers every request with the size of its body. ``reviews``: the review handler the
    protocol finds on the app it serves (none: every request takes the ASGI path)."""

    reviews: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await echo(scope, receive, send)


ECHO = EchoApp()


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":
        await asyncio.sleep(0.3)
    reply = b'{"size":%d}' % len(body) if scope["path"] != "/big" else b"x" * 1_000_000
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(reply)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": reply})


class LoopbackServer:
    def __init__(self, app: Any = ECHO, keep_alive: float = SHORT) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            http=hardened.HardenedHttpToolsProtocol,
            loop="asyncio",
            lifespan="off",
            log_level="critical",
            timeout_keep_alive=int(keep_alive) or 1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        return sock

    def accepting(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackServer]:
    monkeypatch.setattr(hardened, "HEADER_READ_SECONDS", SHORT)
    monkeypatch.setattr(hardened, "BODY_READ_SECONDS", SHORT)
    monkeypatch.setattr(hardened, "IDLE_KEEPALIVE_SECONDS", SHORT)
    server = LoopbackServer()
    yield server
    server.stop()


def read_all(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_response(sock: socket.socket) -> bytes:
    """One response (headers and a Content-Length body) from a kept-alive connection, and not a
    byte more: pipelined replies can arrive in one segment, and what follows this one is the next's.
    """
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)  # the head byte by byte: a reply is small, and nothing is over-read
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    length = int(
        next(
            line.split(b":")[1] for line in data.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        assert chunk, f"closed inside a response body: {data + body!r}"
        body += chunk
    return data + body


REQUEST = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_a_normal_request_is_served_and_kept_alive(served: LoopbackServer) -> None:
    with served.connect() as sock:
        for _ in range(3):
            sock.sendall(REQUEST)
            reply = read_response(sock)
            assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"size":2}')


def test_headers_larger_than_the_limit_get_431_before_they_are_buffered(served: LoopbackServer) -> None:
    with served.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(MAX_HEADER_BYTES // 16384 + 4):
                sock.sendall(b"a" * 16384)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while still sending: the reply is already in our buffer
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
    assert b"connection: close" in reply


def test_headers_sent_too_slowly_get_408_and_the_connection_closes(served: LoopbackServer) -> None:
    started = time.monotonic()
    with served.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\n")
        try:
            for byte in b"Host: x\r\nX-Slow: abcdefghijklmnop":
                if select.select([sock], [], [], 0.1)[0]:
                    break  # the server answered
                sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
    assert time.monotonic() - started < SHORT + 2


def test_a_body_shorter_than_its_content_length_gets_408(served: LoopbackServer) -> None:
    started = time.monotonic()
    with served.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
    assert b"request body not received" in reply
    assert SHORT - 0.1 < time.monotonic() - started < SHORT + 2


@pytest.mark.parametrize("after_a_request", [False, True])
def test_an_idle_connection_is_closed(served: LoopbackServer, after_a_request: bool) -> None:
    started = time.monotonic()
    with served.connect() as sock:
        if after_a_request:
            sock.sendall(REQUEST)
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        assert read_all(sock) == b""
    assert time.monotonic() - started < SHORT + 2


@pytest.mark.parametrize("connection", [b"", b"Connection: close\r\n"], ids=["keep-alive", "close"])
def test_a_body_over_the_limit_gets_one_413_then_a_clean_close(
    served: LoopbackServer, connection: bytes
) -> None:
    """The 413 is the connection's last word: no unsolicited 408 once the client has sent the rest
    of the oversized body (it used to be read as the start of a next request), and no reset with
    ``Connection: close`` (the socket used to close with the body's bytes unread)."""
    from function.contract import MAX_BODY_BYTES

    size = MAX_BODY_BYTES + 1
    sock = served.connect()
    sock.settimeout(30)
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n" % (connection, size))
    sock.sendall(b"x" * size)
    received = read_all(sock)  # a reset raises ConnectionResetError here
    assert received.startswith(b"HTTP/1.1 413 "), received[:200]
    assert received.count(b"HTTP/1.1 ") == 1, received
    assert f"larger than {MAX_BODY_BYTES} bytes".encode() in received


def test_a_chunked_body_over_the_limit_gets_413_and_a_clean_close(served: LoopbackServer) -> None:
    from function.contract import MAX_BODY_BYTES

    sock = served.connect()
    sock.settimeout(30)
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * (1024 * 1024)
    with contextlib.suppress(OSError):  # the server may half-close and stop caring mid-way
        for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"0\r\n\r\n")
    received = read_all(sock)
    assert received.startswith(b"HTTP/1.1 413 "), received[:200]
    assert received.count(b"HTTP/1.1 ") == 1, received


def test_a_client_that_pipelines_and_never_reads_is_dropped(
    served: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies nobody reads fill the send buffer, and uvicorn waits for it to drain for ever:
    WRITE_SECONDS bounds that wait (0.5 s here; the bound below is far above it)."""
    monkeypatch.setattr(hardened, "WRITE_SECONDS", SHORT)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.connect(("127.0.0.1", served.port))
    sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 20)  # 20 MB of replies, none read
    deadline = time.monotonic() + 30
    while served.server.server_state.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not served.server.server_state.connections, "the connection is still held"
    sock.close()


def test_stray_bytes_that_begin_no_request_do_not_hold_a_connection(served: LoopbackServer) -> None:
    started = time.monotonic()
    with served.connect() as sock:
        try:
            for _ in range(30):
                if select.select([sock], [], [], 0.1)[0]:
                    break
                sock.sendall(b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        read_all(sock)
    assert time.monotonic() - started < SHORT + 2.5


def test_at_shutdown_requests_are_answered_with_close_and_idle_connections_are_left_to_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server closes no connection its client may still send a request on: requests in flight
    at shutdown, and requests sent later on kept-alive connections, are answered with
    ``connection: close`` (then closed); an idle connection gets no FIN and no reset, and the
    server ends once its clients have closed them."""
    for name in ("HEADER_READ_SECONDS", "BODY_READ_SECONDS", "IDLE_KEEPALIVE_SECONDS"):
        monkeypatch.setattr(hardened, name, 30.0)
    served = LoopbackServer(keep_alive=30)
    try:
        busy = [served.connect() for _ in range(10)]
        idle = [served.connect() for _ in range(5)]
        for sock in busy + idle:
            sock.sendall(REQUEST)
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        for sock in busy:
            sock.sendall(REQUEST.replace(b"/echo", b"/slow"))
        served.server.should_exit = True
        for sock in busy:
            with sock:
                reply = read_all(sock)  # raises ConnectionResetError on a reset
            assert reply.startswith(b"HTTP/1.1 200") and b"connection: close" in reply, reply
            assert reply.count(b"HTTP/1.1 ") == 1
        time.sleep(1.0)  # well past the moment the server stopped accepting
        assert not served.accepting()
        for sock in idle:
            assert select.select([sock], [], [], 0)[0] == [], "an idle connection was closed"
        for sock in idle[:3]:
            with sock:
                sock.sendall(REQUEST)
                reply = read_all(sock)
            assert reply.startswith(b"HTTP/1.1 200") and b"connection: close" in reply, reply
            assert reply.count(b"HTTP/1.1 ") == 1
        assert served.thread.is_alive()  # two idle connections still held for their client
        for sock in idle[3:]:
            sock.close()
        served.thread.join(10)
        assert not served.thread.is_alive()
    finally:
        served.stop()


def test_served_sigterm_under_load_resets_no_connection(tmp_path: Any) -> None:
    """``castslice serve`` itself (gunicorn + the hardened worker): keep-alive clients posting
    reviews while SIGTERM arrives see answers or clean closes, never a reset."""
    served = Served(tmp_path)
    body = (REVIEWS / "default-slice-inference.json").read_bytes()
    resets: list[BaseException] = []
    answered = [0]
    stop = threading.Event()

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        while not stop.is_set():
            try:
                connection.request("POST", "/mutate", body, {"content-type": "application/json"})
                reply = connection.getresponse()
                reply.read()
                answered[0] += 1
                if reply.getheader("connection") == "close":
                    return
            except ConnectionResetError as error:
                resets.append(error)
                return
            except (http.client.RemoteDisconnected, ConnectionRefusedError, BrokenPipeError):
                return  # closed cleanly before our request was read, or no longer accepting

    try:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        served.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(15)
        stop.set()
    finally:
        stop.set()
        served.kill()
    assert answered[0] > 8
    assert not resets, resets


def test_the_http_doc_documents_the_values_in_force() -> None:
    from function import contract
    from tests.support import ROOT

    readme = (ROOT / "docs" / "http.md").read_text()
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[2].strip()
        for line in readme.splitlines()
        if line.startswith("| `") and line.split("|")[1].strip(" `").isupper()
    }
    expected = {
        "MAX_HEADER_BYTES": f"{contract.MAX_HEADER_BYTES // 1024} KiB",
        "HEADER_READ_SECONDS": f"{contract.HEADER_READ_SECONDS:g} s",
        "BODY_READ_SECONDS": f"{contract.BODY_READ_SECONDS:g} s",
        "IDLE_KEEPALIVE_SECONDS": f"{contract.IDLE_KEEPALIVE_SECONDS:g} s",
        "KEPT_ALIVE_IDLE_SECONDS": f"{contract.KEPT_ALIVE_IDLE_SECONDS:g} s",
        "SHUTDOWN_DRAIN_SECONDS": f"{contract.SHUTDOWN_DRAIN_SECONDS:g} s",
        "SHUTDOWN_LINGER_SECONDS": f"{contract.SHUTDOWN_LINGER_SECONDS:g} s",
        "LARGE_BODY_BYTES": f"{contract.LARGE_BODY_BYTES // 1024} KiB",
        "LARGE_REVIEW_SECONDS": f"{contract.LARGE_REVIEW_SECONDS:g} s",
        "MAX_JSON_DEPTH": f"{contract.MAX_JSON_DEPTH} levels",
        "MAX_QUOTED_CHARS": f"{contract.MAX_QUOTED_CHARS}",
    }
    assert {name: rows.get(name) for name in expected} == expected


# -- reviews answered by the protocol itself (the served app's ``reviews``) -----------------------
class DirectHandler:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = False

    def handle(self, method: str, path: str, body: bytes) -> Any:
        from function.serve.http_api import HttpReply

        assert method == "POST"
        self.calls.append((path, len(body)))
        if self.fail:
            raise RuntimeError("boom")
        return HttpReply(200, b'{"direct":%d}' % len(body))


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackServer]:
    """The server with its read and idle timers far out, for tests about what is answered and in
    what order, not when: on a machine starved of CPU, a 0.5 s idle timer could close a connection
    before its first bytes are read, and the test would be measuring the machine."""
    for name in ("HEADER_READ_SECONDS", "BODY_READ_SECONDS", "IDLE_KEEPALIVE_SECONDS"):
        monkeypatch.setattr(hardened, name, 30.0)
    server = LoopbackServer()
    yield server
    server.stop()


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> DirectHandler:
    handler = DirectHandler()
    monkeypatch.setattr(ECHO, "reviews", handler)  # read by each new connection's protocol
    return handler


def review_request(body: bytes, path: bytes = b"/mutate", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (path, extra, len(body), body)


def test_reviews_are_answered_directly_and_kept_alive(patient: LoopbackServer, direct: DirectHandler) -> None:
    with patient.connect() as sock:
        for path in (b"/mutate", b"/", b"/mutate?timeout=10s"):
            sock.sendall(review_request(b"{}" * 3, path))
            reply = read_response(sock)
            assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"direct":6}'), reply
            assert b"content-type: application/json" in reply and b"connection: close" not in reply
    assert direct.calls == [("/mutate", 6), ("/", 6), ("/mutate", 6)]


def test_pipelined_reviews_are_answered_in_order(patient: LoopbackServer, direct: DirectHandler) -> None:
    with patient.connect() as sock:
        sock.sendall(review_request(b"a") + REQUEST + review_request(b"bbb") + review_request(b"cc"))
        replies = [read_response(sock) for _ in range(4)]
    assert [r.rpartition(b"\r\n\r\n")[2] for r in replies] == [
        b'{"direct":1}',
        b'{"size":2}',  # not a review: the ASGI app answered it, in its turn
        b'{"direct":3}',
        b'{"direct":2}',
    ]


@pytest.mark.parametrize(
    "request_bytes",
    [
        review_request(b"{}", extra=b"Connection: close\r\n"),
        review_request(b"{}").replace(b"HTTP/1.1", b"HTTP/1.0"),
    ],
    ids=["connection-close", "http-1.0"],
)
def test_a_review_on_a_closing_connection_is_answered_then_closed(
    patient: LoopbackServer, direct: DirectHandler, request_bytes: bytes
) -> None:
    with patient.connect() as sock:
        sock.sendall(request_bytes)
        reply = read_all(sock)  # returns once the server closed
    assert reply.startswith(b"HTTP/1.1 200") and b"connection: close" in reply
    assert reply.endswith(b'{"direct":2}')


def test_a_body_in_several_segments_is_answered_once_complete(
    patient: LoopbackServer, direct: DirectHandler
) -> None:
    body = b"x" * 100_000  # past uvicorn's 64 KiB high-water mark, where it pauses reading
    request = review_request(body)
    with patient.connect() as sock:
        for start in range(0, len(request), 30_000):
            sock.sendall(request[start : start + 30_000])
            time.sleep(0.02)
        assert read_response(sock).endswith(b'{"direct":100000}')
    assert direct.calls == [("/mutate", 100_000)]


def test_what_is_not_a_small_declared_review_takes_the_asgi_path(
    patient: LoopbackServer, direct: DirectHandler
) -> None:
    from function.contract import LARGE_BODY_BYTES

    large = b"x" * (LARGE_BODY_BYTES + 1)
    chunked = b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    expect = review_request(b"{}", extra=b"Expect: 100-continue\r\nConnection: close\r\n")
    with patient.connect() as sock:
        for request, size in ((review_request(large), len(large)), (chunked, 2), (REQUEST, 2)):
            sock.sendall(request)
            reply = read_response(sock)
            assert reply.endswith(b'{"size":%d}' % size), reply[-80:]
        sock.sendall(b"GET /mutate HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b'{"size":0}')
        sock.sendall(expect)  # ASGI's receive() sends the interim 100 Continue
        reply = read_all(sock)
        assert reply.startswith(b"HTTP/1.1 100") and reply.endswith(b'{"size":2}'), reply
    assert direct.calls == []


def test_a_failing_direct_handler_gets_a_json_500_and_the_connection_lives(
    patient: LoopbackServer, direct: DirectHandler
) -> None:
    direct.fail = True
    with patient.connect() as sock:
        sock.sendall(review_request(b"{}"))
        reply = read_response(sock)
        assert reply.startswith(b"HTTP/1.1 500") and b'"status":500' in reply
        direct.fail = False
        sock.sendall(review_request(b"{}"))
        assert read_response(sock).endswith(b'{"direct":2}')


def test_a_review_body_sent_too_slowly_gets_408_and_no_answer(
    served: LoopbackServer, direct: DirectHandler
) -> None:
    with served.connect() as sock:
        sock.sendall(review_request(b"{}" * 10)[:-5])
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408")
    assert direct.calls == []


def test_a_direct_review_writes_uvicorns_own_access_line(
    patient: LoopbackServer, direct: DirectHandler
) -> None:
    from uvicorn.logging import AccessFormatter

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))  # AccessFormatter unpacks the arguments: any mismatch raises

    handler = Collect()
    access_format = "%(client_addr)s - %(request_line)s %(status_code)s"
    handler.setFormatter(AccessFormatter(access_format, use_colors=False))
    access = logging.getLogger("uvicorn.access")
    level = access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        with patient.connect() as sock:
            sock.sendall(review_request(b"{}", b"/mutate?timeout=10s"))
            assert read_response(sock).startswith(b"HTTP/1.1 200")
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert len(lines) == 1 and lines[0].endswith(" - POST /mutate?timeout=10s HTTP/1.1 200 OK"), lines


def test_the_serving_app_answers_small_reviews_from_the_protocol_with_its_one_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``castslice serve``'s app under the hardened protocol: a review is decided by the app's own
    handler, called from the parser's callback, not through ASGI; other requests reach the same
    handler through ASGI (functions-framework's app)."""
    from function.serve.asgi import ServingApp, serving_app

    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    app = serving_app("mutate")
    assert isinstance(app, ServingApp)
    direct: list[str] = []
    over_asgi: list[str] = []
    handle, answer = app.reviews.handle, app.reviews.answer

    def counted_handle(method: str, path: str, body: bytes | None) -> Any:
        direct.append(path)
        return handle(method, path, body)

    async def counted_answer(method: str, path: str, body: bytes | None) -> Any:
        over_asgi.append(path)
        return await answer(method, path, body)

    monkeypatch.setattr(app.reviews, "handle", counted_handle)
    monkeypatch.setattr(app.reviews, "answer", counted_answer)
    server = LoopbackServer(app)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("POST", "/mutate", (REVIEWS / "default-slice-inference.json").read_bytes())
        reply = connection.getresponse()
        assert reply.status == 200
        assert json.loads(reply.read())["response"]["patchType"] == "JSONPatch"
        connection.request("GET", "/healthz")
        reply = connection.getresponse()
        assert (reply.status, json.loads(reply.read())) == (200, {"status": "ok"})
    finally:
        server.stop()
    assert (direct, over_asgi) == (["/mutate"], ["/healthz"])


def test_served_keeps_new_and_kept_alive_idle_connections_open_for_the_client_to_close(tmp_path: Any) -> None:
    """``castslice serve`` leaves closing an idle connection to the apiserver (whose own idle limit
    is 90 s), a new one as much as a kept-alive one (Go's transport pools a connection it dialled
    and did not need, and sends a later review on it): a review sent after a pause is answered on
    the same connection, instead of racing the server's close."""
    from function.contract import IDLE_KEEPALIVE_SECONDS, KEPT_ALIVE_IDLE_SECONDS

    assert IDLE_KEEPALIVE_SECONDS == KEPT_ALIVE_IDLE_SECONDS > 90
    served = Served(tmp_path)
    body = (REVIEWS / "default-slice-inference.json").read_bytes()
    try:
        sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        connection.sock = sock
        for pause in (6.5, 6.5):  # past the 5 s new connections used to be given
            time.sleep(pause)
            connection.request("POST", "/mutate", body, {"content-type": "application/json"})
            reply = connection.getresponse()
            reply.read()
            assert reply.status == 200
            assert connection.sock is sock  # the same connection, not a reconnection
    finally:
        served.kill()
