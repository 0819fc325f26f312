"""The recorder the webhook runs with: which sink the configuration and environment choose, and
which answers become events (decisions yes; dry runs and requests that are not Pod CREATE no)."""

from __future__ import annotations

import copy
import io
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from prometheus_client import CollectorRegistry

from function.admission.review import Admission
from function.admission.wire import parse_review
from function.audit.events import Event
from function.audit.recorder import AuditRecorder, build_recorder, choose_sink
from function.audit.sinks import DaprSink, KnativeSink, StdoutSink, StdoutWriter, WireEvent
from function.core.config import ConfigError, parse_config
from function.core.engine import Engine
from tests.support import load_review

WRITER = StdoutWriter(lambda: io.StringIO())


def audit_config(**audit: Any) -> Any:
    return parse_config({"audit": audit}).audit


@pytest.mark.parametrize(
    ("sink", "environ", "expected"),
    [
        ("auto", {}, StdoutSink),
        ("auto", {"K_SINK": "http://broker-ingress.knative-eventing.svc/ns/b"}, KnativeSink),
        ("auto", {"DAPR_HTTP_PORT": "3500"}, DaprSink),
        ("auto", {"K_SINK": "http://broker/", "DAPR_HTTP_PORT": "3500"}, KnativeSink),
        ("auto", {"K_SINK": "  "}, StdoutSink),
        ("stdout", {"K_SINK": "http://broker/"}, StdoutSink),
        ("dapr", {}, DaprSink),
        ("none", {"K_SINK": "http://broker/"}, type(None)),
    ],
)
def test_the_sink_is_chosen_from_configuration_and_environment(
    sink: str, environ: dict[str, str], expected: type
) -> None:
    assert isinstance(choose_sink(audit_config(sink=sink), environ, WRITER), expected)


def test_dapr_sink_uses_the_sidecar_port_pubsub_and_topic() -> None:
    chosen = choose_sink(
        audit_config(daprPubsub="audit bus", daprTopic="decisions"), {"DAPR_HTTP_PORT": "3999"}, WRITER
    )
    assert isinstance(chosen, DaprSink)
    assert chosen.poster.url == "http://localhost:3999/v1.0/publish/audit%20bus/decisions"


