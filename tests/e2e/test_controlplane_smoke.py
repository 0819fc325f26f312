"""Smoke test of the e2e control plane itself: the apiserver stores objects
(JSON maps included, which exercises the patched reflect2) and the controller
manager turns a Deployment into a ReplicaSet and a Pod."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from .controlplane import ControlPlane

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


def test_control_plane_stores_pods_and_runs_controllers(control_plane: ControlPlane) -> None:
    ns = f"smoke-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(ns)

    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        apps = client.AppsV1Api(api)

        # a bare, privileged Pod: stored as sent, Pending (there are no nodes)
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
        assert pod.spec.node_name is None
        assert pod.status.phase == "Pending"

        # Pretty JSON and YAML are encoded with json-iterator, whose map
        # iteration (vendored reflect2 v1.0.1) breaks under Go >= 1.18 unless
        # patched (.ci/provision-k8s): maps come out null, then the handler panics.
        for path, accept in [
            (f"/api/v1/namespaces/{ns}/pods/bare?pretty=true", None),
            (f"/api/v1/namespaces/{ns}/pods/bare", "application/yaml"),
        ]:
            status, body = control_plane.get(path, accept=accept)
            assert status == 200, (path, accept, body[:500])
            assert b"castslice.test/kind" in body, (path, accept, body[:500])

        # a Deployment: the controller manager makes a ReplicaSet and a Pod
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
        assert dpod.status.phase == "Pending"

        core.delete_namespace(ns)
