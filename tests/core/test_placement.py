"""function/core/placement.py: the spot modes, the ANDed node affinity, controllers and the split rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core import placement as p
from function.core import rules

SPOT_TOLERATION = {"key": "scheduling.cast.ai/spot", "operator": "Exists"}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "c"}], **spec}}


def twice(target: dict[str, Any], mode: p.SpotMode, scheme: p.LabelScheme = p.CASTAI) -> str | None:
    """Apply a mode, check that a second application is a no-op, return the first account."""
    first = p.apply_spot_mode(target, mode, scheme)
    after = copy.deepcopy(target)
    assert p.apply_spot_mode(target, mode, scheme) is None
    assert target == after
    return first


def test_only_spot_adds_toleration_and_node_selector() -> None:
    target = pod()
    assert twice(target, "only-spot") == (
        "toleration scheduling.cast.ai/spot Exists, nodeSelector scheduling.cast.ai/spot=true"
    )
    assert target["spec"]["tolerations"] == [SPOT_TOLERATION]
    assert target["spec"]["nodeSelector"] == {"scheduling.cast.ai/spot": "true"}
    assert "affinity" not in target["spec"]


def test_optional_spot_adds_the_toleration_only() -> None:
    target = pod(tolerations=[{"key": "other", "operator": "Exists"}])
    assert twice(target, "optional-spot") == "toleration scheduling.cast.ai/spot Exists"
    assert target["spec"]["tolerations"] == [{"key": "other", "operator": "Exists"}, SPOT_TOLERATION]
    assert "nodeSelector" not in target["spec"]


def test_preferred_spot_is_a_weight_one_preference_on_the_spot_label() -> None:
    target = pod()
    twice(target, "preferred-spot")
    assert target["spec"]["affinity"] == {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [{"key": "scheduling.cast.ai/spot", "operator": "Exists"}]
                    },
                }
            ]
        }
    }


def test_karpenter_preference_uses_in_because_on_demand_nodes_carry_the_key_too() -> None:
    target = pod()
    twice(target, "preferred-spot", p.KARPENTER)
    term = target["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["preference"]["matchExpressions"] == [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}
    ]


def test_an_existing_toleration_of_the_taint_is_not_duplicated() -> None:
    for existing in (
        {"key": "scheduling.cast.ai/spot", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
    ):
        target = pod(tolerations=[existing])
        assert twice(target, "optional-spot") is None
        assert target["spec"]["tolerations"] == [existing]


def test_a_toleration_for_another_effect_is_not_enough() -> None:
    no_execute = {"key": "scheduling.cast.ai/spot", "operator": "Exists", "effect": "NoExecute"}
    target = pod(tolerations=[no_execute])
    assert twice(target, "optional-spot") == "toleration scheduling.cast.ai/spot Exists"


def test_on_demand_on_a_tainting_scheme_only_removes_spot_marks() -> None:
    target = pod(
        tolerations=[SPOT_TOLERATION, {"key": "x", "operator": "Exists"}],
        nodeSelector={"scheduling.cast.ai/spot": "true", "zone": "a"},
    )
    assert twice(target, "on-demand") == (
        "removed toleration scheduling.cast.ai/spot, removed nodeSelector scheduling.cast.ai/spot"
    )
    assert target["spec"]["tolerations"] == [{"key": "x", "operator": "Exists"}]
    assert target["spec"]["nodeSelector"] == {"zone": "a"}
    assert "affinity" not in target["spec"]


def test_on_demand_removes_emptied_lists_and_maps() -> None:
    target = pod(tolerations=[SPOT_TOLERATION], nodeSelector={"scheduling.cast.ai/spot": "true"})
    twice(target, "preferred-spot")
    twice(target, "on-demand")
    assert target == pod()


def test_on_demand_on_an_untainted_scheme_excludes_spot_by_required_affinity() -> None:
    target = pod()
    account = twice(target, "on-demand", p.KARPENTER)
    assert account == "required affinity karpenter.sh/capacity-type NotIn [spot]"
    assert target["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]}
                ]
            }
        ]
    }


def test_on_demand_with_a_tolerate_everything_toleration_still_gets_the_affinity() -> None:
    target = pod(tolerations=[{"operator": "Exists"}])
    assert twice(target, "on-demand") == "required affinity scheduling.cast.ai/spot NotIn [true]"
    assert target["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_the_exclusion_is_anded_into_every_term_and_skips_empty_ones() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    terms = [
        {"matchExpressions": [zone]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        {},
        {"matchExpressions": []},
    ]
    target = pod(
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    )
    expression = p.EKS.not_spot_expression
    assert p.and_into_required_node_affinity(target, expression)
    assert not p.and_into_required_node_affinity(target, expression)
    got = target["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert got["nodeSelectorTerms"] == [
        {"matchExpressions": [zone, expression]},
        {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
            "matchExpressions": [expression],
        },
        {},
        {"matchExpressions": []},
    ]


@pytest.mark.parametrize(
    "affinity",
    [
        "junk",
        {"nodeAffinity": ["junk"]},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}},
    ],
)
def test_a_malformed_affinity_is_left_for_the_apiserver(affinity: object) -> None:
    target = pod(affinity=affinity)
    before = copy.deepcopy(target)
    assert not p.and_into_required_node_affinity(target, p.GKE.not_spot_expression)
    assert target == before


def test_a_malformed_spec_is_left_alone() -> None:
    for target in ({"spec": "x"}, {}, pod(tolerations="x", nodeSelector="y")):
        before = copy.deepcopy(target)
        for mode in p.SPOT_MODES:
            p.apply_spot_mode(target, mode, p.CASTAI)
        assert target == before


def test_aks_and_castai_taint_spot_nodes_the_others_do_not() -> None:
    assert {name for name, scheme in p.BUILTIN_SCHEMES.items() if scheme.tainted} == {"castai", "aks"}
    assert p.EKS.spot_value == "SPOT"
    assert p.GKE.key == "cloud.google.com/gke-spot"


def test_custom_scheme_rejects_invalid_labels() -> None:
    assert p.custom_scheme("example.com/pool", "spot", tainted=False).key == "example.com/pool"
    with pytest.raises(ValueError, match="not a valid node label key"):
        p.custom_scheme("Bad_Domain/pool", "spot", tainted=False)
    with pytest.raises(ValueError, match="not a valid node label value"):
        p.custom_scheme("pool", "spot!", tainted=False)
    with pytest.raises(ValueError, match="empty"):
        p.custom_scheme("pool", "", tainted=False)


def test_placement_of_reads_only_valid_values() -> None:
    assert p.placement_of({"metadata": {"labels": {p.PLACEMENT_LABEL: "spot"}}}) == "spot"
    assert p.placement_of({"metadata": {"labels": {p.PLACEMENT_LABEL: "on-demand"}}}) == "on-demand"
    assert p.placement_of({"metadata": {"labels": {p.PLACEMENT_LABEL: "SPOT"}}}) is None
    assert p.placement_of({}) is None


def test_partial_split_floor_rule() -> None:
    # n = 1 at 40 %: floor(0.4) = 0 -> on-demand; at 100 %: spot.
    assert p.partial_split(p.SiblingCounts(), 40) == "on-demand"
    assert p.partial_split(p.SiblingCounts(), 99) == "on-demand"
    assert p.partial_split(p.SiblingCounts(), 100) == "spot"
    # n = 3 at 40 %: floor(1.2) = 1 spot.
    assert p.partial_split(p.SiblingCounts(on_demand=2), 40) == "spot"
    assert p.partial_split(p.SiblingCounts(spot=1, on_demand=1), 40) == "on-demand"
    # unplaced siblings count towards n only
    assert p.partial_split(p.SiblingCounts(unplaced=4), 40) == "spot"
    assert p.partial_split(p.SiblingCounts(on_demand=9), 0) == "on-demand"


def test_sequential_scale_up_ends_at_exactly_the_floor() -> None:
    for percentage in (1, 25, 40, 50, 65, 99, 100):
        counts = p.SiblingCounts()
        for _ in range(10):
            if p.partial_split(counts, percentage) == "spot":
                counts = p.SiblingCounts(counts.spot + 1, counts.on_demand)
            else:
                counts = p.SiblingCounts(counts.spot, counts.on_demand + 1)
            assert counts.spot <= (counts.spot + counts.on_demand) * percentage // 100
        assert counts.spot == 10 * percentage // 100


def test_hash_split_is_deterministic_and_near_the_percentage() -> None:
    assert p.hash_split("abc", 40) == p.hash_split("abc", 40)
    assert p.hash_split("abc", 0) == "on-demand"
    assert p.hash_split("abc", 100) == "spot"
    spot = sum(p.hash_split(f"uid-{i}", 40) == "spot" for i in range(2000))
    assert 700 <= spot <= 900  # 40 % of 2000 = 800, +-100 is > 4 standard deviations


def test_scheduling_violations_catch_what_the_apiserver_rejects() -> None:
    good = pod(tolerations=[SPOT_TOLERATION], nodeSelector={"scheduling.cast.ai/spot": "true"})
    good["metadata"]["labels"] = {p.PLACEMENT_LABEL: "spot"}
    for mode in ("preferred-spot",):
        p.apply_spot_mode(good, mode, p.KARPENTER)
    p.and_into_required_node_affinity(good, p.KARPENTER.not_spot_expression)
    assert rules.scheduling_violations(good) == set()
    bad = pod(
        tolerations=[
            {"operator": "Exists", "value": "x"},
            {"operator": "Equal"},
            "x",
            {"key": "k", "operator": "Is"},
        ],
        nodeSelector={"bad key": "v", "k": "bad value!"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "k", "operator": "In", "values": []},
                                {"key": "k", "operator": "Exists", "values": ["a"]},
                                {"key": "k", "operator": "Gt", "values": ["1", "2"]},
                                {"key": "k", "operator": "Near"},
                                "x",
                            ]
                        }
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}],
            }
        },
    )
    bad["metadata"].update(labels={"a": 1}, annotations={"b": 2})
    assert len(rules.scheduling_violations(bad)) == 14
    empty_terms = pod(
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
        }
    )
    assert rules.scheduling_violations(empty_terms) == {
        "spec.affinity.nodeAffinity.required: needs at least one nodeSelectorTerm"
    }
    assert rules.scheduling_violations(pod(nodeSelector="x")) == {"spec.nodeSelector: must be a map"}


def test_anded_terms_share_no_lists() -> None:
    terms = [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"matchFields": []}]
    terms.append({"matchExpressions": [{"key": "b", "operator": "Exists"}]})
    required = {"nodeSelectorTerms": terms}
    target = pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}})
    expression = p.KARPENTER.not_spot_expression
    p.and_into_required_node_affinity(target, expression)
    first, third = terms[0]["matchExpressions"][-1], terms[2]["matchExpressions"][-1]
    assert first == third == expression
    assert first["values"] is not third["values"] and first["values"] is not expression["values"]
