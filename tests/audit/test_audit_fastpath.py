"""The audit path's shortcuts give exactly what the plain path gives: the wire event built
directly (events.build_wire_event) against the CloudEvent read back (WireEvent.of(build_event)),
the patch size check, the time format and the event id, batched stdout writes, batched delivery
and the backlog's wakeups."""

from __future__ import annotations

import io
import json
import os
import random
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from function.admission.facts import audit_facts
from function.admission.review import Admission, request_context
from function.admission.wire import AdmissionReview, parse_review
from function.audit import delivery
from function.audit.delivery import MAX_BATCH, Backlog, EventSender, Pending, RetryPolicy
from function.audit.events import (
    MAX_PATCH_BYTES,
    REDACTED,
    build_event,
    build_wire_event,
    compact_json_size,
    event_data,
    format_time,
    redact_patch,
)
from function.audit.metrics import AuditMetrics
from function.audit.recorder import AuditRecorder, random_event_id
from function.audit.sinks import (
    DELIVERED,
    DELIVERED_HEADER,
    WRITE_BYTES,
    SendResult,
    StdoutSink,
    StdoutWriter,
    WireEvent,
)
from function.core.config import Config, parse_config
from function.core.engine import Decision, Engine
from function.core.mutators.base import Action, MutatorDecision
from tests.support import load_review, review_names
from tests.support.audit import parse_lines, wait_for

MOMENT = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
SECRET = "s3cr3t-value"


def review_of(document: dict[str, Any]) -> AdmissionReview:
    return parse_review(json.dumps(document).encode())


def secret_review() -> AdmissionReview:
    document = load_review("default-slice-inference")
    container = document["request"]["object"]["spec"]["containers"][0]
    container["env"] = [{"name": "TOKEN", "value": SECRET}]
    container["command"] = ["run", SECRET]
    container["args"] = ["--token", SECRET]
    return review_of(document)


DURATIONS = {"mutated": 0.000123456789, "denied": -1.0}
"""Seconds the adapter measured for some DECISIONS: nine digits kept, a negative one read as 0."""


def both(
    review: AdmissionReview, decision: Decision, duration_seconds: float = 0.0, **overrides: Any
) -> tuple[WireEvent, WireEvent]:
    options: dict[str, Any] = {
        "event_id": "id-1",
        "decided_at": MOMENT,
        "source": "/castslice/test",
        "config_digest": "sha256:" + "0" * 16,
    }
    options.update(overrides)
    facts = audit_facts(review, decision, duration_seconds)
    return build_wire_event(facts, decision, **options), WireEvent.of(build_event(facts, decision, **options))


def same(direct: WireEvent, via_cloud_event: WireEvent) -> None:
    assert direct == via_cloud_event
    assert list(direct.attributes) == list(via_cloud_event.attributes), "attribute order"
    assert direct.data == via_cloud_event.data, "data bytes"
    assert direct.structured() == via_cloud_event.structured()


@pytest.mark.parametrize("name", review_names())
def test_the_direct_wire_event_is_the_cloud_event_read_back_for_every_recorded_review(name: str) -> None:
    review = review_of(load_review(name))
    decision = Admission(Engine(Config())).review(review).decision
    # Every recorded review is a Pod CREATE: the engine decides each one, and each gets an event.
    assert decision is not None, name
    same(*both(review, decision))


