"""Delivery: the bounded backlog, retries with backoff, spill to stdout, the bounded drain, and the
real sinks against loopback servers (healthy, failing, refusing, hanging)."""

from __future__ import annotations

import io
import json
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary, to_dict, to_structured
from cloudevents.http import CloudEvent

from function.admission.facts import audit_facts
from function.admission.review import request_context
from function.admission.wire import parse_review
from function.audit.delivery import EventSender, RetryPolicy
from function.audit.events import build_event
from function.audit.metrics import AuditMetrics
from function.audit.sinks import (
    DaprSink,
    KnativeSink,
    SendResult,
    StdoutSink,
    StdoutWriter,
    WireEvent,
    classify,
)
from function.core.config import Config
from function.core.engine import Engine
from tests.support import load_review
from tests.support.audit import HangingSink, RecordingSink, parse_lines, refused_url, wait_for
from tests.support.tls import write_pair

FAST = RetryPolicy(max_attempts=3, initial_backoff=0.005, max_backoff=0.02)
REVIEW = parse_review(json.dumps(load_review("default-slice-inference")).encode())
DECISION = Engine(Config()).decide(REVIEW.request.object, request_context(REVIEW))


def make_event(number: int) -> CloudEvent:
    return build_event(
        audit_facts(REVIEW, DECISION),
        DECISION,
        event_id=f"ev-{number}",
        decided_at=datetime.now(UTC),
        source="/castslice/test",
        config_digest="sha256:" + "0" * 16,
    )


