"""Lifecycle CloudEvents of a GpuLease: what the audit stream carries (attributes filters see, a
small data payload with no Pod in it)."""

from __future__ import annotations

import json

from function.control.reconcilers.gpu_leases import lifecycle_event
from function.core.leases import slim_lease


def test_a_lifecycle_step_is_a_versioned_cloudevent_about_the_lease() -> None:
    lease = slim_lease(
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
    assert lease is not None
    event = lifecycle_event("OverCommitted", lease, {"phase": "Active", "used": "9", "overage": "1"})
    attributes = event.attributes
    assert attributes["type"] == "io.castops.castslice.gpulease.overcommitted.v1"
    assert attributes["subject"] == "ml/h100" and attributes["source"] == "/castslice/control"
    assert attributes["specversion"] == "1.0" and attributes["datacontenttype"] == "application/json"
    assert attributes["podnamespace"] == "ml"
    data = json.loads(event.data)
    assert data["step"] == "OverCommitted" and data["count"] == "8"
    assert data["status"]["overage"] == "1" and data["lease"]["model"] == "H100"
    assert len(event.data) < 1024
