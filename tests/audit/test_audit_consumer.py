"""The reference consumer: schema checks, the SQLite store and its queries, the `audit` function
target through functions-framework, and `castslice audit`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary, to_dict, to_structured
from cloudevents.http import CloudEvent

from function.audit.command import parse_when
from function.audit.consumer import AuditStore, InvalidEvent, Query, event_problems
from function.cli import main
from function.contract import LEASE_STEPS
from tests.support.audit import START, event_for


@pytest.fixture
def store(tmp_path: Path) -> Any:
    opened = AuditStore(tmp_path / "audit.sqlite3")
    yield opened
    opened.close()


@pytest.fixture
def filled(store: AuditStore) -> AuditStore:
    """Six decisions over three hours in two namespaces."""
    store.accept(event_for("default-slice-inference", 1, 0))  # mutated
    store.accept(event_for("default-not-opted-in", 2, 10))  # unchanged
    store.accept(event_for("default-bad-ratio", 3, 70))  # denied
    store.accept(event_for("default-trainer-0", 4, 75, namespace="ml"))  # mutated
    store.accept(event_for("kube-system-coredns-like", 5, 130))  # unchanged, excluded namespace
    store.accept(event_for("default-no-gpu-opted-in", 6, 140, namespace="ml"))  # unchanged
    return store


def test_a_valid_event_is_stored_once_even_when_delivered_twice(store: AuditStore) -> None:
    event = event_for("default-slice-inference", 1)
    assert store.accept(event) is True
    assert store.accept(event) is False, "at-least-once delivery: the repeat is acknowledged, not stored"
    [stored] = store.events()
    assert stored == json.loads(json.dumps(to_dict(event)))
    assert store.count() == 1


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda e: e["data"].update(object={"kind": "Pod"}), "Additional properties"),
        (lambda e: e["data"]["pod"].update(env=[{"name": "A", "value": "x"}]), "Additional properties"),
        (lambda e: e["data"].pop("patch"), "'patch' is a required property"),
        (lambda e: e.update(outcome="denied"), "attribute outcome"),
        (lambda e: e.update(mutators=""), "attribute mutators"),
        (lambda e: e.update(podnamespace="other"), "attribute podnamespace"),
        (lambda e: e.update(subject="namespaces/x/pods/y"), "attribute subject"),
        (lambda e: e.update(type="io.castops.castslice.admission.denied.v1"), "type says denied"),
        (lambda e: e.update(type="com.example.other.v1"), "not a CastSlice decision type"),
        (lambda e: e.update(dataschema="https://example.com/other.json"), "dataschema must be"),
        (lambda e: e.update(datacontenttype="text/plain"), "datacontenttype"),
        (lambda e: e.update(time="yesterday"), "RFC 3339"),
        (lambda e: e.pop("mutators"), "extension attribute mutators is missing"),
        (lambda e: e.update(data="not an object"), "data must be a JSON object"),
    ],
)
def test_an_invalid_event_is_rejected_and_kept_aside(store: AuditStore, change: Any, words: str) -> None:
    document = to_dict(event_for("default-slice-inference", 1))
    assert event_problems(document) == []
    change(document)
    with pytest.raises(InvalidEvent) as raised:
        store.accept(document)
    assert any(words in problem for problem in raised.value.problems), raised.value.problems
    assert store.count() == 0
    [rejected] = store.rejected()
    assert rejected["problems"] == raised.value.problems and rejected["id"] == "ev-1"


def test_queries_filter_by_time_namespace_outcome_and_mutator(filled: AuditStore) -> None:
    def ids(query: Query) -> list[str]:
        return [event["id"] for event in filled.events(query)]

    assert ids(Query()) == ["ev-6", "ev-5", "ev-4", "ev-3", "ev-2", "ev-1"], "newest first"
    assert ids(Query(limit=2)) == ["ev-6", "ev-5"]
    assert ids(Query(since=START + timedelta(minutes=70))) == ["ev-6", "ev-5", "ev-4", "ev-3"]
    assert ids(Query(until=START + timedelta(minutes=70))) == ["ev-2", "ev-1"]
    assert ids(Query(namespace="ml")) == ["ev-6", "ev-4"]
    assert ids(Query(outcome="mutated")) == ["ev-4", "ev-1"]
    assert ids(Query(mutator="gpu-slicing")) == ["ev-4", "ev-3", "ev-1"], "acted: mutated or denied"
    assert ids(Query(mutator="gpu-slicing", namespace="default")) == ["ev-3", "ev-1"]
    assert ids(Query(mutator="no-such-mutator")) == []


def test_summary_by_outcome_namespace_mutator_and_time(filled: AuditStore) -> None:
    summary = filled.summary()
    assert summary["total"] == 6 and summary["rejected"] == 0
    assert summary["byOutcome"] == {"mutated": 2, "unchanged": 3, "denied": 1, "error": 0}
    assert summary["byNamespace"] == [
        {"namespace": "default", "total": 3, "mutated": 1, "unchanged": 1, "denied": 1, "error": 0},
        {"namespace": "ml", "total": 2, "mutated": 1, "unchanged": 1, "denied": 0, "error": 0},
        {"namespace": "kube-system", "total": 1, "mutated": 0, "unchanged": 1, "denied": 0, "error": 0},
    ]
    # kube-system is excluded before any mutator runs, so gpu-slicing judged five Pods, not six.
    assert summary["byMutator"] == [
        {"mutator": "gpu-slicing", "total": 5, "mutated": 2, "unchanged": 2, "denied": 1}
    ]
    assert summary["byTime"]["bucket"] == "hour"
    assert [(row["start"], row["total"]) for row in summary["byTime"]["rows"]] == [
        ("2025-06-01T10", 2),
        ("2025-06-01T11", 2),
        ("2025-06-01T12", 2),
    ]
    assert summary["first"] == "2025-06-01T10:00:00.000000Z" and summary["last"].startswith(
        "2025-06-01T12:20"
    )
    narrowed = filled.summary(Query(namespace="ml"), bucket="day")
    assert narrowed["total"] == 2 and narrowed["byTime"]["rows"] == [
        {"start": "2025-06-01", "total": 2, "mutated": 1, "unchanged": 1, "denied": 0, "error": 0}
    ]


# -- the function target -----------------------------------------------------------------------------
@pytest.fixture
def audit_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The consumer as ``castslice serve --target audit`` serves it."""
    from starlette.testclient import TestClient

    from function.serve.asgi import serving_app

    monkeypatch.setenv("CASTSLICE_AUDIT_DB", str(tmp_path / "target.sqlite3"))
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    return TestClient(serving_app("audit"))


