"""functions-framework entry points.

``mutate`` is the webhook (an ASGI HTTP function, served by ``castslice serve`` and by
``functions-framework --source function/func.py --target mutate --asgi``). ``mutate_wsgi`` is
the same webhook on functions-framework's default Flask server, kept so the benchmark can
compare the two servers on the same code. Both are thin: all HTTP behaviour is in http_api.

``new()`` is the same webhook for Knative Functions (``func build`` / ``func deploy``): the
func-python middleware imports the ``function`` package, calls ``new()`` and serves the returned
object's ASGI ``handle`` on its own server (hypercorn), calling ``start(cfg)`` at start-up,
``stop()`` at shutdown and ``ready()`` / ``alive()`` for /health/readiness and /health/liveness.

``audit`` is the reference audit consumer (an ASGI CloudEvent function, ``castslice serve
--target audit``): it receives the webhook's decision events from a Trigger, checks them against
the shipped JSON Schema and stores them in SQLite at $CASTSLICE_AUDIT_DB (``castslice audit``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping

import flask
import functions_framework
from cloudevents.http import CloudEvent
from functions_framework import aio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from function.audit.consumer import AUDIT_DB_ENV, DEFAULT_AUDIT_DB, AuditStore, InvalidEvent
from function.audit.recorder import AuditRecorder
from function.audit.shutdown import ASGIApp, Message, Receive, Scope, Send
from function.contract import LARGE_BODY_BYTES, LARGE_REVIEWS_ENV, MAX_BODY_BYTES, MUTATE_PATHS
from function.serve.app import build_webhook, build_webhook_and_recorder
from function.serve.http_api import HttpReply, WebhookHttp
from function.serve.offload import LargeReviews

# Built at import: a bad configuration stops the server from starting, with the key named.
webhook = build_webhook()

_large_reviews: LargeReviews | None = None


def large_reviews() -> LargeReviews:
    # Started on the first large review, in the serving process: importing this module (tests,
    # functions-framework's loader) starts no process.
    global _large_reviews
    if _large_reviews is None:
        _large_reviews = LargeReviews()
    return _large_reviews


def _declared_too_large(content_length: str | int | None) -> bool:
    try:
        return content_length is not None and int(content_length) > MAX_BODY_BYTES
    except ValueError:
        return False


async def _read_limited(request: Request) -> bytes | None:
    if _declared_too_large(request.headers.get("content-length")):
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _starlette(reply: HttpReply) -> Response:
    return Response(reply.body, reply.status, headers=reply.headers, media_type=reply.content_type)


async def answer(method: str, path: str, body: bytes | None) -> HttpReply:
    """The reply to one request whose body has been read (None: larger than MAX_BODY_BYTES)."""
    if (
        body is not None
        and len(body) > LARGE_BODY_BYTES
        and os.environ.get(LARGE_REVIEWS_ENV) == "process"
        and webhook.is_review(method, path)
    ):
        # A large Pod would stall every other request on this event loop for up to a second:
        # it is decided in the large-review process instead (function/serve/offload.py).
        try:
            outcome = await asyncio.wrap_future(large_reviews().submit(body))
        except Exception:  # a dead child must not fail the review: decide it here instead
            logging.getLogger("castslice.offload").exception(
                "large-review process failed; deciding in-process"
            )
            return webhook.handle(method, path, body)
        return webhook.recorded(*outcome)
    return webhook.handle(method, path, body)


@aio.http
async def mutate(request: Request) -> Response:
    try:
        body = await _read_limited(request) if request.method == "POST" else b""
    except ClientDisconnect:
        # The client left (or the server gave up on a body arriving too slowly, see
        # function/serve/protocol.py): nobody is there to read an answer; the server drops this one.
        return Response(status_code=408)
    return _starlette(await answer(request.method, request.url.path, body))


# -- the review path as `castslice serve` serves it ----------------------------------------------
class _Disconnected(Exception):
    pass


async def _read_body(scope: Scope, receive: Receive) -> bytes | None:
    """The request body, or None when it is (or is declared) larger than MAX_BODY_BYTES."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if _declared_too_large(value.decode("latin-1")):
                return None
            break
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _Disconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body if len(body) <= MAX_BODY_BYTES else None  # the common case: one message
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _start(reply: HttpReply) -> Message:
    headers = [
        (b"content-type", reply.content_type.encode("latin-1")),
        (b"content-length", str(len(reply.body)).encode("latin-1")),
    ]
    for name, value in reply.headers.items():
        headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    return {"type": "http.response.start", "status": reply.status, "headers": headers}


