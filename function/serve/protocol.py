"""The HTTP server's connection rules: bounded headers, bounded read times, a clean shutdown.

``castslice serve`` runs functions-framework's ASGI app under gunicorn with uvicorn workers, the
server ``functions-framework --asgi`` builds. uvicorn's httptools protocol has none of the limits
a server facing a network needs: no bound on header size (a 60 MB header is read into memory), no
time limit on reading headers or a body (a client sending one byte a second keeps a connection,
and a body shorter than its Content-Length holds one, for ever), no idle limit on a connection
that never sends a byte, and at shutdown it closes idle keep-alive connections, racing a request
the client may be writing at that moment (an HTTP/1.1 client cannot tell it from a request the
server read, so the apiserver does not retry the POST: the Pod is admitted unmutated).

``HardenedHttpToolsProtocol`` adds exactly those rules to uvicorn's protocol, and
``CastSliceWorker`` is the uvicorn worker that uses it (``castslice serve`` passes it to gunicorn
as ``worker_class``). The values are in function/contract.py and the README ("The HTTP surface").

It also answers admission reviews itself, with the review handler of the app it serves (the
app's ``reviews``, see function/serve/asgi.py ``ServingApp``): a review is small, its answer is
computed synchronously (WebhookHttp.handle never awaits), and ASGI's per-request machinery (a
task, an event, message dicts, two writes) costs about as much as deciding a Pod. A review whose
body is declared, not too large and arrives while the client reads its replies is answered from
the parser's callback, in one write; anything else takes the ASGI path.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

import uvicorn
from gunicorn.arbiter import Arbiter
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from function.contract import (
    BODY_READ_SECONDS,
    HEADER_READ_SECONDS,
    IDLE_KEEPALIVE_SECONDS,
    KEPT_ALIVE_IDLE_SECONDS,
    LARGE_BODY_BYTES,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    SHUTDOWN_LINGER_SECONDS,
    WRITE_SECONDS,
)
from function.serve.draining import DRAINING, drain_seconds
from function.serve.http_api import INTERNAL_ERROR, HttpReply, ReviewHandler, is_review, problem

log = logging.getLogger("castslice.server")

if not hasattr(HttpToolsProtocol, "_start_asgi_task"):
    # Without the hook every review would silently take the ASGI path; pyproject.toml bounds the
    # versions this module is tested against.
    raise ImportError(
        f"uvicorn {uvicorn.__version__} has no HttpToolsProtocol._start_asgi_task, which "
        "function/serve/protocol.py overrides: install the uvicorn version pyproject.toml names"
    )


def http_bytes(reply: HttpReply, head: Iterable[bytes] = (), close: bool = False) -> bytes:
    """``reply`` as HTTP/1.1 bytes: status line, ``head`` (whole header lines), its headers."""
    parts = [STATUS_LINE[reply.status], *head]
    parts += (b"content-type: ", reply.content_type.encode("latin-1"), b"\r\n")
    parts += (b"content-length: ", str(len(reply.body)).encode("latin-1"), b"\r\n")
    for name, text in reply.headers.items():
        parts += (name.lower().encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n")
    if close:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", reply.body)
    return b"".join(parts)


HEADERS_TOO_LARGE = http_bytes(
    problem(431, f"request line and headers larger than {MAX_HEADER_BYTES} bytes"), close=True
)
HEADERS_TOO_SLOW = http_bytes(
    problem(408, f"request line and headers not received within {HEADER_READ_SECONDS:g} s"), close=True
)
BODY_TOO_SLOW = http_bytes(
    problem(408, f"request body not received within {BODY_READ_SECONDS:g} s"), close=True
)
BODY_TOO_LARGE = http_bytes(problem(413, f"request body larger than {MAX_BODY_BYTES} bytes"), close=True)


def _declared_length(cycle: RequestResponseCycle) -> int | None:
    for name, value in cycle.scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _direct_eligible(cycle: RequestResponseCycle) -> bool:
    """A review this protocol can answer itself: POSTed to a review path with a declared body no
    larger than what is decided on the event loop anyway (function/serve/offload.py takes the rest),
    and without ``Expect: 100-continue`` (which ASGI's receive answers)."""
    scope = cycle.scope
    if not is_review(scope["method"], scope["path"]) or cycle.waiting_for_100_continue:
        return False
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.isdigit() and int(value) <= LARGE_BODY_BYTES
    return False


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with size and time limits on reading a request, and a shutdown
    that closes no connection its client may still send a request on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_headers = False
        self._header_bytes = 0
        self._read_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._in_message = False
        """Between a request's first byte and the end of its body, as the parser reads them."""
        self._body_bytes = 0
        self._shutting_down = False
        self._eof_sent = False
        self._messages_ended = 0
        """Requests whose last byte has been read on this connection."""
        self._direct: RequestResponseCycle | None = None
        """A review read by this protocol, to be answered when its body is complete."""
        self._reviews: ReviewHandler | None = getattr(self.config.app, "reviews", None)
        """The served app's review handler (function/serve/asgi.py ServingApp); None: every
        request takes the ASGI path."""

    # -- connection life ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timer only after a response: a connection that never sends
        # a byte would otherwise stay open for ever.
        self.timeout_keep_alive_task = self.loop.call_later(
            IDLE_KEEPALIVE_SECONDS, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        self._cancel_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        # The send buffer is full: the client is not reading its replies. uvicorn then waits for
        # it to drain, for ever; bound that wait.
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(WRITE_SECONDS, self._write_too_slow)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        if self._eof_sent:
            return  # shutting down and already said so with a FIN: read and drop until the peer closes
        # Bytes arriving while no body is being read belong to a request line or headers.
        between = self._reading_headers or not self._in_message
        ended_before = self._messages_ended
        super().data_received(data)
        if self.transport.is_closing():
            return
        # Count what arrives while headers are incomplete, so a header that never ends is refused
        # before httptools buffers it (it has no limit of its own).
        if self._reading_headers:
            self._header_bytes += len(data) if between else 0
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse(HEADERS_TOO_LARGE, "request headers larger than %d bytes", MAX_HEADER_BYTES)
        elif (
            self._read_timer is None
            and not self._in_message
            and self._messages_ended == ended_before
            and (self.cycle is None or self.cycle.response_complete)
        ):
            # Bytes that begin no request (stray CRLFs) cancelled the idle timer: bound them too.
            # (Not bytes that ended a request, answered at once by the direct path: the connection
            # is then idle, kept alive, and the kept-alive limit bounds it.)
            self._arm_read_timer(HEADER_READ_SECONDS, HEADERS_TOO_SLOW, "headers")

    def send_400_response(self, msg: str) -> None:
        # httptools wraps _Refused in a parser error, which uvicorn answers with a 400: the
        # connection already got its 431 and is closing, so there is nothing more to say.
        if not self.transport.is_closing():
            super().send_400_response(msg)

    # -- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._in_message = True
        self._header_bytes = 0
        self._body_bytes = 0
        self._arm_read_timer(HEADER_READ_SECONDS, HEADERS_TOO_SLOW, "headers")

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        self._check_header_size()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        self._check_header_size()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._arm_read_timer(BODY_READ_SECONDS, BODY_TOO_SLOW, "body")
        super().on_headers_complete()
        if (self._shutting_down or DRAINING.is_set()) and self.cycle is not None:
            # Answered with "connection: close", then closed: while draining, the client's next
            # connection goes to a replica that stays (function/serve/draining.py).
            self.cycle.keep_alive = False
        declared = _declared_length(self.cycle) if self.cycle is not None else None
        if declared is not None and declared > MAX_BODY_BYTES:
            self._refuse_body()

    def on_body(self, body: bytes) -> None:
        if self._eof_sent:
            return  # refused: the rest is read and dropped
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:  # chunked, or more than declared
            self._refuse_body()
            return
        super().on_body(body)
        if self._direct is not None and self._direct is self.cycle:
            # uvicorn pauses reading past 64 KiB until the app reads; here nobody else will.
            self.flow.resume_reading()

    def on_message_complete(self) -> None:
        self._in_message = False
        self._messages_ended += 1
        self._cancel_read_timer()
        if self._eof_sent:
            return  # a refused request's end: nothing to answer
        super().on_message_complete()
        if self._direct is not None and self._direct is self.cycle:
            self._answer_direct(self._direct)

    # -- reviews answered here ----------------------------------------------------------------
    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self._reviews is not None and not self.flow.write_paused and _direct_eligible(cycle):
            # A client not reading its replies (write_paused) goes the ASGI way, which waits.
            if cycle.more_body:
                self._direct = cycle  # answered in on_message_complete
            else:
                # A pipelined request, already read: answered on the next turn of the loop,
                # not inside the previous reply's completion.
                self._direct = cycle
                self.loop.call_soon(self._answer_direct, cycle)
            return
        super()._start_asgi_task(cycle, app)

    def _answer_direct(self, cycle: RequestResponseCycle) -> None:
        if self._direct is not cycle:
            return
        self._direct = None
        if self.transport.is_closing() or cycle.disconnected or self._reviews is None:
            return
        try:
            reply = self._reviews.handle("POST", cycle.scope["path"], bytes(cycle.body))
        except Exception:  # the handler guards itself; this is the server's last resort
            log.exception("unexpected error answering a review")
            reply = INTERNAL_ERROR
        cycle.body = bytearray()
        defaults = [b"%s: %s\r\n" % (name, value) for name, value in cycle.default_headers]
        if cycle.access_log:
            # uvicorn's own access line, argument for argument: its AccessFormatter unpacks five.
            cycle.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(cycle.scope),
                cycle.scope["method"],
                get_path_with_query_string(cycle.scope),
                cycle.scope["http_version"],
                reply.status,
            )
        cycle.response_started = True
        cycle.response_complete = True
        self.transport.write(http_bytes(reply, defaults, close=not cycle.keep_alive))
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()

    # -- limits -------------------------------------------------------------------------------
    def _check_header_size(self) -> None:
        if self._header_bytes > MAX_HEADER_BYTES:
            # Raised inside httptools' callback: stop parsing; data_received sees the closed transport.
            self._refuse(HEADERS_TOO_LARGE, "request headers larger than %d bytes", MAX_HEADER_BYTES)
            raise _Refused

    def _arm_read_timer(self, seconds: float, reply: bytes, what: str) -> None:
        self._cancel_read_timer()
        self._read_timer = self.loop.call_later(seconds, self._read_too_slow, reply, what)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_too_slow(self, reply: bytes, what: str) -> None:
        self._read_timer = None
        if self.cycle is not None and what == "body" and self.cycle.response_started:
            self.transport.close()  # the app already answered; only the unread rest is missing
            return
        if self.cycle is not None and what == "body":
            # The app sees a disconnect on its next read, and whatever it answers is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self._refuse(reply, "request %s too slow: closed", what)

    def _refuse_body(self) -> None:
        """A body over MAX_BODY_BYTES: 413 now, from here, and the connection closed cleanly. The
        client is usually still sending: answered by the app, the 413 would leave the rest of the
        body to arrive on a kept-alive connection (read as the start of a next request, it earned
        an unsolicited 408), and with ``Connection: close`` the socket closed with those bytes
        unread, which the kernel answers with a reset."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The app sees a disconnect on its next read, and whatever it answers is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self._refuse(BODY_TOO_LARGE, "request body larger than %d bytes: 413, closed", MAX_BODY_BYTES)
        self.flow.resume_reading()  # read and drop the rest until the client closes

    def _write_too_slow(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        log.warning("client read no reply for %g s: connection dropped", WRITE_SECONDS)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        # Nothing can reach a client that does not read: drop the connection and what it holds.
        self.transport.abort()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _refuse(self, reply: bytes, message: str, *args: object) -> None:
        if self.transport.is_closing():
            return
        log.warning(message, *args)
        self._cancel_read_timer()
        self.transport.write(reply)
        # Not close(): the client may still be sending, and closing with its bytes unread makes
        # the kernel answer with a reset, which can destroy the reply before it is read.
        self._close_idle_cleanly()

    # -- graceful shutdown --------------------------------------------------------------------
    def shutdown(self) -> None:
        """Called by uvicorn's server once it stopped accepting connections (SIGTERM).

        No connection the client may still reuse is closed by the server: an HTTP/1.1 client that
        has just written a request on a kept-alive connection and reads the server's FIN gets an
        EOF, and Go's transport (the apiserver's) does not retry a POST that met one. So a request
        in flight, or arriving later, is answered with ``connection: close`` and the connection
        closes after that answer; an idle connection stays open until its client closes it (the
        apiserver's idle limit is below KEPT_ALIVE_IDLE_SECONDS, which still bounds it)."""
        self._shutting_down = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.response_started:
            cycle.keep_alive = False  # in flight: answered with "connection: close"
        # A reply already started without "connection: close" promised the client this
        # connection: it stays open, idle, after that reply, like any other.

    def _close_idle_cleanly(self) -> None:
        self._unset_keepalive_if_required()
        if not self.transport.can_write_eof():
            self.transport.close()  # TLS: close_notify
            return
        # Half-close: the peer reads our FIN, sends nothing more and closes; whatever it sent
        # meanwhile is read and dropped, so the kernel never answers it with a reset.
        if self._eof_sent:
            return
        self._eof_sent = True
        self.transport.write_eof()
        self.loop.call_later(SHUTDOWN_LINGER_SECONDS, self.transport.close)


class _Refused(Exception):
    """Stops httptools' parser from inside a callback once the connection is refused."""


class DrainingServer(Server):
    """uvicorn's server, which at SIGTERM first drains for ``drain`` seconds (function/serve/draining.py):
    still accepting and answering, not ready, every reply ``connection: close``; then uvicorn's own
    graceful shutdown. Another SIGTERM meanwhile changes nothing; SIGINT and SIGQUIT stop at once."""

    def __init__(self, config: Config, drain: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_until: float | None = None
        self._drain_logged = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.drain <= 0 or self.should_exit:
            super().handle_exit(sig, frame)
            return
        if self.drain_until is None:
            # Re-raised after the shutdown, as uvicorn does with the signals it handles.
            self._captured_signals.append(sig)
            self.drain_until = time.monotonic() + self.drain
            DRAINING.set()

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and not self.should_exit:
            if not self._drain_logged:  # not from the signal handler: logging takes locks
                self._drain_logged = True
                log.info(
                    "SIGTERM: draining for %g s (not ready, connection: close), then stopping", self.drain
                )
            if time.monotonic() >= self.drain_until:
                log.info("drained: no longer accepting connections")
                self.should_exit = True
        return await super().on_tick(counter)


class CastSliceWorker(UvicornWorker):  # type: ignore[misc]  # uvicorn_worker ships no types
    """uvicorn's gunicorn worker, on the hardened protocol (uvloop when installed), draining at SIGTERM."""

    CONFIG_KWARGS: dict[str, Any] = {  # noqa: RUF012 - the base class declares it so
        "loop": "auto",
        "http": HardenedHttpToolsProtocol,
        "timeout_keep_alive": KEPT_ALIVE_IDLE_SECONDS,
    }

    async def _serve(self) -> None:
        # UvicornWorker._serve with the draining server (castslice serve checked the setting).
        self.config.app = self.wsgi
        server = DrainingServer(self.config, drain_seconds())
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
