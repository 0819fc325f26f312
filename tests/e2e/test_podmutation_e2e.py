"""PodMutation policies on a real, current kube-apiserver (etcd, controller-manager, kube-scheduler,
kwok's fleet; see controlplane.py).

The CRD, the validating webhook and the mutating webhook are the project's own manifests (rendered
by kustomize), pointed at a `castslice serve` on loopback with TLS whose cluster view watches the
apiserver (admin kubeconfig here; tests/e2e/test_view_e2e.py runs the view with the ServiceAccount's
own RBAC). PodMutations are applied with kubectl, as a user does; Pods and Deployments are checked
as the apiserver stores them and where the real scheduler puts them.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import SPOT, ControlPlane
from .launch import EventLog, ServedWebhook, pointed_at, start_event_sink
from .support import kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = KNATIVE_DIR / "components" / "pod-mutations"
CASTAI_CRD = ROOT / "tests" / "data" / "podmutation" / "castai-crd.yaml"
NAMESPACE = "e2e-podmut"
SPLIT_LABEL, SPLIT_VALUE = "castslice-e2e", "podmut"
MARK = "castops.io/pod-mutation"


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def apply(plane: ControlPlane, *objects: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kubectl(plane, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def podmutation(name: str, spec: dict[str, Any], api: str = "castops.io/v1alpha1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "PodMutation", "metadata": {"name": name}, "spec": spec}


def pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def _established(api: Any, name: str) -> bool:
    from kubernetes import client

    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    plane = control_plane
    api = plane.api_client()
    extensions = client.ApiextensionsV1Api(api)
    rendered = render(COMPONENT)
    crd = one(rendered, "CustomResourceDefinition")
    castai_crd = yaml.safe_load(CASTAI_CRD.read_text())
    for definition in (crd, castai_crd):
        extensions.create_custom_resource_definition(definition)
        eventually(lambda d=definition: _established(api, d["metadata"]["name"]), what="CRD established")

    events = EventLog()
    sink_url, sink = start_event_sink(events)
    # The served webhook's watches read the cluster as admin (test_view_e2e.py checks the RBAC).
    server = ServedWebhook(
        plane,
        "podmut",
        {"gpuSlicing": {"enabled": False}, "podMutations": {"enabled": True, "castaiObjects": True}},
        sink_url,
        kubeconfig=plane.kubeconfig,
    )
    ca = plane.ca_cert.read_bytes()
    registration = client.AdmissionregistrationV1Api(api)
    route = {"key": SPLIT_LABEL, "operator": "In", "values": [SPLIT_VALUE]}
    mutating = pointed_at(
        one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration"), "e2e-podmut", server.url, ca, route
    )
    validating = pointed_at(
        one(rendered, "ValidatingWebhookConfiguration"), "e2e-podmut-validate", server.url, ca
    )
    registration.create_mutating_webhook_configuration(mutating)
    registration.create_validating_webhook_configuration(validating)
    plane.create_namespace(NAMESPACE, labels={SPLIT_LABEL: SPLIT_VALUE})
    core = client.CoreV1Api(api)
    state = {"plane": plane, "api": api, "core": core, "apps": client.AppsV1Api(api), "server": server}
    # The apiserver picks webhook configurations up asynchronously, the view the PodMutation too.
    assert apply(plane, podmutation("probe", {"filter": {"workload": {"names": ["probe"]}}})).returncode == 0
    try:
        eventually(
            lambda: MARK in (dry_run(state, pod("probe"))["metadata"].get("annotations") or {}), what="probe"
        )
    except AssertionError:
        create(state, pod("probe"))
        time.sleep(1)
        seen = events.events[-1]["body"][:1500] if events.events else b"no event"
        calls = server.admissions()
        server.stop()
        log = f"admissions {calls}; dry run metadata {seen}\n" + server.log_tail()
        raise AssertionError(f"the webhook never applied a PodMutation; its log:\n{log}") from None
    try:
        yield state
    finally:
        kubectl(plane, "delete", "podmutations.castops.io", "--all")
        registration.delete_mutating_webhook_configuration("e2e-podmut")
        registration.delete_validating_webhook_configuration("e2e-podmut-validate")
        server.stop()
        sink.shutdown()
        for definition in (crd, castai_crd):
            extensions.delete_custom_resource_definition(definition["metadata"]["name"])
        api.close()


def dry_run(cluster: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    raw = cluster["core"].create_namespaced_pod(NAMESPACE, manifest, dry_run="All", _preload_content=False)
    data: dict[str, Any] = json.loads(raw.data)
    return data


def create(cluster: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    raw = cluster["core"].create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)
    data: dict[str, Any] = json.loads(raw.data)
    return data


def wait_mutation(cluster: dict[str, Any], manifest: dict[str, Any], ref: str, gone: bool = False) -> None:
    """Until a dry run of ``manifest`` gets the PodMutation generation ``ref`` (name/generation),
    i.e. the webhook's view holds it; with ``gone``, until it no longer gets it."""

    def check() -> bool:
        got = (dry_run(cluster, manifest)["metadata"].get("annotations") or {}).get(MARK)
        return (got != ref) if gone else (got == ref)

    eventually(check, what=f"podmutation {ref} {'out of' if gone else 'in'} the webhook's view")


