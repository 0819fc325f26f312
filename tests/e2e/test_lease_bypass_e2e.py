"""No way around a GPU lease, tried as a hostile tenant would (issue 34): a user holding the
built-in ``edit`` role in its namespaces (a client certificate; RoleBindings as a platform team
writes them), against the project's manifests on the control plane: the GpuLease CRD, the
admission policies of components/gpu-leases (the witness, the stamp, the required-namespace and
the template policies), two serving processes behind one address running as the webhook's
ServiceAccount, and two controllers running as theirs.

Namespaces: ``bypass-req`` is labelled ``castops.io/gpu-leases: required`` (what the platform
sets; ``edit`` cannot), ``bypass-down`` too but its webhook calls a closed port (a webhook that is
down), ``bypass-open`` has a lease and no label. For the whole module a sampler lists the Pods of
the lease-required namespaces every 0.5 s and records any moment at which the GPUs bound to nodes of
a model (or charged to one lease) exceed what the namespace's leases of that model (that lease)
hold; the module ends by asserting there was none. Each numbered way of the issue (but 7, large
reviews) has its test; the figures (rounds, counts, samples) are printed at the end of the run.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import ControlPlane, FakeNode, node_manifest
from .identity import CONTROL_SA_NAME, SA_NAMESPACE, delete_created, service_account_kubeconfig
from .launch import (
    EventLog,
    ServedController,
    ServedWebhook,
    TwoBehindOne,
    pointed_at,
    start_event_sink,
)
from .support import delete_crd, kubectl
from .workloads import eventually, stamp

pytestmark = pytest.mark.e2e

COMPONENT = KNATIVE_DIR / "components" / "gpu-leases"
GROUP, VERSION, PLURAL = "castops.io", "v1alpha1", "gpuleases"
MODEL_LABEL = "nvidia.com/gpu.product"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
TAINT = "castslice.test/bypass"
ROUTE = "castslice-e2e-bypass"
REQ, DOWN, OPEN = "bypass-req", "bypass-down", "bypass-open"
REQUIRED = {"castops.io/gpu-leases": "required"}
TENANT = "tenant-a"
NODES = (
    *(
        FakeNode(
            f"bypass-h100-{n}",
            "gpu-h100",
            {MODEL_LABEL: H100},
            ({"key": TAINT, "effect": "NoSchedule"},),
            {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
        )
        for n in (1, 2)
    ),
    *(
        FakeNode(
            f"bypass-a100-{n}",
            "gpu-a100",
            {MODEL_LABEL: A100},
            ({"key": TAINT, "effect": "NoSchedule"},),
            {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
        )
        for n in (1, 2)
    ),
)
WEBHOOK_CONFIG: dict[str, Any] = {
    # Opted-in Pods get a claim from gpuSlicing's templates (none is created here: the Pod stays
    # Pending, and is charged all the same).
    "gpuSlicing": {"enabled": True, "backend": "dra", "dra": {"missingTemplate": "warn"}},
    "gpuLeases": {"enabled": True, "memoryMiBByModel": {H100: 81920, A100: 40960}},
}
CONTROL_CONFIG: dict[str, Any] = {"gpuSlicing": {"enabled": False}, "gpuLeases": {"enabled": True}}
FAST_ELECTION = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")
LONG_NAME = ".".join(["h100-reserved-for-the-long-running-training-of-team-a-" + str(n) for n in range(4)])
STAMP_KEYS = ("castops.io/gpu-lease", "castops.io/gpu-lease-state")
STAMP_ANNOTATIONS = ("castops.io/gpu-lease-charge", "castops.io/gpu-lease-decision")


def gpu_pod(name: str, gpus: Any = 1, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    limits = spec.pop("limits", {"nvidia.com/gpu": str(gpus)})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.example/train:1", "resources": {"limits": limits}}
            ],
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }


def model_in(*models: str) -> dict[str, Any]:
    return {"key": MODEL_LABEL, "operator": "In", "values": list(models)}


# -- the GPUs that run, sampled ------------------------------------------------------------------
class Sampler:
    """Every 0.5 s: per lease-required namespace, the GPUs (``nvidia.com/gpu``) of Pods bound to a
    node and not finished, by the node's model and by the lease their stamp names, against the
    namespace's leases (in any phase: a lease being released holds its Pods until they are gone)."""

    def __init__(self, plane: ControlPlane, namespaces: tuple[str, ...]) -> None:
        from kubernetes import client

        self.api = plane.api_client()
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self.namespaces = namespaces
        self.samples = 0
        self.beyond: list[str] = []
        self.failed: list[str] = []
        self.peak: dict[str, int] = {}
        self.models = {node.name: node.labels[MODEL_LABEL] for node in NODES}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from kubernetes.client import ApiException
        from urllib3.exceptions import HTTPError

        while not self._stop.wait(0.5):
            try:
                self.sample()
            except (ApiException, HTTPError, OSError) as error:
                self.failed.append(repr(error)[:300])

    def sample(self) -> None:
        for namespace in self.namespaces:
            leases = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            by_model: dict[str, int] = {}
            by_lease: dict[str, int] = {}
            for lease in leases:
                count = int(str(lease["spec"]["count"]))
                by_model[lease["spec"]["gpuModel"]] = by_model.get(lease["spec"]["gpuModel"], 0) + count
                by_lease[lease["metadata"]["name"]] = count
            running: dict[str, int] = {}
            charged: dict[str, int] = {}
            for pod in self.core.list_namespaced_pod(namespace).items:
                if not pod.spec.node_name or pod.status.phase in ("Succeeded", "Failed"):
                    continue
                gpus = sum(
                    int((c.resources.limits or {}).get("nvidia.com/gpu", "0")) for c in pod.spec.containers
                )
                model = self.models.get(pod.spec.node_name, "?")
                running[model] = running.get(model, 0) + gpus
                lease = (pod.metadata.labels or {}).get("castops.io/gpu-lease", "")
                charged[lease] = charged.get(lease, 0) + gpus
            self.samples += 1
            for model, gpus in running.items():
                self.peak[f"{namespace}/{model}"] = max(self.peak.get(f"{namespace}/{model}", 0), gpus)
                if gpus > by_model.get(model, 0):
                    self.beyond.append(
                        f"{namespace}: {gpus} {model} GPUs run, leases hold {by_model.get(model, 0)}"
                    )
            for lease, gpus in charged.items():
                hold = next((c for name, c in by_lease.items() if _label(name) == lease), 0)
                if gpus > hold:
                    self.beyond.append(f"{namespace}: {gpus} GPUs run charged to {lease!r}, it holds {hold}")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.api.close()


