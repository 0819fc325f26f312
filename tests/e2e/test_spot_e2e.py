"""Spot placement on a real control plane: kube-apiserver, kube-controller-manager (ReplicaSets and
DaemonSets make the Pods), kube-scheduler and kwok's fake fleet (CAST AI spot Nodes: label
``scheduling.cast.ai/spot: "true"`` and a NoSchedule taint on that key; see controlplane.py).

The webhook is ``castslice serve`` (TLS on loopback) registered with the project's own
MutatingWebhookConfiguration (knative/base, rendered), and its cluster view runs as the webhook's
ServiceAccount with the RBAC the manifests render (the deployment overlay plus the cluster-view
component): a kubeconfig holding only a token of that ServiceAccount, never admin.

Servers, each behind its own webhook configuration, routed by a namespace label: ``one`` (one
serving process), ``two`` (two single-worker servers, each with its own view and ledger, behind a
per-connection round-robin proxy: one address, as a Service in front of two Pods), ``workers``
(one server with WORKERS=2; the kernel hands connections to either worker) and ``shadow`` (the
spot mutator in shadow mode). The burst deviations are
printed (``-s``) and kept as test properties (``--junitxml``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import ON_DEMAND, SPOT_KEY, ControlPlane
from .identity import delete_created, service_account_kubeconfig
from .launch import EventLog, ServedWebhook, TwoBehindOne, pointed_at, start_event_sink
from .workloads import (
    PLACEMENT,
    assert_on_their_nodes,
    deployment,
    eventually,
    live_pods,
    placements,
    remove,
    scale,
    wait_running,
)

pytestmark = pytest.mark.e2e

ROUTE = "castslice-e2e-spot"
"""Namespace label naming the server that handles the namespace (one, two, shadow)."""
SPOT_TOLERATION = {"key": SPOT_KEY, "operator": "Exists"}
FORCED_NAMESPACE = "spot-forced"
TIER = "castslice-e2e-tier"
"""Namespace label a namespaceSelector term forces on-demand by (the view watches Namespaces)."""
CRITICAL_NAMESPACE = "spot-critical"

SPOT_CONFIG: dict[str, Any] = {
    "gpuSlicing": {"enabled": False},
    "spot": {
        "enabled": True,
        "spotPercentageOfReplicaSet": 40,
        "forcePodsToOnDemand": [
            {"namespaces": [FORCED_NAMESPACE]},
            {"namespaceSelector": {"matchLabels": {TIER: "critical"}}},
        ],
    },
}


# -- the servers ------------------------------------------------------------------------------------
def webhook_configuration(server: ServedWebhook | TwoBehindOne, ca: bytes) -> dict[str, Any]:
    """The project's own webhook manifest, pointed at ``server``, for namespaces routed to it."""
    rendered = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
    route = {"key": ROUTE, "operator": "In", "values": [server.name]}
    return pointed_at(rendered, f"e2e-spot-{server.name}", server.url, ca, route)