async def review_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /mutate`` as a bare ASGI endpoint: the same ``answer`` as ``mutate``, without the
    Starlette request, router and middleware functions-framework puts around every call.

    Those cost about 55 us a request served, as much as deciding a Pod (tests/benchmark.py), and
    give a review nothing: the reply is built by WebhookHttp either way, which never raises.
    """
    try:
        body = await _read_body(scope, receive)
    except _Disconnected:
        await send(_start(HttpReply(408, b"")))  # as ``mutate`` answers: the server drops it
        await send({"type": "http.response.body", "body": b""})
        return
    reply = await answer("POST", scope["path"], body)
    await send(_start(reply))
    await send({"type": "http.response.body", "body": reply.body})


def direct_review(path: str, body: bytes) -> HttpReply:
    """A review as function/serve/protocol.py answers it without ASGI: only bodies no larger than
    LARGE_BODY_BYTES come here, which ``answer`` decides in-process as well."""
    return webhook.handle("POST", path, body)


def with_review_endpoint(app: ASGIApp) -> ASGIApp:
    """``app`` (functions-framework's) with admission reviews sent to ``review_endpoint``; every
    other request (health, readiness, metrics, PodMutation validation, wrong methods) goes to
    ``app`` and the ``mutate`` function as before."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in MUTATE_PATHS:
            await review_endpoint(scope, receive, send)
        else:
            await app(scope, receive, send)

    return serve


@functions_framework.http
def mutate_wsgi(request: flask.Request) -> flask.Response:
    body: bytes | None = b""
    if request.method == "POST":
        if _declared_too_large(request.content_length):
            body = None
        else:
            body = request.stream.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                body = None
    reply = webhook.handle(request.method, request.path, body)
    return flask.Response(reply.body, reply.status, reply.headers, content_type=reply.content_type)


class KnativeFunction:
    """The webhook as a Knative Functions instance (what ``new()`` returns).

    Built in ``start``, not at construction: func-python hands ``start`` the environment as a
    dict (``cfg``), which is where the configuration file (CASTSLICE_CONFIG) and the audit sink
    (K_SINK from a SinkBinding, DAPR_HTTP_PORT) are read from.
    """

    def __init__(self) -> None:
        self._webhook: WebhookHttp | None = None
        self._recorder: AuditRecorder | None = None

    def start(self, cfg: Mapping[str, str]) -> None:
        # A bad configuration raises here, naming the key: the middleware does not start serving.
        self._webhook, self._recorder = build_webhook_and_recorder(environ=dict(cfg))
        if self._recorder.sender is not None:
            # Now, in the serving process: the sender's threads must not be started before a fork.
            self._recorder.sender.start()

    def stop(self) -> None:
        # The drain: queued audit events get audit.drainSeconds to reach the sink, the rest is
        # written to stdout. The middleware calls this on lifespan shutdown (SIGTERM).
        if self._recorder is not None:
            left = self._recorder.close()
            if left:
                logging.getLogger("castslice.audit").warning("%d audit event(s) went to stdout at stop", left)

    def ready(self) -> tuple[bool, str]:
        if self._webhook is None:
            return False, "not started"
        return (True, "ready") if self._webhook.ready() else (False, "shutting down")

    def alive(self) -> tuple[bool, str]:
        return True, "alive"

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._webhook is None:  # start() was not called: no configuration, no sink
            reply = HttpReply(503, b'{"error":"not started","status":503}')
        else:
            request = Request(scope, receive)
            body = await _read_limited(request) if request.method == "POST" else b""
            reply = self._webhook.handle(request.method, request.url.path, body)
        await _starlette(reply)(scope, receive, send)


def new() -> KnativeFunction:
    """The Knative Functions constructor (func-python's ``serve(new)``)."""
    return KnativeFunction()


_audit_store: AuditStore | None = None
_audit_store_lock = threading.Lock()


def audit_store() -> AuditStore:
    # Opened on first use, in the worker process: a SQLite connection must not cross a fork.
    global _audit_store
    with _audit_store_lock:
        if _audit_store is None:
            _audit_store = AuditStore(os.environ.get(AUDIT_DB_ENV, DEFAULT_AUDIT_DB))
        return _audit_store


@aio.cloud_event
async def audit(event: CloudEvent) -> None:
    try:
        await asyncio.to_thread(audit_store().accept, event)
    except InvalidEvent as invalid:
        # 400, not 500: a broker does not retry it (retrying cannot fix it); it goes to the
        # Trigger's dead-letter sink if any, and the rejected table keeps it here.
        raise HTTPException(400, detail=f"not a valid CastSlice decision event: {invalid}") from None
