"""Where the real kube-scheduler puts Pods on the fake fleet (no webhook registered here): the
CAST AI spot contract of REFERENCE.md ("Spot placement") holds on this cluster, so the webhook's
spot and GPU tests can rely on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from .controlplane import GPU, GPU_NODE, ON_DEMAND, SPOT, SPOT_KEY, ControlPlane

pytestmark = pytest.mark.e2e

SPOT_TOLERATION = {"key": SPOT_KEY, "operator": "Exists"}


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"sched-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    yield name
    with control_plane.api_client() as api:
        client.CoreV1Api(api).delete_namespace(name)


def _create(control_plane: ControlPlane, namespace: str, name: str, **spec: Any) -> None:
    container = {"name": "main", "image": "busybox", "resources": spec.pop("resources", {})}
    manifest = {"metadata": {"name": name}, "spec": {"containers": [container], **spec}}
    with control_plane.api_client() as api:
        client.CoreV1Api(api).create_namespaced_pod(namespace, manifest)


def test_spot_only_pod_lands_on_a_spot_node(control_plane: ControlPlane, namespace: str) -> None:
    # spot only = toleration + nodeSelector scheduling.cast.ai/spot=true
    _create(
        control_plane,
        namespace,
        "spot-only",
        tolerations=[SPOT_TOLERATION],
        nodeSelector={SPOT_KEY: "true"},
    )
    pod = control_plane.wait_for_pod(namespace, "spot-only")
    assert pod["spec"]["nodeName"] in control_plane.node_names(SPOT)


def test_pods_without_the_toleration_never_land_on_spot_nodes(
    control_plane: ControlPlane, namespace: str
) -> None:
    names = [f"plain-{i}" for i in range(6)]
    for name in names:
        _create(control_plane, namespace, name, resources={"requests": {"cpu": "100m"}})
    placed = {name: control_plane.wait_for_pod(namespace, name)["spec"]["nodeName"] for name in names}
    assert all(control_plane.node_kind(node) in (ON_DEMAND, GPU_NODE) for node in placed.values()), placed


def test_spot_only_pod_without_the_toleration_is_unschedulable(
    control_plane: ControlPlane, namespace: str
) -> None:
    _create(control_plane, namespace, "selector-only", nodeSelector={SPOT_KEY: "true"})
    condition = control_plane.wait_for_unschedulable(namespace, "selector-only")
    assert "untolerated taint" in condition["message"], condition


def test_a_whole_gpu_fits_nowhere_on_a_time_sliced_fleet(control_plane: ControlPlane, namespace: str) -> None:
    """The premise of the webhook's scheduling tests: no Node hands out whole nvidia.com/gpu."""
    _create(control_plane, namespace, "whole-gpu", resources={"limits": {GPU: "1"}})
    condition = control_plane.wait_for_unschedulable(namespace, "whole-gpu")
    assert f"Insufficient {GPU}" in condition["message"], condition
