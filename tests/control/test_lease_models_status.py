"""The status of a lease of several models or a family: GPU-equivalents in use per model, as
each Pod was charged, and each model's cap."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from function.control.reconcilers.gpu_leases import desired_status, models_status
from function.core.leases import (
    CHARGE_ANNOTATION,
    DECISION_ANNOTATION,
    LEASE_LABEL,
    MODEL_ANNOTATION,
    STATE_LABEL,
    Usage,
    slim_charged_pod,
    slim_lease,
)

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"


def lease_of(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "hopper",
            "namespace": "ml",
            "uid": "lease-1",
            "creationTimestamp": "2026-11-25T00:00:00Z",
        },
        "spec": {"count": 4, **spec},
    }


def on(model: str, milli: int, n: int, state: str = "charged") -> dict[str, Any]:
    annotations = {CHARGE_ANNOTATION: f"{milli}m", DECISION_ANNOTATION: f"d-{n}"}
    if model:
        annotations[MODEL_ANNOTATION] = model
    return {
        "metadata": {
            "name": f"hopper-{n}",
            "namespace": "ml",
            "uid": f"pod-{n}",
            "labels": {LEASE_LABEL: "hopper", STATE_LABEL: state},
            "annotations": annotations,
        }
    }


def test_status_reports_each_model_and_its_cap() -> None:
    lease = slim_lease(lease_of(gpuModels=[H100, H200], caps={H200: 2}))
    assert lease is not None
    pods = [slim_charged_pod(p) for p in (on(H100, 1000, 1), on(H200, 2000, 2), on("", 500, 3))]
    queued = slim_charged_pod(on(H100, 1000, 4, state="queued"))
    rows = models_status(lease, [p for p in (*pods, queued) if p is not None])
    assert rows == [
        {"model": H200, "used": "2", "cap": "2"},
        {"model": H100, "used": "1"},
        {"model": "any", "used": "0.5"},
    ]
    single = slim_lease(lease_of(gpuModel=H100))
    assert single is not None and models_status(single, []) is None


def test_status_models_is_written_by_the_controller() -> None:
    lease = slim_lease(lease_of(gpuModels=[H100, H200]))
    record = slim_charged_pod(on(H200, 1000, 1))
    assert lease is not None and record is not None
    status = desired_status(
        lease, Usage(used=1000, pods=1), 0, datetime(2026, 11, 25, 12, tzinfo=UTC), pods=[record]
    )
    assert status["models"] == [{"model": H200, "used": "1"}]