class Stdout:
    """What the sender writes to stdout, parsed."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()
        self.writer = StdoutWriter(lambda: self.buffer)

    def lines(self) -> list[dict[str, Any]]:
        return parse_lines(self.buffer.getvalue())

    def undelivered(self) -> dict[str, dict[str, Any]]:
        return {line["event"]["id"]: line for line in self.lines() if line["delivered"] is False}


class ScriptedSink:
    """Answers with ``results`` in turn (the last repeats); records the ids it was sent."""

    name = "fake"

    def __init__(self, *results: SendResult | Exception) -> None:
        self.results = list(results) or [SendResult(True)]
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def send(self, event: WireEvent) -> SendResult:
        with self.lock:
            self.calls.append(event.id)
            result = self.results[min(len(self.calls) - 1, len(self.results) - 1)]
        if isinstance(result, Exception):
            raise result
        return result

    def delivered_ids(self) -> set[str]:
        return set(self.calls) if self.results[-1] == SendResult(True) else set()

    def close(self) -> None:
        return None


class BlockingSink:
    """Holds every send until released (a sink that is slow or stuck)."""

    name = "fake"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.delivered: list[str] = []

    def send(self, event: WireEvent) -> SendResult:
        self.started.set()
        if not self.release.wait(30):
            return SendResult(False, retryable=True, detail="never released")
        self.delivered.append(event.id)
        return SendResult(True)

    def close(self) -> None:
        return None


def sample(metrics: AuditMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def sender_for(sink: Any, stdout: Stdout, **options: Any) -> tuple[EventSender, AuditMetrics]:
    metrics = AuditMetrics(getattr(sink, "name", "fake"))
    options.setdefault("policy", FAST)
    options.setdefault("drain_seconds", 2.0)
    return EventSender(sink, stdout.writer, metrics, rng=random.Random(7), **options), metrics


@pytest.fixture
def stdout() -> Stdout:
    return Stdout()


@pytest.fixture
def closers() -> Iterator[list[EventSender]]:
    senders: list[EventSender] = []
    yield senders
    for sender in senders:
        sender.close(0.5)


def test_healthy_sink_gets_every_event_and_stdout_stays_empty(
    stdout: Stdout, closers: list[EventSender]
) -> None:
    sink = ScriptedSink(SendResult(True))
    sender, metrics = sender_for(sink, stdout, senders=2)
    closers.append(sender)
    for number in range(50):
        sender.submit(make_event(number))
    wait_for(lambda: sample(metrics, "castslice_audit_events_delivered_total", sink="fake") == 50, 5)
    assert sorted(sink.calls) == sorted(f"ev-{n}" for n in range(50))
    assert sender.close() == 0
    assert stdout.lines() == []


def test_retryable_failures_are_retried_then_delivered(stdout: Stdout, closers: list[EventSender]) -> None:
    sink = ScriptedSink(
        SendResult(False, True, "HTTP 503"), SendResult(False, True, "HTTP 503"), SendResult(True)
    )
    sender, metrics = sender_for(sink, stdout)
    closers.append(sender)
    sender.submit(make_event(1))
    wait_for(lambda: sample(metrics, "castslice_audit_events_delivered_total", sink="fake") == 1, 5)
    assert sink.calls == ["ev-1"] * 3
    assert sample(metrics, "castslice_audit_event_retries_total", sink="fake") == 2
    assert stdout.lines() == []


def test_a_rejected_event_goes_to_stdout_at_once_marked_undelivered(
    stdout: Stdout, closers: list[EventSender]
) -> None:
    sink = ScriptedSink(SendResult(False, False, "HTTP 400 from http://broker"))
    sender, metrics = sender_for(sink, stdout)
    closers.append(sender)
    event = make_event(1)
    sender.submit(event)
    wait_for(lambda: stdout.lines(), 5, what="the spilled line")
    [line] = stdout.lines()
    assert line["castslice"] == "audit-event" and line["delivered"] is False
    assert line["reason"] == "rejected by sink" and line["detail"] == "HTTP 400 from http://broker"
    assert line["attempts"] == 1 and sink.calls == ["ev-1"]
    # The whole event, in structured form: a log pipeline can replay it as is.
    assert line["event"]["id"] == "ev-1" and line["event"]["data"] == event.data
    assert line["event"]["type"] == event["type"] and line["event"]["specversion"] == "1.0"
    assert sample(metrics, "castslice_audit_events_spilled_total", reason="rejected") == 1


def test_an_event_that_keeps_failing_goes_to_stdout_after_max_attempts(
    stdout: Stdout, closers: list[EventSender]
) -> None:
    sink = ScriptedSink(ConnectionError("sink bug"), SendResult(False, True, "timed out"))
    sender, metrics = sender_for(sink, stdout)
    closers.append(sender)
    sender.submit(make_event(1))
    wait_for(lambda: stdout.undelivered(), 5, what="the spilled line")
    line = stdout.undelivered()["ev-1"]
    assert line["reason"] == "retries exhausted" and line["attempts"] == 3 and line["detail"] == "timed out"
    assert sink.calls == ["ev-1"] * 3
    assert sample(metrics, "castslice_audit_events_spilled_total", reason="retries_exhausted") == 1
    # The sender survived the sink raising, and goes on with the next event.
    sink.results = [SendResult(True)]
    sender.submit(make_event(2))
    wait_for(lambda: sample(metrics, "castslice_audit_events_delivered_total", sink="fake") == 1, 5)


def test_a_full_backlog_spills_at_once_without_blocking_and_stays_bounded(
    stdout: Stdout, closers: list[EventSender]
) -> None:
    sink = BlockingSink()
    sender, metrics = sender_for(sink, stdout, capacity=3)
    closers.append(sender)
    sender.submit(make_event(0))
    assert sink.started.wait(5)  # ev-0 is in flight, stuck
    started = time.perf_counter()
    for number in range(1, 20):
        sender.submit(make_event(number))
        assert sender.depth() <= 3
    assert time.perf_counter() - started < 0.5, "submitting never waits for the sink"
    wait_for(lambda: len(stdout.undelivered()) == 16, 5, what="the spilled lines")
    spilled = stdout.undelivered()
    assert set(spilled) == {f"ev-{n}" for n in range(4, 20)}
    assert {line["reason"] for line in spilled.values()} == {"queue full"}
    assert sample(metrics, "castslice_audit_queue_depth") == 3
    assert sample(metrics, "castslice_audit_queue_capacity") == 3
    assert sample(metrics, "castslice_audit_events_spilled_total", reason="queue_full") == 16
    sink.release.set()
    wait_for(lambda: len(sink.delivered) == 4, 5)
    assert set(sink.delivered) | set(spilled) == {f"ev-{n}" for n in range(20)}
    assert not set(sink.delivered) & set(spilled)


def test_close_drains_within_its_bound_and_writes_the_rest_to_stdout(
    stdout: Stdout, closers: list[EventSender]
) -> None:
    sink = BlockingSink()
    sender, metrics = sender_for(sink, stdout, capacity=100)
    for number in range(10):
        sender.submit(make_event(number))
    assert sink.started.wait(5)
    started = time.monotonic()
    left = sender.close(timeout=0.3)
    took = time.monotonic() - started
    assert 0.25 <= took < 1.0
    assert left == 10
    spilled = stdout.undelivered()
    assert set(spilled) == {f"ev-{n}" for n in range(10)}, "the in-flight event too"
    assert {line["reason"] for line in spilled.values()} == {"shutdown"}
    assert sample(metrics, "castslice_audit_events_spilled_total", reason="shutdown") == 10
    assert not sender.accepting
    # After close, an event goes to stdout (through the spill writer: submit never writes itself).
    sender.submit(make_event(99))
    wait_for(lambda: "ev-99" in stdout.undelivered(), 5, what="the late event on stdout")
    assert stdout.undelivered()["ev-99"]["reason"] == "shutdown"
    assert sender.close() == 0, "closing twice is harmless"
    sink.release.set()


def test_close_waits_for_a_healthy_sink_to_take_everything(stdout: Stdout) -> None:
    sink = ScriptedSink(SendResult(False, True, "503"), SendResult(True))
    sender, metrics = sender_for(sink, stdout, capacity=100)
    for number in range(20):
        sender.submit(make_event(number))
    assert sender.close(timeout=5) == 0
    assert sample(metrics, "castslice_audit_events_delivered_total", sink="fake") == 20
    assert stdout.lines() == []


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    policy = RetryPolicy(max_attempts=10, initial_backoff=0.2, max_backoff=5.0)
    rng = random.Random(1)
    for attempt, step in [(1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 3.2), (6, 5.0), (9, 5.0)]:
        delays = {policy.delay(attempt, rng) for _ in range(50)}
        assert all(step / 2 <= d <= step for d in delays), (attempt, delays)
        assert len(delays) > 40, "jittered"
    assert policy.delay(1, rng, retry_after=3) == 3
    assert policy.delay(1, rng, retry_after=60) == 5.0, "Retry-After is capped by maxBackoffSeconds"


@pytest.mark.parametrize(
    ("status", "delivered", "retryable"),
    [
        (200, True, False),
        (202, True, False),
        (204, True, False),
        (400, False, False),
        (401, False, False),
        (403, False, False),
        (404, False, True),
        (408, False, True),
        (409, False, True),
        (413, False, False),
        (429, False, True),
        (500, False, True),
        (502, False, True),
        (503, False, True),
    ],
)
def test_status_classification(status: int, delivered: bool, retryable: bool) -> None:
    result = classify(status)
    assert (result.delivered, result.retryable) == (delivered, retryable)


def test_stdout_sink_writes_delivered_lines(stdout: Stdout) -> None:
    sink = StdoutSink(stdout.writer)
    assert sink.send(WireEvent.of(make_event(1))).delivered
    [line] = stdout.lines()
    assert line == {"castslice": "audit-event", "delivered": True, "event": line["event"]}
    assert line["event"]["id"] == "ev-1" and "reason" not in line


def test_a_queued_event_is_serialized_once_and_round_trips() -> None:
    event = make_event(1)
    wire = WireEvent.of(event)
    assert isinstance(wire.data, bytes), "a backlog holds bytes, not dict trees for the GC to walk"
    assert json.loads(wire.structured()) == json.loads(to_structured(event)[1])
    headers, body = wire.binary()
    expected_headers, expected_body = to_binary(event)
    assert headers == expected_headers and json.loads(body) == json.loads(expected_body)
    assert to_dict(wire.cloud_event()) == to_dict(event)


def test_stdout_lines_are_ascii_so_any_stdout_encoding_takes_them() -> None:
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    event = CloudEvent({"type": "t.v1", "source": "/s", "id": "1"}, {"reason": "naïve ✓"})
    assert StdoutWriter(lambda: stream).undelivered(WireEvent.of(event), "queue full")
    [line] = parse_lines(stream.buffer.getvalue().decode("ascii"))  # type: ignore[attr-defined]
    assert line["event"]["data"] == {"reason": "naïve ✓"} and line["reason"] == "queue full"


# -- real HTTP sinks on loopback ------------------------------------------------------------------------
def test_knative_sink_posts_binary_mode_to_k_sink(stdout: Stdout, closers: list[EventSender]) -> None:
    server = RecordingSink([202])
    try:
        sender, metrics = sender_for(KnativeSink(server.url + "ingress", 2.0), stdout)
        closers.append(sender)
        events = [make_event(n) for n in range(3)]
        for event in events:
            sender.submit(event)
        wait_for(lambda: sample(metrics, "castslice_audit_events_delivered_total", sink="knative") == 3, 5)
        assert server.ids() == ["ev-0", "ev-1", "ev-2"]
        request = server.requests[0]
        assert request["path"] == "/ingress"
        headers = request["headers"]
        assert headers["content-type"] == "application/json"
        assert headers["ce-specversion"] == "1.0" and headers["ce-type"] == events[0]["type"]
        assert headers["ce-source"] == "/castslice/test"
        assert headers["ce-subject"] == "namespaces/default/pods/slice-inference"
        assert headers["ce-dataschema"] == events[0]["dataschema"]
        assert (headers["ce-outcome"], headers["ce-podnamespace"], headers["ce-mutators"]) == (
            "mutated",
            "default",
            "gpu-slicing",
        )
        assert json.loads(request["body"]) == events[0].data
        assert stdout.lines() == []
    finally:
        server.close()


def test_sink_answering_500_is_retried_then_the_event_is_on_stdout(
    stdout: Stdout, closers: list[EventSender]
) -> None:
    server = RecordingSink([500])
    try:
        sender, metrics = sender_for(KnativeSink(server.url, 2.0), stdout)
        closers.append(sender)
        sender.submit(make_event(1))
        wait_for(lambda: stdout.undelivered(), 5, what="the spilled line")
        assert server.ids() == ["ev-1"] * 3, "the same event id on every attempt"
        line = stdout.undelivered()["ev-1"]
        assert line["reason"] == "retries exhausted" and "HTTP 500" in line["detail"]
        assert sample(metrics, "castslice_audit_event_retries_total", sink="knative") == 2
    finally:
        server.close()


def test_429_with_retry_after_then_accepted(stdout: Stdout, closers: list[EventSender]) -> None:
    server = RecordingSink([429, 202], headers={"Retry-After": "0"})
    try:
        sender, metrics = sender_for(KnativeSink(server.url, 2.0), stdout)
        closers.append(sender)
        sender.submit(make_event(1))
        wait_for(lambda: sample(metrics, "castslice_audit_events_delivered_total", sink="knative") == 1, 5)
        assert server.ids() == ["ev-1", "ev-1"]
    finally:
        server.close()


def test_refused_connection_ends_on_stdout(stdout: Stdout, closers: list[EventSender]) -> None:
    sender, _ = sender_for(KnativeSink(refused_url(), 2.0), stdout)
    closers.append(sender)
    sender.submit(make_event(1))
    wait_for(lambda: stdout.undelivered(), 5, what="the spilled line")
    line = stdout.undelivered()["ev-1"]
    assert line["reason"] == "retries exhausted" and "ConnectionRefusedError" in line["detail"]


def test_hanging_sink_times_out_and_ends_on_stdout(stdout: Stdout, closers: list[EventSender]) -> None:
    hanging = HangingSink()
    try:
        sender, _ = sender_for(KnativeSink(hanging.url, 0.2), stdout, policy=RetryPolicy(2, 0.01, 0.02))
        closers.append(sender)
        started = time.perf_counter()
        sender.submit(make_event(1))
        assert time.perf_counter() - started < 0.05
        wait_for(lambda: stdout.undelivered(), 5, what="the spilled line")
        line = stdout.undelivered()["ev-1"]
        assert line["reason"] == "retries exhausted" and "timed out after 0.2s" in line["detail"]
        assert line["attempts"] == 2
    finally:
        hanging.close()


def test_dapr_sink_publishes_the_structured_event(stdout: Stdout, closers: list[EventSender]) -> None:
    server = RecordingSink([204])
    try:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        sink = DaprSink(port, "pubsub", "castslice-decisions", 2.0, api_token="t0ken")
        sender, metrics = sender_for(sink, stdout)
        closers.append(sender)
        event = make_event(1)
        sender.submit(event)
        wait_for(lambda: sample(metrics, "castslice_audit_events_delivered_total", sink="dapr") == 1, 5)
        request = server.requests[0]
        assert request["path"] == "/v1.0/publish/pubsub/castslice-decisions"
        assert request["headers"]["content-type"] == "application/cloudevents+json"
        assert request["headers"]["dapr-api-token"] == "t0ken"
        body = json.loads(request["body"])
        assert body["id"] == "ev-1" and body["type"] == event["type"] and body["data"] == event.data
        assert body["outcome"] == "mutated" and body["dataschema"] == event["dataschema"]
    finally:
        server.close()


def test_https_sink_verified_with_k_ca_certs(
    tmp_path: Path, stdout: Stdout, closers: list[EventSender]
) -> None:
    certificate, key = write_pair(tmp_path, "localhost")
    server = RecordingSink([202], tls=(certificate, key))
    try:
        trusted, trusted_metrics = sender_for(KnativeSink(server.url, 2.0, certificate.read_text()), stdout)
        untrusted, _ = sender_for(KnativeSink(server.url, 2.0), stdout)
        closers.extend([trusted, untrusted])
        trusted.submit(make_event(1))
        wait_for(lambda: sample(trusted_metrics, "castslice_audit_events_delivered_total", sink="knative"), 5)
        assert server.ids() == ["ev-1"]
        # Without the CA (K_CA_CERTS unset) the certificate is not trusted: never sent, kept on stdout.
        untrusted.submit(make_event(2))
        wait_for(lambda: stdout.undelivered(), 5, what="the spilled line")
        assert "CERTIFICATE_VERIFY_FAILED" in stdout.undelivered()["ev-2"]["detail"]
        assert server.ids() == ["ev-1"]
    finally:
        server.close()