def _label(name: str) -> str:
    from function.core.leases import lease_label

    return lease_label(name)


# -- the cluster -------------------------------------------------------------------------------------
def tenant_client(plane: ControlPlane) -> Any:
    """An ApiClient for the user ``tenant-a`` (a client certificate of the cluster's CA)."""
    from kubernetes import client

    cert = plane.issue_cert("tenant-a", TENANT, client=True, server=False)
    cfg = client.Configuration()
    cfg.host = plane.host
    cfg.ssl_ca_cert = str(plane.ca_cert)
    cfg.cert_file, cfg.key_file = str(cert.cert), str(cert.key)
    return client.ApiClient(cfg)


def policies() -> list[dict[str, Any]]:
    """The component's admission policies, the controller's account as components/settings writes it."""
    found = [o for o in render(COMPONENT) if "AdmissionPolicy" in o["kind"]]
    text = yaml.safe_dump_all(found).replace("set-by-components-settings", SA_NAMESPACE)
    return [o for o in yaml.safe_load_all(text) if o]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def create_lease(
    state: dict[str, Any], namespace: str, name: str, model: str, count: int, **spec: Any
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuLease",
        "metadata": {"name": name},
        "spec": {"gpuModel": model, "count": count, **spec},
    }
    state["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    settle(state)


def lease_status(state: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    found = state["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return found.get("status") or {}


def settle(state: dict[str, Any]) -> None:
    """Until both serving processes' views hold every lease and every charged Pod the apiserver
    has (a Deny lease is exact across two processes only for what both have seen: that race is
    the burst's, measured apart)."""
    custom, core = state["custom"], state["core"]

    def same() -> bool:
        leases = len(custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"])
        pods = len(
            core.list_pod_for_all_namespaces(
                label_selector="castops.io/gpu-lease",
                field_selector="status.phase!=Succeeded,status.phase!=Failed",
            ).items
        )
        return all(
            s.view_objects("gpuleases") == leases and s.view_objects("gpu-lease-pods") == pods
            for s in state["servers"].servers
        )

    eventually(same, 30, "both serving processes' views caught up")


def refusal(create: Callable[[], Any]) -> str:
    """The message of a refused creation (403 from a webhook or a policy; 422 from a policy)."""
    from kubernetes.client import ApiException

    try:
        create()
    except ApiException as error:
        assert error.status in (403, 422), error.body
        return str(json.loads(error.body).get("message", error.body))
    raise AssertionError("created")


def says_why_and_what_to_do(message: str, *facts: str) -> None:
    assert "remedy" in message, message
    for fact in facts:
        assert fact in message, (fact, message)


@pytest.fixture(scope="module")
def bypass(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from kubernetes import client
    from kubernetes.client import ApiException

    plane = control_plane
    api = plane.api_client()
    core, extensions = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    registration = client.AdmissionregistrationV1Api(api)
    for node in NODES:
        core.create_node(node_manifest(node))
    crd = one(render(COMPONENT), "CustomResourceDefinition")

    def crd_created() -> bool:
        try:
            extensions.create_custom_resource_definition(crd)
        except ApiException as error:
            if error.status == 409:  # another module's, still being deleted
                return False
            raise
        return True

    eventually(crd_created, 60, "the GpuLease CRD created")
    eventually(lambda: plane.get(f"/apis/{GROUP}/{VERSION}/{PLURAL}")[0] == 200, what="GpuLeases served")
    directory = tmp_path_factory.mktemp("bypass")
    created: list[dict[str, Any]] = []
    components = ("gpu-leases", "dra", "controller")
    webhook_kubeconfig = service_account_kubeconfig(plane, directory, created, components)
    control_kubeconfig = service_account_kubeconfig(plane, directory, created, components, CONTROL_SA_NAME)
    applied = yaml.safe_dump_all(policies())
    result = kubectl(plane, "apply", "-f", "-", stdin=applied)
    assert result.returncode == 0, result.stderr
    events = EventLog()
    sink_url, sink = start_event_sink(events)
    servers = TwoBehindOne(
        "bypass",
        [
            ServedWebhook(plane, f"bypass-{n}", WEBHOOK_CONFIG, sink_url, kubeconfig=webhook_kubeconfig)
            for n in "ab"
        ],
    )
    ca = plane.ca_cert.read_bytes()
    base = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
    hooks = {
        "e2e-bypass": (servers.url, "up"),
        "e2e-bypass-down": (f"https://127.0.0.1:{closed_port()}", "down"),
    }
    for name, (url, route) in hooks.items():
        registration.create_mutating_webhook_configuration(
            pointed_at(base, name, url, ca, {"key": ROUTE, "operator": "In", "values": [route]})
        )
    for namespace, route, labels in ((REQ, "up", REQUIRED), (DOWN, "down", REQUIRED), (OPEN, "up", {})):
        plane.create_namespace(namespace, labels={ROUTE: route, **labels})
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "tenant-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}],
            },
        )
    config_path = directory / "castslice-control.yaml"
    config_path.write_text(yaml.safe_dump(CONTROL_CONFIG))
    controllers = [
        ServedController(
            plane,
            f"bypass-{n}",
            config_path,
            sink_url,
            SA_NAMESPACE,
            kubeconfig=control_kubeconfig,
            extra=FAST_ELECTION,
        )
        for n in "ab"
    ]
    eventually(lambda: any(c.leading() for c in controllers), 60, "a controller leading")
    tenant_api = tenant_client(plane)
    state: dict[str, Any] = {
        "plane": plane,
        "core": core,
        "apps": client.AppsV1Api(api),
        "custom": client.CustomObjectsApi(api),
        "tenant": client.CoreV1Api(tenant_api),
        "tenant_apps": client.AppsV1Api(tenant_api),
        "tenant_custom": client.CustomObjectsApi(tenant_api),
        "servers": servers,
        "controllers": controllers,
        "events": events,
    }
    _wait_in_force(state)
    state["sampler"] = Sampler(plane, (REQ, DOWN))
    try:
        yield state
    finally:
        state["sampler"].stop()
        for controller in controllers:
            controller.stop()
        for name in hooks:
            registration.delete_mutating_webhook_configuration(name)
        kubectl(plane, "delete", "--wait=true", "-f", "-", stdin=applied)
        servers.stop()
        sink.shutdown()
        custom = state["custom"]
        for namespace in (REQ, DOWN, OPEN):
            for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
                custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    item["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )
            core.delete_namespace(namespace)
        for node in NODES:
            core.delete_node(node.name)
        delete_crd(api, crd["metadata"]["name"])
        delete_created(plane, created)
        tenant_api.close()
        api.close()


def _wait_in_force(state: dict[str, Any]) -> None:
    """Webhook configurations and policies are picked up asynchronously: until a dry run shows
    each in force (the webhook charging, the witness marking, the required policy refusing)."""
    tenant = state["tenant"]
    create_lease(state, REQ, "probe", H100, 1, podSelector={"matchLabels": {"probe": "yes"}})

    def charged() -> bool:
        pod = gpu_pod("probe", labels={"probe": "yes"})
        made = tenant.create_namespaced_pod(REQ, pod, dry_run="All")
        return "castops.io/gpu-lease" in (made.metadata.labels or {})

    eventually(charged, 60, "the webhook charging")

    def refused(namespace: str, pod: dict[str, Any], word: str) -> bool:
        from kubernetes.client import ApiException

        try:
            tenant.create_namespaced_pod(namespace, pod, dry_run="All")
        except ApiException as error:
            return word in str(error.body)
        return False

    forged = gpu_pod("forged", labels={"castops.io/gpu-lease": "probe"})
    eventually(lambda: refused(OPEN, forged, "ForgedStamp"), 60, "the witness and the forged policy")
    eventually(lambda: refused(DOWN, gpu_pod("down"), "NotCharged"), 60, "the required policy")


# -- 1. deleting or expiring a lease closes the namespace ------------------------------------------
def deployment(name: str, replicas: int, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    template = gpu_pod("x", labels={"app": name, **labels}, **spec)
    template["metadata"] = {"labels": {"app": name, **labels}}
    del template["apiVersion"], template["kind"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def failed_creates(state: dict[str, Any], namespace: str, after: float) -> list[str]:
    """The ReplicaSet controller's FailedCreate messages (it says why the apiserver refused)."""
    events = state["core"].list_namespaced_event(namespace, field_selector="reason=FailedCreate").items
    return [
        e.message
        for e in events
        if (e.last_timestamp or e.event_time or datetime.now(UTC)).timestamp() >= after - 1
    ]


def live_pods(state: dict[str, Any], namespace: str, app: str) -> list[Any]:
    pods = state["core"].list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


@pytest.mark.parametrize("how", ["deleted", "expired"])
def test_1_the_last_lease_deleted_or_expired_closes_the_namespace_to_recreated_pods(
    bypass: dict[str, Any], how: str, record_property: Callable[[str, object], None]
) -> None:
    name = f"doomed-{how}"
    window = {"end": stamp(datetime.now(UTC) + timedelta(seconds=15))} if how == "expired" else {}
    create_lease(
        bypass, REQ, name, A100, 2, podSelector={"matchLabels": {"lease": name}},
        onExpiry={"action": "Evict", "gracePeriodSeconds": 1}, **({"window": window} if window else {}),
    )  # fmt: skip
    bypass["tenant_apps"].create_namespaced_deployment(REQ, deployment(name, 2, {"lease": name}))
    eventually(
        lambda: len([p for p in live_pods(bypass, REQ, name) if p.spec.node_name]) == 2, 60, "2 Pods bound"
    )
    began = time.time()
    if how == "deleted":
        bypass["custom"].delete_namespaced_custom_object(GROUP, VERSION, REQ, PLURAL, name)
    eventually(lambda: not live_pods(bypass, REQ, name), 60, "the lease's Pods evicted")
    messages = eventually(lambda: failed_creates(bypass, REQ, began), 30, "the ReplicaSet refused")
    time.sleep(3)  # the ReplicaSet keeps trying, with backoff: none of its Pods is stored
    assert not live_pods(bypass, REQ, name)
    word = "NoMatchingLease" if how == "deleted" else "LeaseExpired"
    assert any(word in m or "LeaseExpired" in m for m in messages), messages
    says_why_and_what_to_do(next(m for m in messages if "castslice" in m))
    record_property("refusals", len(messages))
    bypass["apps"].delete_namespaced_deployment(name, REQ)


# -- 2. a forged stamp erases no charge ----------------------------------------------------------
def test_2_a_forged_stamp_is_refused_and_the_count_never_drops_in_10_rounds(
    bypass: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    create_lease(bypass, REQ, "a100", A100, 6, podSelector={"matchLabels": {"team": "t"}})
    create_lease(bypass, OPEN, "open", A100, 4, podSelector={"matchLabels": {"team": "t"}})
    tenant = bypass["tenant"]
    tenant.create_namespaced_pod(REQ, gpu_pod("real", labels={"team": "t"}, nodeSelector={MODEL_LABEL: A100}))
    tenant.create_namespaced_pod(
        OPEN, gpu_pod("real", labels={"team": "t"}, nodeSelector={MODEL_LABEL: A100})
    )
    eventually(lambda: lease_status(bypass, REQ, "a100").get("used") == "1", 30, "the charge in status")
    settle(bypass)

    def count(namespace: str, lease: str) -> tuple[str, int]:
        pods = (
            bypass["core"]
            .list_namespaced_pod(namespace, label_selector=f"castops.io/gpu-lease={lease}")
            .items
        )
        return lease_status(bypass, namespace, lease).get("used", ""), len(pods)

    before = {REQ: count(REQ, "a100"), OPEN: count(OPEN, "open")}
    rounds = []
    for round_number in range(10):
        messages = []
        for namespace in (REQ, OPEN):
            real = tenant.read_namespaced_pod("real", namespace)  # what `kubectl get pod -o yaml` shows
            labels = {k: v for k, v in real.metadata.labels.items()}
            annotations = {k: v for k, v in real.metadata.annotations.items() if k.startswith("castops.io/")}
            for opt_out in (True, False):
                copy = gpu_pod(
                    f"copy-{round_number}-{int(opt_out)}",
                    labels={**labels, **({"castops.io/webhook": "ignore"} if opt_out else {})},
                    annotations=annotations,
                    nodeSelector={MODEL_LABEL: A100},
                )
                messages.append(refusal(lambda c=copy, n=namespace: tenant.create_namespaced_pod(n, c)))
        time.sleep(0.5)
        after = {REQ: count(REQ, "a100"), OPEN: count(OPEN, "open")}
        rounds.append(after)
        assert after == before, (round_number, before, after)
        for message in messages:
            says_why_and_what_to_do(message)
    record_property("count per round (used, pods)", rounds[-1])
    print(f"\nforged-stamp rounds: 10, count before {before}, after every round {set(map(str, rounds))}")


# -- 3. the opt-out label, and a webhook that is down ----------------------------------------------
def test_3_the_opt_out_and_a_webhook_that_is_down_let_no_gpu_pod_through(
    bypass: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    tenant = bypass["tenant"]
    opted_out = gpu_pod("opted-out", 8, labels={"team": "t", "castops.io/webhook": "ignore"})
    says_why_and_what_to_do(
        refusal(lambda: tenant.create_namespaced_pod(REQ, opted_out)), "OptOutRefused", "castops.io/webhook"
    )
    # bypass-down's webhook calls a closed port (failurePolicy Ignore, as shipped): for 5 s, every
    # GPU Pod is refused by the apiserver itself, whatever it asks for; a Pod without GPUs runs.
    refused, began = 0, time.monotonic()
    kinds = (
        {},
        {"limits": {"nvidia.com/gpu-shared": "2"}},
        {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
        {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}},
        {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "castslice-gpu-1-abcdef12"}]},
    )
    while time.monotonic() - began < 5:
        spec = kinds[refused % len(kinds)]
        pod = gpu_pod(f"down-{refused}", **spec)
        message = refusal(lambda p=pod: tenant.create_namespaced_pod(DOWN, p))
        says_why_and_what_to_do(message, "NotCharged", "castops.io/gpu-leases=required")
        refused += 1
    plain = gpu_pod("no-gpu", limits={"cpu": "100m"})
    tenant.create_namespaced_pod(DOWN, plain)
    assert not [p for p in bypass["core"].list_namespaced_pod(DOWN).items if p.metadata.name != "no-gpu"]
    record_property("GPU Pods tried with the webhook down, all refused", refused)
    print(f"\nwebhook down for 5 s: {refused} GPU Pods tried, 0 admitted")


# -- 4. charged to one model, scheduled on another ------------------------------------------------
def node_model(state: dict[str, Any], name: str) -> str:
    pod = state["plane"].wait_for_pod(REQ, name, timeout=60)
    return next(n.labels[MODEL_LABEL] for n in NODES if n.name == pod["spec"]["nodeName"])


def test_4_a_pod_runs_on_the_model_of_its_lease_whatever_its_affinity(bypass: dict[str, Any]) -> None:
    create_lease(bypass, REQ, "h100", H100, 4, podSelector={"matchLabels": {"team": "t"}})
    tenant = bypass["tenant"]
    team = {"team": "t"}
    # [In H100, A100] AND [In A100]: A100 only (it was charged to H100 and ran on A100).
    both = affinity([model_in(H100, A100), model_in(A100)])
    tenant.create_namespaced_pod(REQ, gpu_pod("intersection", labels=team, affinity=both))
    # [In H100, A100], naming the H100 lease: pinned to H100.
    either = affinity([model_in(H100, A100)])
    tenant.create_namespaced_pod(
        REQ, gpu_pod("pinned", labels=team, affinity=either, annotations={"castops.io/gpu-lease": "h100"})
    )
    # Two terms, H100 or A100, choosing by itself: on its lease's model, whichever it is.
    tenant.create_namespaced_pod(
        REQ, gpu_pod("terms", labels=team, affinity=affinity([model_in(H100)], [model_in(A100)]))
    )
    for name in ("intersection", "pinned", "terms"):
        pod = bypass["core"].read_namespaced_pod(name, REQ)
        lease = pod.metadata.labels["castops.io/gpu-lease"]
        model = {"a100": A100, "h100": H100}[lease]
        assert node_model(bypass, name) == model, name
    assert (
        bypass["core"].read_namespaced_pod("intersection", REQ).metadata.labels["castops.io/gpu-lease"]
        == "a100"
    )
    settle(bypass)
    message = refusal(lambda: tenant.create_namespaced_pod(REQ, gpu_pod("anywhere", labels=team)))
    says_why_and_what_to_do(message, "AmbiguousModel")
    message = refusal(
        lambda: tenant.create_namespaced_pod(
            REQ,
            gpu_pod(
                "elsewhere",
                labels=team,
                affinity=affinity([{"key": MODEL_LABEL, "operator": "NotIn", "values": [H100, A100]}]),
            ),
        )
    )
    says_why_and_what_to_do(message, "NoMatchingLease", "any model but")


# -- 5. any lease name -----------------------------------------------------------------------------
def test_5_a_lease_named_with_253_characters_charges_counts_and_refuses(bypass: dict[str, Any]) -> None:
    assert len(LONG_NAME) > 200
    create_lease(bypass, REQ, LONG_NAME, H100, 1, podSelector={"matchLabels": {"lease": "long"}})
    tenant = bypass["tenant"]
    pod = tenant.create_namespaced_pod(REQ, gpu_pod("long-1", labels={"lease": "long"}))
    assert pod.metadata.labels["castops.io/gpu-lease"] == _label(LONG_NAME)
    assert node_model(bypass, "long-1") == H100
    eventually(
        lambda: lease_status(bypass, REQ, LONG_NAME).get("used") == "1", 30, "the controller counting it"
    )
    settle(bypass)
    message = refusal(lambda: tenant.create_namespaced_pod(REQ, gpu_pod("long-2", labels={"lease": "long"})))
    says_why_and_what_to_do(message, "LeaseExhausted", "1 of 1 GPU in use")


# -- 6. GPUs through DRA ---------------------------------------------------------------------------
def test_6_claims_are_charged_when_castslice_made_them_and_refused_naming_them_otherwise(
    bypass: dict[str, Any],
) -> None:
    from kubernetes import client

    tenant = bypass["tenant"]
    resource = client.ResourceV1Api(bypass["tenant"].api_client)

    def template(name: str, count: int = 8) -> dict[str, Any]:
        request = {
            "name": "gpu",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count},
        }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }

    # The tenant may write templates (edit), but not one named as gpuSlicing's.
    says_why_and_what_to_do(
        refusal(
            lambda: resource.create_namespaced_resource_claim_template(
                REQ, template("castslice-gpu-4-abcdef12")
            )
        ),
        "castslice-gpu-4-abcdef12",
    )
    resource.create_namespaced_resource_claim_template(REQ, template("eight-gpus"))
    mine = gpu_pod(
        "my-claim",
        labels={"team": "t"},
        limits={"cpu": "1"},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "eight-gpus"}],
    )
    says_why_and_what_to_do(
        refusal(lambda: tenant.create_namespaced_pod(REQ, mine)),
        "UnknownClaim",
        "gpu (ResourceClaimTemplate eight-gpus)",
    )
    shared = {
        **mine,
        "spec": {**mine["spec"], "resourceClaims": [{"name": "gpu", "resourceClaimName": "team-claim"}]},
    }
    says_why_and_what_to_do(
        refusal(lambda: tenant.create_namespaced_pod(REQ, shared)), "gpu (ResourceClaim team-claim)"
    )
    # gpuSlicing's own dra backend: half a GPU of the Pod's model, charged as such.
    sliced = gpu_pod(
        "sliced",
        labels={"team": "t"},
        nodeSelector={MODEL_LABEL: H100},
        annotations={"castops.io/optimize": "true", "castops.io/slice-ratio": "4"},
    )
    made = tenant.create_namespaced_pod(REQ, sliced)
    assert made.spec.resource_claims and made.spec.resource_claims[0].resource_claim_template_name.startswith(
        "castslice-gpu-4-"
    )
    assert made.metadata.annotations["castops.io/gpu-lease-charge"] == "500m"
    settle(bypass)


# -- 8. charges that match what the Pod gets ---------------------------------------------------------
def test_8_vgpu_shares_are_charged_as_hami_allocates_and_a_huge_quantity_is_an_answer(
    bypass: dict[str, Any],
) -> None:
    tenant = bypass["tenant"]
    team = {"team": "t"}
    cores = tenant.create_namespaced_pod(
        REQ,
        gpu_pod(
            "cores-only",
            labels=team,
            nodeSelector={MODEL_LABEL: A100},
            limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1"},
        ),
    )
    assert cores.metadata.annotations["castops.io/gpu-lease-charge"] == "1000m"  # the whole memory
    memory = tenant.create_namespaced_pod(
        REQ,
        gpu_pod(
            "memory",
            labels=team,
            annotations={"castops.io/gpu-lease": "a100"},
            limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"},
        ),
    )
    assert memory.metadata.annotations["castops.io/gpu-lease-charge"] == "500m"  # half an A100
    assert memory.spec.node_selector == {MODEL_LABEL: A100}
    settle(bypass)
    huge = gpu_pod("huge", labels=team, nodeSelector={MODEL_LABEL: A100}, limits={"nvidia.com/gpu": "1e400"})
    says_why_and_what_to_do(refusal(lambda: tenant.create_namespaced_pod(REQ, huge)), "ExceedsLease")


# -- bursts against two serving processes ---------------------------------------------------------
BURST = 50


def burst_rounds(
    state: dict[str, Any], namespace: str, name: str, rounds: int, queue: bool
) -> list[dict[str, int]]:
    """A Deployment of one-GPU Pods scaled 0 -> 50 against a lease of 8, ``rounds`` times."""
    apps, core = state["tenant_apps"], state["core"]
    apps.create_namespaced_deployment(namespace, deployment(name, 0, {}, nodeSelector={MODEL_LABEL: H100}))
    found = []
    for _ in range(rounds):
        apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": BURST}})

        def pods() -> list[Any]:
            return live_pods(state, namespace, name)

        def started() -> int:
            return sum(1 for p in pods() if not p.spec.scheduling_gates)

        if queue:
            eventually(lambda: len(pods()) == BURST, 60, "every Pod admitted, gated")
            eventually(lambda: started() >= 8, 30, "the controller starting 8")
            peak = 0
            for _ in range(10):  # and never more, while the controller keeps reconciling
                peak = max(peak, started())
                time.sleep(0.2)
            found.append({"admitted": len(pods()), "started": peak, "over": max(peak - 8, 0)})
        else:

            def tried() -> bool:
                sets = apps.list_namespaced_replica_set(namespace, label_selector=f"app={name}").items
                return any((rs.status.replicas or 0) >= BURST or (rs.status.conditions or []) for rs in sets)

            eventually(tried, 60, "the ReplicaSet tried all 50")
            time.sleep(2.0)  # the ReplicaSet retries refused Pods with backoff: let it try again
            admitted = sum(
                1 for p in pods() if (p.metadata.labels or {}).get("castops.io/gpu-lease-state") == "charged"
            )
            found.append({"admitted": admitted, "over": max(admitted - 8, 0)})
        apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}})
        eventually(
            lambda: not core.list_namespaced_pod(namespace, label_selector=f"app={name}").items, 60, "gone"
        )
        settle(state)
    apps.delete_namespaced_deployment(name, namespace)
    return found