MUTATOR = MutatorDecision("gpu-slicing", Action.mutated, "sliced: ünïcode reason", ("a warning",))
SHADOW = MutatorDecision("spot", Action.mutated, "shadow", (), shadow=True)
ENV_OP: Any = {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "X", "value": SECRET}}
DECISIONS = {
    "mutated": Decision(
        "mutated",
        True,
        "mutated by gpu-slicing",
        patch=(
            {"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET},
            {"op": "add", "path": "/spec/containers/0/command/1", "value": SECRET},
            {"op": "replace", "path": "/spec/containers/0/args/-", "value": SECRET},
            ENV_OP,
            {"op": "add", "path": "/metadata/labels/x", "value": SECRET},
            {"op": "add", "path": "/spec/containers/0/resources/limits/x", "value": 1.5},
        ),
        decisions=(MUTATOR, SHADOW),
        warnings=("w" * 300,),
    ),
    "denied": Decision(
        "denied",
        False,
        "denied by spot",
        decisions=(MutatorDecision("spot", Action.denied, "no"),),
        denial="x" * 5000,
    ),
    "unchanged": Decision("unchanged", True, "nothing to do", decisions=(SHADOW,)),
    "error": Decision("error", True, "internal error: " + "y" * 3000),
}


@pytest.mark.parametrize("outcome", sorted(DECISIONS))
@pytest.mark.parametrize("extensions", [None, {}, {"cluster": "eu-1", "team": "ml"}])
def test_the_direct_wire_event_equals_the_cloud_event_read_back(
    outcome: str, extensions: dict[str, str] | None
) -> None:
    direct, via = both(
        secret_review(), DECISIONS[outcome], DURATIONS.get(outcome, 0.0), extensions=extensions
    )
    same(direct, via)
    if extensions:
        assert list(direct.attributes)[:2] == ["cluster", "team"], "extensions first, as before"


def test_the_direct_wire_event_redacts_and_counts_like_redact_patch() -> None:
    review = secret_review()
    decision = DECISIONS["mutated"]
    direct, _ = both(review, decision)
    data = json.loads(direct.data)
    expected, count = redact_patch(decision.patch, review.request.object)
    assert (data["patch"], data["patchRedactions"]) == (expected, count) and count == 4
    assert [op["value"] for op in data["patch"][:3]] == [REDACTED] * 3
    assert data["patch"][3]["value"] == {"name": "X", "value": REDACTED}, "inside an added object"
    assert data["patch"][4]["value"] == SECRET, "not a place where secrets live"
    assert SECRET not in direct.data.decode().replace(data["patch"][4]["value"], "", 1)


@pytest.mark.parametrize(
    "op",
    [
        {"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET},
        {"op": "add", "path": "/spec/initContainers/0/command/0", "value": SECRET},
        {"op": "add", "path": "/spec/containers/0/args/-", "value": SECRET},
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "X", "value": SECRET}]},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "c", "args": [SECRET]}},
    ],
)
def test_each_place_a_secret_can_sit_is_redacted_without_a_full_pod_search(op: dict[str, Any]) -> None:
    decision = Decision("mutated", True, "r", patch=(op,))  # type: ignore[arg-type]
    for data in (
        json.loads(both(secret_review(), decision)[0].data),
        event_data(audit_facts(secret_review(), decision), decision, config_digest="d", decided_at=MOMENT),
    ):
        assert data["patchRedactions"] == 1
        assert SECRET not in json.dumps(data)


