"""GPU slicing only to a resource some node offers, on a real control plane (kube-apiserver, the
scheduler, kwok's fake Nodes).

The webhook is ``castslice serve`` (TLS on loopback) registered with the project's own
MutatingWebhookConfiguration, its view running as the webhook's ServiceAccount with the RBAC the
deployment overlay renders (components/cluster-view-nodes included): a token of that account,
never admin. Its configuration slices ``nvidia.com/gpu`` into ``nvidia.com/gpu.shared`` (the name
NVIDIA's device plugin gives shared GPUs with ``renameByDefault``), with
``requireAdvertisedTarget``. No Node of the shared fleet offers that name (its GPU Nodes advertise
``nvidia.com/gpu-shared``); this module adds a kwok Node that advertises only whole
``nvidia.com/gpu`` (tainted, so no other module's Pod lands on it). An opted-in Pod is admitted
whole, with the warning on kubectl's stderr and the reason in the audit event; once the Node's
status advertises ``nvidia.com/gpu.shared`` (a patch of its status, as a device plugin restarted
with a renaming config would make the kubelet write), the next opted-in Pod is sliced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import KWOK_NODE_ANNOTATION, ControlPlane
from .identity import delete_created, service_account_kubeconfig
from .launch import EventLog, ServedWebhook, pointed_at, start_event_sink
from .support import kubectl
from .workloads import eventually

pytestmark = pytest.mark.e2e

NAMESPACE = "slicing-nodes"
NODE = "gpu-whole-1"
TARGET = "nvidia.com/gpu.shared"
TAINT = {"key": "castslice.test/slicing-nodes", "value": "true", "effect": "NoSchedule"}
CONFIG: dict[str, Any] = {
    "gpuSlicing": {"targetResource": TARGET, "requireAdvertisedTarget": True},
}
WARNING = f"castslice: not sliced, no node offers {TARGET}; Pod keeps its nvidia.com/gpu"


def whole_gpu_node() -> dict[str, Any]:
    key, value = KWOK_NODE_ANNOTATION
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "annotations": {key: value},
            "labels": {"kubernetes.io/hostname": NODE, "type": "kwok", "nvidia.com/gpu.product": "A100"},
        },
        "spec": {"taints": [TAINT]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def opted_in_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {"castops.io/optimize": "true"}},
        "spec": {
            "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
            "containers": [
                {"name": "server", "image": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


@pytest.fixture(scope="module")
def slicing(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    created: list[dict[str, Any]] = []
    kubeconfig = service_account_kubeconfig(control_plane, tmp_path_factory.mktemp("nodes-rbac"), created)
    events = EventLog()
    sink_url, sink = start_event_sink(events)
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    core.create_node(whole_gpu_node())
    server = ServedWebhook(control_plane, "slicing-nodes", CONFIG, sink_url, kubeconfig=kubeconfig)
    registration = client.AdmissionregistrationV1Api(api)
    rendered = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
    route = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]}
    configuration = pointed_at(
        rendered, "e2e-slicing-nodes", server.url, control_plane.ca_cert.read_bytes(), route
    )
    registration.create_mutating_webhook_configuration(configuration)
    control_plane.create_namespace(NAMESPACE)
    try:
        yield {"plane": control_plane, "core": core, "server": server, "events": events}
    finally:
        registration.delete_mutating_webhook_configuration("e2e-slicing-nodes")
        core.delete_namespace(NAMESPACE)
        core.delete_node(NODE)
        server.stop()
        sink.shutdown()
        api.close()
        delete_created(control_plane, created)


def create(plane: ControlPlane, pod: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The Pod as stored, and kubectl's stderr (where the apiserver's warnings are printed)."""
    done = kubectl(plane, "create", "-o", "json", "-f", "-", stdin=yaml.safe_dump(pod))
    assert done.returncode == 0, done.stderr
    stored: dict[str, Any] = json.loads(done.stdout)
    return stored, done.stderr


def limits(pod: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = pod["spec"]["containers"][0]["resources"]["limits"]
    return found


def test_an_opted_in_pod_is_admitted_whole_until_a_node_offers_the_shared_resource(
    slicing: dict[str, Any],
) -> None:
    plane: ControlPlane = slicing["plane"]
    server: ServedWebhook = slicing["server"]
    # The view lists every Node: the fleet's and the whole-GPU one (none offering the target).
    eventually(lambda: server.view_objects("nodes") >= 7, 30, "the view to hold the Nodes")

    def called() -> bool:  # the apiserver picks up a webhook configuration asynchronously
        probe = kubectl(
            plane, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(opted_in_pod("p"))
        )
        return WARNING in probe.stderr

    eventually(called, 30, "the webhook to be called")
    whole, stderr = create(plane, opted_in_pod("whole"))
    assert f"Warning: {WARNING}" in stderr
    assert limits(whole) == {"nvidia.com/gpu": "1"}
    assert "castops.io/original-gpu-request" not in whole["metadata"].get("annotations", {})

    def audited() -> bool:
        with slicing["events"].lock:
            bodies = [event["body"].decode() for event in slicing["events"].events]
        return any(f"no node advertises {TARGET}" in body and '"whole"' in body for body in bodies)

    eventually(audited, 30, "the decision's audit event")

    # The device plugin now shares the GPUs under the renamed resource: the kubelet reports it.
    slicing["core"].patch_node_status(
        NODE, {"status": {"allocatable": {TARGET: "32"}, "capacity": {TARGET: "32"}}}
    )

    def sliced() -> bool:
        probe = kubectl(
            plane,
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            stdin=yaml.safe_dump(opted_in_pod("p")),
        )
        return probe.returncode == 0 and TARGET in limits(json.loads(probe.stdout))

    eventually(sliced, 30, "the webhook to see the Node offer the shared resource")
    shared, stderr = create(plane, opted_in_pod("shared"))
    assert WARNING not in stderr
    assert limits(shared) == {TARGET: "1"}
    assert shared["metadata"]["annotations"]["castops.io/original-gpu-request"] == (
        "containers/server: nvidia.com/gpu=1"
    )
    # It runs, on the Node that offers the shared resource.
    running = plane.wait_for_pod(NAMESPACE, "shared")
    assert running["spec"]["nodeName"] == NODE
