"""Smoke test of the e2e cluster itself: the apiserver stores objects and serves them in every
encoding, the fleet is there as designed, kube-scheduler binds Pods and kwok runs them, and the
controller manager turns a Deployment into a ReplicaSet and running Pods."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from .controlplane import GPU, GPU_NODE, GPU_SHARED, ON_DEMAND, SPOT, SPOT_KEY, ControlPlane

pytestmark = pytest.mark.e2e


def _pod_spec() -> client.V1PodSpec:
    return client.V1PodSpec(
        containers=[
            client.V1Container(
                name="main",
                image="registry.invalid/castslice/pause:1",
                security_context=client.V1SecurityContext(privileged=True),
                resources=client.V1ResourceRequirements(requests={"cpu": "10m", "memory": "16Mi"}),
            )
        ]
    )


def test_the_apiserver_is_the_kubernetes_version_ci_builds(control_plane: ControlPlane) -> None:
    version = control_plane.get_json("/version")
    assert version["major"] == "1" and int(version["minor"]) >= 36, version
    assert version["gitVersion"].startswith(f"v1.{version['minor']}."), version


def test_the_fleet_is_ready_with_its_labels_taints_and_gpus(control_plane: ControlPlane) -> None:
    stored = {n["metadata"]["name"]: n for n in control_plane.get_json("/api/v1/nodes")["items"]}
    assert set(stored) == {n.name for n in control_plane.nodes}
    for name in control_plane.node_names(SPOT):
        node = stored[name]
        assert node["metadata"]["labels"][SPOT_KEY] == "true"
        assert {"key": SPOT_KEY, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    for name in control_plane.node_names(ON_DEMAND) + control_plane.node_names(GPU_NODE):
        assert SPOT_KEY not in stored[name]["metadata"]["labels"]
        assert not stored[name]["spec"].get("taints")
    for name in control_plane.node_names(GPU_NODE):
        allocatable = stored[name]["status"]["allocatable"]
        assert int(allocatable[GPU_SHARED]) > 0 and allocatable[GPU] == "0"
    for node in stored.values():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", node["metadata"]["name"]
    # kwok renews each Node's Lease, so the node lifecycle controller keeps them Ready
    leases = control_plane.get_json("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    assert {lease["metadata"]["name"] for lease in leases["items"]} >= set(stored)


def test_control_plane_stores_schedules_and_runs_pods(control_plane: ControlPlane) -> None:
    ns = f"smoke-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(ns)

    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        apps = client.AppsV1Api(api)

        # a bare, privileged Pod: stored as sent, then bound and run on a Node that needs no toleration
        labels = {"app": "smoke", "castslice.test/kind": "pod"}
        core.create_namespaced_pod(
            ns,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="bare", labels=labels, annotations={"note": "e2e"}),
                spec=_pod_spec(),
            ),
        )
        # (the client's models type every field Optional: use them as Any)
        pod: Any = core.read_namespaced_pod("bare", ns)
        assert pod.metadata.labels == labels
        assert pod.metadata.annotations == {"note": "e2e"}
        assert pod.spec.containers[0].security_context.privileged is True
        assert pod.spec.containers[0].resources.requests == {"cpu": "10m", "memory": "16Mi"}
        assert pod.spec.service_account_name == "default"  # ServiceAccount admission ran

        running = control_plane.wait_for_pod(ns, "bare")
        assert control_plane.node_kind(running["spec"]["nodeName"]) in (ON_DEMAND, GPU_NODE)
        assert running["status"]["containerStatuses"][0]["state"]["running"]
        assert running["status"]["podIP"]

        # Pretty JSON and YAML: every encoding of a stored object round-trips its maps.
        for path, accept in [
            (f"/api/v1/namespaces/{ns}/pods/bare?pretty=true", None),
            (f"/api/v1/namespaces/{ns}/pods/bare", "application/yaml"),
        ]:
            status, body = control_plane.get(path, accept=accept)
            assert status == 200, (path, accept, body[:500])
            assert b"castslice.test/kind" in body, (path, accept, body[:500])
        assert json.loads(control_plane.get(f"/api/v1/namespaces/{ns}/pods/bare?pretty=true")[1])

        # a Deployment: the controller manager makes a ReplicaSet and a Pod, which then runs
        selector = {"app": "smoke-deploy"}
        apps.create_namespaced_deployment(
            ns,
            client.V1Deployment(
                metadata=client.V1ObjectMeta(name="web"),
                spec=client.V1DeploymentSpec(
                    replicas=1,
                    selector=client.V1LabelSelector(match_labels=selector),
                    template=client.V1PodTemplateSpec(
                        metadata=client.V1ObjectMeta(labels=selector), spec=_pod_spec()
                    ),
                ),
            ),
        )
        deadline = time.monotonic() + 60
        pods: list[Any] = []
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(ns, label_selector="app=smoke-deploy").items
            if pods:
                break
            time.sleep(0.5)
        assert pods, "kube-controller-manager created no Pod for the Deployment in 60s"

        deployment: Any = apps.read_namespaced_deployment("web", ns)
        replicasets: list[Any] = apps.list_namespaced_replica_set(ns, label_selector="app=smoke-deploy").items
        assert len(replicasets) == 1
        rs = replicasets[0]
        assert rs.metadata.owner_references[0].kind == "Deployment"
        assert rs.metadata.owner_references[0].uid == deployment.metadata.uid

        (dpod,) = pods
        assert dpod.metadata.owner_references[0].kind == "ReplicaSet"
        assert dpod.metadata.owner_references[0].uid == rs.metadata.uid
        assert dpod.metadata.labels["app"] == "smoke-deploy"
        assert "pod-template-hash" in dpod.metadata.labels
        assert dpod.spec.containers[0].security_context.privileged is True
        control_plane.wait_for_pod(ns, dpod.metadata.name)

        # the Deployment controller sees its Pod ready (kwok reports it so)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            deployment = apps.read_namespaced_deployment("web", ns)
            if deployment.status.ready_replicas == 1:
                break
            time.sleep(0.5)
        assert deployment.status.ready_replicas == 1, deployment.status

        core.delete_namespace(ns)
