"""The cluster view against a real kube-apiserver, with the webhook's own ServiceAccount.

The ServiceAccount, ClusterRole and ClusterRoleBinding come from the rendered manifests (an overlay
plus knative/components/cluster-view, as a user deploys them); the webhook gets a token for that
ServiceAccount from the TokenRequest API and a kubeconfig holding only that token, so it runs with
exactly the granted permissions, never as admin. Then: the watches sync, /readyz goes ready, Pods
created and deleted show in the view, a forced 410 and an apiserver restart both end with the
view equal to the apiserver's state, and answering reviews makes no API request.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from function.core.config import parse_config
from function.core.engine import Engine
from function.core.mutators.base import MutatorResult, RequestContext
from function.core.view import PODS, REPLICASETS, ClusterView
from function.kube.client import KubeClient, kube_client
from function.kube.watch import ClusterWatcher, Response
from function.serve.app import build_webhook
from function.serve.http_api import WebhookHttp

from .controlplane import ControlPlane
from .identity import SA_NAME, SA_NAMESPACE, create, rendered_rbac, token_kubeconfig
from .support import restart_apiserver

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "view-e2e"


def eventually(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Gate:
    """Wraps the real transport: counts requests, and can hold watch requests back."""

    def __init__(self, inner: KubeClient) -> None:
        self.inner = inner
        self.open = threading.Event()
        self.open.set()
        self.requests: list[tuple[str, str]] = []

    def get(self, path: str, query: Mapping[str, str], accept: str, read_timeout: float) -> Response:
        verb = "watch" if "watch" in query else "list"
        if verb == "watch":
            self.open.wait(120)
        self.requests.append((verb, path))
        return self.inner.get(path, query, accept, read_timeout)

    def interrupt(self, response: Response) -> None:
        self.inner.interrupt(response)


@pytest.fixture(scope="module")
def kubeconfig(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A kubeconfig holding only a token of the webhook's ServiceAccount (no client certificate).
    The ServiceAccount and its RBAC are deleted afterwards: later tests dry-run-create the shipped
    manifests, which would meet them as AlreadyExists."""
    from kubernetes import client

    rbac = rendered_rbac(tmp_path_factory.mktemp("rbac"))
    with control_plane.api_client() as api:
        for obj in rbac:
            create(api, obj)
        eventually(
            lambda: (
                control_plane.get(f"/api/v1/namespaces/{SA_NAMESPACE}/serviceaccounts/{SA_NAME}")[0] == 200
            )
        )
        create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        control_plane.wait_for_service_account(NAMESPACE)
    path = token_kubeconfig(
        control_plane, SA_NAMESPACE, SA_NAME, tmp_path_factory.mktemp("kubeconfig") / "castslice.kubeconfig"
    )
    yield path
    with control_plane.api_client() as api:
        core, rbac_api = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.delete_namespaced_service_account(SA_NAME, SA_NAMESPACE)
        for obj in rbac:
            if obj["kind"] == "ClusterRoleBinding":
                rbac_api.delete_cluster_role_binding(obj["metadata"]["name"])
            elif obj["kind"] == "ClusterRole":
                rbac_api.delete_cluster_role(obj["metadata"]["name"])


def pod_manifest(name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": {"castops.io/placement": "spot"},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "c", "image": "registry.invalid/none"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def delete_pod(control_plane: ControlPlane, name: str) -> None:
    from kubernetes import client

    with control_plane.api_client() as api:
        client.CoreV1Api(api).delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def create_pod(control_plane: ControlPlane, manifest: dict[str, Any]) -> str:
    from kubernetes import client

    with control_plane.api_client() as api:
        created = client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, manifest)
    return str(created.metadata.uid)


def live_pod_uids(control_plane: ControlPlane) -> set[str]:
    """What the apiserver holds (admin), to compare the view with."""
    pods = control_plane.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    return {
        p["metadata"]["uid"] for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    }


def view_pod_uids(view: ClusterView) -> set[str]:
    return {uid for uid, record in view.index("pods").items() if record.namespace == NAMESPACE}


