"""The webhook on ASGI: one body reader, one reply writer, and the hosts built from them.

Every ASGI host hands the request to one ``ReviewHandler`` (a WebhookHttp, or the
WebhookOnDemand that builds one where it is served) and writes back what it answers:
- ``serve_http``: a complete ASGI HTTP app, for the bare review endpoint and the Knative
  Functions instance (function/serve/knative.py);
- ``answer_request``: for a functions-framework target, which gets a Starlette request and
  returns a response (function/func.py's ``mutate``);
- ``serving_app``: what ``castslice serve`` runs, functions-framework's app with reviews sent
  to ``serve_http`` and, under CastSliceWorker, to the protocol (function/serve/protocol.py),
  which finds the handler as the app's ``reviews``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

from starlette.requests import Request

from function.audit.shutdown import ASGIApp, Message, Receive, Scope, Send, drain_on_shutdown
from function.contract import HEALTHZ_PATH, MAX_BODY_BYTES
from function.core.config import Config
from function.serve.app import WebhookOnDemand, build_webhook
from function.serve.http_api import CLIENT_GONE, HttpReply, ReviewHandler, is_review
from function.serve.offload import LargeReviews

log = logging.getLogger("castslice.server")


FUNC_SOURCE = Path(__file__).parent.parent / "func.py"


class ClientGone(Exception):
    """The client left (or the server gave up on a body arriving too slowly, see
    function/serve/protocol.py) before the body was complete."""


def _declared_too_large(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value) > MAX_BODY_BYTES
            except ValueError:
                return False
    return False


async def read_body(scope: Scope, receive: Receive) -> bytes | None:
    """The request body, or None when it is (or is declared) larger than MAX_BODY_BYTES."""
    if _declared_too_large(scope):
        return None
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body if len(body) <= MAX_BODY_BYTES else None  # the common case: one message
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_reply(send: Send, reply: HttpReply) -> None:
    headers = [
        (b"content-type", reply.content_type.encode("latin-1")),
        (b"content-length", str(len(reply.body)).encode("latin-1")),
    ]
    for name, value in reply.headers.items():
        headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    start: Message = {"type": "http.response.start", "status": reply.status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": reply.body})


async def reply_to(handler: ReviewHandler, scope: Scope, receive: Receive) -> HttpReply:
    """The handler's answer to one HTTP request; only a POST's body is read."""
    method: str = scope["method"]
    try:
        body = await read_body(scope, receive) if method == "POST" else b""
    except ClientGone:
        return CLIENT_GONE
    return await handler.answer(method, scope["path"], body)


async def serve_http(handler: ReviewHandler, scope: Scope, receive: Receive, send: Send) -> None:
    """One HTTP request, read, answered by ``handler`` and written, without a framework: a
    review needs nothing Starlette's request, router and middleware would add, and they cost
    as much as deciding a Pod (tests/benchmarks/webhook.py)."""
    await send_reply(send, await reply_to(handler, scope, receive))


class Reply:
    """An HttpReply as the response a Starlette endpoint returns (functions-framework's target),
    written by ``send_reply`` like every other reply."""

    def __init__(self, reply: HttpReply) -> None:
        self.reply = reply

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_reply(send, self.reply)


async def answer_request(handler: ReviewHandler, request: Request) -> Reply:
    """A functions-framework target's answer: the request's own ASGI scope and receive, read
    as ``serve_http`` reads them."""
    return Reply(await reply_to(handler, request.scope, request.receive))


def functions_framework_target(handler: ReviewHandler) -> Callable[[Request], Awaitable[Reply]]:
    async def mutate(request: Request) -> Reply:
        return await answer_request(handler, request)

    return mutate


class ServingApp:
    """What ``castslice serve`` runs for the webhook: functions-framework's app, as
    ``functions-framework --target mutate --asgi`` builds it, around ``reviews`` (the one
    handler), with admission reviews answered by ``serve_http`` directly. Under CastSliceWorker
    the protocol answers small reviews itself with the same ``reviews``.

    ASGI lifespan: the webhook is built at startup, in the serving process (a failure stops
    it, named); the audit queue drains at shutdown (function/audit/shutdown.py)."""

    def __init__(self, reviews: WebhookOnDemand) -> None:
        from functions_framework.aio import create_asgi_app_from_module

        self.reviews = reviews
        # functions-framework's own app around a target bound to this handler: a module-like
        # object holding it stands for function/func.py, whose ``mutate`` builds its own.
        target = SimpleNamespace(mutate=functions_framework_target(reviews))
        self.app: ASGIApp = create_asgi_app_from_module(  # type: ignore[no-untyped-call]
            "mutate", str(FUNC_SOURCE), "http", target, None
        )
        self.lifespan = drain_on_shutdown(self._lifespan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_review(scope["method"], scope["path"]):
            await serve_http(self.reviews, scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    webhook = self.reviews.start()
                except Exception as error:
                    # The server logs the message and exits; raised too, as Starlette's own
                    # lifespan does, for servers that report the app's exception instead.
                    await send({"type": "lifespan.startup.failed", "message": f"{error}"})
                    raise
                if webhook.large_reviews is not None:
                    start_large_reviews(webhook.large_reviews)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                built = self.reviews.built
                if built is not None and built.large_reviews is not None:
                    built.large_reviews.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def start_large_reviews(large_reviews: LargeReviews) -> None:
    """The large-review process spawned as the server starts (readiness waits for it: the webhook's
    ``ready``), not on the first large review, which would wait for a Python process to start, past
    the apiserver's timeout on a busy machine. If it does not start, large reviews try again."""

    def started(future: Future[bool]) -> None:
        if future.exception() is not None:
            log.error(
                "the large-review process did not start: %s; large reviews will try again", future.exception()
            )

    large_reviews.start().add_done_callback(started)


def serving_app(target: str, config: Config | None = None, *, large_reviews: bool = False) -> ASGIApp:
    """The app ``castslice serve`` runs for ``target``. For the webhook, ``config`` (default: the
    file CASTSLICE_CONFIG names, read when the webhook is built) and ``large_reviews`` (decide
    reviews larger than LARGE_BODY_BYTES in a child process) make its webhook. The audit
    consumer builds none: it is functions-framework's app for function/func.py's ``audit``."""
    if target == "mutate":
        return ServingApp(WebhookOnDemand(lambda: build_webhook(config, large_reviews=large_reviews)))
    from functions_framework.aio import create_asgi_app

    app: ASGIApp = create_asgi_app(target, str(FUNC_SOURCE))  # type: ignore[no-untyped-call]
    if target == "audit":
        app = with_healthz(app)
    # Audit events still queued at SIGTERM are drained (bounded) before the worker dies.
    return drain_on_shutdown(app)


def with_healthz(app: ASGIApp) -> ASGIApp:
    """``app`` answering ``GET /healthz`` itself: a CloudEvent target takes POSTs only, so probes
    (and ``castslice doctor``) would otherwise get an error from a healthy consumer."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == HEALTHZ_PATH and scope["method"] in ("GET", "HEAD"):
            body = b'{"status":"ok"}'
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})
            return
        await app(scope, receive, send)

    return wrapped
