"""CastSlice registered as the mutating webhook of a real, current kube-apiserver (with etcd, a
kube-controller-manager, a kube-scheduler and kwok's fake fleet, see controlplane.py), checked on
the objects the apiserver stores and on where the real scheduler then puts them.

The webhook is served by `castslice serve` with TLS on loopback, exactly as the Deployment overlay
runs it. Its MutatingWebhookConfiguration is the project's own (knative/base/webhook.yaml, as
kustomize renders it): same rules, side effects, failure policy, timeout, reinvocation policy and
selectors; only clientConfig is pointed at the local server, with the test CA as caBundle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.manifests import KNATIVE_DIR, kustomization_dirs, one, render

from .controlplane import GPU_NODE, ControlPlane
from .launch import EventLog, ServedWebhook, pointed_at, start_event_sink

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SLICING_NS = "e2e-slicing"
VGPU_NS = "e2e-vgpu"
SPLIT_LABEL = "castslice-e2e"
"""Namespaces labelled castslice-e2e=vgpu go to a second server whose configuration enables vGPU."""


def webhook_configuration(name: str, server: ServedWebhook, ca: bytes, split: str) -> dict[str, Any]:
    """The project's own webhook manifest, pointed at ``server``; ``split`` routes test namespaces."""
    rendered = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
    route = {"key": SPLIT_LABEL, "operator": "In" if split == "vgpu" else "NotIn", "values": ["vgpu"]}
    return pointed_at(rendered, name, server.url, ca, route)


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    events = EventLog()
    sink_url, sink = start_event_sink(events)
    slicing = ServedWebhook(control_plane, "slicing", {}, sink_url)
    vgpu = ServedWebhook(control_plane, "vgpu", {"vgpu": {"enabled": True}}, sink_url)
    ca = control_plane.ca_cert.read_bytes()
    api = control_plane.api_client()
    registration = client.AdmissionregistrationV1Api(api)
    names = []
    for name, server, split in (("e2e-slicing", slicing, "slicing"), ("e2e-vgpu", vgpu, "vgpu")):
        registration.create_mutating_webhook_configuration(webhook_configuration(name, server, ca, split))
        names.append(name)
    control_plane.create_namespace(SLICING_NS)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": VGPU_NS, "labels": {SPLIT_LABEL: "vgpu"}}})
    control_plane.wait_for_service_account(VGPU_NS)
    _wait_webhook_active(core)
    try:
        yield {
            "plane": control_plane,
            "api": api,
            "core": core,
            "apps": client.AppsV1Api(api),
            "events": events,
            "slicing": slicing,
            "vgpu": vgpu,
        }
    finally:
        for name in names:
            registration.delete_mutating_webhook_configuration(name)
        slicing.stop()
        vgpu.stop()
        sink.shutdown()
        api.close()


