"""function/core/placement.py: the spot modes (what each does and says), the ANDed node affinity,
controllers, the split rules (clamping and the stable hash), malformed parts left alone, and the
apiserver's rules for the fields placement writes (label limits, tolerations, affinities) word for
word, as the proof and the decision reasons rely on them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core import placement as p
from function.core import rules

SPOT_TOLERATION = {"key": "scheduling.cast.ai/spot", "operator": "Exists"}
CASTAI_KEY = "scheduling.cast.ai/spot"
REQUIRED = "spec.affinity.nodeAffinity.required.terms"
PREFERRED = "spec.affinity.nodeAffinity.preferred"


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "c"}], **spec}}


def violations(**spec: Any) -> set[str]:
    return rules.scheduling_violations(pod(**spec))


def required(*expressions: object) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
            }
        }
    }


def preferred(*terms: object) -> dict[str, Any]:
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": list(terms)}}


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


# --- label keys and values at their limits ---------------------------------------------------------

PREFIX_PROBLEM = "the prefix must be a DNS subdomain of at most 253 characters"
NAME_PROBLEM = "the name must be 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
VALUE_PROBLEM = "a label value is at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("a" * 253 + "/x", None),
        ("a" * 254 + "/x", PREFIX_PROBLEM),
        ("/x", PREFIX_PROBLEM),
        ("Example.com/x", PREFIX_PROBLEM),
        ("x" * 63, None),
        ("example.com/" + "x" * 63, None),
        ("x" * 64, NAME_PROBLEM),
        ("example.com/", NAME_PROBLEM),
        ("", NAME_PROBLEM),
        ("-x", NAME_PROBLEM),
    ],
)
def test_label_key_problem_at_its_limits(key: str, problem: str | None) -> None:
    assert rules.label_key_problem(key) == problem


@pytest.mark.parametrize(
    ("value", "problem"),
    [("v" * 63, None), ("", None), ("v" * 64, VALUE_PROBLEM), ("a b", VALUE_PROBLEM)],
)
def test_label_value_problem_at_its_limits(value: str, problem: str | None) -> None:
    assert rules.label_value_problem(value) == problem


def test_custom_scheme_is_what_was_asked_and_not_label_only_by_default() -> None:
    assert p.custom_scheme("example.com/pool", "spot", tainted=True) == p.LabelScheme(
        "custom", "example.com/pool", "spot", tainted=True, label_only_on_spot=False
    )
    assert p.custom_scheme("example.com/pool", "spot", False, label_only_on_spot=True) == p.LabelScheme(
        "custom", "example.com/pool", "spot", tainted=False, label_only_on_spot=True
    )


def test_custom_scheme_names_an_empty_value() -> None:
    with pytest.raises(ValueError) as raised:
        p.custom_scheme("example.com/pool", "", tainted=True)
    assert str(raised.value) == "'' is not a valid node label value: it is empty"


# --- scheduling_violations, word for word ----------------------------------------------------------


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "k", "value": "v"},
        {"key": "k", "operator": "", "value": "v"},
        {"key": "k", "operator": None},
        {"key": "k", "operator": "Equal", "value": "v"},
        {"operator": "Exists"},
    ],
)
def test_tolerations_the_apiserver_accepts(toleration: dict[str, Any]) -> None:
    assert violations(tolerations=[toleration]) == set()


def test_toleration_problems_are_named_by_index() -> None:
    assert violations(
        tolerations=[
            {"key": "k", "operator": "Exists"},
            {"key": "k", "operator": "Exists", "value": "v"},
            {"operator": "Equal", "value": "v"},
            {"key": "k", "operator": "Maybe"},
            "not a map",
        ]
    ) == {
        "spec.tolerations[1]: Exists takes no value",
        "spec.tolerations[2]: an empty key needs operator Exists",
        "spec.tolerations[3]: operator 'Maybe' is not valid",
        "spec.tolerations[4]: must be a map",
    }


@pytest.mark.parametrize(
    ("requirement", "problem"),
    [
        ({"key": "k", "operator": "In", "values": ["a"]}, None),
        ({"key": "k", "operator": "In", "values": []}, "In needs values"),
        ({"key": "k", "operator": "NotIn"}, "NotIn needs values"),
        ({"key": "k", "operator": "Exists"}, None),
        ({"key": "k", "operator": "Exists", "values": ["a"]}, "Exists takes no values"),
        ({"key": "k", "operator": "DoesNotExist"}, None),
        ({"key": "k", "operator": "DoesNotExist", "values": ["a"]}, "DoesNotExist takes no values"),
        ({"key": "k", "operator": "Gt", "values": ["1"]}, None),
        ({"key": "k", "operator": "Lt", "values": ["1"]}, None),
        ({"key": "k", "operator": "Gt", "values": ["1", "2"]}, "Gt needs exactly one value"),
        ({"key": "k", "operator": "Lt", "values": None}, "Lt needs exactly one value"),
        ({"key": "k", "operator": "gt", "values": ["1"]}, "operator 'gt' is not valid"),
        ({"key": "k"}, "operator None is not valid"),
        ({"key": "bad key", "operator": "Exists"}, "key 'bad key' is not a valid label key"),
        ({"key": 5, "operator": "Exists"}, "key 5 is not a valid label key"),
        ("not a map", "must be a map"),
    ],
)
def test_node_selector_requirements_in_both_affinities(requirement: object, problem: str | None) -> None:
    """The same rule, named by where it sits, in a required term and in a preferred term."""
    expected = {f"{REQUIRED}[0].matchExpressions[0]: {problem}"} if problem else set()
    assert violations(affinity=required(requirement)) == expected
    term = {"weight": 10, "preference": {"matchExpressions": [requirement]}}
    expected = {f"{PREFERRED}[0].matchExpressions[0]: {problem}"} if problem else set()
    assert violations(affinity=preferred(term)) == expected


def test_every_problem_is_kept_not_just_the_last() -> None:
    bad = {"key": "k", "operator": "Maybe"}
    affinity = {
        "nodeAffinity": {
            **required(bad)["nodeAffinity"],
            **preferred(
                {"weight": 1, "preference": {"matchExpressions": [bad]}},
                {"weight": 1, "preference": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}},
            )["nodeAffinity"],
        }
    }
    assert violations(tolerations=["x"], affinity=affinity) == {
        "spec.tolerations[0]: must be a map",
        f"{REQUIRED}[0].matchExpressions[0]: operator 'Maybe' is not valid",
        f"{PREFERRED}[0].matchExpressions[0]: operator 'Maybe' is not valid",
    }


@pytest.mark.parametrize(
    ("weight", "valid"), [(1, True), (100, True), (0, False), (101, False), ("5", False)]
)
def test_preferred_weight_is_1_to_100(weight: object, valid: bool) -> None:
    term = {"weight": weight, "preference": {"matchExpressions": []}}
    expected = set() if valid else {f"{PREFERRED}[0]: weight must be 1-100"}
    assert violations(affinity=preferred(term)) == expected


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        (preferred("not a map"), {f"{PREFERRED}[0]: weight must be 1-100"}),
        (preferred({"weight": 1, "preference": "not a map"}), set()),
        (preferred({"weight": 1, "preference": {"matchExpressions": "ab"}}), set()),
        (preferred({"weight": 1}), set()),
        (
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": ["not a map"]}},
            {"spec.affinity.nodeAffinity.required: needs at least one nodeSelectorTerm"},
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["x"]}
                }
            },
            set(),
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": "ab"}]
                    }
                }
            },
            set(),
        ),
    ],
)
def test_malformed_affinity_parts_are_read_without_failing(affinity: object, expected: set[str]) -> None:
    """Shapes the apiserver's decoder would refuse still get an answer (the proof compares sets)."""
    assert violations(affinity=affinity) == expected