def relists(watcher: ClusterWatcher) -> float:
    text = watcher.metrics_text().decode()
    line = next(x for x in text.splitlines() if x.startswith('castslice_view_relists_total{index="pods"}'))
    return float(line.split()[-1])


@pytest.fixture
def gated_webhook(kubeconfig: Path) -> Iterator[tuple[WebhookHttp, Gate]]:
    gate = Gate(kube_client({"KUBECONFIG": str(kubeconfig)}))
    webhook = build_webhook(
        parse_config({}), {}, transport=gate, watches=(PODS, REPLICASETS), freeze_gc=False
    )
    try:
        yield webhook, gate
    finally:
        webhook.watcher.stop()


def test_the_service_account_may_list_and_watch_and_nothing_more(
    control_plane: ControlPlane, kubeconfig: Path
) -> None:
    transport = kube_client({"KUBECONFIG": str(kubeconfig)})

    def status(path: str, query: Mapping[str, str]) -> int:
        response = transport.get(path, query, "application/json", 10)
        response.read()
        response.release_conn()
        return response.status

    assert status("/api/v1/pods", {"limit": "1"}) == 200
    assert status("/apis/apps/v1/replicasets", {"limit": "1"}) == 200
    assert status("/api/v1/secrets", {"limit": "1"}) == 403  # not admin
    assert status("/api/v1/namespaces/default/pods/anything", {}) == 403  # no get
    assert status("/apis/apps/v1/deployments", {"limit": "1"}) == 403


def test_watches_sync_readyz_and_pods_come_and_go(
    control_plane: ControlPlane, gated_webhook: tuple[WebhookHttp, Gate]
) -> None:
    webhook, _ = gated_webhook
    watcher = webhook.watcher
    assert isinstance(watcher, ClusterWatcher)
    eventually(lambda: webhook.handle("GET", "/readyz", None).status == 200, what="/readyz")
    assert watcher.synced()
    # Pods were requested as metadata only (PartialObjectMetadata), as the Accept header asked.
    uid = create_pod(control_plane, pod_manifest(f"solo-{uuid.uuid4().hex[:6]}"))
    eventually(lambda: uid in webhook.admission.cluster().index("pods"), what="the new Pod in the view")
    record = webhook.admission.cluster().index("pods")[uid]
    assert (record.namespace, record.placement, record.terminating) == (NAMESPACE, "spot", False)
    delete_pod(control_plane, record.name)
    eventually(lambda: uid not in webhook.admission.cluster().index("pods"), what="the deleted Pod gone")
    metrics = webhook.handle("GET", "/metrics", None).body.decode()
    assert 'castslice_view_synced{index="pods"} 1.0' in metrics
    assert 'castslice_view_synced{index="replicasets"} 1.0' in metrics


def test_a_deployment_s_pods_group_under_its_replicaset(
    control_plane: ControlPlane, gated_webhook: tuple[WebhookHttp, Gate]
) -> None:
    from kubernetes import client

    webhook, _ = gated_webhook
    assert webhook.watcher.wait_synced(30)
    name = f"web-{uuid.uuid4().hex[:6]}"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "c", "image": "registry.invalid/none"}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }
    with control_plane.api_client() as api:
        client.AppsV1Api(api).create_namespaced_deployment(NAMESPACE, deployment)
    try:

        def replicaset() -> Any:
            found = [
                r for r in webhook.admission.cluster().index("replicasets").values() if r.owner.name == name
            ]
            return found[0] if found else None

        eventually(lambda: replicaset() is not None, what="the Deployment's ReplicaSet in the view")
        rs = replicaset()
        assert (rs.owner.kind, rs.replicas, rs.namespace) == ("Deployment", 3, NAMESPACE)
        eventually(
            lambda: len(webhook.admission.cluster().group("pods", rs.uid)) == 3, what="3 Pods under the RS"
        )
        assert {p.owner.kind for p in webhook.admission.cluster().group("pods", rs.uid).values()} == {
            "ReplicaSet"
        }
    finally:
        with control_plane.api_client() as api:
            client.AppsV1Api(api).delete_namespaced_deployment(
                name, NAMESPACE, propagation_policy="Foreground"
            )


