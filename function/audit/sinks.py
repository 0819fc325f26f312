"""Where decision events go: small classes behind one interface, ``send(event) -> SendResult``.

- ``KnativeSink``: HTTP POST to ``K_SINK`` (a SinkBinding's Broker ingress), CloudEvents binary
  mode, so the broker and Trigger filters read attributes from headers without parsing the body.
- ``DaprSink``: the Dapr sidecar's publish API with the structured event
  (``application/cloudevents+json``), so Dapr forwards our event as is instead of wrapping it.
- ``StdoutSink``: one JSON line per event; the embedded default, read by the cluster's log pipeline.
  It also takes batches (``send_all``): the sender hands it every waiting event at once, written
  in as few writes as keep lines whole.

Sinks get a ``WireEvent``: the CloudEvent's attributes with its data already serialized, once,
on the admission path (events.build_wire_event makes it without a CloudEvent object). A backlog
of thousands of events is then a few small objects each instead of a tree of dicts: the garbage
collector walks every tracked object on a full collection, and the admission path waits for it.

A sink never raises and never retries: it reports what happened (delivered, retryable or not)
and the sender (delivery.py) decides what to do. Stdout is also where undelivered events end up,
with ``"delivered": false`` and the reason, so the two kinds of line are told apart by one key.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import ssl
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TextIO
from urllib.parse import quote, urlsplit

import orjson
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent

log = logging.getLogger("castslice.audit")

LINE_MARKER: Final = "audit-event"
"""Every stdout line is ``{"castslice": "audit-event", "delivered": ..., "event": {...}}``."""
RETRYABLE_STATUSES: Final = frozenset({404, 408, 409, 429})
"""Plus every 5xx: what Knative's own senders retry (a Broker answers 202 on success)."""
DEFAULT_DAPR_PORT: Final = 3500


@dataclass(frozen=True)
class SendResult:
    delivered: bool
    retryable: bool = False
    detail: str = ""
    retry_after: float | None = None
    """Seconds the receiver asked us to wait (Retry-After), when it said so."""


DELIVERED = SendResult(True)
NOT_WRITABLE = SendResult(False, retryable=False, detail="stdout is not writable")
DELIVERED_HEADER: Final = {"castslice": LINE_MARKER, "delivered": True}
WRITE_BYTES: Final = select.PIPE_BUF if hasattr(select, "PIPE_BUF") else 512
"""The most bytes of several lines written at once (4096 on Linux; POSIX promises at least 512)."""


def compact_json(data: Any) -> bytes:
    # ASCII (non-ASCII escaped): a line stays writable whatever stdout's encoding is. orjson (C)
    # writes the same compact JSON several times faster, on the admission path's CPU; only an
    # event with non-ASCII text (rare: names and reasons are ASCII) takes the escaping encoder.
    try:
        encoded = orjson.dumps(data)
    except TypeError:  # orjson.JSONEncodeError: a value orjson cannot write (an int beyond 64 bits)
        encoded = b"\x80"
    if encoded.isascii():
        return encoded
    return json.dumps(data, separators=(",", ":")).encode()


DELIVERED_HEAD: Final = compact_json(DELIVERED_HEADER)[:-1] + b',"event":'
"""The start of every delivered line, up to the event (StdoutWriter.line with DELIVERED_HEADER)."""


@dataclass(frozen=True, slots=True)
class WireEvent:
    """A CloudEvent as it waits and travels: string attributes, and ``data`` as compact JSON."""

    id: str
    attributes: dict[str, str]
    data: bytes

    @classmethod
    def of(cls, event: CloudEvent) -> WireEvent:
        attributes = {name: str(event[name]) for name in event}
        return cls(attributes["id"], attributes, compact_json(event.get_data()))

    def binary(self) -> tuple[dict[str, str], bytes]:
        """HTTP binary mode (ce- headers, data as the body): bytes data passes through as is."""
        return to_binary(CloudEvent(self.attributes, self.data))

    def structured(self) -> bytes:
        """The structured-mode JSON object (attributes and ``data`` side by side), without
        parsing ``data`` again: the attributes object with the data spliced in."""
        head = compact_json(self.attributes)
        return head[:-1] + b',"data":' + self.data + b"}"

    def cloud_event(self) -> CloudEvent:
        return CloudEvent(self.attributes, json.loads(self.data))


class Sink(Protocol):
    name: str

    def send(self, event: WireEvent) -> SendResult: ...

    def close(self) -> None: ...