def test_a_secret_after_a_remove_is_still_redacted() -> None:
    decision = Decision(
        "mutated",
        True,
        "r",
        patch=(
            {"op": "remove", "path": "/metadata/labels/x"},
            {"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET},
        ),
    )
    data = event_data(audit_facts(secret_review(), decision), decision, config_digest="d", decided_at=MOMENT)
    assert data["patchRedactions"] == 1
    assert SECRET not in json.dumps(data)


def test_event_data_hands_out_copies_of_the_patch() -> None:
    decision = Decision("mutated", True, "r", patch=({"op": "add", "path": "/a", "value": "1"},))
    review = review_of(load_review("default-slice-inference"))
    data = event_data(audit_facts(review, decision), decision, config_digest="d", decided_at=MOMENT)
    data["patch"][0]["value"] = "changed"
    assert decision.patch[0]["value"] == "1"


def patch_of(size: int, text: str = "a") -> list[Any]:
    """A one-operation patch whose compact stdlib JSON is ``size`` characters long."""
    patch: list[Any] = [{"op": "add", "path": "/x", "value": ""}]
    base = compact_json_size(patch)
    unit = compact_json_size(text) - 2
    patch[0]["value"] = text * ((size - base) // unit)
    return patch


@pytest.mark.parametrize(
    "patch",
    [
        patch_of(MAX_PATCH_BYTES),
        patch_of(MAX_PATCH_BYTES + 1),
        patch_of(MAX_PATCH_BYTES // 3),
        patch_of(MAX_PATCH_BYTES // 3 + 10),
        patch_of(MAX_PATCH_BYTES + 6, "é"),  # 2 bytes for orjson, 6 characters for the stdlib
        patch_of(MAX_PATCH_BYTES - 6, "é"),
        patch_of(MAX_PATCH_BYTES + 12, "😀"),
        patch_of(MAX_PATCH_BYTES // 3 + 12, "😀"),
        [{"op": "add", "path": "/x", "value": [2**70] * 1500}],  # beyond orjson's integers
        [{"op": "add", "path": "/x", "value": [float("inf")] * 3700}],  # null for orjson
        [{"op": "add", "path": "/x", "value": [1e16] * 5500}],  # 1e16 for orjson, 1e+16 for the stdlib
    ],
)
def test_the_patch_limit_is_the_stdlib_json_size_exactly(patch: list[Any]) -> None:
    size = compact_json_size(patch)
    assert size == len(json.dumps(patch, separators=(",", ":")))
    decision = Decision("mutated", True, "r", patch=tuple(patch))
    review = review_of(load_review("default-slice-inference"))
    data = event_data(audit_facts(review, decision), decision, config_digest="d", decided_at=MOMENT)
    if size > MAX_PATCH_BYTES:
        assert data["patch"] == [] and data["patchRedactions"] == 0
        assert data["patchOmitted"] == (
            f"patch of {size} bytes is larger than the {MAX_PATCH_BYTES}-byte limit for events"
        )
    else:
        assert data["patchOmitted"] is None and len(data["patch"]) == 1
    direct = json.loads(both(review, decision)[0].data)
    assert direct["patchOmitted"] == data["patchOmitted"]


@pytest.mark.parametrize(
    "moment",
    [
        MOMENT,
        datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
        datetime(2025, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),
        datetime(1999, 1, 2, 3, 4, 5, 6),  # naive: local time, as astimezone reads it
        datetime(5, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        datetime(999, 10, 11, 12, 13, 14, 15, tzinfo=UTC),
        datetime(1000, 10, 11, 12, 13, 14, 15, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
def test_the_time_format_is_the_strftime_one(moment: datetime) -> None:
    assert format_time(moment) == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_event_ids_are_version_4_uuids_in_canonical_form() -> None:
    random.seed(7)
    ids = [random_event_id() for _ in range(2000)]
    assert len(set(ids)) == 2000
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    random.seed(7)
    bits = random.getrandbits(128)
    kept = uuid.UUID(ids[0]).int ^ bits
    assert kept & ~((0xF000 << 64) | (0xC000 << 48)) == 0, "only the version and variant bits are set"


# -- batched stdout writes --------------------------------------------------------------------------
class Recording(io.StringIO):
    def __init__(self, fail_on: int | None = None) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.fail_on = fail_on

    def write(self, text: str) -> int:
        if self.fail_on is not None and len(self.writes) == self.fail_on:
            self.writes.append("")
            raise OSError("broken pipe")
        self.writes.append(text)
        return super().write(text)


def lines_of(sizes: list[int]) -> list[bytes]:
    return [(f'{{"n":{number},"pad":"' + "p" * size).encode() + b'"}\n' for number, size in enumerate(sizes)]


def test_a_batch_write_keeps_every_line_whole_and_in_order_within_pipe_buf() -> None:
    sizes = [1500, 1500, 1500, 10, 5000, 20, WRITE_BYTES - 30, 3000, 3000, 1, 1, 1]
    lines = lines_of(sizes)
    stream = Recording()
    assert StdoutWriter(lambda: stream).write_lines(lines) == [True] * len(lines)
    assert stream.getvalue().encode() == b"".join(lines)
    for write in stream.writes:
        assert write.endswith("\n")
        assert len(write.encode()) <= WRITE_BYTES or write.count("\n") == 1, "only a long line goes alone"
    assert [json.loads(line)["n"] for line in stream.getvalue().splitlines()] == list(range(len(sizes)))
    grouped = [write.count("\n") for write in stream.writes]
    assert grouped == [2, 2, 1, 1, 1, 1, 4], "as many whole lines per write as fit"


def sized(number: int, length: int) -> bytes:
    head = f'{{"n":{number},"p":"'.encode()
    return head + b"x" * (length - len(head) - 3) + b'"}\n'


def test_lines_that_fill_pipe_buf_exactly_share_a_write_and_one_more_byte_does_not() -> None:
    exact = [sized(0, WRITE_BYTES // 2), sized(1, WRITE_BYTES - WRITE_BYTES // 2), sized(2, 10)]
    over = [sized(0, WRITE_BYTES // 2), sized(1, WRITE_BYTES - WRITE_BYTES // 2 + 1), sized(2, 10)]
    for lines, grouped in ((exact, [2, 1]), (over, [1, 2])):
        stream = Recording()
        StdoutWriter(lambda: stream).write_lines(lines)  # noqa: B023 - used at once
        assert [write.count("\n") for write in stream.writes] == grouped
        assert stream.getvalue().encode() == b"".join(lines)


def test_a_failed_batch_write_reports_and_logs_exactly_its_lines(caplog: pytest.LogCaptureFixture) -> None:
    lines = lines_of([3000, 3000, 3000])
    stream = Recording(fail_on=1)
    assert StdoutWriter(lambda: stream).write_lines(lines) == [True, False, True]
    assert stream.getvalue().encode() == lines[0] + lines[2]
    assert '"n":1' in caplog.text and '"n":0' not in caplog.text and '"n":2' not in caplog.text


def wire(number: int) -> WireEvent:
    review = review_of(load_review("default-slice-inference"))
    decision = Engine(Config()).decide(review.request.object, request_context(review))
    return build_wire_event(
        audit_facts(review, decision),
        decision,
        event_id=f"ev-{number}",
        decided_at=MOMENT,
        source="/s",
        config_digest="d",
    )


def test_stdout_sink_sends_a_batch_as_the_lines_one_by_one_would_be() -> None:
    events = [wire(number) for number in range(5)]
    batched, single = io.StringIO(), io.StringIO()
    assert StdoutSink(StdoutWriter(lambda: batched)).send_all(events) == [DELIVERED] * 5
    one = StdoutSink(StdoutWriter(lambda: single))
    assert [one.send(event) for event in events] == [DELIVERED] * 5
    assert batched.getvalue() == single.getvalue()
    assert batched.getvalue().encode() == b"".join(StdoutWriter.line(DELIVERED_HEADER, e) for e in events)
    assert [line["event"]["id"] for line in parse_lines(batched.getvalue())] == [f"ev-{n}" for n in range(5)]


def test_stdout_sink_reports_an_unwritable_stdout_per_event() -> None:
    stream = Recording(fail_on=0)
    results = StdoutSink(StdoutWriter(lambda: stream)).send_all([wire(1), wire(2)])
    assert [(r.delivered, r.retryable, r.detail) for r in results] == [
        (False, False, "stdout is not writable")
    ] * 2


# -- the backlog and batched delivery ---------------------------------------------------------------
def pending(number: int) -> Pending:
    return Pending(wire(number), time.monotonic())


def test_take_returns_up_to_the_limit_oldest_first_and_marks_them_in_flight() -> None:
    backlog = Backlog(10)
    items = [pending(n) for n in range(5)]
    for item in items:
        assert backlog.offer(item) is None
    assert backlog.take(3) == items[:3]
    assert backlog.depth() == 2
    assert backlog.take(10) == items[3:]
    assert backlog.settle_all(items[:2]) == [True, True]
    assert backlog.settle_all(items[:2]) == [False, False], "settled once"
    assert backlog.abandon() == items[2:], "the rest are still in flight"


def test_a_rest_ends_when_enough_events_wait_or_the_drain_starts() -> None:
    backlog = Backlog(8)  # enough: half the capacity, 4
    started = time.monotonic()
    backlog.rest(0.05)
    assert time.monotonic() - started >= 0.05, "rests its time with nothing waiting"
    for number in range(4):
        backlog.offer(pending(number))
    started = time.monotonic()
    backlog.rest(30)
    assert time.monotonic() - started < 5, "enough waiting: no rest"

    resting = Backlog(MAX_BATCH * 4)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (resting.rest(30), done.set()))
    thread.start()
    for number in range(MAX_BATCH - 1):
        resting.offer(pending(number))
    assert not done.wait(0.1), "one short of a full batch: still resting"
    resting.offer(pending(MAX_BATCH))
    assert done.wait(5), "a full batch wakes the rester"

    hurried = Backlog(100)
    done.clear()
    thread = threading.Thread(target=lambda: (hurried.rest(30), done.set()))
    thread.start()
    time.sleep(0.05)
    hurried.wait_idle(time.monotonic() + 1)
    assert done.wait(5), "the drain ends a rest"
    thread.join()


def test_a_waiting_taker_is_woken_by_one_event() -> None:
    backlog = Backlog(100)
    got: list[list[Pending]] = []
    thread = threading.Thread(target=lambda: got.append(backlog.take(MAX_BATCH)))
    thread.start()
    time.sleep(0.05)
    item = pending(1)
    backlog.offer(item)
    thread.join(5)
    assert got == [[item]]


class BatchSink:
    """Records each send_all batch; ``script`` gives a batch's results (or raises)."""

    name = "batch"

    def __init__(self, script: Any = None) -> None:
        self.batches: list[list[str]] = []
        self.singles: list[str] = []
        self.script = script

    def send_all(self, events: list[WireEvent]) -> list[SendResult]:
        self.batches.append([event.id for event in events])
        if self.script is not None:
            return list(self.script(events))
        return [DELIVERED] * len(events)

    def send(self, event: WireEvent) -> SendResult:
        self.singles.append(event.id)
        return DELIVERED

    def close(self) -> None:
        return None


def run_sender(sink: BatchSink, count: int) -> tuple[EventSender, io.StringIO, AuditMetrics]:
    buffer = io.StringIO()
    metrics = AuditMetrics("batch")
    sender = EventSender(
        sink, StdoutWriter(lambda: buffer), metrics, policy=RetryPolicy(3, 0.001, 0.002), drain_seconds=5
    )
    for number in range(count):
        sender.submit(wire(number))
    sender.close()
    return sender, buffer, metrics


def test_a_batching_sink_gets_every_event_once_in_order_and_each_is_counted() -> None:
    sink = BatchSink()
    _, buffer, metrics = run_sender(sink, 600)
    sent = [event_id for batch in sink.batches for event_id in batch]
    assert sent == [f"ev-{n}" for n in range(600)]
    assert max(len(batch) for batch in sink.batches) <= MAX_BATCH
    assert sink.singles == [] and buffer.getvalue() == ""
    found = metrics.registry.get_sample_value
    assert found("castslice_audit_events_delivered_total", {"sink": "batch"}) == 600
    assert found("castslice_audit_delivery_seconds_count", {"sink": "batch"}) == 600


def test_a_failed_event_of_a_batch_is_retried_alone_and_the_rest_delivered() -> None:
    failing = SendResult(False, retryable=True, detail="flaky")
    sink = BatchSink(lambda events: [failing if event.id == "ev-1" else DELIVERED for event in events])
    _, buffer, metrics = run_sender(sink, 3)
    assert "ev-1" in sink.singles and "ev-0" not in sink.singles and "ev-2" not in sink.singles
    assert buffer.getvalue() == ""
    assert metrics.registry.get_sample_value("castslice_audit_events_delivered_total", {"sink": "batch"}) == 3


def test_a_rejected_event_of_a_batch_goes_to_stdout_marked_undelivered() -> None:
    rejected = SendResult(False, retryable=False, detail="no")
    sink = BatchSink(lambda events: [rejected if event.id == "ev-1" else DELIVERED for event in events])
    _, buffer, _ = run_sender(sink, 3)
    [line] = parse_lines(buffer.getvalue())
    assert (line["event"]["id"], line["delivered"], line["reason"]) == ("ev-1", False, "rejected by sink")
    assert sink.singles == []


@pytest.mark.parametrize("script", ["raises", "short"])
def test_a_broken_batch_send_fails_the_first_attempt_of_each_event(script: str) -> None:
    def broken(events: list[WireEvent]) -> list[SendResult]:
        if script == "raises":
            raise RuntimeError("bug")
        return [DELIVERED] * (len(events) - 1)

    sink = BatchSink(broken)
    _, buffer, metrics = run_sender(sink, 4)
    assert sorted(sink.singles) == [f"ev-{n}" for n in range(4)], "each retried on its own"
    assert buffer.getvalue() == ""
    assert metrics.registry.get_sample_value("castslice_audit_events_delivered_total", {"sink": "batch"}) == 4


def test_the_recorder_submits_the_direct_wire_event(monkeypatch: pytest.MonkeyPatch) -> None:
    kept: list[Any] = []

    class Keep:
        accepting = True

        def submit(self, event: Any) -> None:
            kept.append(event)

    review = review_of(load_review("default-slice-inference"))
    decision = Engine(Config()).decide(review.request.object, request_context(review))
    recorder = AuditRecorder(
        parse_config({}).audit,
        "sha256:x",
        AuditMetrics(),
        Keep(),  # type: ignore[arg-type]
        {"cluster": "eu-1"},
        new_id=lambda: "id-9",
        now=lambda: MOMENT,
    )
    recorder.record(audit_facts(review, decision), decision)
    [event] = kept
    assert isinstance(event, WireEvent)
    same(
        event,
        WireEvent.of(
            build_event(
                audit_facts(review, decision),
                decision,
                event_id="id-9",
                decided_at=MOMENT,
                source=recorder.config.source,
                config_digest="sha256:x",
                extensions={"cluster": "eu-1"},
            )
        ),
    )


# -- metrics ----------------------------------------------------------------------------------------
def test_cached_metric_children_count_like_labels_did() -> None:
    metrics = AuditMetrics("stdout")
    found = metrics.registry.get_sample_value
    metrics.admission("mutated", False, 0.001)
    metrics.admission("mutated", True, None)
    metrics.admission("ignored", False, None)
    metrics.admission("novel", True, None)  # not in the contract: still counted
    requests = "castslice_admission_requests_total"
    assert found(requests, {"outcome": "mutated", "dry_run": "false"}) == 1
    assert found(requests, {"outcome": "mutated", "dry_run": "true"}) == 1
    assert found(requests, {"outcome": "ignored", "dry_run": "false"}) == 1
    assert found(requests, {"outcome": "novel", "dry_run": "true"}) == 1
    assert found("castslice_admission_decision_seconds_count") == 1
    assert found("castslice_audit_delivery_seconds_count", {"sink": "stdout"}) is None, "no series yet"
    metrics.events_delivered([0.002, 0.2])
    metrics.event_delivered(0.003)
    assert found("castslice_audit_events_delivered_total", {"sink": "stdout"}) == 3
    assert found("castslice_audit_delivery_seconds_count", {"sink": "stdout"}) == 3
    assert found("castslice_audit_delivery_seconds_bucket", {"sink": "stdout", "le": "0.0025"}) == 1
    assert found("castslice_audit_delivery_seconds_sum", {"sink": "stdout"}) == pytest.approx(0.205)
    metrics.event_retried()
    metrics.event_spilled("queue_full")
    metrics.event_spilled("other")
    metrics.event_dropped("shutdown")
    metrics.event_dropped("other")
    assert found("castslice_audit_event_retries_total", {"sink": "stdout"}) == 1
    assert found("castslice_audit_events_spilled_total", {"reason": "queue_full"}) == 1
    assert found("castslice_audit_events_spilled_total", {"reason": "other"}) == 1
    assert found("castslice_audit_events_spilled_total", {"reason": "rejected"}) == 0
    assert found("castslice_audit_events_dropped_total", {"reason": "shutdown"}) == 1
    assert found("castslice_audit_events_dropped_total", {"reason": "other"}) == 1


# -- fork -------------------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_knows_its_pid_and_starts_its_own_sender() -> None:
    read_end, write_end = os.pipe()
    sink = BatchSink()
    buffer = io.StringIO()
    sender = EventSender(sink, StdoutWriter(lambda: buffer), AuditMetrics("batch"), drain_seconds=5)
    sender.submit(wire(0))
    wait_for(lambda: sink.batches == [["ev-0"]], 5)
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which leaves at once
        code = 1
        try:
            fresh = delivery._pid == os.getpid() and not sender.started_here
            sender.submit(wire(1))
            wait_for(lambda: ["ev-1"] in sink.batches, 10)
            code = 0 if fresh and sender.started_here else 2
            os.write(write_end, b"ok" if code == 0 else b"no")
        finally:
            os._exit(code)
    os.close(write_end)
    answer = os.read(read_end, 2)
    os.waitpid(child, 0)
    os.close(read_end)
    assert answer == b"ok", "the child saw its own pid and started its own sender thread"
    assert delivery._pid == os.getpid()
    assert sink.batches == [["ev-0"]], "the parent's sender is untouched"
    sender.close()
