"""functions-framework entry points.

``mutate`` is the webhook (an ASGI HTTP function, served by ``castslice serve`` and by
``functions-framework --source function/func.py --target mutate --asgi``). ``mutate_wsgi`` is
the same webhook on functions-framework's default Flask server, kept so the benchmark can
compare the two servers on the same code. Both are thin: all HTTP behaviour is in http_api.
"""

from __future__ import annotations

import flask
import functions_framework
from functions_framework import aio
from starlette.requests import Request
from starlette.responses import Response

from function.app import build_webhook
from function.contract import MAX_BODY_BYTES
from function.http_api import HttpReply

# Built at import: a bad configuration stops the server from starting, with the key named.
webhook = build_webhook()


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
    body = await _read_limited(request) if request.method == "POST" else b""
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