# -- stdout -----------------------------------------------------------------------------------------
class StdoutWriter:
    """Whole JSON lines to stdout, one writer at a time, flushed: a line is either all there or not.

    ``sys.stdout`` is looked up at each write (not kept), so a replaced stdout (pytest's capture,
    a redirected worker) is honoured.
    """

    def __init__(self, stream: Callable[[], TextIO] | None = None) -> None:
        self._stream = stream or (lambda: sys.stdout)
        self._lock = threading.Lock()

    @staticmethod
    def line(header: Mapping[str, Any], event: WireEvent) -> bytes:
        """``header``'s keys, then ``"event"``: the structured event; newline-terminated."""
        return compact_json(header)[:-1] + b',"event":' + event.structured() + b"}\n"

    def write(self, header: Mapping[str, Any], event: WireEvent) -> bool:
        """One line: ``header``'s keys, then ``"event"``: the structured event."""
        return self.write_lines([self.line(header, event)])[0]

    def write_lines(self, lines: list[bytes]) -> list[bool]:
        """Whole lines in order, in as few writes as PIPE_BUF allows; whether each was written.

        Lines are grouped into writes of at most WRITE_BYTES (a longer line is written alone):
        a pipe takes a write that size in one piece, so lines of several processes sharing
        stdout (gunicorn workers) never interleave mid-line, and one flush carries many events
        (each write lets the admission thread take the interpreter lock back).
        """
        written: list[bool] = []
        with self._lock:
            start = 0
            while start < len(lines):
                end, size = start + 1, len(lines[start])
                while end < len(lines) and size + len(lines[end]) <= WRITE_BYTES:
                    size += len(lines[end])
                    end += 1
                chunk = b"".join(lines[start:end]).decode()
                try:
                    stream = self._stream()
                    stream.write(chunk)
                    stream.flush()
                    written.extend([True] * (end - start))
                except (OSError, ValueError) as error:  # closed or broken stdout: the last resort failed
                    # The whole lines, so the events survive in the stderr log at least.
                    for line in lines[start:end]:
                        log.error(
                            "cannot write an audit event to stdout (%s): %s", error, line.decode().strip()
                        )
                    written.extend([False] * (end - start))
                start = end
        return written

    def delivered(self, event: WireEvent) -> bool:
        return self.delivered_all([event])[0]

    def delivered_all(self, events: list[WireEvent]) -> list[bool]:
        # line(DELIVERED_HEADER, event), the constant head serialized once.
        return self.write_lines([DELIVERED_HEAD + event.structured() + b"}\n" for event in events])

    def undelivered(self, event: WireEvent, reason: str, detail: str = "", attempts: int = 0) -> bool:
        header = {
            "castslice": LINE_MARKER,
            "delivered": False,
            "reason": reason,
            "detail": detail,
            "attempts": attempts,
        }
        return self.write(header, event)


class StdoutSink:
    name = "stdout"

    def __init__(self, writer: StdoutWriter) -> None:
        self.writer = writer

    def send(self, event: WireEvent) -> SendResult:
        return self.send_all([event])[0]

    def send_all(self, events: list[WireEvent]) -> list[SendResult]:
        """send for each, in one write where they fit (the sender hands stdout whole batches)."""
        return [DELIVERED if written else NOT_WRITABLE for written in self.writer.delivered_all(events)]

    def close(self) -> None:
        return None


# -- HTTP -------------------------------------------------------------------------------------------
def classify(status: int, retry_after: str | None = None, where: str = "") -> SendResult:
    """An HTTP status in delivery terms (pure)."""
    if 200 <= status < 300:
        return DELIVERED
    detail = f"HTTP {status}" + (f" from {where}" if where else "")
    retryable = status in RETRYABLE_STATUSES or status >= 500
    wait: float | None = None
    if retryable and retry_after and retry_after.strip().isdigit():
        wait = float(retry_after.strip())
    return SendResult(False, retryable=retryable, detail=detail, retry_after=wait)


class HttpPoster:
    """POSTs over a kept-alive connection per sending thread (http.client: no dependency, and
    no connection set-up per event on the hot path)."""

    def __init__(self, url: str, timeout: float, ca_certs: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"sink URL must be http:// or https:// with a host, got {url!r}")
        self.url = url
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self._context: ssl.SSLContext | None = None
        if self.https:
            # Knative's SinkBinding injects K_CA_CERTS (PEM) when the sink serves eventing TLS.
            self._context = ssl.create_default_context(cadata=ca_certs)
        self._local = threading.local()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, True
        if self.https:
            connection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self._context
            )
        else:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._local.connection = connection
        return connection, False

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def post(self, headers: Mapping[str, str], body: bytes) -> SendResult:
        for _ in range(2):
            connection, reused = self._connection()
            try:
                connection.request("POST", self.target, body=body, headers=dict(headers))
                response = connection.getresponse()
                response.read()  # drain it, so the connection can carry the next event
                if response.will_close:
                    self._drop()
                return classify(response.status, response.getheader("Retry-After"), self.url)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as error:
                self._drop()
                if reused:
                    continue  # the server closed an idle kept-alive connection: one fresh try, not a retry
                return SendResult(False, retryable=True, detail=f"{type(error).__name__} from {self.url}")
            except TimeoutError:
                self._drop()
                detail = f"timed out after {self.timeout}s: {self.url}"
                return SendResult(False, retryable=True, detail=detail)
            except (OSError, http.client.HTTPException) as error:
                self._drop()
                detail = f"{type(error).__name__}: {error} ({self.url})"
                return SendResult(False, retryable=True, detail=detail)
        return SendResult(False, retryable=True, detail=f"connection closed by {self.url}")

    def close(self) -> None:
        self._drop()


class KnativeSink:
    """K_SINK, binary content mode (the attributes as ce- headers, the data as the JSON body)."""

    name = "knative"

    def __init__(self, url: str, timeout: float, ca_certs: str | None = None) -> None:
        self.poster = HttpPoster(url, timeout, ca_certs)

    def send(self, event: WireEvent) -> SendResult:
        headers, body = event.binary()
        return self.poster.post(headers, body)

    def close(self) -> None:
        self.poster.close()


class DaprSink:
    """Dapr pub/sub through the sidecar: POST /v1.0/publish/<pubsub>/<topic>, structured event."""

    name = "dapr"

    def __init__(
        self, port: int, pubsub: str, topic: str, timeout: float, api_token: str | None = None
    ) -> None:
        url = f"http://localhost:{port}/v1.0/publish/{quote(pubsub, safe='')}/{quote(topic, safe='')}"
        self.poster = HttpPoster(url, timeout)
        self.api_token = api_token

    def send(self, event: WireEvent) -> SendResult:
        # Off the admission path (the sender thread), so the SDK's own structured encoding.
        _, body = to_structured(event.cloud_event())
        headers = {"content-type": "application/cloudevents+json"}
        if self.api_token:
            headers["dapr-api-token"] = self.api_token
        return self.poster.post(headers, body)

    def close(self) -> None:
        self.poster.close()
