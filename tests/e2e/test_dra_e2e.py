"""GPU slicing through DRA (``gpuSlicing.backend: dra``) on the real control plane: the webhook
trades a Pod's GPU for a claim from a ResourceClaimTemplate, the kube-controller-manager makes the
claim (owned by the Pod), the scheduler allocates shares of a GPU the fleet publishes through
hand-written ResourceSlices (controlplane.py: two GPUs of 8 shares on each GPU Node, a DeviceClass
without ``extendedResourceName``), and kwok runs the Pod. Nothing prepares a device (no driver):
this proves admission, claim creation, allocation, binding and clean-up.

``castslice control`` keeps the templates in the GPU namespaces (those labelled
castslice-dra-e2e-gpu=true here). Each process runs as its rendered identity: the webhooks with
knative/components/dra, the controller with components/controller and dra-controller; a webhook
that could not list and watch the templates would never become ready, a controller that could not
write them would never create one. Three webhook configurations share the apiserver, each for the
namespaces labelled for it: ``deny`` (the defaults: a missing template is denied), ``warn``
(``missingTemplate: warn``) and ``shadow`` (``mode: shadow``).
"""

from __future__ import annotations

import collections
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from function.contract import DEFAULT_EXCLUDED_NAMESPACES
from function.core.config import parse_config
from function.core.dra import MANAGED_BY_LABEL, STALE_SINCE_ANNOTATION, templates
from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import DRA_SHARES, GPU_NODE, ControlPlane
from .identity import CONTROL_SA_NAME, SA_NAMESPACE, delete_created, service_account_kubeconfig
from .launch import CASTSLICE, EventLog, ServedController, ServedWebhook, pointed_at, start_event_sink
from .workloads import eventually

pytestmark = pytest.mark.e2e

ROUTE = "castslice-dra-e2e"
"""Namespaces labelled castslice-dra-e2e=<server> reach that server; unlabelled ones none of ours."""
GPU_LABEL = "castslice-dra-e2e-gpu"
"""The GPU namespaces: the controller keeps templates in those labelled castslice-dra-e2e-gpu=true."""
NS = "e2e-dra"
EMPTY_NS = "e2e-dra-empty"  # routed to the deny server; no GPU label, so no templates
EXCLUDED_NS = "e2e-dra-excluded"  # routed to the deny server, which lists it in excludedNamespaces
WARN_NS = "e2e-dra-warn"  # routed to the warn server; labelled a GPU namespace by its test
SHADOW_NS = "e2e-dra-shadow"
GITOPS_NS = "e2e-dra-gitops"  # routed to the deny server; templates applied from castslice dra templates
NAMESPACES = {
    NS: ("deny", True),
    EMPTY_NS: ("deny", False),
    EXCLUDED_NS: ("deny", False),
    WARN_NS: ("warn", False),
    SHADOW_NS: ("shadow", True),
    GITOPS_NS: ("deny", False),
}
SLICING: dict[str, Any] = {
    "backend": "dra",
    "dra": {"namespaceSelector": {"matchLabels": {GPU_LABEL: "true"}}, "staleTemplateSeconds": 2},
}
DRA: dict[str, Any] = {"gpuSlicing": SLICING}
SERVERS: dict[str, dict[str, Any]] = {
    "deny": {**DRA, "excludedNamespaces": [*DEFAULT_EXCLUDED_NAMESPACES, EXCLUDED_NS]},
    "warn": {"gpuSlicing": {**SLICING, "dra": {**SLICING["dra"], "missingTemplate": "warn"}}},
    "shadow": {"gpuSlicing": {**SLICING, "mode": "shadow"}},
}
TEMPLATES = {t.slices: t.name for t in templates(parse_config(DRA).section("gpuSlicing").dra)}
OPTED_IN = {"castops.io/optimize": "true"}
GPU = {"nvidia.com/gpu": "1"}
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims"
TEMPLATES_PATH = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates"


