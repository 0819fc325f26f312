"""GpuLease steps as CloudEvents: what the audit stream carries (attributes filters see, a small
data payload naming at most the Pod a step is about)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from function.audit.consumer import event_problems
from function.audit.events import wire_event
from function.audit.sinks import WireEvent
from function.control.reconcilers.gpu_leases import Step, lifecycle_event
from function.core.leases import Lease, slim_charged_pod, slim_lease


def lease() -> Lease:
    record = slim_lease(
        {
            "metadata": {
                "name": "h100",
                "namespace": "ml",
                "uid": "u1",
                "creationTimestamp": "2026-11-25T00:00:00Z",
            },
            "spec": {"gpuModel": "H100", "count": 8},
        }
    )
    assert record is not None
    return record


def emitted(step: Step) -> WireEvent:
    """The step's event as the recorder sends it."""
    return wire_event(lifecycle_event(step), event_id="e-1", time=datetime(2026, 11, 25, 12, 0, tzinfo=UTC))


def test_a_lifecycle_step_is_a_versioned_cloudevent_about_the_lease() -> None:
    status = {"phase": "Active", "used": "9", "overage": "1"}
    event = emitted(Step("OverCommitted", lease(), status, "9 GPU admitted of 8 leased (1 over)"))
    attributes = event.attributes
    assert attributes["type"] == "io.castops.castslice.gpulease.overcommitted.v1"
    assert attributes["subject"] == "ml/h100" and attributes["source"] == "/castslice/control"
    assert attributes["specversion"] == "1.0" and attributes["datacontenttype"] == "application/json"
    assert attributes["podnamespace"] == "ml"
    data = json.loads(event.data)
    assert data["step"] == "OverCommitted" and data["count"] == "8"
    assert data["status"]["overage"] == "1" and data["lease"]["model"] == "H100"
    assert data["message"] == "9 GPU admitted of 8 leased (1 over)" and "pod" not in data
    assert len(event.data) < 1024


def test_a_pods_step_names_the_pod_and_nothing_more_of_it() -> None:
    pod = slim_charged_pod(
        {
            "metadata": {
                "name": "train-1",
                "namespace": "ml",
                "uid": "p1",
                "labels": {"castops.io/gpu-lease": "h100"},
                "annotations": {"castops.io/gpu-lease-charge": "1000m"},
            }
        }
    )
    step = Step("EvictionBlocked", lease(), {}, "refused by a PodDisruptionBudget", pod)
    event = json.loads(emitted(step).structured())
    assert event["type"] == "io.castops.castslice.gpulease.evictionblocked.v1"
    assert event["data"]["pod"] == {"namespace": "ml", "name": "train-1", "uid": "p1"}
    assert event_problems(event) == []  # the reference consumer's check, against the schema


def test_a_chargeback_record_has_the_same_id_and_time_whoever_emits_it_and_passes_the_schema() -> None:
    """Two leaders that both tell one closed budget period send one record: the consumer keeps
    one per id (INSERT OR IGNORE)."""
    from decimal import Decimal

    from function.audit.recorder import AuditRecorder
    from function.core.budget import Period
    from function.core.config import Config

    budgeted = slim_lease(
        {
            "metadata": {
                "name": "h100",
                "namespace": "ml",
                "uid": "u1",
                "creationTimestamp": "2026-11-25T00:00:00Z",
            },
            "spec": {"gpuModel": "H100", "count": 8, "budget": {"gpuHours": 400, "period": "Month"}},
        }
    )
    assert budgeted is not None
    period = Period(
        datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC), Decimal("123.4567891")
    )
    step = Step(
        "PeriodClosed",
        budgeted,
        {"phase": "Active"},
        "closed",
        period=period,
        event_id="u1/2026-11-01T00:00:00Z",
    )
    sent: list[WireEvent] = []

    class Sender:
        accepting = True

        def submit(self, event: WireEvent) -> None:
            sent.append(event)

    config = Config()
    for _leader in range(2):
        recorder = AuditRecorder(config.audit, "d", _Metrics(), Sender())  # type: ignore[arg-type]
        recorder.emit(lifecycle_event(step))
    first, second = (json.loads(event.structured()) for event in sent)
    assert first["id"] == second["id"] == "u1/2026-11-01T00:00:00Z"
    assert first["time"] == second["time"] and first["time"].startswith("2026-12-01T00:00:00")
    assert first["type"] == "io.castops.castslice.gpulease.periodclosed.v1"
    assert first["data"]["period"]["gpuHours"] == "123.456789" and first["data"]["period"]["kind"] == "Month"
    assert event_problems(first) == []


class _Metrics:
    def event_emitted(self) -> None:
        pass