# --- what the spot modes do and say ----------------------------------------------------------------


def test_tolerates_spot_accepts_the_empty_effect_and_the_empty_key() -> None:
    for toleration in (
        {"key": CASTAI_KEY, "operator": "Exists", "effect": ""},
        {"key": "", "operator": "Exists"},
        {"operator": "Exists", "effect": "NoSchedule"},
    ):
        assert p.tolerates_spot(pod(tolerations=[toleration]), p.CASTAI), toleration
    assert not p.tolerates_spot(pod(tolerations=[{"key": "other", "operator": "Exists"}]), p.CASTAI)


def test_tolerates_spot_on_a_pod_without_a_spec() -> None:
    assert p.tolerates_spot({"metadata": {}}, p.CASTAI) is False
    assert p.tolerates_spot({"spec": "not a map"}, p.CASTAI) is False


def test_malformed_tolerations_are_left_for_the_apiserver() -> None:
    target = pod(tolerations="not a list")
    assert p.apply_spot_mode(target, "optional-spot", p.CASTAI) is None
    assert target == pod(tolerations="not a list")


def test_an_empty_node_selector_is_the_users_to_keep() -> None:
    modes: tuple[p.SpotMode, ...] = ("optional-spot", "preferred-spot")
    for mode in modes:
        target = pod(nodeSelector={})
        p.apply_spot_mode(target, mode, p.CASTAI)
        assert target["spec"]["nodeSelector"] == {}, mode