def apply_rendered_templates(plane: ControlPlane, namespace: str) -> None:
    """The templates as a GitOps user applies them: ``castslice dra templates -n NS``."""
    from kubernetes import client

    config = plane.workdir / "castslice-dra-deny.yaml"  # the deny server's (ServedWebhook's name)
    rendered = subprocess.run(
        [CASTSLICE, "dra", "templates", "-n", namespace, "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    with plane.api_client() as api:
        objects = client.CustomObjectsApi(api)
        for template in yaml.safe_load_all(rendered):
            objects.create_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", template
            )


def templates_in(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's templates by name."""
    items = plane.get_json(TEMPLATES_PATH.format(namespace))["items"]
    return {t["metadata"]["name"]: t for t in items}


def has_every_template(plane: ControlPlane, namespace: str, names: set[str]) -> bool:
    return names <= set(templates_in(plane, namespace))


def start_controller(cluster: dict[str, Any], config: dict[str, Any], name: str) -> ServedController:
    plane: ControlPlane = cluster["plane"]
    path = plane.workdir / f"castslice-control-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    controller = ServedController(
        plane, name, path, cluster["sink"], SA_NAMESPACE, kubeconfig=cluster["control_kubeconfig"]
    )
    cluster["controller"] = controller
    eventually(controller.leading, 60, f"controller {name} leading")
    return controller


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    events = EventLog()
    sink_url, sink = start_event_sink(events)
    created: list[dict[str, Any]] = []
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    registration = client.AdmissionregistrationV1Api(api)
    servers: dict[str, ServedWebhook] = {}
    state: dict[str, Any] = {
        "plane": control_plane,
        "api": api,
        "core": core,
        "apps": client.AppsV1Api(api),
        "registration": registration,
        "events": events,
        "sink": sink_url,
        "servers": servers,
    }
    try:
        identities = tmp_path_factory.mktemp("dra-identity")
        state["kubeconfig"] = service_account_kubeconfig(control_plane, identities, created, ("dra",))
        state["control_kubeconfig"] = service_account_kubeconfig(
            control_plane, identities, created, ("controller", "dra-controller"), CONTROL_SA_NAME
        )
        # One after another: a server started from another thread would die with that thread
        # (controlplane.PREEXEC's parent-death signal follows the thread that forked it).
        for name, config in SERVERS.items():
            servers[name] = ServedWebhook(
                control_plane, f"dra-{name}", config, sink_url, kubeconfig=state["kubeconfig"]
            )
        state["webhook"] = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
        ca = control_plane.ca_cert.read_bytes()
        for name, server in servers.items():
            route = {"key": ROUTE, "operator": "In", "values": [name]}
            registration.create_mutating_webhook_configuration(
                pointed_at(state["webhook"], f"e2e-dra-{name}", server.url, ca, route)
            )
        for namespace, (route, gpu) in NAMESPACES.items():
            labels = {ROUTE: route, **({GPU_LABEL: "true"} if gpu else {})}
            control_plane.create_namespace(namespace, labels=labels)
        start_controller(state, DRA, "dra")
        for namespace in (NS, SHADOW_NS):
            eventually(
                lambda namespace=namespace: has_every_template(
                    control_plane, namespace, set(TEMPLATES.values())
                ),
                60,
                f"the controller's templates in {namespace}",
            )
        _wait_webhooks_active(core, servers)
        yield state
    finally:
        if "controller" in state:
            state["controller"].stop()
        for name in SERVERS:
            registration.delete_mutating_webhook_configuration(f"e2e-dra-{name}")
        for server in servers.values():
            server.stop()
        delete_created(control_plane, created)
        sink.shutdown()
        api.close()


def _wait_webhooks_active(core: Any, servers: dict[str, ServedWebhook]) -> None:
    """The apiserver picks up new webhook configurations asynchronously: dry runs in each server's
    namespace until that server has answered one (shadow mode changes nothing to look at)."""
    for name, namespace in (("deny", NS), ("warn", WARN_NS), ("shadow", SHADOW_NS)):
        server, before = servers[name], servers[name].admissions()

        def answered(
            server: ServedWebhook = server, namespace: str = namespace, before: float = before
        ) -> bool:
            core.create_namespaced_pod(namespace, pod("probe", OPTED_IN), dry_run="All")
            return server.admissions() > before

        eventually(answered, 30, f"the {name} webhook to be called")


# -- helpers -----------------------------------------------------------------------------------------
def pod(
    name: str, annotations: dict[str, str] | None = None, limits: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "cuda"}
    container["resources"] = {"limits": dict(GPU if limits is None else limits)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": [container], **spec},
    }


def create(
    cluster: dict[str, Any], namespace: str, manifest: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Create a Pod: (the Pod as stored, the warnings the apiserver passed on)."""
    answer = cluster["core"].create_namespaced_pod(namespace, manifest, _preload_content=False)
    return json.loads(answer.data), answer.headers.get_all("Warning") or []


def stored(cluster: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    plane: ControlPlane = cluster["plane"]
    return plane.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")


def claims(cluster: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    plane: ControlPlane = cluster["plane"]
    items: list[dict[str, Any]] = plane.get_json(CLAIMS.format(namespace))["items"]
    return items


def claim_of(cluster: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """The claim the kube-controller-manager made for the Pod's castslice-gpu, once allocated."""

    def allocated() -> dict[str, Any] | None:
        statuses = stored(cluster, namespace, name).get("status", {}).get("resourceClaimStatuses") or []
        made = {s["name"]: s.get("resourceClaimName") for s in statuses}.get("castslice-gpu")
        if not made:
            return None
        plane: ControlPlane = cluster["plane"]
        claim = plane.get_json(CLAIMS.format(namespace) + "/" + made)
        return claim if claim.get("status", {}).get("allocation") else None

    found: dict[str, Any] = eventually(allocated, 60, f"the allocated claim of {namespace}/{name}")
    return found


def device_of(claim: dict[str, Any]) -> tuple[str, str, dict[str, str]]:
    """(pool, device, consumed capacity) of the claim's one allocated device."""
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return result["pool"], result["device"], result.get("consumedCapacity", {})


def delete_pods(cluster: dict[str, Any], namespace: str, *names: str) -> None:
    """Delete the Pods (those a controller has not deleted already) and wait until they and their
    claims are gone."""
    from kubernetes.client.exceptions import ApiException

    for name in names:
        try:
            cluster["core"].delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise
    plane: ControlPlane = cluster["plane"]
    for name in names:
        eventually(
            lambda name=name: plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")[0] == 404,
            60,
            f"{name} gone",
        )
    owners = set(names)
    eventually(
        lambda: (
            not any(
                ref.get("name") in owners
                for c in claims(cluster, namespace)
                for ref in c["metadata"].get("ownerReferences", [])
            )
        ),
        60,
        "the claims of the deleted Pods to go",
    )


# -- the tests ---------------------------------------------------------------------------------------
def test_a_slice_ratio_4_pod_gets_a_claim_it_owns_allocated_4_shares_and_runs_on_a_gpu_node(
    cluster: dict[str, Any],
) -> None:
    plane: ControlPlane = cluster["plane"]
    created, warnings = create(cluster, NS, pod("ratio-4", {**OPTED_IN, "castops.io/slice-ratio": "4"}))
    assert warnings == []
    assert created["spec"]["resourceClaims"] == [
        {"name": "castslice-gpu", "resourceClaimTemplateName": TEMPLATES[4]}
    ]
    assert created["spec"]["containers"][0]["resources"] == {"claims": [{"name": "castslice-gpu"}]}
    running = plane.wait_for_pod(NS, "ratio-4")
    assert plane.node_kind(running["spec"]["nodeName"]) == GPU_NODE
    claim = claim_of(cluster, NS, "ratio-4")
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner.get("controller")) == (
        "Pod",
        "ratio-4",
        running["metadata"]["uid"],
        True,
    )
    pool, _, consumed = device_of(claim)
    assert consumed == {"shares": "4"}
    assert pool == running["spec"]["nodeName"]
    delete_pods(cluster, NS, "ratio-4")


def test_pods_of_4_shares_pack_two_per_gpu_and_the_ninth_waits_for_a_sibling(cluster: dict[str, Any]) -> None:
    plane: ControlPlane = cluster["plane"]
    gpus = sum(n.dra_gpus for n in plane.nodes)
    fits = gpus * DRA_SHARES // 4
    names = [f"pack-{i}" for i in range(fits)]
    started = time.monotonic()
    for name in names:
        create(cluster, NS, pod(name, {**OPTED_IN, "castops.io/workload-type": "training"}))
    for name in names:
        plane.wait_for_pod(NS, name)
    print(f"\n[dra e2e] {fits} Pods of 4 shares Running on {gpus} GPUs in {time.monotonic() - started:.2f}s")
    placed = collections.Counter(device_of(claim_of(cluster, NS, name))[:2] for name in names)
    assert sorted(placed.values()) == [2] * gpus
    create(cluster, NS, pod("pack-extra", {**OPTED_IN, "castops.io/workload-type": "training"}))
    condition = plane.wait_for_unschedulable(NS, "pack-extra")
    assert "cannot allocate all claims" in condition["message"]
    delete_pods(cluster, NS, names[0])
    plane.wait_for_pod(NS, "pack-extra")
    delete_pods(cluster, NS, *names[1:], "pack-extra")
    assert claims(cluster, NS) == []


def test_a_deployments_replicas_each_get_their_own_claim(cluster: dict[str, Any]) -> None:
    plane: ControlPlane = cluster["plane"]
    template = pod("unused", {**OPTED_IN, "castops.io/workload-type": "inference"})
    template["metadata"] = {"labels": {"app": "fleet"}, "annotations": template["metadata"]["annotations"]}
    cluster["apps"].create_namespaced_deployment(
        NS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "fleet"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "fleet"}},
                "template": {k: template[k] for k in ("metadata", "spec")},
            },
        },
    )

    def both() -> list[Any] | None:
        found = cluster["core"].list_namespaced_pod(NS, label_selector="app=fleet").items
        return found if len(found) == 2 else None

    listed = eventually(both, 60, "the Deployment's 2 Pods")
    names = [p.metadata.name for p in listed]
    made = set()
    for name in names:
        plane.wait_for_pod(NS, name)
        claim = claim_of(cluster, NS, name)
        made.add(claim["metadata"]["name"])
        assert claim["metadata"]["ownerReferences"][0]["name"] == name
        assert device_of(claim)[2] == {"shares": "2"}
        assert (
            stored(cluster, NS, name)["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            == TEMPLATES[2]
        )
    assert len(made) == 2
    cluster["apps"].delete_namespaced_deployment("fleet", NS)
    delete_pods(cluster, NS, *names)


def test_a_native_sidecar_and_the_app_share_one_claim(cluster: dict[str, Any]) -> None:
    plane: ControlPlane = cluster["plane"]
    sidecar = {
        "name": "proxy",
        "image": "envoy",
        "restartPolicy": "Always",
        "resources": {"limits": dict(GPU)},
    }
    created, _ = create(cluster, NS, pod("with-sidecar", OPTED_IN, initContainers=[sidecar]))
    assert len(created["spec"]["resourceClaims"]) == 1
    assert created["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "castslice-gpu"}]}
    assert created["spec"]["containers"][0]["resources"] == {"claims": [{"name": "castslice-gpu"}]}
    plane.wait_for_pod(NS, "with-sidecar")
    assert device_of(claim_of(cluster, NS, "with-sidecar"))[2] == {"shares": "1"}
    assert len(claims(cluster, NS)) == 1
    delete_pods(cluster, NS, "with-sidecar")


def test_the_pods_own_claims_are_kept(cluster: dict[str, Any]) -> None:
    from kubernetes import client

    plane: ControlPlane = cluster["plane"]
    own = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-share"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "capacity": {"requests": {"shares": "1"}},
                            },
                        }
                    ]
                }
            }
        },
    }
    client.CustomObjectsApi(cluster["api"]).create_namespaced_custom_object(
        "resource.k8s.io", "v1", NS, "resourceclaimtemplates", own
    )
    manifest = pod(
        "own-claim",
        {**OPTED_IN, "castops.io/slice-ratio": "3"},
        resourceClaims=[{"name": "mine", "resourceClaimTemplateName": "one-share"}],
    )
    manifest["spec"]["containers"][0]["resources"]["claims"] = [{"name": "mine"}]
    created, _ = create(cluster, NS, manifest)
    assert created["spec"]["resourceClaims"] == [
        {"name": "mine", "resourceClaimTemplateName": "one-share"},
        {"name": "castslice-gpu", "resourceClaimTemplateName": TEMPLATES[3]},
    ]
    assert created["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "mine"},
        {"name": "castslice-gpu"},
    ]
    plane.wait_for_pod(NS, "own-claim")
    assert device_of(claim_of(cluster, NS, "own-claim"))[2] == {"shares": "3"}
    assert len(claims(cluster, NS)) == 2
    delete_pods(cluster, NS, "own-claim")


