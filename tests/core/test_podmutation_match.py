"""function/core/podmutation/match.py: the workload a Pod belongs to (controller chains, the
pod-template-hash fallback, odd references), toleration and label rules at their edges, excludes that
do not match, and the rank's own words. (The ranking table case by case, with every example of CAST
AI's documentation: tests/core/test_podmutation_core.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from function.core.podmutation.compiled import EXACT, NONE, REGEX, CompiledMutation
from function.core.podmutation.match import Rank, Workload, rank, workload_of
from tests.support import compiled_mutation

NS = "prod"
WEB = Workload(NS, "Deployment", "web")


def exact(value: str) -> dict[str, str]:
    return {"type": "exact", "value": value}


def regex(value: str) -> dict[str, str]:
    return {"type": "regex", "value": value}


def pod(labels: dict[str, str] | None = None, tolerations: list[Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "web-1", "labels": labels or {}}, "spec": {"tolerations": tolerations or []}}


# --- the workload -----------------------------------------------------------------------------------


def owned(*references: Any, **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"ownerReferences": list(references), **metadata}}


@pytest.mark.parametrize(
    ("target", "workload"),
    [
        ({"metadata": "not a map"}, Workload(NS, "Pod", "")),
        ({"metadata": {"generateName": "web-"}}, Workload(NS, "Pod", "web-")),
        ({"metadata": {}}, Workload(NS, "Pod", "")),
        (
            owned("junk", {"kind": "Job", "name": "j", "uid": "u", "controller": True}),
            Workload(NS, "Job", "j"),
        ),
        # A controller reference without a kind or a uid names no controller (function.core.pod):
        # the Pod is bare here as it is to spot.
        (owned({"name": "x", "controller": True}), Workload(NS, "Pod", "")),
        (owned({"kind": "Job", "controller": True}), Workload(NS, "Pod", "")),
        (
            owned(
                {"kind": "Job", "name": "batch-abc", "uid": "u", "controller": True},
                labels={"pod-template-hash": "abc"},
            ),
            Workload(NS, "Job", "batch-abc"),
        ),
        (
            owned(
                {"kind": "ReplicaSet", "name": "web-abc", "uid": "u", "controller": True},
                labels={"pod-template-hash": "zzz"},
            ),
            Workload(NS, "ReplicaSet", "web-abc"),
        ),
    ],
)
def test_workload_of(target: dict[str, Any], workload: Workload) -> None:
    assert workload_of(target, NS) == workload


def test_a_replicaset_the_view_knows_without_a_parent_falls_back_to_the_template_hash() -> None:
    target = owned(
        {"kind": "ReplicaSet", "name": "web-abc", "uid": "rs", "controller": True},
        labels={"pod-template-hash": "abc"},
    )
    assert workload_of(target, NS, lambda kind, name, uid: None) == WEB


def test_owner_chains_are_followed_eight_levels_at_most() -> None:
    def deeper(kind: str, name: str, uid: str) -> tuple[str, str, str]:
        level = int(name.removeprefix("level-"))
        return "Owner", f"level-{level + 1}", f"u{level + 1}"

    target = owned({"kind": "Owner", "name": "level-0", "uid": "u0", "controller": True})
    assert workload_of(target, NS, deeper) == Workload(NS, "Owner", "level-8")


# --- tolerations --------------------------------------------------------------------------------------


def toleration_rule(*rows: dict[str, Any], operator: str = "and") -> CompiledMutation:
    return compiled_mutation(
        {"filterV2": {"pod": {"tolerations": {"operator": operator, "matchers": list(rows)}}}}
    )


def test_a_toleration_without_operator_is_equal_and_without_value_is_empty() -> None:
    rule = toleration_rule(
        {"operatorMatcher": exact("Equal"), "valueMatcher": regex(""), "effectMatcher": regex("")}
    )
    assert rank(rule, WEB, pod(tolerations=[{"key": "gpu"}])) == Rank(tolerations=REGEX)
    exists = toleration_rule({"operatorMatcher": exact("Exists")})
    assert rank(exists, WEB, pod(tolerations=[{"key": "gpu", "operator": "Exists"}])) == Rank(
        tolerations=EXACT
    )
    assert rank(exists, WEB, pod(tolerations=[{"key": "gpu"}])) is None


def test_a_toleration_without_key_has_the_empty_key() -> None:
    rule = toleration_rule({"keyMatcher": regex("")})
    assert rank(rule, WEB, pod(tolerations=[{"operator": "Exists"}])) == Rank(tolerations=REGEX)


def test_a_malformed_toleration_does_not_hide_the_next() -> None:
    rule = toleration_rule({"keyMatcher": exact("gpu")})
    assert rank(rule, WEB, pod(tolerations=["junk", {"key": "gpu"}])) == Rank(tolerations=EXACT)


def test_and_needs_every_row_or_needs_one() -> None:
    rows = ({"keyMatcher": exact("gpu")}, {"keyMatcher": exact("spot")})
    tolerations = [{"key": "gpu"}]
    assert rank(toleration_rule(*rows), WEB, pod(tolerations=tolerations)) is None
    assert rank(toleration_rule(*rows, operator="or"), WEB, pod(tolerations=tolerations)) == Rank(
        tolerations=EXACT
    )


def test_rank_reads_labels_and_tolerations_from_any_pod_shape() -> None:
    rule = toleration_rule({"keyMatcher": exact("gpu")}, operator="or")
    assert rank(rule, WEB, {"metadata": "x", "spec": "y"}) is None
    assert rank(compiled_mutation({}), WEB, {"metadata": "x", "spec": "y"}) == Rank()


# --- labels and excludes --------------------------------------------------------------------------------


def test_without_a_label_rule_there_are_no_label_hits() -> None:
    assert rank(
        compiled_mutation({"filterV2": {"workload": {"kinds": [exact("Deployment")]}}}), WEB, pod()
    ) == Rank(kinds=EXACT)


def test_an_exclude_that_matches_only_in_part_does_not_exclude() -> None:
    exclude = {"operator": "and", "matchers": [{"keyMatcher": exact("a")}, {"keyMatcher": exact("b")}]}
    spec = {"filterV2": {"pod": {"excludeLabels": exclude}}}
    assert rank(compiled_mutation(spec), WEB, pod({"a": "1"})) == Rank()
    assert rank(compiled_mutation(spec), WEB, pod({"a": "1", "b": "2"})) is None


def test_an_exclude_kind_that_does_not_match_does_not_exclude() -> None:
    spec = {"filterV2": {"workload": {"excludeKinds": [exact("Job")]}}}
    assert rank(compiled_mutation(spec), WEB, pod()) == Rank()
    assert rank(compiled_mutation(spec), Workload(NS, "Job", "j"), pod()) is None


def test_the_rank_says_how_each_dimension_matched() -> None:
    assert Rank(names=REGEX, labels=EXACT, label_hits=2, tolerations=NONE).describe() == (
        "names regex, labels exact (2), tolerations -, kinds -, namespaces -"
    )


def test_a_toleration_is_matched_on_its_value_and_effect() -> None:
    rule = toleration_rule({"valueMatcher": exact("v"), "effectMatcher": exact("NoSchedule")})
    matching = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert rank(rule, WEB, pod(tolerations=[matching])) == Rank(tolerations=EXACT)
    assert rank(rule, WEB, pod(tolerations=[{**matching, "effect": "NoExecute"}])) is None


def test_a_row_without_matchers_matches_any_toleration() -> None:
    rule = toleration_rule({})
    assert rank(rule, WEB, pod(tolerations=[{"key": "k"}])) == Rank(tolerations=EXACT)
    assert rank(rule, WEB, pod()) is None


def test_the_owner_lookup_gets_the_references_kind_name_and_uid() -> None:
    asked: list[tuple[str, str, str]] = []

    def lookup(kind: str, name: str, uid: str) -> None:
        asked.append((kind, name, uid))

    workload_of(owned({"kind": "ReplicaSet", "name": "web-abc", "uid": "u", "controller": True}), NS, lookup)
    assert asked[0] == ("ReplicaSet", "web-abc", "u")