def test_a_410_relists_and_the_view_ends_equal_to_the_apiserver(
    control_plane: ControlPlane, gated_webhook: tuple[WebhookHttp, Gate]
) -> None:
    webhook, gate = gated_webhook
    watcher = webhook.watcher
    assert watcher.wait_synced(30)
    eventually(lambda: "pods" in watcher._open, what="the Pod watch open")
    gone = create_pod(control_plane, pod_manifest(f"gone-{uuid.uuid4().hex[:6]}"))
    eventually(lambda: gone in webhook.admission.cluster().index("pods"))
    before = relists(watcher)
    # Hold the watch back and break it; change the cluster meanwhile; restart the apiserver, whose
    # new watch cache starts after the view's resourceVersion: resuming is answered 410 Gone
    # ("too old resource version"), and the view must list again.
    gate.open.clear()
    watcher.transport.interrupt(watcher._open["pods"])
    delete_pod(control_plane, webhook.admission.cluster().index("pods")[gone].name)
    new = create_pod(control_plane, pod_manifest(f"new-{uuid.uuid4().hex[:6]}"))
    restart_apiserver(control_plane)
    assert gone in webhook.admission.cluster().index("pods")  # the view could not know yet
    gate.open.set()
    eventually(lambda: relists(watcher) == before + 1, what="a relist after 410")
    eventually(
        lambda: view_pod_uids(webhook.admission.cluster()) == live_pod_uids(control_plane), what="equal"
    )
    view = webhook.admission.cluster().index("pods")
    assert new in view and gone not in view
    assert webhook.handle("GET", "/readyz", None).status == 200  # stayed ready throughout


class CountingProbe:
    name = "probe"

    def __init__(self) -> None:
        self.calls = 0

    def mutate(self, pod: dict[str, Any], ctx: RequestContext) -> MutatorResult:
        self.calls += 1
        assert ctx.cluster.synced("pods")
        return MutatorResult.unchanged(f"{len(ctx.cluster.index('pods'))} pods in view")


def test_reviews_make_no_api_request(
    control_plane: ControlPlane, gated_webhook: tuple[WebhookHttp, Gate]
) -> None:
    webhook, gate = gated_webhook
    assert webhook.watcher.wait_synced(30)
    eventually(lambda: len(webhook.watcher._open) == 2, what="both watches open")
    probe = CountingProbe()
    webhook.admission.engine = Engine(parse_config({}), mutators=[probe], shadow=[])
    review = json.loads(
        (ROOT / "tests" / "data" / "admission-reviews" / "default-slice-inference.json").read_text()
    )
    asked = len(gate.requests)
    for _ in range(50):
        assert webhook.handle("POST", "/mutate", json.dumps(review).encode()).status == 200
    assert probe.calls >= 50
    assert len(gate.requests) == asked


def test_an_apiserver_restart_is_survived(
    control_plane: ControlPlane, gated_webhook: tuple[WebhookHttp, Gate]
) -> None:
    webhook, gate = gated_webhook
    watcher = webhook.watcher
    assert watcher.wait_synced(30)
    eventually(lambda: "pods" in watcher._open, what="the Pod watch open")
    lists_before = sum(1 for verb, path in gate.requests if verb == "list" and path == "/api/v1/pods")
    relists_before = relists(watcher)
    restart_apiserver(control_plane)
    # The watch resumes (from its resourceVersion, or by a relist on 410 if the new watch cache
    # starts later); either way a Pod created after the restart reaches the view.
    after = create_pod(control_plane, pod_manifest(f"after-{uuid.uuid4().hex[:6]}"))
    eventually(
        lambda: after in webhook.admission.cluster().index("pods"), timeout=60, what="a Pod after restart"
    )
    eventually(
        lambda: view_pod_uids(webhook.admission.cluster()) == live_pod_uids(control_plane), what="equal"
    )
    watches = [verb for verb, path in gate.requests if verb == "watch" and path == "/api/v1/pods"]
    assert len(watches) >= 2
    lists_after = sum(1 for verb, path in gate.requests if verb == "list" and path == "/api/v1/pods")
    # Every list after the first is a relist, and counted as one.
    assert lists_after - lists_before == relists(watcher) - relists_before
    assert webhook.handle("GET", "/readyz", None).status == 200
