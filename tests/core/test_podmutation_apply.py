"""function/core/podmutation/apply.py: what each part of a mutation changes and how it says so,
toleration sameness, required affinity merging, group choice at its ties, and the Pod shape check
that keeps a bad patch from being sent."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core.placement import PLACEMENT_LABEL, SiblingCounts
from function.core.podmutation.apply import (
    GROUP_ANNOTATION,
    Siblings,
    add_toleration,
    and_into_required,
    apply_mutation,
    choose_group,
    pod_shape_problem,
)
from function.core.podmutation.compiled import Group
from function.core.podmutation.names import MARK_ANNOTATION, marked_by
from tests.support import compiled_mutation

TEMPLATE_KEY = "scheduling.cast.ai/node-template"


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}], **spec}}


def changes(spec: dict[str, Any], target: dict[str, Any] | None = None) -> list[str]:
    _, done = apply_mutation(target if target is not None else pod(), compiled_mutation(spec))
    return done.changes


# --- marks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "mark"),
    [
        ({"metadata": {"annotations": {MARK_ANNOTATION: "m/2"}}}, "m/2"),
        ({"metadata": {"annotations": {MARK_ANNOTATION: 5}}}, None),
        ({"metadata": {"annotations": {MARK_ANNOTATION: ""}}}, None),
        ({"metadata": {"annotations": {MARK_ANNOTATION: "m"}}}, None),
        ({"metadata": {"annotations": {MARK_ANNOTATION: "M/2"}}}, None),
        (
            {"metadata": {"annotations": {MARK_ANNOTATION: "pod-mutations.example/12"}}},
            "pod-mutations.example/12",
        ),
        ({"metadata": "not a map"}, None),
        ({}, None),
    ],
)
def test_marked_by(target: dict[str, Any], mark: str | None) -> None:
    assert marked_by(target) == mark


# --- what each part says -----------------------------------------------------------------------------


def test_labels_and_annotations_name_every_changed_key() -> None:
    target = pod()
    target["metadata"]["labels"] = {"same": "1"}
    assert changes(
        {"labels": {"same": "1", "a": "x", "b": "y"}, "annotations": {"c": "1", "d": "2"}}, target
    ) == [
        "labels a,b",
        "annotations c,d",
    ]


def test_removing_the_last_node_selector_key_removes_the_selector() -> None:
    target = pod(nodeSelector={"zone": "a"})
    result, done = apply_mutation(target, compiled_mutation({"nodeSelector": {"remove": ["zone"]}}))
    assert done.changes == ["nodeSelector"] and "nodeSelector" not in result["spec"]


def test_tolerations_are_counted_as_added() -> None:
    tolerations = [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]
    assert changes({"tolerations": tolerations}) == ["tolerations +2"]


def test_affinities_say_which_was_changed() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": term}],
        }
    }
    target = pod()
    assert changes({"affinity": affinity}, target) == ["required node affinity", "preferred node affinity"]
    assert target["spec"]["affinity"] == affinity  # as written: no defaulted empty lists added
    assert changes({"affinity": affinity}, target) == []


def test_node_templates_move_the_selector_into_affinity_and_tolerate() -> None:
    target = pod(nodeSelector={TEMPLATE_KEY: "gpu"})
    assert changes({"nodeTemplatesToConsolidate": ["gpu", "cpu"]}, target) == [
        "node-template nodeSelector -> affinity",
        "node templates gpu,cpu",
        "toleration gpu",
        "toleration cpu",
    ]
    assert "nodeSelector" not in target["spec"]


# --- tolerations: the same one is not added twice -------------------------------------------------------


@pytest.mark.parametrize(
    ("existing", "new", "added"),
    [
        ({"key": "k", "operator": "Equal", "value": "v"}, {"key": "k", "value": "v"}, False),
        ({"key": "k", "value": "", "effect": None}, {"key": "k", "operator": "Equal"}, False),
        ({"key": "k", "operator": "Exists"}, {"key": "k", "operator": "Equal"}, True),
        ({"key": "k", "operator": "Equal"}, {"key": "k", "operator": "Exists"}, True),
        ({"key": "k", "value": "v"}, {"key": "k"}, True),
        ({"key": "k"}, {"key": "k", "value": "v"}, True),
        ({"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}, True),
        ({"key": "k", "effect": "NoSchedule"}, {"key": "k", "effect": "NoExecute"}, True),
        (
            {"key": "k", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "k", "effect": "NoExecute", "tolerationSeconds": 60},
            True,
        ),
        ("not a map", {"key": "k"}, True),
    ],
)
def test_a_toleration_is_added_unless_the_same_one_is_there(
    existing: Any, new: dict[str, Any], added: bool
) -> None:
    spec: dict[str, Any] = {"tolerations": [existing]}
    assert add_toleration(spec, new) is added
    assert spec["tolerations"] == ([existing, new] if added else [existing])


# --- required node affinity ------------------------------------------------------------------------


ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
HOST = {"key": "metadata.name", "operator": "In", "values": ["n1"]}


def required(spec: dict[str, Any]) -> Any:
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


def test_an_empty_term_list_takes_the_new_terms() -> None:
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
        }
    }
    assert and_into_required(spec, [{"matchExpressions": [ZONE]}]) is True
    assert required(spec) == [{"matchExpressions": [ZONE]}]


def test_match_fields_are_anded_too_and_a_broken_term_becomes_the_new_one() -> None:
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [HOST]}, "not a map"]
                }
            }
        }
    }
    assert and_into_required(spec, [{"matchExpressions": [ZONE], "matchFields": [HOST]}]) is True
    assert required(spec) == [
        {"matchFields": [HOST], "matchExpressions": [ZONE]},
        {"matchExpressions": [ZONE], "matchFields": [HOST]},
    ]


# --- groups ------------------------------------------------------------------------------------------


def group(name: str, percentage: int) -> Group:
    return Group(name, percentage, None, ())


def siblings(*groups: str) -> Siblings:
    return Siblings(SiblingCounts(unplaced=len(groups)), groups)


@pytest.mark.parametrize(
    ("groups", "earlier", "chosen"),
    [
        ((group("a", 50), group("b", 50)), (), "a"),  # a tie goes to the earlier group
        ((group("a", 50), group("b", 50)), ("a",), "b"),
        ((group("a", 50),), (), "a"),  # a tie with "no group" goes to the group
        ((group("a", 50),), ("a",), None),
        ((group("a", 50), group("b", 50)), ("a",) * 50 + ("b",) * 50, "a"),  # no remainder share at 100 %
        ((group("a", 0), group("b", 100)), (), "b"),
    ],
)
def test_choose_group(groups: tuple[Group, ...], earlier: tuple[str, ...], chosen: str | None) -> None:
    winner = choose_group(groups, siblings(*earlier))
    assert (winner.name if winner else None) == chosen


def test_a_group_with_a_spot_mode_places_on_spot_and_the_rest_on_demand() -> None:
    spec = {
        "distributionGroups": [
            {
                "name": "a",
                "percentage": 50,
                "configuration": {
                    "spotMode": "only-spot",
                    "patches": [{"op": "add", "path": "/metadata/labels/g", "value": "a"}],
                },
            }
        ]
    }
    first, done = apply_mutation(pod(), compiled_mutation(spec))
    assert done.changes == [
        "spot (toleration scheduling.cast.ai/spot Exists, nodeSelector scheduling.cast.ai/spot=true)",
        "group a patches (1 ops)",
    ]
    assert first["metadata"]["labels"] == {PLACEMENT_LABEL: "spot", "g": "a"}
    assert first["metadata"]["annotations"][GROUP_ANNOTATION] == "a"
    second, done = apply_mutation(pod(), compiled_mutation(spec), siblings("a"))
    assert done.changes == ["on-demand"]
    assert second["metadata"]["labels"] == {PLACEMENT_LABEL: "on-demand"}
    assert second["metadata"]["annotations"][GROUP_ANNOTATION] == "none"


def test_a_template_leaves_groups_to_each_pod() -> None:
    template: dict[str, Any] = {"metadata": {}, "spec": {"containers": []}}
    spec = {"distributionGroups": [{"name": "a", "percentage": 50}]}
    result, done = apply_mutation(template, compiled_mutation(spec))
    assert done.notes == ["spot distribution and groups: chosen per Pod when each is created"]
    assert GROUP_ANNOTATION not in result["metadata"]["annotations"]


# --- the shape check -----------------------------------------------------------------------------


def test_the_shape_check_names_what_the_apiserver_would_refuse() -> None:
    assert pod_shape_problem({"metadata": "x", "spec": {}}) == "metadata and spec must stay objects"
    bad = pod(tolerations=["x"])
    bad["metadata"]["labels"] = {"a": "b c"}
    assert (
        pod_shape_problem(bad) == "metadata.labels[a]: not a valid label; spec.tolerations[0]: must be a map"
    )
    assert pod_shape_problem(bad, copy.deepcopy(bad)) is None


def test_a_pod_already_invalid_still_gets_valid_patches() -> None:
    target = pod()
    target["metadata"]["labels"] = {"a": "b c"}
    spec = {"patches": [{"op": "add", "path": "/metadata/annotations/x", "value": "1"}]}
    result, done = apply_mutation(target, compiled_mutation(spec))
    assert done.warnings == [] and done.changes == ["patches (1 ops)"]
    assert result["metadata"]["annotations"]["x"] == "1"


def test_a_failing_sequence_does_not_stop_the_next() -> None:
    spec = {
        "patchesV2": [
            {"operations": [{"op": "remove", "path": "/spec/nothing"}]},
            {"operations": [{"op": "add", "path": "/metadata/labels", "value": {"ok": "1"}}]},
        ]
    }
    result, done = apply_mutation(pod(), compiled_mutation(spec))
    assert done.changes == ["patches #2 (1 ops)"]
    assert done.warnings[0].startswith("patches #1 not applied: [0] remove /spec/nothing")
    assert result["metadata"]["labels"] == {"ok": "1"}


def test_a_sequence_that_would_make_the_pod_invalid_does_not_stop_the_next() -> None:
    spec = {
        "patchesV2": [
            {"operations": [{"op": "add", "path": "/metadata/labels", "value": {"bad": "a b"}}]},
            {"operations": [{"op": "add", "path": "/metadata/annotations/ok", "value": "1"}]},
        ]
    }
    result, done = apply_mutation(pod(), compiled_mutation(spec))
    assert done.warnings == [
        "patches #1 not applied: the Pod would be invalid: metadata.labels[bad]: not a valid label"
    ]
    assert done.changes == ["patches #2 (1 ops)"]
    assert result["metadata"]["annotations"]["ok"] == "1" and "labels" not in result["metadata"]