def _wait_webhook_active(core: Any) -> None:
    """The apiserver picks up new webhook configurations asynchronously: probe with a dry run."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = pod("probe", {"castops.io/optimize": "true"}, limits={"nvidia.com/gpu": "1"})
        created = core.create_namespaced_pod(SLICING_NS, probe, dry_run="All")
        if "nvidia.com/gpu-shared" in (created.spec.containers[0].resources.limits or {}):
            return
        time.sleep(0.5)
    raise RuntimeError("the webhook never became active")


def pod(
    name: str,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


def stored(cluster: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    raw = cluster["core"].read_namespaced_pod(name, namespace, _preload_content=False)
    data: dict[str, Any] = json.loads(raw.data)
    return data


def resources_of(stored_pod: dict[str, Any], kind: str = "containers", index: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = stored_pod["spec"][kind][index].get("resources", {})
    return resources


OPTED_IN = {"castops.io/optimize": "true"}
GPU = {"nvidia.com/gpu": "1"}


@pytest.mark.parametrize(
    ("name", "annotations", "limits", "expected"),
    [
        ("inference", {**OPTED_IN, "castops.io/workload-type": "inference"}, GPU, "2"),
        ("training", {**OPTED_IN, "castops.io/workload-type": "training"}, GPU, "4"),
        ("batch", {**OPTED_IN, "castops.io/workload-type": "batch"}, GPU, "2"),
        ("dev", {**OPTED_IN, "castops.io/workload-type": "dev"}, GPU, "1"),
        ("default-count", OPTED_IN, GPU, "1"),
        (
            "ratio-wins",
            {**OPTED_IN, "castops.io/slice-ratio": "8", "castops.io/workload-type": "training"},
            {"nvidia.com/gpu": "2"},
            "8",
        ),
    ],
)
def test_opted_in_pod_is_stored_with_shared_gpus_in_requests_and_limits(
    cluster: dict[str, Any], name: str, annotations: dict[str, str], limits: dict[str, str], expected: str
) -> None:
    cluster["core"].create_namespaced_pod(SLICING_NS, pod(name, annotations, limits))
    resources = resources_of(stored(cluster, SLICING_NS, name))
    assert resources == {
        "limits": {"nvidia.com/gpu-shared": expected},
        "requests": {"nvidia.com/gpu-shared": expected},
    }
    # and the real scheduler finds it a GPU Node with enough shared replicas
    plane: ControlPlane = cluster["plane"]
    running = plane.wait_for_pod(SLICING_NS, name)
    assert plane.node_kind(running["spec"]["nodeName"]) == GPU_NODE


def test_init_containers_and_unrelated_resources(cluster: dict[str, Any]) -> None:
    manifest = pod(
        "with-init",
        {**OPTED_IN, "castops.io/workload-type": "batch"},
        {"nvidia.com/gpu": "1", "memory": "1Gi"},
    )
    manifest["spec"]["initContainers"] = [
        {"name": "warmup", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    manifest["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    cluster["core"].create_namespaced_pod(SLICING_NS, manifest)
    result = stored(cluster, SLICING_NS, "with-init")
    assert resources_of(result, "initContainers") == {
        "limits": {"nvidia.com/gpu-shared": "2"},
        "requests": {"nvidia.com/gpu-shared": "2"},
    }
    assert resources_of(result) == {
        "limits": {"memory": "1Gi", "nvidia.com/gpu-shared": "2"},
        "requests": {"memory": "1Gi", "nvidia.com/gpu-shared": "2"},
    }
    assert resources_of(result, index=1) == {}


@pytest.mark.parametrize(
    ("name", "annotations", "limits", "labels"),
    [
        ("not-opted-in", {"castops.io/optimize": "True"}, GPU, {}),
        ("no-gpu", OPTED_IN, {"memory": "64Mi"}, {}),
        ("opted-out", OPTED_IN, GPU, {"castops.io/webhook": "ignore"}),
    ],
)
def test_pods_where_nothing_applies_are_stored_unchanged(
    cluster: dict[str, Any],
    name: str,
    annotations: dict[str, str],
    limits: dict[str, str],
    labels: dict[str, str],
) -> None:
    cluster["core"].create_namespaced_pod(SLICING_NS, pod(name, annotations, limits, labels))
    resources = resources_of(stored(cluster, SLICING_NS, name))
    assert resources == {"limits": limits, "requests": limits}


def test_system_namespaces_never_reach_the_webhook(cluster: dict[str, Any]) -> None:
    """The apiserver labels every namespace kubernetes.io/metadata.name=<name> (1.21+), so the
    manifest's namespaceSelector keeps kube-system away from the webhook altogether: the apiserver
    does not even call it (the function's excludedNamespaces stays a backstop for old clusters)."""
    slicing: ServedWebhook = cluster["slicing"]
    labels = cluster["core"].read_namespace("kube-system").metadata.labels
    assert labels["kubernetes.io/metadata.name"] == "kube-system"
    before = slicing.admissions()
    cluster["core"].create_namespaced_pod("kube-system", pod("in-kube-system", OPTED_IN, GPU))
    try:
        assert resources_of(stored(cluster, "kube-system", "in-kube-system"))["limits"] == GPU
        assert slicing.admissions() == before
        # the same Pod in a namespace the selector lets through is sent to the webhook
        cluster["core"].create_namespaced_pod(SLICING_NS, pod("counted", OPTED_IN, GPU))
        assert slicing.admissions() > before
    finally:
        cluster["core"].delete_namespaced_pod("in-kube-system", "kube-system", grace_period_seconds=0)


@pytest.mark.parametrize(
    ("annotation", "value", "accepted"),
    [
        ("castops.io/slice-ratio", "-3", "a whole number from 1 to 1000"),
        ("castops.io/slice-ratio", "abc", "a whole number from 1 to 1000"),
        ("castops.io/workload-type", "simulation", "batch (2), dev (1), inference (2), training (4)"),
    ],
)
def test_bad_annotation_is_denied_with_a_message_the_client_sees(
    cluster: dict[str, Any], annotation: str, value: str, accepted: str
) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as denied:
        cluster["core"].create_namespaced_pod(SLICING_NS, pod("bad", {**OPTED_IN, annotation: value}, GPU))
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert "denied the request" in message
    assert f'annotation {annotation}: "{value}" is not valid; accepted: {accepted}' in message


def test_deployment_pods_created_by_the_controller_manager_are_sliced(cluster: dict[str, Any]) -> None:
    template = pod("unused", {**OPTED_IN, "castops.io/workload-type": "inference"}, GPU, {"app": "fleet"})
    del template["metadata"]["name"]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "fleet"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "fleet"}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    cluster["apps"].create_namespaced_deployment(SLICING_NS, deployment)
    deadline = time.monotonic() + 60
    pods: list[Any] = []
    while time.monotonic() < deadline:
        pods = cluster["core"].list_namespaced_pod(SLICING_NS, label_selector="app=fleet").items
        if len(pods) == 2:
            break
        time.sleep(0.5)
    assert len(pods) == 2, "the controller manager did not create the Deployment's Pods"
    plane: ControlPlane = cluster["plane"]
    for created in pods:
        assert created.metadata.generate_name  # controller-made: no name in the admission request
        resources = created.spec.containers[0].resources
        assert resources.limits == {"nvidia.com/gpu-shared": "2"}
        assert resources.requests == {"nvidia.com/gpu-shared": "2"}
        running = plane.wait_for_pod(SLICING_NS, created.metadata.name)
        assert plane.node_kind(running["spec"]["nodeName"]) == GPU_NODE
    # The Deployment's own template is not a Pod: it stays as written.
    template_resources = cluster["apps"].read_namespaced_deployment("fleet", SLICING_NS).spec.template.spec
    assert template_resources.containers[0].resources.limits == GPU