def test_the_most_specific_mutation_wins_and_is_named(cluster: dict[str, Any]) -> None:
    plane = cluster["plane"]
    done = apply(
        plane,
        podmutation(
            "e2e-namespace", {"filter": {"workload": {"namespaces": [NAMESPACE]}}, "labels": {"by": "ns"}}
        ),
        podmutation(
            "e2e-name",
            {
                "filter": {"workload": {"names": ["winner"]}},
                "labels": {"by": "name"},
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
                ],
            },
        ),
    )
    assert done.returncode == 0, done.stderr
    wait_mutation(cluster, pod("winner"), "e2e-name/1")
    wait_mutation(cluster, pod("other"), "e2e-namespace/1")
    stored = create(cluster, pod("winner"))
    assert stored["metadata"]["labels"]["by"] == "name"
    assert stored["metadata"]["annotations"][MARK] == "e2e-name/1"
    assert {"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"} in stored["spec"][
        "tolerations"
    ]
    other = create(cluster, pod("other"))
    assert other["metadata"]["labels"]["by"] == "ns"


def test_a_deployment_s_pods_get_its_mutation_and_land_on_spot(cluster: dict[str, Any]) -> None:
    plane: ControlPlane = cluster["plane"]
    done = apply(
        plane,
        podmutation(
            "e2e-deployment",
            {
                "filter": {"workload": {"kinds": ["Deployment"], "names": ["spot-api"]}},
                "labels": {"via": "deployment"},
                "spotConfig": {"mode": "only-spot"},
            },
        ),
    )
    assert done.returncode == 0, done.stderr
    # a dry-run Pod owned by the Deployment (the apiserver accepts an owner it does not know)
    probe = pod("spot-api-probe")
    probe["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "spot-api",
            "uid": "0" * 8,
            "controller": True,
        }
    ]
    wait_mutation(cluster, probe, "e2e-deployment/1")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "spot-api"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "spot-api"}},
            "template": {
                "metadata": {"labels": {"app": "spot-api"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }
    cluster["apps"].create_namespaced_deployment(NAMESPACE, deployment)

    def pods() -> list[dict[str, Any]]:
        raw = cluster["core"].list_namespaced_pod(
            NAMESPACE, label_selector="app=spot-api", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(raw.data)["items"]
        return items if len(items) == 2 else []

    for item in eventually(pods, what="the Deployment's Pods"):
        assert item["metadata"]["labels"]["via"] == "deployment"
        assert item["metadata"]["annotations"][MARK].startswith("e2e-deployment/")
        assert item["spec"]["nodeSelector"] == {"scheduling.cast.ai/spot": "true"}
        running = plane.wait_for_pod(NAMESPACE, item["metadata"]["name"])
        assert plane.node_kind(running["spec"]["nodeName"]) == SPOT


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # the validating webhook
        (
            {"filter": {"workload": {"names": ["(("]}}},
            "spec.filter.workload.names: '((' is not a valid regex",
        ),
        ({"patches": [{"op": "add", "path": "/spec/[key", "value": 1}]}, "patches[0].path"),
        (
            {
                "nodeTemplatesToConsolidate": ["a"],
                "nodeSelector": {"add": {"scheduling.cast.ai/node-template": "b"}},
            },
            "nodeTemplatesToConsolidate and nodeSelector.add",
        ),
        # the CRD's schema and CEL rules
        ({"spotConfig": {"mode": "only-spot", "distributionPercentage": 300}}, "distributionPercentage"),
        ({"patches": [{"op": "frob", "path": "/a"}]}, "spec.patches[0].op"),
        (
            {"distributionGroups": [{"name": "a", "percentage": 60}, {"name": "b", "percentage": 50}]},
            "percentages add up to more than 100 %",
        ),
        ({"filter": {}, "filterV2": {}}, "filter and filterV2 are both set"),
    ],
)
def test_an_invalid_podmutation_is_refused_by_kubectl_apply(
    cluster: dict[str, Any], spec: dict[str, Any], message: str
) -> None:
    done = apply(cluster["plane"], podmutation("e2e-invalid", spec))
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert kubectl(cluster["plane"], "get", "podmut", "e2e-invalid").returncode != 0


def test_editing_a_podmutation_changes_the_next_pod_without_a_restart(cluster: dict[str, Any]) -> None:
    plane = cluster["plane"]
    spec = {"filter": {"workload": {"names": ["edited-.*"]}}, "labels": {"version": "one"}}
    assert apply(plane, podmutation("e2e-edit", spec)).returncode == 0
    wait_mutation(cluster, pod("edited-probe"), "e2e-edit/1")
    assert create(cluster, pod("edited-1"))["metadata"]["labels"]["version"] == "one"
    spec["labels"]["version"] = "two"
    assert apply(plane, podmutation("e2e-edit", spec)).returncode == 0
    wait_mutation(cluster, pod("edited-probe"), "e2e-edit/2")
    assert create(cluster, pod("edited-2"))["metadata"]["labels"]["version"] == "two"
    assert kubectl(plane, "delete", "podmut", "e2e-edit").returncode == 0
    wait_mutation(cluster, pod("edited-probe"), "e2e-edit/2", gone=True)  # deleted: no longer applied


def test_a_castai_object_is_honoured_with_the_switch_on(cluster: dict[str, Any]) -> None:
    plane = cluster["plane"]
    castai = podmutation(
        "e2e-castai",
        {
            "filter": {"workload": {"names": ["^castai-.*$"]}},
            "patches": [
                {"op": "add", "path": "/metadata/annotations/mutated-by-pod-mutator", "value": "true"}
            ],
        },
        api="pod-mutations.cast.ai/v1",
    )
    done = apply(plane, castai)
    assert done.returncode == 0, done.stderr
    wait_mutation(cluster, pod("castai-probe"), "e2e-castai/1")
    stored = create(cluster, pod("castai-1"))
    assert stored["metadata"]["annotations"]["mutated-by-pod-mutator"] == "true"


def test_a_failing_patch_admits_the_pod_with_a_warning(cluster: dict[str, Any]) -> None:
    plane = cluster["plane"]
    spec = {
        "filter": {"workload": {"names": ["warned"]}},
        "labels": {"kept": "yes"},
        "patches": [
            {
                "op": "test",
                "path": "/spec/tolerations/0/key",
                "value": "node-role.kubernetes.io/control-plane",
            },
            {"op": "remove", "path": "/spec/tolerations/0"},
        ],
    }
    assert apply(plane, podmutation("e2e-warn", spec)).returncode == 0
    wait_mutation(cluster, pod("warned"), "e2e-warn/1")
    done = kubectl(plane, "create", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(pod("warned")))
    assert done.returncode == 0, done.stderr
    assert "Warning: podmutation e2e-warn/1: patches not applied" in done.stderr
    stored = json.loads(kubectl(plane, "get", "pod", "-n", NAMESPACE, "warned", "-o", "json").stdout)
    assert stored["metadata"]["labels"]["kept"] == "yes"
