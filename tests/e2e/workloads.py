"""Workloads on the e2e control plane, as the spot and PodMutation burst tests make and read them:
a Deployment, its live Pods, their placements and the kind of Node each landed on. ``cluster`` is a
test module's fixture value: the control plane (``plane``), ``core`` (CoreV1Api) and ``apps``
(AppsV1Api)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from .controlplane import SPOT, ControlPlane

PLACEMENT = "castops.io/placement"


def eventually(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something true, and return that (a found object, a count)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def stamp(moment: datetime) -> str:
    """A time as the apiserver writes it in a resource (RFC 3339, whole seconds, Z)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def deployment(name: str, replicas: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations or {}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def live_pods(cluster: dict[str, Any], namespace: str, app: str) -> list[dict[str, Any]]:
    raw = cluster["core"].list_namespaced_pod(namespace, label_selector=f"app={app}", _preload_content=False)
    items: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def wait_running(cluster: dict[str, Any], namespace: str, app: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def done() -> bool:
        nonlocal found
        found = live_pods(cluster, namespace, app)
        return len(found) == count and all(
            p["spec"].get("nodeName") and p.get("status", {}).get("phase") == "Running" for p in found
        )

    eventually(done, 120, f"{count} Running Pods of {namespace}/{app}")
    return found


def placements(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"].get("labels", {}).get(PLACEMENT, "") for p in pods]


def assert_on_their_nodes(plane: ControlPlane, pods: list[dict[str, Any]]) -> None:
    """Spot Pods sit on spot Nodes, the others do not."""
    for p in pods:
        kind = plane.node_kind(p["spec"]["nodeName"])
        if p["metadata"]["labels"].get(PLACEMENT) == "spot":
            assert kind == SPOT, (p["metadata"]["name"], kind)
        else:
            assert kind != SPOT, (p["metadata"]["name"], kind)


def scale(cluster: dict[str, Any], namespace: str, name: str, replicas: int) -> None:
    cluster["apps"].patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


def remove(cluster: dict[str, Any], namespace: str, name: str) -> None:
    cluster["apps"].delete_namespaced_deployment(name, namespace, propagation_policy="Background")
