"""Drift: a stored Pod the webhook would change today was not seen by it (function/core/drift.py).

Stored Pods are made the way the apiserver makes them: the webhook's decision applied (or not, for
a Pod that skipped it), then a uid, a node and a status added.
"""

from __future__ import annotations

import copy
from typing import Any

from function.core.config import parse_config
from function.core.drift import (
    Tally,
    WithoutPod,
    as_admitted,
    findings,
    judge,
    opted_out_namespaces,
)
from function.core.engine import Engine
from function.core.mutators.base import RequestContext
from function.core.view import PODS, REPLICASETS, StaticView, slim_pod, slim_replicaset

RS_UID = "rs-uid"
CONFIG = parse_config({"spot": {"enabled": True, "spotPercentageOfReplicaSet": 40}})


def gpu_pod(name: str, namespace: str = "ml", opted_in: bool = True) -> dict[str, Any]:
    annotations = {"castops.io/optimize": "true", "castops.io/workload-type": "inference"} if opted_in else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "containers": [{"name": "app", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }


def rs_pod(name: str, namespace: str = "web") -> dict[str, Any]:
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c", "uid": RS_UID}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-7d4b9c-",
            "namespace": namespace,
            "ownerReferences": [{**owner, "controller": True}],
        },
        "spec": {"containers": [{"name": "app", "image": "x"}]},
        "_name": name,
    }


def stored(pod: dict[str, Any], *, admitted_by: Engine | None, uid: str) -> dict[str, Any]:
    """``pod`` as the apiserver stores it: mutated by ``admitted_by`` (None: the webhook was down),
    then named, given a uid, bound to a node and running."""
    pod = copy.deepcopy(pod)
    name = pod.pop("_name", None)
    if admitted_by is not None:
        namespace = pod["metadata"]["namespace"]
        decision = admitted_by.decide(pod, RequestContext(uid=f"admission-{uid}", namespace=namespace))
        assert decision.outcome in ("mutated", "unchanged"), decision.reason
        pod = copy.deepcopy(decision.mutated_pod) if decision.mutated_pod is not None else pod
    if name is not None:
        pod["metadata"]["name"] = name
    pod["metadata"]["uid"] = uid
    pod["spec"]["nodeName"] = "node-1"
    pod["status"] = {"phase": "Running"}
    return pod


def view_of(pods: list[dict[str, Any]]) -> StaticView:
    replicaset = {
        "metadata": {"name": "web-7d4b9c", "namespace": "web", "uid": RS_UID},
        "spec": {"replicas": len(pods)},
    }
    records = [r for r in map(slim_pod, pods) if r is not None]
    return StaticView({"pods": records, "replicasets": [slim_replicaset(replicaset)]}, (PODS, REPLICASETS))


def test_a_gpu_pod_that_skipped_the_webhook_is_found_and_a_sliced_one_is_not() -> None:
    engine = Engine(CONFIG)
    skipped = stored(gpu_pod("missed"), admitted_by=None, uid="u1")
    seen = stored(gpu_pod("sliced"), admitted_by=engine, uid="u2")
    view = view_of([])
    finding = judge(engine, skipped, view)
    assert finding is not None and finding.drift
    assert (finding.namespace, finding.name, finding.uid, finding.outcome) == (
        "ml",
        "missed",
        "u1",
        "mutated",
    )
    assert [c.mutator for c in finding.changes] == ["gpu-slicing"]
    assert "nvidia.com/gpu-shared" in finding.changes[0].reason
    assert judge(engine, seen, view) is None


def test_a_pod_not_opted_in_is_not_drift() -> None:
    engine = Engine(CONFIG)
    assert (
        judge(engine, stored(gpu_pod("plain", opted_in=False), admitted_by=None, uid="u"), view_of([]))
        is None
    )


def test_an_unplaced_replicaset_pod_is_found_and_placed_ones_are_sticky() -> None:
    engine = Engine(CONFIG)
    placed = [stored(rs_pod(f"web-{n}"), admitted_by=engine, uid=f"p{n}") for n in range(3)]
    skipped = stored(rs_pod("web-x"), admitted_by=None, uid="skipped")
    view = view_of([*placed, skipped])
    assert all(p["metadata"]["labels"]["castops.io/placement"] for p in placed)
    for pod in placed:
        assert judge(engine, pod, view) is None
    finding = judge(engine, skipped, view)
    assert finding is not None and [c.mutator for c in finding.changes] == ["spot"]
    # Over its three placed siblings, itself left out (not "1 unplaced"): n = 4.
    sides = [p["metadata"]["labels"]["castops.io/placement"] for p in placed]
    counted = f"siblings {sides.count('spot')} spot, {sides.count('on-demand')} on-demand, 0 unplaced"
    assert counted in finding.changes[0].reason and "floor(4x40/100)" in finding.changes[0].reason


def test_a_placed_pod_is_not_reported_when_its_replicaset_split_moved() -> None:
    """Three spot Pods of a ReplicaSet at 40 %: over the target, but placements are sticky."""
    engine = Engine(CONFIG)
    pods = []
    for n in range(3):
        pod = rs_pod(f"web-{n}")
        pod["metadata"]["annotations"] = {"scheduling.cast.ai/lifecycle": "spot"}
        pod = stored(pod, admitted_by=engine, uid=f"s{n}")
        del pod["metadata"]["annotations"]["scheduling.cast.ai/lifecycle"]  # the template changed
        pods.append(pod)
    view = view_of(pods)
    assert [p["metadata"]["labels"]["castops.io/placement"] for p in pods] == ["spot"] * 3
    assert [judge(engine, p, view) for p in pods] == [None, None, None]