def test_a_slice_count_above_one_gpu_is_denied_with_the_range(cluster: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as denied:
        create(cluster, NS, pod("too-many", {**OPTED_IN, "castops.io/slice-ratio": "12"}))
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert (
        'annotation castops.io/slice-ratio: "12" is not valid; accepted: a whole number from 1 to 8'
        in message
    )
    assert "one gpu.nvidia.com device holds 8 slices" in message


def test_a_missing_template_is_denied_naming_it(cluster: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as denied:
        create(cluster, EMPTY_NS, pod("no-template", {**OPTED_IN, "castops.io/slice-ratio": "2"}))
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert f"ResourceClaimTemplate {TEMPLATES[2]} (2 slices) is missing in namespace {EMPTY_NS}" in message


def test_with_warn_a_pod_whose_template_is_missing_waits_and_runs_once_the_controller_makes_it(
    cluster: dict[str, Any],
) -> None:
    plane: ControlPlane = cluster["plane"]
    created, warnings = create(cluster, WARN_NS, pod("waits", {**OPTED_IN, "castops.io/slice-ratio": "2"}))
    assert created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == TEMPLATES[2]
    assert any(f"ResourceClaimTemplate {TEMPLATES[2]} missing" in w for w in warnings), warnings
    time.sleep(2)
    assert stored(cluster, WARN_NS, "waits")["status"].get("phase") == "Pending"
    # It becomes a GPU namespace: the controller makes its templates, the Pod's claim follows.
    cluster["core"].patch_namespace(WARN_NS, {"metadata": {"labels": {GPU_LABEL: "true"}}})
    started = time.monotonic()
    plane.wait_for_pod(WARN_NS, "waits")
    took = time.monotonic() - started
    print(f"\n[dra e2e] Pending Pod Running {took:.2f}s after its namespace became a GPU one")
    delete_pods(cluster, WARN_NS, "waits")


def test_the_controller_gives_a_new_gpu_namespace_its_templates_and_recreates_a_deleted_one(
    cluster: dict[str, Any],
) -> None:
    from kubernetes import client

    plane: ControlPlane = cluster["plane"]
    started = time.monotonic()
    plane.create_namespace("e2e-dra-new", labels={GPU_LABEL: "true"})
    eventually(lambda: has_every_template(plane, "e2e-dra-new", set(TEMPLATES.values())), 60, "8 templates")
    took = time.monotonic() - started
    print(f"\n[dra e2e] a new GPU namespace had its 8 templates {took:.2f}s after it was created")
    made = templates_in(plane, "e2e-dra-new")
    assert set(made) == set(TEMPLATES.values())
    assert all(t["metadata"]["labels"][MANAGED_BY_LABEL] == "castslice" for t in made.values())
    # One deleted by hand comes back (a new object: the spec is the same, so the name is).
    client.CustomObjectsApi(cluster["api"]).delete_namespaced_custom_object(
        "resource.k8s.io", "v1", "e2e-dra-new", "resourceclaimtemplates", TEMPLATES[4]
    )

    def recreated() -> bool:
        again = templates_in(plane, "e2e-dra-new").get(TEMPLATES[4])
        return again is not None and again["metadata"]["uid"] != made[TEMPLATES[4]]["metadata"]["uid"]

    eventually(recreated, 60, "the deleted template recreated")
    # Not a GPU namespace: none.
    assert templates_in(plane, EMPTY_NS) == {}


def test_templates_applied_through_gitops_serve_pods_and_the_controller_leaves_them_alone(
    cluster: dict[str, Any],
) -> None:
    plane: ControlPlane = cluster["plane"]
    apply_rendered_templates(plane, GITOPS_NS)
    versions = {name: t["metadata"]["resourceVersion"] for name, t in templates_in(plane, GITOPS_NS).items()}
    assert set(versions) == set(TEMPLATES.values())
    create(cluster, GITOPS_NS, pod("gitops", {**OPTED_IN, "castops.io/slice-ratio": "2"}))
    plane.wait_for_pod(GITOPS_NS, "gitops")
    delete_pods(cluster, GITOPS_NS, "gitops")
    # Even once it is a GPU namespace, the controller finds them present and writes nothing.
    cluster["core"].patch_namespace(GITOPS_NS, {"metadata": {"labels": {GPU_LABEL: "true"}}})
    time.sleep(3)
    after = templates_in(plane, GITOPS_NS)
    assert {name: t["metadata"]["resourceVersion"] for name, t in after.items()} == versions
    assert all(MANAGED_BY_LABEL not in t["metadata"]["labels"] for t in after.values())


def test_a_dry_run_creates_no_claim_and_no_event(cluster: dict[str, Any]) -> None:
    events: EventLog = cluster["events"]
    dry = cluster["core"].create_namespaced_pod(NS, pod("dry", OPTED_IN), dry_run="All")
    assert dry.spec.resource_claims[0].resource_claim_template_name == TEMPLATES[1]
    create(cluster, NS, pod("wet", OPTED_IN))  # its event proves the sender works: no mere delay
    eventually(lambda: f"namespaces/{NS}/pods/wet" in events.subjects(), 15, "the wet Pod's event")
    assert f"namespaces/{NS}/pods/dry" not in events.subjects()
    claim_of(cluster, NS, "wet")
    owners = {ref["name"] for c in claims(cluster, NS) for ref in c["metadata"].get("ownerReferences", [])}
    assert owners == {"wet"}
    delete_pods(cluster, NS, "wet")


@pytest.mark.parametrize(
    ("namespace", "name", "annotations", "limits"),
    [
        (NS, "not-opted-in", {"castops.io/optimize": "True"}, GPU),
        (NS, "zero-gpus", OPTED_IN, {"nvidia.com/gpu": "0"}),
        (EXCLUDED_NS, "excluded", OPTED_IN, GPU),
        ("kube-system", "system", OPTED_IN, GPU),
        (SHADOW_NS, "shadowed", OPTED_IN, GPU),
    ],
)
def test_pods_where_slicing_does_not_apply_are_stored_unchanged(
    cluster: dict[str, Any], namespace: str, name: str, annotations: dict[str, str], limits: dict[str, str]
) -> None:
    created, _ = create(cluster, namespace, pod(name, annotations, limits))
    try:
        assert "resourceClaims" not in created["spec"]
        assert created["spec"]["containers"][0]["resources"] == {"limits": limits, "requests": limits}
    finally:
        cluster["core"].delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def test_shadow_mode_records_the_claim_it_would_have_added(cluster: dict[str, Any]) -> None:
    events: EventLog = cluster["events"]
    create(cluster, SHADOW_NS, pod("shadow-event", OPTED_IN))
    subject = f"namespaces/{SHADOW_NS}/pods/shadow-event"
    eventually(lambda: subject in events.subjects(), 15, "the shadow decision's event")
    event = next(e for e in events.events if e["headers"].get("ce-subject") == subject)
    (decided,) = json.loads(event["body"])["mutators"]
    assert decided["shadow"] is True
    assert decided["action"] == "mutated"
    assert f"claim castslice-gpu from ResourceClaimTemplate {TEMPLATES[1]}" in decided["reason"]
    cluster["core"].delete_namespaced_pod("shadow-event", SHADOW_NS, grace_period_seconds=0)


def test_zz_a_configuration_change_replaces_the_templates_without_disturbing_running_pods(
    cluster: dict[str, Any],
) -> None:
    """Last: the controller and the deny webhook move to a configuration whose templates carry a
    driver configuration (new specs, so new names), as a rollout of a changed ConfigMap does."""
    plane: ControlPlane = cluster["plane"]
    create(cluster, NS, pod("steady", {**OPTED_IN, "castops.io/slice-ratio": "2"}))
    before = plane.wait_for_pod(NS, "steady")
    claim = claim_of(cluster, NS, "steady")

    changed_slicing = {
        **SLICING,
        "dra": {
            **SLICING["dra"],
            "config": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "TimeSlicing"}}},
        },
    }
    changed = {"gpuSlicing": changed_slicing}
    new_names = {t.slices: t.name for t in templates(parse_config(changed).section("gpuSlicing").dra)}
    assert not set(new_names.values()) & set(TEMPLATES.values())
    cluster["controller"].stop()
    start_controller(cluster, changed, "dra-changed")
    eventually(lambda: has_every_template(plane, NS, set(new_names.values())), 60, "the new templates")
    # The old ones: marked stale, then gone after staleTemplateSeconds (2 s here).
    eventually(
        lambda: not set(TEMPLATES.values()) & set(templates_in(plane, NS)), 60, "the old templates gone"
    )
    # ... and the user's own template (test_the_pods_own_claims_are_kept) untouched.
    assert set(templates_in(plane, NS)) == {*new_names.values(), "one-share"}
    assert all(
        STALE_SINCE_ANNOTATION not in (t["metadata"].get("annotations") or {})
        for t in templates_in(plane, NS).values()
    )

    # The running Pod: same node, same claim, same allocation.
    now = stored(cluster, NS, "steady")
    assert now["status"]["phase"] == "Running"
    assert now["spec"]["nodeName"] == before["spec"]["nodeName"]
    assert claim_of(cluster, NS, "steady")["metadata"]["uid"] == claim["metadata"]["uid"]
    assert claim_of(cluster, NS, "steady")["status"]["allocation"] == claim["status"]["allocation"]

    # The deny webhook rolls to the new configuration: new Pods get the new templates.
    servers: dict[str, ServedWebhook] = cluster["servers"]
    servers["deny"].stop()
    servers["deny"] = ServedWebhook(
        plane,
        "dra-deny-changed",
        {**changed, "excludedNamespaces": SERVERS["deny"]["excludedNamespaces"]},
        cluster["sink"],
        kubeconfig=cluster["kubeconfig"],
    )
    route = {"key": ROUTE, "operator": "In", "values": ["deny"]}
    registration = cluster["registration"]
    moved = pointed_at(
        cluster["webhook"], "e2e-dra-deny", servers["deny"].url, plane.ca_cert.read_bytes(), route
    )
    version = registration.read_mutating_webhook_configuration("e2e-dra-deny").metadata.resource_version
    moved["metadata"]["resourceVersion"] = version
    registration.replace_mutating_webhook_configuration("e2e-dra-deny", moved)

    def new_name_given() -> bool:
        dry = cluster["core"].create_namespaced_pod(NS, pod("probe", OPTED_IN), dry_run="All")
        return (
            bool(dry.spec.resource_claims)
            and dry.spec.resource_claims[0].resource_claim_template_name == new_names[1]
        )

    eventually(new_name_given, 30, "the deny webhook on the new configuration")
    created, _ = create(cluster, NS, pod("after", {**OPTED_IN, "castops.io/slice-ratio": "2"}))
    assert created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == new_names[2]
    plane.wait_for_pod(NS, "after")
    (config,) = claim_of(cluster, NS, "after")["status"]["allocation"]["devices"]["config"]
    assert config["opaque"]["parameters"] == {"sharing": {"strategy": "TimeSlicing"}}
    delete_pods(cluster, NS, "steady", "after")
