"""A burst under a PodMutation's distribution, on the real control plane: a Deployment created at
20 replicas in a namespace a PodMutation sends half to spot (``spotConfig.distributionPercentage:
50``), the ReplicaSet controller creating the Pods as fast as it does (batches of 1, 2, 4, 8, 5),
each decided before the watch shows the earlier ones. Two servers, each behind its own webhook
configuration routed by a namespace label: ``one`` serving process, and ``two`` single-worker
processes (each its own view and ledger) behind one address, as a Service in front of two Pods.

Rounds: ``CASTSLICE_E2E_PODMUTATION_BURSTS`` (default 2; the figures in the docs come from 10).
Each round is printed (``-s``) and kept as a test property (``--junitxml``). One process must hit
the target, 10 spot Pods, exactly; two must come within one Pod of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import ControlPlane
from .launch import EventLog, ServedWebhook, TwoBehindOne, pointed_at, start_event_sink
from .workloads import (
    PLACEMENT,
    assert_on_their_nodes,
    deployment,
    eventually,
    live_pods,
    placements,
    remove,
    wait_running,
)

pytestmark = pytest.mark.e2e

ROUTE = "castslice-e2e-podmutation-burst"
"""Namespace label naming the server that handles the namespace (one, two)."""
MARK = "castops.io/pod-mutation"
REPLICAS, PERCENTAGE = 20, 50
TARGET = REPLICAS * PERCENTAGE // 100
CONFIG: dict[str, Any] = {"gpuSlicing": {"enabled": False}, "podMutations": {"enabled": True}}
NAMESPACES = {"burst-one": "one", "burst-two": "two"}
HALF_ON_SPOT = {
    "apiVersion": "castops.io/v1alpha1",
    "kind": "PodMutation",
    "metadata": {"name": "half-on-spot"},
    "spec": {
        "filter": {"workload": {"namespaces": sorted(NAMESPACES)}},
        "spotConfig": {"mode": "only-spot", "distributionPercentage": PERCENTAGE},
    },
}


def _probe() -> dict[str, Any]:
    """A Pod as a ReplicaSet creates it (a controller reference to a made-up ReplicaSet)."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "probe", "uid": "probe-uid"}
    return {
        "metadata": {"generateName": "probe-", "ownerReferences": [{**owner, "controller": True}]},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def _marked(core: Any, namespace: str) -> bool:
    raw = core.create_namespaced_pod(namespace, _probe(), dry_run="All", _preload_content=False)
    return MARK in (json.loads(raw.data)["metadata"].get("annotations") or {})


@pytest.fixture(scope="module")
def bursts(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    plane = control_plane
    api = plane.api_client()
    extensions = client.ApiextensionsV1Api(api)
    crd = one(render(KNATIVE_DIR / "components" / "pod-mutations"), "CustomResourceDefinition")
    extensions.create_custom_resource_definition(crd)

    def established() -> bool:
        found = extensions.read_custom_resource_definition(crd["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in found.status.conditions or [])

    eventually(established, 30, "the PodMutation CRD established")
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object("castops.io", "v1alpha1", "podmutations", HALF_ON_SPOT)
    events = EventLog()
    sink_url, sink = start_event_sink(events)
    servers: dict[str, ServedWebhook | TwoBehindOne] = {}
    registration = client.AdmissionregistrationV1Api(api)
    core = client.CoreV1Api(api)
    try:
        servers["one"] = ServedWebhook(plane, "pm-burst-one", CONFIG, sink_url, kubeconfig=plane.kubeconfig)
        servers["two"] = TwoBehindOne(
            "pm-burst-two",
            [
                ServedWebhook(plane, f"pm-burst-two-{n}", CONFIG, sink_url, kubeconfig=plane.kubeconfig)
                for n in ("a", "b")
            ],
        )
        rendered = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
        ca = plane.ca_cert.read_bytes()
        for route, server in servers.items():
            name = f"e2e-podmutation-burst-{route}"
            selector = {"key": ROUTE, "operator": "In", "values": [route]}
            registration.create_mutating_webhook_configuration(
                pointed_at(rendered, name, server.url, ca, selector)
            )
        for namespace, route in NAMESPACES.items():
            plane.create_namespace(namespace, labels={ROUTE: route})
        # The apiserver picks webhook configurations up asynchronously, each server's view the
        # PodMutation too: several marked dry runs in a row reach both servers behind the proxy.
        for namespace in NAMESPACES:
            for _ in range(4):
                eventually(lambda namespace=namespace: _marked(core, namespace), 60, f"{namespace} mutated")
        yield {"plane": plane, "core": core, "apps": client.AppsV1Api(api), "servers": servers}
    finally:
        for route in servers:
            registration.delete_mutating_webhook_configuration(f"e2e-podmutation-burst-{route}")
        for namespace in NAMESPACES:
            core.delete_namespace(namespace)
        for server in servers.values():
            server.stop()
        sink.shutdown()
        custom.delete_cluster_custom_object("castops.io", "v1alpha1", "podmutations", "half-on-spot")
        extensions.delete_custom_resource_definition(crd["metadata"]["name"])
        api.close()


def logs(server: ServedWebhook | TwoBehindOne) -> str:
    """What the serving processes logged past start-up, when a Pod was not placed."""
    servers = server.servers if isinstance(server, TwoBehindOne) else [server]
    return "\n".join(f"{s.name}: {s.log_tail()}" for s in servers)


@pytest.mark.parametrize("server", ["one", "two"])
def test_a_burst_of_20_at_50_percent_is_split_by_the_ledger(
    bursts: dict[str, Any], server: str, record_property: Callable[[str, object], None]
) -> None:
    namespace = f"burst-{server}"
    deviations = []
    for round_number in range(int(os.environ.get("CASTSLICE_E2E_PODMUTATION_BURSTS", "2"))):
        name = f"burst-{server}-{round_number}"
        bursts["apps"].create_namespaced_deployment(namespace, deployment(name, REPLICAS))
        pods = wait_running(bursts, namespace, name, REPLICAS)
        got = placements(pods)
        unplaced = [p["metadata"] for p in pods if p["metadata"].get("labels", {}).get(PLACEMENT) is None]
        # A Pod admitted without a decision (the webhook's timeout passed, failurePolicy Ignore):
        # which, whether a PodMutation marked it, and what the servers logged.
        marks = [(m["name"], (m.get("annotations") or {}).get(MARK)) for m in unplaced]
        assert not unplaced, (marks, logs(bursts["servers"][server]))
        assert all(p["metadata"]["annotations"].get(MARK) for p in pods)
        assert_on_their_nodes(bursts["plane"], pods)
        spot = got.count("spot")
        deviations.append(spot - TARGET)
        print(f"\n[podmutation burst e2e] {server}: round {round_number + 1}: {spot} spot of {REPLICAS}")
        remove(bursts, namespace, name)
        eventually(lambda name=name: not live_pods(bursts, namespace, name), 120, f"{name} gone")
    record_property(f"podmutation_burst_spot_deviations_{server}", ",".join(f"{d:+d}" for d in deviations))
    by_worker = bursts["servers"][server].admissions_by_worker()
    print(
        f"\n[podmutation burst e2e] 0->{REPLICAS} at once at {PERCENTAGE} %, {server} serving process(es), "
        f"{len(deviations)} rounds: spot - {TARGET} = {', '.join(f'{d:+d}' for d in deviations)}; "
        f"admissions per process seen: {by_worker}"
    )
    if server == "one":
        # One process decides one review at a time, with its own recent decisions: exact.
        assert set(deviations) == {0}, deviations
    else:
        # Each process knows only its own recent decisions until the watch shows the other's.
        assert all(abs(d) <= 1 for d in deviations), deviations