def test_a_pod_judged_does_not_count_as_its_own_sibling() -> None:
    """One on-demand sibling and the skipped Pod: n = 2 gives floor(0.8) = 0 spot (on-demand); had
    the Pod counted itself (it is in the view) n = 3 would give 1 (spot)."""
    engine = Engine(CONFIG)
    sibling = stored(rs_pod("web-0"), admitted_by=engine, uid="s0")
    assert sibling["metadata"]["labels"]["castops.io/placement"] == "on-demand"
    skipped = stored(rs_pod("web-1"), admitted_by=None, uid="skipped")
    finding = judge(engine, skipped, view_of([sibling, skipped]))
    assert finding is not None and finding.changes[0].reason.startswith("on-demand:")
    assert "siblings 0 spot, 1 on-demand, 0 unplaced" in finding.changes[0].reason


def test_the_view_without_the_pod_hides_it_from_index_and_group_only() -> None:
    pods = [stored(rs_pod(f"web-{n}"), admitted_by=None, uid=f"u{n}") for n in range(3)]
    view = view_of(pods)
    hidden = WithoutPod(view, "u1")
    assert set(hidden.index("pods")) == {"u0", "u2"} and len(hidden.index("pods")) == 2
    assert "u1" not in hidden.index("pods") and hidden.index("pods").get("u1") is None
    assert set(hidden.group("pods", RS_UID)) == {"u0", "u2"}
    assert hidden.index("replicasets") == view.index("replicasets")
    assert hidden.synced("pods") and hidden.available
    assert WithoutPod(view, "absent").index("pods") is view.index("pods")


def test_a_bound_vgpu_pod_is_judged_without_its_node() -> None:
    """vGPU denies a Pod created with spec.nodeName; the scheduler's nodeName is not the user's."""
    engine = Engine(parse_config({"gpuSlicing": {"enabled": False}, "vgpu": {"enabled": True}}))
    pod = gpu_pod("vgpu", opted_in=False)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "2000"
    seen = stored(pod, admitted_by=engine, uid="v1")
    assert seen["spec"]["schedulerName"] == "hami-scheduler" and seen["spec"]["nodeName"] == "node-1"
    assert judge(engine, seen, view_of([])) is None
    skipped = stored(pod, admitted_by=None, uid="v2")
    finding = judge(engine, skipped, view_of([]))
    assert finding is not None and finding.outcome == "mutated"
    assert [c.mutator for c in finding.changes] == ["vgpu"]


def test_as_admitted_drops_the_node_and_the_status_and_copies() -> None:
    pod = stored(gpu_pod("p"), admitted_by=None, uid="u")
    admitted = as_admitted(pod)
    assert "nodeName" not in admitted["spec"] and admitted["status"] == {}
    assert pod["spec"]["nodeName"] == "node-1" and pod["status"] == {"phase": "Running"}
    assert admitted["metadata"] is pod["metadata"]  # shallow: the engine copies what it edits


def test_finished_deleted_and_opted_out_pods_are_not_judged() -> None:
    engine = Engine(CONFIG)
    done = stored(gpu_pod("done"), admitted_by=None, uid="d")
    done["status"]["phase"] = "Succeeded"
    going = stored(gpu_pod("going"), admitted_by=None, uid="g")
    going["metadata"]["deletionTimestamp"] = "2026-11-25T00:00:00Z"
    quiet = stored(gpu_pod("quiet", namespace="quiet"), admitted_by=None, uid="q")
    missed = stored(gpu_pod("missed"), admitted_by=None, uid="m")
    namespaces = [
        {"kind": "Namespace", "metadata": {"name": "quiet", "labels": {"castops.io/webhook": "ignore"}}},
        {"kind": "Namespace", "metadata": {"name": "ml", "labels": {"castops.io/webhook": "yes"}}},
        {"kind": "Namespace", "metadata": {"name": "bare"}},
    ]
    opted_out = opted_out_namespaces(namespaces)
    assert opted_out == {"quiet"}
    tally = Tally()
    found = list(findings(engine, [done, going, quiet, missed], view_of([]), tally, opted_out))
    assert [f.name for f in found] == ["missed"]
    assert (tally.judged, tally.drifted, tally.errors) == (1, 1, 0)


def test_the_tally_counts_by_mutator_and_namespace_and_says_so_in_one_line() -> None:
    engine = Engine(CONFIG)
    pods = [
        stored(gpu_pod("a", namespace="ml"), admitted_by=None, uid="a"),
        stored(gpu_pod("b", namespace="ml"), admitted_by=None, uid="b"),
        stored(gpu_pod("c", namespace="lab"), admitted_by=None, uid="c"),
        stored(gpu_pod("d", namespace="lab", opted_in=False), admitted_by=None, uid="d"),
    ]
    tally = Tally()
    assert len(list(findings(engine, pods, view_of([]), tally))) == 3
    assert dict(tally.by_mutator_namespace) == {("gpu-slicing", "ml"): 2, ("gpu-slicing", "lab"): 1}
    assert tally.summary() == (
        "drift: 4 Pod(s) judged, 3 the webhook would change (gpu-slicing in lab: 1, gpu-slicing in ml: 2)"
    )
    assert Tally(judged=5).summary() == "drift: 5 Pod(s) judged, none the webhook would change"


def test_a_denial_is_drift_and_names_the_mutator() -> None:
    engine = Engine(CONFIG)
    pod = gpu_pod("bad")
    pod["metadata"]["annotations"]["castops.io/slice-ratio"] = "-3"
    finding = judge(engine, stored(pod, admitted_by=None, uid="x"), view_of([]))
    assert finding is not None and finding.outcome == "denied" and finding.drift
    assert finding.changes[0].mutator == "gpu-slicing" and "slice-ratio" in finding.changes[0].reason
    assert finding.as_dict()["mutators"][0]["action"] == "denied"