def test_the_audit_target_answers_get_healthz_for_probes(audit_client: Any, tmp_path: Path) -> None:
    answer = audit_client.get("/healthz")
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"})
    assert audit_client.head("/healthz").status_code == 200
    # Anything else still goes to the CloudEvent function (a GET is not an event).
    assert audit_client.get("/").status_code != 200


def test_the_audit_target_stores_binary_and_structured_events(audit_client: Any, tmp_path: Path) -> None:
    headers, body = to_binary(event_for("default-slice-inference", 1))
    assert audit_client.post("/", headers=headers, content=body).status_code == 200
    headers, body = to_structured(event_for("default-bad-ratio", 2))
    assert audit_client.post("/", headers=headers, content=body).status_code == 200
    # A broker retry of the same event is acknowledged again.
    assert audit_client.post("/", headers=headers, content=body).status_code == 200
    stored = AuditStore(tmp_path / "target.sqlite3")
    try:
        assert sorted(e["id"] for e in stored.events()) == ["ev-1", "ev-2"]
    finally:
        stored.close()


def test_the_audit_target_answers_400_to_an_invalid_event(audit_client: Any, tmp_path: Path) -> None:
    document = to_dict(event_for("default-slice-inference", 1))
    document["data"]["object"] = {"kind": "Pod"}
    headers, body = to_structured(
        CloudEvent({k: v for k, v in document.items() if k != "data"}, document["data"])
    )
    answer = audit_client.post("/", headers=headers, content=body)
    assert answer.status_code == 400, "not retryable: a broker sends it to the dead-letter sink"
    assert "not a valid CastSlice decision event" in answer.text
    not_a_cloudevent = audit_client.post("/", content=b"{}", headers={"content-type": "application/json"})
    assert not_a_cloudevent.status_code == 400
    stored = AuditStore(tmp_path / "target.sqlite3")
    try:
        assert stored.count() == 0 and len(stored.rejected()) == 1
    finally:
        stored.close()


# -- castslice audit ----------------------------------------------------------------------------------
def test_cli_summary_table(filled: AuditStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--db", filled.path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 decision(s) from 2025-06-01T10:00:00.000000Z")
    lines = out.splitlines()
    assert "mutated    2" in lines and "unchanged  3" in lines and "denied     1" in lines
    assert any(line.split() == ["ml", "2", "1", "1", "0", "0"] for line in lines)
    assert any(line.split() == ["gpu-slicing", "5", "2", "2", "1"] for line in lines)
    assert any(line.split() == ["2025-06-01T11", "2", "1", "0", "1", "0"] for line in lines)