@pytest.fixture(scope="module")
def spot(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    created: list[dict[str, Any]] = []
    # A namespaceSelector term (SPOT_CONFIG) makes the view watch Namespaces: the component a user
    # adds for it (README, "Spot placement"). Without it no server would become ready.
    kubeconfig = service_account_kubeconfig(
        control_plane, tmp_path_factory.mktemp("spot-rbac"), created, ("cluster-view-namespaces",)
    )
    events = EventLog()
    sink_url, sink = start_event_sink(events)

    def served(name: str, config: dict[str, Any] = SPOT_CONFIG, workers: int = 1) -> ServedWebhook:
        return ServedWebhook(control_plane, name, config, sink_url, kubeconfig=kubeconfig, workers=workers)

    servers = {
        "one": served("one"),
        "two": TwoBehindOne("two", [served("two-a"), served("two-b")]),
        "workers": served("workers", workers=2),
        "shadow": served(
            "shadow",
            {
                **SPOT_CONFIG,
                "spot": {**SPOT_CONFIG["spot"], "mode": "shadow", "spotPercentageOfReplicaSet": 0},
            },
        ),
    }
    api = control_plane.api_client()
    registration = client.AdmissionregistrationV1Api(api)
    ca = control_plane.ca_cert.read_bytes()
    for server in servers.values():
        registration.create_mutating_webhook_configuration(webhook_configuration(server, ca))
    namespaces = {
        "spot-one": "one",
        "spot-two": "two",
        "spot-workers": "workers",
        FORCED_NAMESPACE: "one",
        "spot-shadow": "shadow",
    }
    for namespace, route in namespaces.items():
        control_plane.create_namespace(namespace, labels={ROUTE: route})
    control_plane.create_namespace(CRITICAL_NAMESPACE, labels={ROUTE: "one", TIER: "critical"})
    core = client.CoreV1Api(api)
    _wait_active(core)
    try:
        yield {
            "plane": control_plane,
            "core": core,
            "apps": client.AppsV1Api(api),
            "events": events,
            "servers": servers,
        }
    finally:
        for server in servers.values():
            registration.delete_mutating_webhook_configuration(f"e2e-spot-{server.name}")
        for namespace in (*namespaces, CRITICAL_NAMESPACE):
            core.delete_namespace(namespace)
        for server in servers.values():
            server.stop()
        sink.shutdown()
        api.close()
        delete_created(control_plane, created)


def _wait_active(core: Any) -> None:
    """The apiserver picks up webhook configurations asynchronously: probe with dry runs."""

    def active() -> bool:
        probe = deployment_pod_probe()
        created = core.create_namespaced_pod("spot-one", probe, dry_run="All")
        return bool((created.metadata.labels or {}).get(PLACEMENT))

    eventually(active, 30, "the spot webhook to be called")


def deployment_pod_probe() -> dict[str, Any]:
    """A Pod as a ReplicaSet would create it (a controller reference to a made-up ReplicaSet)."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "probe", "uid": str(uuid.uuid4())}
    return {
        "metadata": {"generateName": "probe-", "ownerReferences": [{**owner, "controller": True}]},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


# -- the tests --------------------------------------------------------------------------------------
def test_partial_spot_scaled_one_replica_at_a_time_ends_at_4_spot_and_6_on_demand(
    spot: dict[str, Any],
) -> None:
    spot["apps"].create_namespaced_deployment("spot-one", deployment("steady", 0))
    for replicas in range(1, 11):
        scale(spot, "spot-one", "steady", replicas)
        pods = wait_running(spot, "spot-one", "steady", replicas)
        # at every step spot stays at or below floor(n x 40 / 100)
        assert placements(pods).count("spot") <= replicas * 40 // 100, (replicas, placements(pods))
    got = placements(pods)
    assert got.count("spot") == 4 and got.count("on-demand") == 6, got
    assert_on_their_nodes(spot["plane"], pods)
    costs = {p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] for p in pods}
    assert costs == {"-100", "100"}
    # The serving process's own view (not the ledger) holds the Pods: its watches run in the worker.
    server: ServedWebhook = spot["servers"]["one"]
    eventually(lambda: server.view_objects("pods") >= 10, 30, "the worker's view to hold the 10 Pods")
    remove(spot, "spot-one", "steady")


@pytest.mark.parametrize("server", ["one", "two", "workers"])
def test_partial_spot_burst_from_0_to_20_reports_its_deviation(
    spot: dict[str, Any], server: str, record_property: Callable[[str, object], None]
) -> None:
    """CASTSLICE_E2E_SPOT_BURSTS rounds (default 1), each a new Deployment created at 20 replicas."""
    namespace = f"spot-{server}"
    deviations = []
    for round_number in range(int(os.environ.get("CASTSLICE_E2E_SPOT_BURSTS", "1"))):
        name = f"burst-{server}-{round_number}"
        spot["apps"].create_namespaced_deployment(namespace, deployment(name, 20))
        pods = wait_running(spot, namespace, name, 20)
        got = placements(pods)
        assert got.count("spot") + got.count("on-demand") == 20
        assert_on_their_nodes(spot["plane"], pods)
        deviations.append(got.count("spot") - 20 * 40 // 100)
        remove(spot, namespace, name)
        eventually(lambda name=name: not live_pods(spot, namespace, name), 120, f"{name} gone")
    record_property(f"burst_spot_deviations_{server}", ",".join(f"{d:+d}" for d in deviations))
    by_worker = spot["servers"][server].admissions_by_worker()
    record_property(f"admissions_by_worker_{server}", by_worker)
    print(
        f"\n[spot e2e] 0->20 at once, {server} serving process(es), {len(deviations)} rounds: "
        f"spot - 8 = {', '.join(f'{d:+d}' for d in deviations)}; admissions per worker seen: {by_worker}"
    )
    if server == "one":
        # One process decides one review at a time with its own recent decisions: exact.
        assert set(deviations) == {0}, deviations


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        (FORCED_NAMESPACE, "forced"),  # by name
        # By labels: they come from the view's Namespaces watch, on the rendered RBAC.
        (CRITICAL_NAMESPACE, "critical"),
    ],
    ids=["by-name", "by-labels"],
)
def test_force_on_demand_by_namespace(spot: dict[str, Any], namespace: str, name: str) -> None:
    spot["apps"].create_namespaced_deployment(namespace, deployment(name, 3))
    pods = wait_running(spot, namespace, name, 3)
    assert placements(pods) == ["on-demand"] * 3
    assert all(SPOT_TOLERATION not in (p["spec"].get("tolerations") or []) for p in pods)
    assert_on_their_nodes(spot["plane"], pods)
    remove(spot, namespace, name)


def test_lifecycle_override_on_the_template(spot: dict[str, Any]) -> None:
    spot["apps"].create_namespaced_deployment(
        "spot-one", deployment("all-spot", 3, {"scheduling.cast.ai/lifecycle": "spot"})
    )
    pods = wait_running(spot, "spot-one", "all-spot", 3)
    assert placements(pods) == ["spot"] * 3  # 40 % would give 1
    assert_on_their_nodes(spot["plane"], pods)
    remove(spot, "spot-one", "all-spot")


def test_daemonset_pods_get_the_spot_toleration_only(
    spot: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    plane: ControlPlane = spot["plane"]
    manifest = deployment("agent", 0)
    manifest.update(kind="DaemonSet")
    manifest["spec"].pop("replicas")
    spot["apps"].create_namespaced_daemon_set("spot-one", manifest)
    desired = 0

    def counted() -> bool:
        nonlocal desired
        status = spot["apps"].read_namespaced_daemon_set_status("agent", "spot-one").status
        desired = status.desired_number_scheduled or 0
        return (status.observed_generation or 0) >= 1 and desired > 0

    eventually(counted, 60, "the DaemonSet controller to count its Nodes")
    pods = wait_running(spot, "spot-one", "agent", desired)
    for p in pods:
        assert SPOT_TOLERATION in p["spec"]["tolerations"]
        assert SPOT_KEY not in (p["spec"].get("nodeSelector") or {})
        assert PLACEMENT not in p["metadata"].get("labels", {})
    kinds = sorted(str(plane.node_kind(p["spec"]["nodeName"])) for p in pods)
    # The DaemonSet controller picks its Nodes by the *template's* tolerations, before admission:
    # the toleration the webhook adds cannot make it create Pods for tainted spot Nodes.
    record_property("daemonset_node_kinds", ",".join(kinds))
    print(f"\n[spot e2e] DaemonSet Pods on: {kinds} (fleet: {len(plane.nodes)} Nodes)")
    assert ON_DEMAND in kinds
    spot["apps"].delete_namespaced_daemon_set("agent", "spot-one")


def test_a_bare_pod_is_untouched(spot: dict[str, Any]) -> None:
    manifest = {
        "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "terminationGracePeriodSeconds": 0},
    }
    spot["core"].create_namespaced_pod("spot-one", manifest)
    stored = json.loads(spot["core"].read_namespaced_pod("bare", "spot-one", _preload_content=False).data)
    assert PLACEMENT not in (stored["metadata"].get("labels") or {})
    assert SPOT_TOLERATION not in stored["spec"].get("tolerations", [])
    assert SPOT_KEY not in (stored["spec"].get("nodeSelector") or {})
    spot["core"].delete_namespaced_pod("bare", "spot-one", grace_period_seconds=0)


def test_shadow_mode_sends_no_patch_but_audits_the_decision(spot: dict[str, Any]) -> None:
    events: EventLog = spot["events"]
    spot["apps"].create_namespaced_deployment("spot-shadow", deployment("shadowed", 2))
    pods = wait_running(spot, "spot-shadow", "shadowed", 2)
    for p in pods:
        assert PLACEMENT not in p["metadata"].get("labels", {})
        assert SPOT_TOLERATION not in (p["spec"].get("tolerations") or [])
        assert_on_their_nodes(spot["plane"], [p])

    def shadow_decisions() -> list[dict[str, Any]]:
        with events.lock:
            bodies = [
                e["body"] for e in events.events if e["headers"].get("ce-podnamespace") == "spot-shadow"
            ]
        decided = []
        for body in bodies:
            for decision in json.loads(body).get("mutators", []):
                if decision["mutator"] == "spot" and decision.get("shadow"):
                    decided.append(decision)
        return decided

    eventually(lambda: len(shadow_decisions()) >= 2, 30, "two shadow spot decisions in the audit trail")
    for decision in shadow_decisions()[:2]:
        assert decision["action"] == "mutated" and decision["reason"].startswith("spot: rule defaultToSpot")
    remove(spot, "spot-shadow", "shadowed")