def _wait_for_event(events: EventLog, subject: str, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subject in events.subjects():
            return True
        time.sleep(0.1)
    return False


def test_server_side_dry_run_mutates_but_emits_no_audit_event(cluster: dict[str, Any]) -> None:
    events: EventLog = cluster["events"]
    dry = cluster["core"].create_namespaced_pod(SLICING_NS, pod("dry", OPTED_IN, GPU), dry_run="All")
    assert dry.spec.containers[0].resources.limits == {"nvidia.com/gpu-shared": "1"}
    # A real creation afterwards: its event proves the sender is working, so the dry run's
    # absence is not just a slow queue.
    cluster["core"].create_namespaced_pod(SLICING_NS, pod("wet", OPTED_IN, GPU))
    assert _wait_for_event(events, f"namespaces/{SLICING_NS}/pods/wet")
    assert f"namespaces/{SLICING_NS}/pods/dry" not in events.subjects()
    wet = next(
        e for e in events.events if e["headers"].get("ce-subject") == f"namespaces/{SLICING_NS}/pods/wet"
    )
    assert wet["headers"]["ce-type"] == "io.castops.castslice.admission.mutated.v1"
    data = json.loads(wet["body"])
    assert data["request"]["operation"] == "CREATE" and data["request"]["uid"]
    assert data["pod"]["name"] == "wet" and data["outcome"] == "mutated"
    assert [m["mutator"] for m in data["mutators"] if m["action"] == "mutated"] == ["gpu-slicing"]
    assert wet["headers"]["ce-outcome"] == "mutated" and wet["headers"]["ce-podnamespace"] == SLICING_NS


def test_vgpu_pod_goes_to_the_vgpu_scheduler_with_priority_env(cluster: dict[str, Any]) -> None:
    manifest = pod(
        "cuda", limits={"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30", "nvidia.com/priority": "1"}
    )
    cluster["core"].create_namespaced_pod(VGPU_NS, manifest)
    result = stored(cluster, VGPU_NS, "cuda")
    assert result["spec"]["schedulerName"] == "hami-scheduler"
    container = result["spec"]["containers"][0]
    assert {"name": "CUDA_TASK_PRIORITY", "value": "1"} in container.get("env", [])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"


def test_whole_gpu_vgpu_pod_is_stored_with_exclusive_cores(cluster: dict[str, Any]) -> None:
    """HAMi PR #1354: a whole GPU books its compute as exclusive (gpucores 100), limits and requests."""
    cluster["core"].create_namespaced_pod(VGPU_NS, pod("whole-gpu", limits={"nvidia.com/gpu": "1"}))
    result = stored(cluster, VGPU_NS, "whole-gpu")
    assert result["spec"]["schedulerName"] == "hami-scheduler"
    assert resources_of(result)["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}
    assert resources_of(result)["requests"] == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}


def test_vgpu_pod_with_node_name_is_denied(cluster: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as denied:
        cluster["core"].create_namespaced_pod(VGPU_NS, pod("pinned", limits=GPU, nodeName="gpu-node-1"))
    assert denied.value.status == 403
    assert "nodeName" in json.loads(denied.value.body)["message"]


def test_privileged_vgpu_pod_is_denied_naming_the_container(cluster: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    manifest = pod("privileged", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"})
    manifest["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as denied:
        cluster["core"].create_namespaced_pod(VGPU_NS, manifest)
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert "privileged" in message and "main" in message


def test_slicing_and_vgpu_together(cluster: dict[str, Any]) -> None:
    """Both mutators on: an opted-in whole-GPU Pod is sliced and stays with the default scheduler;
    an opted-in Pod that also asks for vGPU memory is a conflict, denied by default."""
    from kubernetes.client.exceptions import ApiException

    cluster["core"].create_namespaced_pod(VGPU_NS, pod("sliced-not-vgpu", OPTED_IN, GPU))
    result = stored(cluster, VGPU_NS, "sliced-not-vgpu")
    assert resources_of(result)["limits"] == {"nvidia.com/gpu-shared": "1"}
    assert result["spec"]["schedulerName"] == "default-scheduler"
    with pytest.raises(ApiException) as denied:
        cluster["core"].create_namespaced_pod(
            VGPU_NS, pod("conflict", OPTED_IN, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"})
        )
    assert denied.value.status == 403


def test_a_stored_vgpu_pod_sent_again_gains_nothing(cluster: dict[str, Any]) -> None:
    """Reinvocation: the webhook's own output, created again, is stored identically (no duplicate env)."""
    manifest = pod("again-1", limits={"nvidia.com/gpumem": "1000", "nvidia.com/priority": "0"})
    cluster["core"].create_namespaced_pod(VGPU_NS, manifest)
    first = stored(cluster, VGPU_NS, "again-1")
    second_manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "again-2"},
        "spec": {k: v for k, v in first["spec"].items() if k not in ("nodeName",)},
    }
    cluster["core"].create_namespaced_pod(VGPU_NS, second_manifest)
    second = stored(cluster, VGPU_NS, "again-2")
    assert second["spec"]["containers"] == first["spec"]["containers"]
    assert [e["name"] for e in second["spec"]["containers"][0]["env"]] == ["CUDA_TASK_PRIORITY"]
    assert second["spec"]["schedulerName"] == "hami-scheduler"


@pytest.fixture(scope="module")
def crds(cluster: dict[str, Any]) -> None:
    """The Knative and cert-manager CRDs, installed as shipped (CEL rules included)."""
    from tests.e2e.crds import install_crds

    install_crds(cluster["api"])


def test_every_knative_manifest_passes_a_server_side_dry_run(cluster: dict[str, Any], crds: None) -> None:
    """Every rendered object goes in as rendered (policy/v1 PodDisruptionBudget included), beside
    the CRDs as shipped: the apiserver validates them all for real."""
    from tests.e2e.crds import apply_dry_run

    for directory in kustomization_dirs():  # components render only inside an overlay
        apply_dry_run(cluster["api"], render(directory), str(directory.relative_to(ROOT)))


def test_crd_cel_rules_are_enforced(cluster: dict[str, Any], crds: None) -> None:
    """The CRDs' x-kubernetes-validations are compiled and enforced, not stripped: cert-manager's
    Issuer allows exactly one Venafi back end."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    issuers = dynamic.DynamicClient(cluster["api"]).resources.get(
        api_version="cert-manager.io/v1", kind="Issuer"
    )
    cloud = {"apiTokenSecretRef": {"name": "token"}}
    tpp = {"url": "https://tpp.invalid/vedsdk", "credentialsRef": {"name": "credentials"}}

    def issuer(venafi: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": "venafi", "namespace": SLICING_NS},
            "spec": {"venafi": {"zone": "castslice", **venafi}},
        }

    issuers.create(body=issuer({"cloud": cloud}), namespace=SLICING_NS, query_params=[("dryRun", "All")])
    with pytest.raises(ApiException) as rejected:
        issuers.create(
            body=issuer({"cloud": cloud, "tpp": tpp}), namespace=SLICING_NS, query_params=[("dryRun", "All")]
        )
    assert rejected.value.status == 422
    assert "exactly one of tpp, cloud, or ngts must be configured" in rejected.value.body


def test_native_sidecar_asking_for_a_gpu_is_sliced_and_runs(cluster: dict[str, Any]) -> None:
    """A native sidecar (an init container with restartPolicy: Always, Kubernetes 1.28+) is
    sliced like any container; the apiserver keeps its restartPolicy, counts it in the Pod's
    requests for the whole Pod's life, and the Pod runs on a GPU Node with the sidecar started."""
    plane: ControlPlane = cluster["plane"]
    manifest = pod("sidecar", {**OPTED_IN, "castops.io/workload-type": "inference"}, GPU)
    manifest["spec"]["initContainers"] = [
        {
            "name": "gpu-sidecar",
            "image": "busybox",
            "restartPolicy": "Always",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    ]
    cluster["core"].create_namespaced_pod(SLICING_NS, manifest)
    result = stored(cluster, SLICING_NS, "sidecar")
    sidecar = result["spec"]["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["resources"] == {
        "limits": {"nvidia.com/gpu-shared": "2"},
        "requests": {"nvidia.com/gpu-shared": "2"},
    }
    assert resources_of(result)["limits"] == {"nvidia.com/gpu-shared": "2"}
    running = plane.wait_for_pod(SLICING_NS, "sidecar")
    assert plane.node_kind(running["spec"]["nodeName"]) == GPU_NODE
    (status,) = running["status"]["initContainerStatuses"]
    assert status["name"] == "gpu-sidecar" and status["started"] is True and status["state"]["running"]


def test_sliced_pod_is_bound_to_a_gpu_node_by_the_scheduler(cluster: dict[str, Any]) -> None:
    """Opted in, the Pod asks for shared replicas, which the GPU Nodes advertise: kube-scheduler
    binds it to one and it runs; its whole-GPU twin below cannot be placed anywhere."""
    plane: ControlPlane = cluster["plane"]
    cluster["core"].create_namespaced_pod(SLICING_NS, pod("placed", OPTED_IN, GPU))
    running = plane.wait_for_pod(SLICING_NS, "placed")
    assert running["spec"]["nodeName"] in plane.node_names(GPU_NODE)
    assert resources_of(running)["requests"] == {"nvidia.com/gpu-shared": "1"}
    assert running["status"]["phase"] == "Running"


def test_pod_left_unsliced_stays_pending_where_no_node_has_whole_gpus(cluster: dict[str, Any]) -> None:
    """Not opted in (castops.io/optimize is not exactly "true"): the webhook leaves the whole-GPU
    request alone, and on a fleet whose GPUs are all time-sliced no Node can take it."""
    plane: ControlPlane = cluster["plane"]
    cluster["core"].create_namespaced_pod(SLICING_NS, pod("left-whole", {"castops.io/optimize": "yes"}, GPU))
    assert resources_of(stored(cluster, SLICING_NS, "left-whole"))["limits"] == GPU
    condition = plane.wait_for_unschedulable(SLICING_NS, "left-whole")
    assert "Insufficient nvidia.com/gpu" in condition["message"], condition
    assert not stored(cluster, SLICING_NS, "left-whole")["spec"].get("nodeName")


def test_zz_pods_are_admitted_unmutated_when_the_webhook_is_down(cluster: dict[str, Any]) -> None:
    """Runs last in this module (pytest keeps file order): it stops the slicing server."""
    cluster["slicing"].stop()
    cluster["core"].create_namespaced_pod(SLICING_NS, pod("while-down", OPTED_IN, GPU))
    assert resources_of(stored(cluster, SLICING_NS, "while-down"))["limits"] == GPU
    # the price of failurePolicy: Ignore on a time-sliced fleet: the Pod cannot be placed
    condition = cluster["plane"].wait_for_unschedulable(SLICING_NS, "while-down")
    assert "Insufficient nvidia.com/gpu" in condition["message"], condition
