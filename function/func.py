"""functions-framework entry points.

``mutate`` is the webhook (an ASGI HTTP function, served by ``castslice serve`` and by
``functions-framework --source function/func.py --target mutate --asgi``). ``mutate_wsgi`` is
the same webhook on functions-framework's default Flask server, kept so the benchmark can
compare the two servers on the same code. Both are thin: all HTTP behaviour is in http_api.

``audit`` is the reference audit consumer (an ASGI CloudEvent function, ``castslice serve
--target audit``): it receives the webhook's decision events from a Trigger, checks them against
the shipped JSON Schema and stores them in SQLite at $CASTSLICE_AUDIT_DB (``castslice audit``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import flask
import functions_framework
from cloudevents.http import CloudEvent
from functions_framework import aio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from function.app import build_webhook
from function.audit.consumer import AUDIT_DB_ENV, DEFAULT_AUDIT_DB, AuditStore, InvalidEvent
from function.contract import LARGE_BODY_BYTES, MAX_BODY_BYTES, SWITCH_INTERVAL_SECONDS
from function.http_api import HttpReply

# Built at import: a bad configuration stops the server from starting, with the key named.
webhook = build_webhook()

# One thread for large reviews: more would only share the same GIL. While it works, the event
# loop needs the GIL back quickly to answer small reviews and /healthz: the interpreter hands the
# GIL over every SWITCH_INTERVAL_SECONDS instead of 5 ms (see contract.py for the measurement).
large_reviews = ThreadPoolExecutor(max_workers=1, thread_name_prefix="castslice-large-review")
sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)


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


@aio.http
async def mutate(request: Request) -> Response:
    try:
        body = await _read_limited(request) if request.method == "POST" else b""
    except ClientDisconnect:
        # The client left (or the server gave up on a body arriving too slowly, see
        # function/server.py): nobody is there to read an answer; the server drops this one.
        return Response(status_code=408)
    if body is not None and len(body) > LARGE_BODY_BYTES:
        # A large Pod takes the engine long enough (up to about a second for 3 MiB of small
        # objects) to stall every other request on this event loop: it runs on the one thread of
        # the large-review executor instead, one at a time, in arrival order.
        reply = await asyncio.get_running_loop().run_in_executor(
            large_reviews, webhook.handle, request.method, request.url.path, body
        )
        return _starlette(reply)
    return _starlette(webhook.handle(request.method, request.url.path, body))


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