def test_a_burst_of_50_against_two_serving_processes_stays_within_the_bound(
    bypass: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    create_lease(bypass, OPEN, "burst", H100, 8, podSelector={"matchLabels": {"app": "burst"}})
    rounds = burst_rounds(bypass, OPEN, "burst", 3, queue=False)
    for number, found in enumerate(rounds, 1):
        record_property(f"Deny round {number}", found)
    print(f"\nDeny, lease of 8, bursts of {BURST}: {rounds}")
    assert all(found["over"] <= (2 - 1) * 8 for found in rounds)  # (R - 1) x count, R = 2


def test_a_burst_of_50_in_queue_mode_is_never_over(
    bypass: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    create_lease(
        bypass, REQ, "burst-q", H100, 8, enforcement="Queue", podSelector={"matchLabels": {"app": "burst-q"}}
    )
    rounds = burst_rounds(bypass, REQ, "burst-q", 2, queue=True)
    for number, found in enumerate(rounds, 1):
        record_property(f"Queue round {number}", found)
    print(f"\nQueue, lease of 8, bursts of {BURST}: {rounds}")
    assert [found["over"] for found in rounds] == [0] * len(rounds)


# -- the whole module: 0 GPUs beyond the leases, sampled ----------------------------------------------
def test_no_gpu_ran_beyond_the_leases_of_a_lease_required_namespace_at_any_sample(
    bypass: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    sampler = bypass["sampler"]
    record_property("samples", sampler.samples)
    record_property("peak GPUs bound per namespace and model", sampler.peak)
    print(f"\nsampled every 0.5 s: {sampler.samples} samples, peaks {sampler.peak}, beyond: {sampler.beyond}")
    assert sampler.samples >= 100
    assert not sampler.beyond
    assert len(sampler.failed) <= sampler.samples // 20, sampler.failed[:5]