@pytest.mark.parametrize(
    ("sink", "environ", "words"),
    [
        ("knative", {}, "K_SINK is not set"),
        ("auto", {"K_SINK": "ftp://broker"}, "K_SINK"),
        ("auto", {"DAPR_HTTP_PORT": "http"}, "DAPR_HTTP_PORT"),
        ("auto", {"K_SINK": "http://b/", "K_CE_OVERRIDES": "{not json"}, "K_CE_OVERRIDES"),
        ("auto", {"K_SINK": "http://b/", "K_CE_OVERRIDES": '{"extensions": {"outcome": "x"}}'}, "outcome"),
    ],
)
def test_an_unusable_sink_environment_falls_back_to_stdout_with_an_error(
    sink: str, environ: dict[str, str], words: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The platform injects these; a bad one must not stop admission (only the config file does).
    recorder = build_recorder(parse_config({"audit": {"sink": sink}}), environ)
    assert recorder.sender is not None
    expected = "knative" if "K_CE_OVERRIDES" in environ else "stdout"
    assert recorder.sender.sink.name == expected
    assert words in caplog.text
    assert recorder.extensions == {}


def test_usable_k_ce_overrides_entries_are_kept_and_the_rest_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    overrides = '{"extensions": {"cluster": "eu-1", "outcome": "x", "Team": "a", "unset": null}}'
    recorder = build_recorder(parse_config({}), {"K_SINK": "http://b/", "K_CE_OVERRIDES": overrides})
    assert recorder.extensions == {"cluster": "eu-1"}
    assert "'outcome'" in caplog.text and "'Team'" in caplog.text


@pytest.mark.parametrize(
    ("audit", "words"),
    [
        ({"source": ""}, "source"),
        ({"source": "has space"}, "source"),
        ({"queueSize": 0}, "queueSize"),
        ({"senders": 9}, "senders"),
        ({"initialBackoffSeconds": 2, "maxBackoffSeconds": 1}, "maxBackoffSeconds"),
        ({"daprTopic": " "}, "daprTopic"),
        ({"sinkk": "stdout"}, "unknown key"),
    ],
)
def test_audit_configuration_is_checked(audit: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config({"audit": audit})


class Submitted:
    """A stand-in sender that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[CloudEvent] = []
        self.accepting = True

    def submit(self, event: WireEvent | CloudEvent) -> None:
        # The recorder hands over the wire form (events.build_wire_event); read back as a
        # CloudEvent here so the assertions see attributes and data.
        self.events.append(event.cloud_event() if isinstance(event, WireEvent) else event)


def recorder_with(submitted: Submitted, **environ: str) -> AuditRecorder:
    config = parse_config({})
    recorder = build_recorder(config, {"K_SINK": "http://127.0.0.1:9/", **environ})
    recorder.sender = submitted  # type: ignore[assignment]
    return recorder


def answer(recorder: AuditRecorder, document: dict[str, Any]) -> None:
    Admission(Engine(parse_config({})), recorder).review(parse_review(json.dumps(document).encode()))


def test_one_event_per_decision_none_for_dry_runs_or_other_requests() -> None:
    submitted = Submitted()
    recorder = recorder_with(submitted, K_CE_OVERRIDES='{"extensions": {"cluster": "eu-1"}}')
    answer(recorder, load_review("default-slice-inference"))
    answer(recorder, load_review("default-dry-run-probe"))
    update = copy.deepcopy(load_review("default-slice-inference"))
    update["request"]["operation"] = "UPDATE"
    answer(recorder, update)
    [event] = submitted.events
    assert event.data["request"]["uid"] == load_review("default-slice-inference")["request"]["uid"]
    assert event["cluster"] == "eu-1", "K_CE_OVERRIDES from the SinkBinding"
    assert event["source"] == "/castslice/webhook"
    found = recorder.metrics.registry.get_sample_value
    assert found("castslice_admission_requests_total", {"outcome": "mutated", "dry_run": "true"}) == 1
    assert found("castslice_admission_requests_total", {"outcome": "ignored", "dry_run": "false"}) == 1
    assert found("castslice_audit_events_emitted_total") == 1


def test_event_ids_are_unique_and_sink_none_emits_nothing() -> None:
    submitted = Submitted()
    recorder = recorder_with(submitted)
    for _ in range(3):
        answer(recorder, load_review("default-slice-inference"))
    assert len({event["id"] for event in submitted.events}) == 3, "a reinvocation is a new decision, a new id"
    silent = build_recorder(parse_config({"audit": {"sink": "none"}}), {})
    answer(silent, load_review("default-slice-inference"))
    assert silent.sender is None and silent.ready() and silent.close() == 0
    assert silent.metrics.registry.get_sample_value("castslice_audit_events_emitted_total") == 0


def test_an_event_of_the_controller_gets_its_id_time_and_extensions_as_a_decision_does() -> None:
    submitted = Submitted()
    registry = CollectorRegistry()
    recorder = build_recorder(
        parse_config({}),
        {"K_SINK": "http://127.0.0.1:9/", "K_CE_OVERRIDES": '{"extensions": {"cluster": "eu-1"}}'},
        registry,
    )
    recorder.sender = submitted  # type: ignore[assignment]
    found_at = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)  # no microseconds: still written
    recorder.emit(Event("io.example.found.v1", "/castslice/control", "ns/x", {"a": 1}, filters={"k": "v"}))
    recorder.emit(Event("io.example.found.v1", "/castslice/control", "ns/y", {}, time=found_at))
    answer(recorder, load_review("default-slice-inference"))
    first, second, decision = submitted.events
    assert first["cluster"] == "eu-1" and first["k"] == "v" and first.data == {"a": 1}
    assert second["time"] == "2026-11-25T12:00:00.000000Z"
    ids = [event["id"] for event in submitted.events]
    uuid4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert len(set(ids)) == 3 and all(re.fullmatch(uuid4, i) for i in ids), "one id format"
    times = [event["time"] for event in submitted.events]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", t) for t in times), "one format"
    assert list(first)[:8] == list(decision)[:8], "the same attributes in the same order"
    # Counted where the process serves its metrics.
    assert registry.get_sample_value("castslice_audit_events_emitted_total") == 3
    silent = build_recorder(parse_config({"audit": {"sink": "none"}}), {})
    silent.emit(Event("t", "/s", "x", {}))  # sink none: nowhere, nothing counted
    assert silent.metrics.registry.get_sample_value("castslice_audit_events_emitted_total") == 0
