"""Drift with GPU leases on (function/core/drift.py): a Pod the webhook charged is not drift; a GPU
Pod in a leased namespace that carries no charge is its own finding, with what the lease would
decide now, whether the webhook would be sent it or not (a Pod or namespace that opted out of the
webhook is still held to its namespace's lease); a charge less than the Pod asks for is found too.

Stored Pods are made as the apiserver makes them: the webhook's decision applied (its uid, the
view at that moment), or not for a Pod that skipped it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from function.core.config import parse_config
from function.core.drift import UNCHARGED, Tally, findings, judge
from function.core.engine import Engine
from function.core.leases import CHARGED_PODS, LEASES, slim_charged_pod, slim_lease
from function.core.mutators.base import RequestContext
from function.core.view import PODS, Overlay, StaticView, slim_pod

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
CONFIG = parse_config({"gpuSlicing": {"enabled": False}, "gpuLeases": {"enabled": True}})
ENGINE = Engine(CONFIG)


def lease(namespace: str = "ml", count: int = 2, name: str = "h100") -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"lease-{namespace}-{name}",
            "creationTimestamp": "2026-11-25T00:00:00Z",
        },
        "spec": {"gpuModel": "H100", "count": count},
    }


def gpu_pod(name: str, namespace: str = "ml", gpus: int = 1, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "uid": f"uid-{name}"},
        "spec": {
            "containers": [
                {"name": "app", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }


def view(leases: list[dict[str, Any]], pods: list[dict[str, Any]]) -> StaticView:
    return StaticView(
        {
            LEASES.index: {o["metadata"]["uid"]: slim_lease(o) for o in leases},
            CHARGED_PODS.index: {
                CHARGED_PODS.key(p): r for p in pods if (r := slim_charged_pod(p)) is not None
            },
            PODS.index: [r for r in map(slim_pod, pods) if r is not None],
        },
        specs=(LEASES, CHARGED_PODS, PODS),
    )


def admitted(pod: dict[str, Any], leases: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """``pod`` as stored after the webhook charged it (over the cluster as it was)."""
    context = RequestContext(
        uid=f"admission-{pod['metadata']['name']}",
        namespace=pod["metadata"]["namespace"],
        cluster=Overlay(view(leases, pods), now=NOW),
    )
    decision = ENGINE.decide(copy.deepcopy(pod), context)
    assert decision.outcome == "mutated", decision.reason
    stored = copy.deepcopy(decision.mutated_pod)
    stored["spec"]["nodeName"] = "gpu-1"
    stored["status"] = {"phase": "Running"}
    return stored


def cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    leases = [lease()]
    charged = admitted(gpu_pod("charged"), leases, [])
    skipped = gpu_pod("skipped")  # created while the webhook was down
    opted_out = gpu_pod("opted-out", **{"castops.io/webhook": "ignore"})
    no_gpu = gpu_pod("no-gpu", gpus=0)
    elsewhere = gpu_pod("elsewhere", namespace="no-lease")
    return leases, [charged, skipped, opted_out, no_gpu, elsewhere]


def test_exactly_the_uncharged_gpu_pods_of_leased_namespaces_are_found() -> None:
    leases, pods = cluster()
    tally = Tally()
    found = list(findings(ENGINE, pods, view(leases, pods), tally, now=NOW))
    assert sorted(f.name for f in found) == ["opted-out", "skipped"]
    assert all(f.uncharged for f in found)
    assert tally.uncharged == 2 and tally.judged == 5
    assert "2 uncharged by their namespace's GPU lease" in tally.summary()


def test_the_finding_says_what_the_lease_would_decide_now() -> None:
    leases, pods = cluster()
    by_name = {f.name: f for f in findings(ENGINE, pods, view(leases, pods), now=NOW)}
    (change,) = by_name["skipped"].changes
    assert change.mutator == "gpu-leases" and change.reason.startswith("uncharged: ")
    assert "h100" in change.reason  # charged to it, with the numbers: 1 of 2 in use
    (change,) = by_name["opted-out"].changes
    assert by_name["opted-out"].outcome == UNCHARGED and "h100" in change.reason


def test_a_full_lease_would_deny_the_uncharged_pod_and_says_so() -> None:
    leases = [lease(count=1)]
    charged = admitted(gpu_pod("charged"), leases, [])
    skipped = gpu_pod("skipped")
    finding = judge(ENGINE, skipped, view(leases, [charged, skipped]), NOW)
    assert finding is not None and finding.outcome == "denied"
    assert "LeaseExhausted" in finding.changes[0].reason


def test_an_opted_out_namespace_is_held_to_its_lease_only() -> None:
    leases, pods = cluster()
    skipped = pods[1]
    finding = judge(ENGINE, skipped, view(leases, pods), NOW, sent=False)
    assert finding is not None and finding.outcome == UNCHARGED and finding.uncharged
    charged = pods[0]
    assert judge(ENGINE, charged, view(leases, pods), NOW, sent=False) is None


def test_a_charge_below_what_the_pod_asks_for_is_found() -> None:
    leases, pods = cluster()
    forged = copy.deepcopy(pods[0])
    forged["metadata"]["annotations"]["castops.io/gpu-lease-charge"] = "0m"
    finding = judge(ENGINE, forged, view(leases, [forged]), NOW)
    assert finding is not None and finding.uncharged
    assert (
        "undercharged: charged 0m to gpu lease h100, but the Pod asks for 1000m" in finding.changes[0].reason
    )


def test_without_a_clock_no_lease_is_judged_rather_than_every_pod_found() -> None:
    leases, pods = cluster()
    assert judge(ENGINE, pods[0], view(leases, pods)) is None  # the charged Pod
    assert judge(ENGINE, pods[2], view(leases, pods), sent=False) is None