def test_preferred_spot_says_what_it_added() -> None:
    target = pod()
    assert p.apply_spot_mode(target, "preferred-spot", p.CASTAI) == (
        f"toleration {CASTAI_KEY} Exists, preferred affinity {CASTAI_KEY} (weight 1)"
    )


@pytest.mark.parametrize(
    "affinity",
    [
        "not a map",
        {"nodeAffinity": "not a map"},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": "not a list"}},
    ],
)
def test_preferred_spot_leaves_a_malformed_affinity_alone(affinity: object) -> None:
    target = pod(affinity=copy.deepcopy(affinity))
    assert p.apply_spot_mode(target, "preferred-spot", p.CASTAI) == f"toleration {CASTAI_KEY} Exists"
    assert target["spec"]["affinity"] == affinity


def test_on_demand_removes_only_the_spot_preference_and_says_so() -> None:
    other = {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}
    target = pod(affinity=preferred(p.CASTAI.preferred_spot_term, other))
    assert p.apply_spot_mode(target, "on-demand", p.CASTAI) == "removed preferred spot affinity"
    assert target["spec"]["affinity"] == preferred(other)


def test_on_demand_beside_another_affinity_kind_adds_the_exclusion() -> None:
    pod_affinity: dict[str, Any] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
    target = pod(affinity=copy.deepcopy(pod_affinity))
    assert p.apply_spot_mode(target, "on-demand", p.KARPENTER) == (
        "required affinity karpenter.sh/capacity-type NotIn [spot]"
    )
    assert target["spec"]["affinity"] == {**pod_affinity, **required(p.KARPENTER.not_spot_expression)}


# --- and_into_required_node_affinity --------------------------------------------------------------

EXPRESSION: dict[str, Any] = {"key": "pool", "operator": "NotIn", "values": ["spot"]}


@pytest.mark.parametrize(
    "target",
    [
        {"metadata": {}},
        pod(affinity="not a map"),
        pod(affinity={"nodeAffinity": []}),
        pod(affinity=required(EXPRESSION)),
    ],
)
def test_and_into_required_returns_false_when_nothing_changed(target: dict[str, Any]) -> None:
    before = copy.deepcopy(target)
    assert p.and_into_required_node_affinity(target, EXPRESSION) is False
    assert target == before


def test_the_created_requirement_shares_nothing_with_the_callers() -> None:
    expression = copy.deepcopy(EXPRESSION)
    target = pod()
    assert p.and_into_required_node_affinity(target, expression) is True
    expression["values"].append("preemptible")
    assert target["spec"]["affinity"] == required(EXPRESSION)


def test_a_term_with_malformed_expressions_does_not_stop_the_next_term() -> None:
    zone = {"key": "zone", "operator": "Exists"}
    terms = [{"matchExpressions": "not a list"}, {"matchExpressions": [zone]}]
    target = pod(
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    )
    assert p.and_into_required_node_affinity(target, EXPRESSION) is True
    written = target["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert written["nodeSelectorTerms"] == [
        {"matchExpressions": "not a list"},
        {"matchExpressions": [zone, EXPRESSION]},
    ]


# --- the split rules -------------------------------------------------------------------------------


@pytest.mark.parametrize("percentage", [0, -20])
def test_partial_split_at_or_below_zero_never_goes_spot(percentage: int) -> None:
    assert p.partial_split(p.SiblingCounts(on_demand=199), percentage) == p.ON_DEMAND


@pytest.mark.parametrize(
    ("key", "percentage", "placement"),
    [
        ("uid-0", 50, p.SPOT),  # bucket 392
        ("uid-2", 50, p.ON_DEMAND),  # bucket 9459
        ("uid-4", 50, p.ON_DEMAND),  # bucket 5262
        ("uid-192", 50, p.ON_DEMAND),  # bucket 5000: the boundary is not spot
        ("uid-192", 51, p.SPOT),
        ("uid-38", 52, p.ON_DEMAND),  # bucket 5214
        ("uid-38", 53, p.SPOT),
    ],
)
def test_hash_split_is_pinned(key: str, percentage: int, placement: str) -> None:
    """The buckets are part of the contract: a change would move replicas on upgrade."""
    assert p.hash_split(key, percentage) == placement
