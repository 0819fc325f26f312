"""Drain the audit backlog when the server shuts down, before the process dies.

Under gunicorn's uvicorn worker (what ``castslice serve`` and ``functions-framework --asgi`` run)
a SIGTERM does not end the worker through ``sys.exit``: uvicorn captures the signal, shuts the
server down gracefully, restores the previous handler (the default one) and raises the signal
again, so the process is killed and ``atexit`` hooks never run. The one hook that does run, after
the last request and before that, is the ASGI lifespan shutdown: this wrapper drains there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from function.audit.delivery import close_all

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def drain_on_shutdown(app: ASGIApp, drain: Callable[[], object] = close_all) -> ASGIApp:
    """``app`` with the audit drain run when the server reports lifespan shutdown."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_after_drain(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                # In a thread: the drain blocks for up to audit.drainSeconds.
                await asyncio.to_thread(drain)
            await send(message)

        await app(scope, receive, send_after_drain)

    return wrapped
