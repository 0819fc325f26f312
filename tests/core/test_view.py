"""function/core/view.py, the pure cluster view: slim records, the keys and owner groups it files them
under, indices, snapshots."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from function.core.pod import NO_OWNER, Owner
from function.core.view import (
    EMPTY_VIEW,
    NODES,
    PLACEMENT_LABEL,
    PODS,
    REPLICASETS,
    IndexState,
    NodeRecord,
    Overlay,
    PodRecord,
    ReplicaSetRecord,
    StaticView,
    View,
    WatchSpec,
    by_advertised,
    by_owner,
    merge_specs,
    pairs,
    rbac_rules,
    record_key,
    slim_node,
    slim_pod,
    slim_replicaset,
)


def pod(uid: str, owner: str = "", *, placement: str | None = None, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"p-{uid}", "namespace": "ns", "uid": uid}
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner, "controller": True}
        ]
    if placement is not None:
        metadata["labels"] = {PLACEMENT_LABEL: placement, "app": "x"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-23T20:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}


# -- slim records ---------------------------------------------------------------------------------
def test_slim_pod_keeps_owner_placement_and_deletion_only() -> None:
    record = slim_pod(pod("u1", "rs1", placement="spot", deleting=True))
    assert record == PodRecord("ns", "p-u1", "u1", Owner("rs1", "ReplicaSet", "rs"), "spot", True)
    assert slim_pod(pod("u2")) == PodRecord("ns", "p-u2", "u2", NO_OWNER, "", False)


def test_slim_pod_reads_partial_object_metadata_as_the_watch_delivers_it() -> None:
    partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", **pod("u1", "rs1")}
    partial["kind"] = "PartialObjectMetadata"
    record = slim_pod(partial)
    assert record is not None and record.owner.uid == "rs1" and record.uid == "u1"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_are_not_kept(phase: str) -> None:
    assert slim_pod({**pod("u1", "rs1"), "status": {"phase": phase}}) is None


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_live_pods_are_kept(phase: str) -> None:
    assert slim_pod({**pod("u1", "rs1"), "status": {"phase": phase}}) is not None


def test_a_pod_without_uid_is_not_kept() -> None:
    assert slim_pod({"metadata": {"name": "x"}}) is None
    assert slim_pod({}) is None
    assert slim_replicaset({"metadata": {"name": "x"}}) is None


def test_malformed_metadata_gives_empty_fields_not_errors() -> None:
    record = slim_pod({"metadata": {"uid": "u", "labels": ["x"], "namespace": 3, "name": None}})
    assert record == PodRecord("", "", "u", NO_OWNER, "", False)
    assert slim_pod({"metadata": "junk"}) is None


def test_slim_replicaset_keeps_desired_replicas_and_deployment() -> None:
    rs = {
        "metadata": {
            "name": "web-1",
            "namespace": "ns",
            "uid": "rs1",
            "ownerReferences": [{"kind": "Deployment", "name": "web", "uid": "d1", "controller": True}],
        },
        "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    assert slim_replicaset(rs) == ReplicaSetRecord(
        "ns", "web-1", "rs1", Owner("d1", "Deployment", "web"), 3, False
    )
    assert slim_replicaset({**rs, "spec": {"replicas": True}}).replicas is None  # type: ignore[union-attr]
    assert slim_replicaset({**rs, "spec": None}).replicas is None  # type: ignore[union-attr]


# -- specs and RBAC -------------------------------------------------------------------------------
def test_spec_paths_are_cluster_wide_collections() -> None:
    assert PODS.path() == "/api/v1/pods"
    assert REPLICASETS.path() == "/apis/apps/v1/replicasets"
    assert PODS.api_version == "v1" and REPLICASETS.api_version == "apps/v1"


def test_spec_matches_kind_and_group_not_version() -> None:
    assert REPLICASETS.matches({"apiVersion": "apps/v1", "kind": "ReplicaSet"})
    assert REPLICASETS.matches({"apiVersion": "apps/v1beta2", "kind": "ReplicaSet"})
    assert not REPLICASETS.matches({"apiVersion": "extensions.example/v1", "kind": "ReplicaSet"})
    assert not REPLICASETS.matches({"apiVersion": "apps/v1", "kind": "Deployment"})
    assert PODS.matches({"apiVersion": "v1", "kind": "Pod"})
    assert not PODS.matches({"apiVersion": "example.com/v1", "kind": "Pod"})
    assert not PODS.matches({"kind": "Pod"})


def test_rbac_rules_are_list_and_watch_per_group() -> None:
    assert rbac_rules([]) == []
    assert rbac_rules([PODS, REPLICASETS, PODS]) == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list", "watch"]},
    ]
    nodes = WatchSpec(
        "nodes", "", "v1", "nodes", "Node", namespaced=False, slim=slim_pod, rbac_verbs=("watch", "list")
    )
    assert rbac_rules([PODS, nodes]) == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]}
    ]


def test_two_different_specs_for_one_index_are_refused() -> None:
    assert merge_specs([PODS, REPLICASETS, PODS]) == (PODS, REPLICASETS)
    other = WatchSpec("pods", "", "v1", "pods", "Pod", slim=slim_pod)
    with pytest.raises(ValueError, match="two different watches for the cluster-view index 'pods'"):
        merge_specs([PODS, other])


# -- indices --------------------------------------------------------------------------------------
def test_empty_view_is_unavailable_and_empty() -> None:
    assert not EMPTY_VIEW.available
    assert len(EMPTY_VIEW.index("pods")) == 0
    assert len(EMPTY_VIEW.group("pods", "x")) == 0
    assert not EMPTY_VIEW.synced("pods")


def test_static_view_groups_pods_by_owner() -> None:
    records = [slim_pod(pod(f"u{i}", "rs1" if i < 3 else "rs2")) for i in range(5)]
    view = StaticView({"pods": records, "replicasets": []})
    assert view.available and view.synced("pods") and view.synced("replicasets")
    assert not view.synced("podmutations")
    assert set(view.group("pods", "rs1")) == {"u0", "u1", "u2"}
    assert set(view.group("pods", "rs2")) == {"u3", "u4"}
    assert len(view.group("pods", "rs3")) == 0
    assert len(view.index("pods")) == 5
    assert view.index("pods")["u3"].owner.uid == "rs2"
    assert len(view.index("unknown")) == 0 and len(view.group("unknown", "rs1")) == 0


def test_state_updates_leave_earlier_snapshots_untouched() -> None:
    state = IndexState.build([slim_pod(pod("u1", "rs1"))], PODS)
    snapshot = View({"pods": state})
    moved = state.put("u1", slim_pod(pod("u1", "rs2")), by_owner)
    added = moved.put("u2", slim_pod(pod("u2", "rs1")), by_owner)
    removed = added.remove("u1", by_owner)
    assert set(snapshot.group("pods", "rs1")) == {"u1"}  # the old snapshot did not change
    assert set(View({"pods": moved}).group("pods", "rs2")) == {"u1"}
    assert len(View({"pods": moved}).group("pods", "rs1")) == 0  # a moved record leaves its old group
    assert "rs1" not in moved.groups  # and an empty group is dropped, not kept forever
    assert set(View({"pods": removed}).index("pods")) == {"u2"}
    assert "rs2" not in removed.groups
    assert removed.remove("never-there", by_owner) is removed


def test_a_record_without_uid_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty str uid"):
        IndexState.build([("no", "uid")], None)


OPS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 12), st.sampled_from(["", "rs1", "rs2", "rs3"])), max_size=60
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_index_state_agrees_with_a_plain_dict_model(ops: list[tuple[bool, int, str]]) -> None:
    state = IndexState(synced=True)
    model: dict[str, PodRecord] = {}
    for is_put, number, owner in ops:
        uid = f"u{number}"
        if is_put:
            record = slim_pod(pod(uid, owner))
            assert record is not None
            state = state.put(uid, record, by_owner)
            model[uid] = record
        else:
            state = state.remove(uid, by_owner)
            model.pop(uid, None)
    assert dict(state.records) == model
    expected: dict[str, dict[str, PodRecord]] = {}
    for uid, record in model.items():
        expected.setdefault(record.owner.uid, {})[uid] = record
    assert {key: dict(members) for key, members in state.groups.items()} == expected
    assert state.synced


# -- records at their edges: terminating ReplicaSets, keys and owner groups, what a static view says ---
class Bare(NamedTuple):
    uid: str


class OddOwner(NamedTuple):
    uid: str
    owner: str


def replicaset(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "rs", "uid": "u1", **metadata},
    }


def test_a_replicaset_being_deleted_is_marked_terminating() -> None:
    assert slim_replicaset(replicaset(deletionTimestamp="2026-11-25T00:00:00Z")) == ReplicaSetRecord(
        "", "rs", "u1", Owner(), None, terminating=True
    )
    record = slim_replicaset(replicaset())
    assert record is not None and record.terminating is False


def test_records_without_an_owner_group_under_the_empty_key() -> None:
    assert by_owner(Bare("u1")) == ""
    assert by_owner(OddOwner("u1", "not an Owner")) == ""
    assert by_owner({"metadata": {"uid": "u1"}}) == ""


def test_record_key_of_a_whole_object_is_its_metadata_uid() -> None:
    assert record_key({"metadata": {"uid": "u1"}}) == "u1"
    assert record_key(Bare("u2")) == "u2"


@pytest.mark.parametrize("record", [{"metadata": {"uid": 5}}, {"metadata": {"uid": ""}}, Bare("")])
def test_record_key_refuses_a_uid_that_is_not_a_non_empty_string(record: object) -> None:
    with pytest.raises(ValueError) as raised:
        record_key(record)
    assert str(raised.value) == f"a cluster-view record needs a non-empty str uid: {record!r}"


def test_removing_from_an_index_built_without_groups() -> None:
    state = IndexState.build([Bare("a")], None).remove("a", by_owner)
    assert dict(state.records) == {} and dict(state.groups) == {}


def test_a_static_view_can_be_unavailable_and_says_what_it_holds() -> None:
    view = StaticView({"pods": [Bare("a"), Bare("b")], "replicasets": []}, available=False)
    assert view.available is False
    assert repr(view) == "View(available=False, pods=2, replicasets=0)"
    assert repr(StaticView({})) == "View(available=True, )"


def test_an_overlay_answers_as_its_base_but_for_its_indices_and_its_time() -> None:
    """The one delegating view: the in-flight ledgers (and the command line's PodMutations) as
    indices that read as synced, the snapshot's time, everything else the base's own."""
    from datetime import UTC, datetime

    from function.core.leases import CHARGED_PODS

    charged = {
        "metadata": {
            "uid": "p1",
            "name": "p1",
            "namespace": "ml",
            "labels": {"castops.io/gpu-lease": "h100"},
            "annotations": {"castops.io/gpu-lease-charge": "1"},
        }
    }
    base = StaticView({"pods": [pod("a", "rs")], CHARGED_PODS.index: [charged]}, (PODS, CHARGED_PODS))
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    view = Overlay(base, {"in-flight": {"rs": ("d-1",)}}, now=now)
    assert view.index("in-flight") == {"rs": ("d-1",)} and view.synced("in-flight")
    assert view.index("pods") is base.index("pods") and view.group("pods", "rs") is base.group("pods", "rs")
    assert not view.synced("namespaces") and view.available
    [lease_key] = base.index(CHARGED_PODS.index).values()
    key = CHARGED_PODS.group_by(lease_key) if CHARGED_PODS.group_by else ""
    assert view.tally(CHARGED_PODS.index, key) == base.tally(CHARGED_PODS.index, key) != ()
    assert view.now == now and base.now is None
    assert Overlay(view).now == now, "an overlay over an overlay keeps the time it was given"
    assert Overlay(EMPTY_VIEW, {"in-flight": {}}).available is False


# -- Nodes: metadata and allocatable, grouped by what they advertise ------------------------------
def node(name: str, labels: dict[str, str] | None = None, **allocatable: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {}},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {key.replace("__", "/"): value for key, value in allocatable.items()},
            "images": [{"names": ["registry/cuda:12"], "sizeBytes": 4_000_000_000}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_slim_node_keeps_labels_and_allocatable_only_sorted_and_flat() -> None:
    record = slim_node(
        node(
            "gpu-1",
            {"nvidia.com/gpu.product": "A100", "kubernetes.io/arch": "amd64"},
            cpu="8",
            nvidia_com__gpu="4",
        )
    )
    assert record == NodeRecord(
        "gpu-1",
        "uid-gpu-1",
        ("kubernetes.io/arch", "amd64", "nvidia.com/gpu.product", "A100"),
        ("cpu", "8", "nvidia_com/gpu", "4"),
    )
    assert record.label("nvidia.com/gpu.product") == "A100" and record.label("absent") is None
    assert record.allocatable_of("cpu") == "8"
    assert pairs(record.labels) == {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "A100"}


def test_a_node_advertises_only_extended_resources_it_offers_more_than_none_of() -> None:
    record = slim_node(node("n", cpu="8", memory="32Gi", nvidia__gpu="0", nvidia__shared="8", bad__q="lots"))
    assert record is not None and record.advertised() == ("nvidia/shared",)
    assert by_advertised(record) == ("nvidia/shared",)


def test_label_and_quantity_strings_are_shared_between_nodes() -> None:
    first = slim_node(node("a", {"pool": "gpu-" + "a100"}, cpu="8"))
    second = slim_node(node("b", {"pool": "gpu-" + "a100"}, cpu="8"))
    assert first is not None and second is not None
    assert first.labels[1] is second.labels[1] and first.allocatable[1] is second.allocatable[1]


def test_a_node_without_a_name_is_not_kept_and_odd_maps_read_as_empty() -> None:
    assert slim_node({"kind": "Node", "metadata": {}}) is None
    odd = slim_node(
        {"kind": "Node", "metadata": {"name": "n", "labels": ["x"]}, "status": {"allocatable": 3}}
    )
    assert odd == NodeRecord("n", "", (), ())


def test_nodes_are_keyed_by_name_and_grouped_by_every_resource_they_advertise() -> None:
    assert NODES.key(node("gpu-1")) == "gpu-1" and not NODES.namespaced and not NODES.metadata_only
    nodes = [
        node("gpu-1", nvidia_com__gpu="4"),
        node("gpu-2", nvidia_com__gpu="4", **{"nvidia_com__gpu-shared": "16"}),
        node("cpu-1", cpu="8"),
    ]
    view = StaticView({"nodes": {NODES.key(obj): NODES.slim(obj) for obj in nodes}}, (NODES,))
    assert set(view.index("nodes")) == {"gpu-1", "gpu-2", "cpu-1"}
    assert set(view.group("nodes", "nvidia_com/gpu")) == {"gpu-1", "gpu-2"}
    assert set(view.group("nodes", "nvidia_com/gpu-shared")) == {"gpu-2"}
    assert not view.group("nodes", "cpu")


def test_a_node_that_stops_advertising_leaves_the_group_and_the_group_goes_when_empty() -> None:
    offers = slim_node(node("n", **{"x__shared": "4", "x__gpu": "1"}))
    stops = slim_node(node("n", **{"x__gpu": "1"}))
    assert offers is not None and stops is not None
    state = IndexState(synced=True).put("n", offers, by_advertised)
    assert set(state.groups) == {"x/shared", "x/gpu"}
    state = state.put("n", stops, by_advertised)
    assert set(state.groups) == {"x/gpu"} and state.records["n"] is stops
    assert not state.remove("n", by_advertised).groups


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.sets(st.sampled_from("abc"))), max_size=40))
def test_multi_group_index_agrees_with_a_plain_dict_model(ops: list[tuple[bool, int, set[str]]]) -> None:
    state = IndexState(synced=True)
    model: dict[str, NodeRecord] = {}
    for is_put, number, offered in ops:
        name = f"n{number}"
        if is_put:
            record = slim_node(node(name, **{f"x__{resource}": "1" for resource in offered}))
            assert record is not None
            state = state.put(name, record, by_advertised)
            model[name] = record
        else:
            state = state.remove(name, by_advertised)
            model.pop(name, None)
    assert dict(state.records) == model
    expected: dict[str, dict[str, NodeRecord]] = {}
    for name, record in model.items():
        for key in record.advertised():
            expected.setdefault(key, {})[name] = record
    assert {key: dict(members) for key, members in state.groups.items()} == expected