def test_cli_list_with_filters(filled: AuditStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "list", "--db", filled.path, "--outcome", "mutated"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TIME", "OUTCOME", "NAMESPACE", "POD", "MUTATORS", "REASON"]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["2025-06-01T11:15:00Z", "mutated", "ml", "trainer-0", "gpu-slicing"],
        ["2025-06-01T10:00:00Z", "mutated", "default", "slice-inference", "gpu-slicing"],
    ]
    assert (
        main(["audit", "list", "--db", filled.path, "-n", "ml", "--mutator", "gpu-slicing", "-o", "json"])
        == 0
    )
    [event] = json.loads(capsys.readouterr().out)
    assert event["id"] == "ev-4" and event["data"]["pod"]["name"] == "trainer-0"
    assert (
        main(["audit", "summary", "--db", filled.path, "--since", "2025-06-01T11:00:00", "-o", "json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["total"] == 4


def test_cli_without_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--db", str(tmp_path / "missing.sqlite3")]) == 2
    assert "no audit database" in capsys.readouterr().err
    assert not (tmp_path / "missing.sqlite3").exists()


def test_since_accepts_durations_and_times() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_when("15m", now) == now - timedelta(minutes=15)
    assert parse_when("2h", now) == now - timedelta(hours=2)
    assert parse_when("7d", now) == now - timedelta(days=7)
    assert parse_when("2025-01-01T00:00:00Z") == datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_when("2025-01-01") == datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(Exception, match="neither a duration"):
        parse_when("soon")


# -- the lease controller's lifecycle events --------------------------------------------------------
def lifecycle(step: str, status: dict[str, Any] | None = None) -> Any:
    """A lifecycle event exactly as `castslice control` emits it (WireEvent: its recorder gives
    the event its id and time)."""
    from function.audit.events import wire_event
    from function.audit.recorder import random_event_id
    from function.control.reconcilers.gpu_leases import Step, lifecycle_event
    from function.core.leases import slim_lease

    lease = slim_lease(
        {
            "metadata": {
                "name": "h100",
                "namespace": "ml",
                "uid": "u1",
                "creationTimestamp": "2026-11-25T00:00:00Z",
            },
            "spec": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "count": 8},
        }
    )
    assert lease is not None
    status = status or {"phase": "Active", "used": "9", "queued": "0", "overage": "1", "pods": 9}
    event = lifecycle_event(Step(step, lease, status, f"the lease's {step}"))
    return wire_event(event, event_id=random_event_id(), time=datetime.now(UTC))


@pytest.mark.parametrize("step", LEASE_STEPS)
def test_every_gpulease_lifecycle_event_the_controller_emits_is_accepted_once(
    store: AuditStore, step: str
) -> None:
    event = json.loads(lifecycle(step).structured())
    assert event_problems(event) == []
    assert store.accept(event) is True
    assert store.accept(event) is False  # a redelivery: no second row
    (kept,) = store.lease_events("ml", "h100")
    assert kept["type"] == f"io.castops.castslice.gpulease.{step.lower()}.v1" and kept["data"]["step"] == step
    assert store.count() == 0 and store.rejected() == []  # not counted as an admission decision


def test_a_lifecycle_event_that_contradicts_itself_is_rejected(store: AuditStore) -> None:
    event = json.loads(lifecycle("Expired").structured())
    event["type"] = "io.castops.castslice.gpulease.activated.v1"
    event["subject"] = "ml/a100"
    with pytest.raises(InvalidEvent) as raised:
        store.accept(event)
    assert any("type says Activated but data.step is Expired" in p for p in raised.value.problems)
    bad_status = json.loads(lifecycle("Activated", {"phase": "Sleeping"}).structured())
    assert any("data/status/phase" in p for p in event_problems(bad_status))
    assert store.lease_events() == [] and len(store.rejected()) == 1


def test_the_audit_target_stores_the_controllers_lifecycle_events(audit_client: Any, tmp_path: Path) -> None:
    headers, body = lifecycle("OverCommitted").binary()
    assert audit_client.post("/", headers=headers, content=body).status_code == 200
    stored = AuditStore(tmp_path / "target.sqlite3")
    try:
        (kept,) = stored.lease_events()
        assert kept["source"] == "/castslice/control" and kept["data"]["status"]["overage"] == "1"
    finally:
        stored.close()
