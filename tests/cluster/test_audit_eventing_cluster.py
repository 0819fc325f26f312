"""The audit CloudEvents through a real Knative Eventing: the Knative install of
test_knative_route_cluster with ``components/eventing`` added the way docs/deploy.md tells users
to (an overlay of their own: the route overlay plus the component), on Knative Eventing's
channel-based broker over the in-memory channel (platform.install_eventing). The SinkBinding gives
the webhook's Knative Service ``K_SINK`` (a new revision); a GPU Pod's decision then travels
webhook -> Broker ingress -> in-memory channel -> Broker filter -> Trigger -> ``castslice-audit``
(the reference consumer, a Knative Service behind the same Traefik), which checks it against the
shipped schema and stores it; it is read back from the consumer's store with ``castslice audit
list -o json`` in its container."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .installs import NAMESPACE, Installs, ready_pods
from .realnode import RealCluster
from .support import GPU_SHARED, advertise_gpus, create, gpu_pod, workload_namespace

AUDIT_PODS = "serving.knative.dev/service=castslice-audit"
DELIVERY_SECONDS = 120.0


@pytest.fixture(scope="module")
def eventing(installs: Installs) -> Iterator[RealCluster]:
    installs.eventing()
    cluster = installs.cluster
    advertise_gpus(cluster)
    yield cluster


def stored_events(cluster: RealCluster) -> list[dict[str, Any]]:
    """The decisions castslice-audit stored (its SQLite, through the CLI in its container)."""
    pod = ready_pods(cluster, NAMESPACE, AUDIT_PODS)[0]["metadata"]["name"]
    out = cluster.kubectl(
        "-n", NAMESPACE, "exec", pod, "-c", "castslice-audit", "--",
        "castslice", "audit", "list", "--since", "1h", "-o", "json",
    )  # fmt: skip
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def test_the_webhook_sends_its_decisions_to_the_broker_once_bound(eventing: RealCluster) -> None:
    cluster = eventing
    ksvc = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "ksvc", "castslice", "-o", "json"))
    container = ksvc["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    broker = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "broker", "castslice", "-o", "json"))
    assert env.get("K_SINK") == broker["status"]["address"]["url"], (env, broker["status"])
    # The revision the route serves has it in every Pod, and keeps min-scale's two.
    revision = ksvc["status"]["latestReadyRevisionName"]
    pods = ready_pods(cluster, NAMESPACE, f"serving.knative.dev/revision={revision}")
    assert len(pods) >= 2, revision
    for pod in pods:
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "castslice")
        assert any(e["name"] == "K_SINK" for e in container.get("env", [])), pod["metadata"]["name"]


def test_a_gpu_pods_decision_arrives_at_the_audit_consumer_through_broker_and_trigger(
    eventing: RealCluster, record_property: Any
) -> None:
    cluster = eventing
    namespace = workload_namespace(cluster, "audit")
    stored = create(cluster, namespace, gpu_pod("inference-audited"))
    assert stored["spec"]["containers"][0]["resources"]["limits"].get(GPU_SHARED) == "2"
    subject = f"namespaces/{namespace}/pods/inference-audited"
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        found[:] = [e for e in stored_events(cluster) if e.get("subject") == subject]
        return bool(found)

    cluster.wait(arrived, DELIVERY_SECONDS, f"the audit event of {subject} at castslice-audit")
    decision = found[0]["data"]
    assert decision["outcome"] == "mutated", decision
    assert {"mutator": "gpu-slicing", "action": "mutated"}.items() <= next(
        m for m in decision["mutators"] if m["mutator"] == "gpu-slicing"
    ).items(), decision["mutators"]
    # Nothing the consumer refused (a schema mismatch would land there, not in the store).
    pod = ready_pods(cluster, NAMESPACE, AUDIT_PODS)[0]["metadata"]["name"]
    rejected = cluster.kubectl(
        "-n", NAMESPACE, "exec", pod, "-c", "castslice-audit", "--",
        "castslice", "audit", "rejected", "-o", "json",
    )  # fmt: skip
    assert json.loads(rejected) == [], rejected
    record_property("decision events stored by castslice-audit", len(stored_events(cluster)))
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
