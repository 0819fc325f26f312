"""function/core/mutators/spot.py, answer by answer: every reason word for word, the namespace a Pod is
judged in, selector terms reading the namespace and its labels, the plug-in as the registry builds
it, and the records the namespace watch keeps."""

from __future__ import annotations

from typing import Any

import pytest

from function.contract import FUNCTION_NAMESPACE
from function.core.configtypes import OnInvalidAnnotation
from function.core.mutators.base import Action, MutatorResult
from function.core.mutators.registry import Neighbours, Settings
from function.core.mutators.spot import (
    LIFECYCLE,
    PLUGIN,
    SPOT_PERCENTAGE,
    NamespaceRecord,
    SpotConfig,
    namespace_name,
    sibling_counts,
    slim_namespace,
)
from function.core.placement import DECISION_ANNOTATION, PLACEMENT_LABEL, SiblingCounts
from function.core.pod import Owner
from function.core.view import PodRecord
from tests.spot_support import RS_UID, Ctx, make_pod, owner, run, spot_mutator, view_with
from tests.support import PodGroupView

TOLERATION = "toleration scheduling.cast.ai/spot Exists"
SELECTOR = "nodeSelector scheduling.cast.ai/spot=true"


def rs_pod(**kwargs: Any) -> dict[str, Any]:
    return make_pod(owner(), **kwargs)


# --- reasons, word for word -----------------------------------------------------------------------


def test_a_spot_placement_says_every_change_in_order() -> None:
    result, _ = run(spot_mutator(preset="allSpot"), rs_pod())
    assert result.reason == (
        f"spot: rule defaultToSpot; {TOLERATION}, {SELECTOR}, label {PLACEMENT_LABEL}=spot, "
        "controller.kubernetes.io/pod-deletion-cost=-100"
    )


def test_a_placed_pod_with_nothing_left_to_change_says_so() -> None:
    _, placed = run(spot_mutator(preset="allSpot"), rs_pod())
    result = spot_mutator(preset="allSpot").mutate(placed, Ctx())
    assert result == MutatorResult.unchanged(
        f"spot: already placed ({PLACEMENT_LABEL}=spot); nothing to change"
    )


def test_a_daemonset_pod_that_tolerates_spot_is_left_as_it_is() -> None:
    pod = make_pod(owner("DaemonSet", "agent"), tolerations=[{"operator": "Exists"}])
    result, after = run(spot_mutator(preset="allSpot"), pod)
    assert result == MutatorResult.unchanged("DaemonSet Pod already tolerates spot")
    assert after == pod


def test_a_daemonset_pod_gets_the_toleration_only() -> None:
    result, after = run(spot_mutator(preset="allSpot"), make_pod(owner("DaemonSet", "agent")))
    assert result == MutatorResult.mutated(f"DaemonSet Pod: spot toleration only ({TOLERATION})")
    assert "nodeSelector" not in after["spec"]


def test_a_bad_lifecycle_under_warn_names_value_accepted_and_consequence() -> None:
    pod = rs_pod(annotations={LIFECYCLE: "sometimes"})
    result, after = run(spot_mutator(deny_invalid=False, preset="allSpot"), pod)
    assert result.action is Action.unchanged
    assert result.reason == (
        f'annotation {LIFECYCLE}: "sometimes" is not valid; accepted: "spot" or "on-demand"; Pod not placed'
    )
    assert result.warnings == (
        f'castslice: {LIFECYCLE}="sometimes" ignored, Pod not placed; use "spot" or "on-demand"',
    )
    assert after == pod


def test_a_bad_percentage_under_deny_names_what_is_accepted() -> None:
    result, _ = run(spot_mutator(preset="allSpot"), rs_pod(annotations={SPOT_PERCENTAGE: "100"}))
    assert result == MutatorResult.denied(
        f'castslice: annotation {SPOT_PERCENTAGE}: "100" is not valid; accepted: a whole number from 1 to 99'
    )


def test_no_rule_and_no_default_leaves_the_pod_and_says_why() -> None:
    result, _ = run(spot_mutator(defaultToSpot=False), rs_pod())
    assert result == MutatorResult.unchanged("no rule matched and defaultToSpot is false: left alone")


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": "not a map", "spec": {}},
            "a Pod template (no name or generateName): placed per Pod when each is created",
        ),
        (make_pod(), "bare Pod (no controller): left alone (placeBarePods: false)"),
    ],
)
def test_pods_left_alone_say_why(pod: dict[str, Any], why: str) -> None:
    result, after = run(spot_mutator(preset="allSpot"), pod)
    assert result == MutatorResult.unchanged(why)
    assert after == pod


def test_malformed_metadata_without_a_request_namespace_is_a_template() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": "not a map", "spec": {}}
    result, _ = run(spot_mutator(preset="allSpot"), pod, Ctx(namespace=""))
    assert result == MutatorResult.unchanged(
        "a Pod template (no name or generateName): placed per Pod when each is created"
    )


def test_a_pod_with_its_own_node_selector_is_ignored_when_asked() -> None:
    mutator = spot_mutator(preset="allSpot", ignorePodsWithNodeSelectorsAffinities=True)
    result, _ = run(mutator, rs_pod(nodeSelector={"zone": "a"}))
    assert result == MutatorResult.unchanged(
        "has its own nodeSelector or node affinity (ignorePodsWithNodeSelectorsAffinities)"
    )


def test_a_spec_that_is_not_a_map_is_left_for_the_apiserver_but_marked() -> None:
    pod = rs_pod()
    pod["spec"] = "not a map"
    result, after = run(spot_mutator(preset="allSpot"), pod)
    assert result.reason == (
        f"spot: rule defaultToSpot; label {PLACEMENT_LABEL}=spot, "
        "controller.kubernetes.io/pod-deletion-cost=-100"
    )
    assert after["spec"] == "not a map"


def test_the_kube_system_preset_names_itself() -> None:
    result, _ = run(
        spot_mutator(preset="allSpotExceptKubeSystem"),
        make_pod(owner(), namespace="kube-system"),
        Ctx(namespace="kube-system"),
    )
    assert result.reason.startswith("on-demand: rule preset allSpotExceptKubeSystem (kube-system); ")


def test_one_percent_of_a_replicaset_is_a_split_not_all_spot() -> None:
    result, pod = run(spot_mutator(spotPercentageOfReplicaSet=1), rs_pod(), Ctx(cluster=view_with([])))
    assert result.reason.startswith("on-demand: rule spotPercentageOfReplicaSet=1 for ReplicaSet ")
    assert pod["metadata"]["labels"] == {PLACEMENT_LABEL: "on-demand"}


# --- the namespace a Pod is judged in ----------------------------------------------------------------


def test_without_a_request_namespace_the_pods_own_namespace_counts() -> None:
    pod = make_pod(owner(), namespace=FUNCTION_NAMESPACE)
    result, _ = run(spot_mutator(preset="allSpot", own_namespace=FUNCTION_NAMESPACE), pod, Ctx(namespace=""))
    assert result == MutatorResult.unchanged(f"namespace {FUNCTION_NAMESPACE} is the webhook's own")


@pytest.mark.parametrize(
    "term",
    [{"namespaces": ["shop"]}, {"namespaceSelector": {"matchLabels": {"team": "a"}}}],
)
def test_selector_terms_read_the_namespace_and_its_labels(term: dict[str, Any]) -> None:
    ctx = Ctx(namespace="shop", cluster=view_with([], namespaces={"shop": {"team": "a"}}))
    pod = make_pod(owner(), namespace="shop")
    ignored, _ = run(spot_mutator(preset="allSpot", ignorePods=[term]), pod, ctx)
    assert ignored == MutatorResult.unchanged("matches ignorePods[0]")
    forced, _ = run(spot_mutator(preset="allSpot", forcePodsToOnDemand=[term]), pod, ctx)
    assert forced.reason.startswith("on-demand: rule forcePodsToOnDemand[0]; ")
    to_spot, _ = run(spot_mutator(defaultToSpot=False, forcePodsToSpot=[term]), pod, ctx)
    assert to_spot.reason.startswith("spot: rule forcePodsToSpot[0]; ")


# --- the plug-in as the registry builds it ----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "action"),
    [(OnInvalidAnnotation.deny, Action.denied), (OnInvalidAnnotation.warn, Action.unchanged)],
)
def test_the_plugin_follows_the_invalid_annotations_policy(
    policy: OnInvalidAnnotation, action: Action
) -> None:
    mutator = PLUGIN.build(SpotConfig(enabled=True, preset="allSpot"), Settings(policy), Neighbours())
    result, _ = run(mutator, rs_pod(annotations={LIFECYCLE: "sometimes"}))  # type: ignore[arg-type]
    assert result.action is action


def test_the_plugin_leaves_the_webhooks_own_namespace_alone() -> None:
    mutator = PLUGIN.build(SpotConfig(enabled=True, preset="allSpot"), Settings(), Neighbours())
    pod = make_pod(owner(), namespace=FUNCTION_NAMESPACE)
    result = mutator.mutate(pod, Ctx(namespace=FUNCTION_NAMESPACE))
    assert result == MutatorResult.unchanged(f"namespace {FUNCTION_NAMESPACE} is the webhook's own")


# --- counting siblings ------------------------------------------------------------------------------


def record(n: int, placement: str) -> PodRecord:
    return PodRecord(
        "default", f"web-{n}", f"pod-{n}", Owner(RS_UID, "ReplicaSet", "web"), placement, False, f"d-{n}"
    )


def test_sibling_counts_count_every_sibling_past_a_foreign_record() -> None:
    members = {
        "junk": ("not", "a", "PodRecord"),
        **{
            f"pod-{n}": record(n, placement)
            for n, placement in enumerate(["spot", "spot", "", "", "on-demand"])
        },
    }
    assert sibling_counts(PodGroupView(RS_UID, members), RS_UID) == (
        SiblingCounts(spot=2, on_demand=1, unplaced=2),
        0,
    )


# --- what the namespace watch keeps -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kept"),
    [
        (
            {"metadata": {"uid": "u", "name": "shop", "labels": {"team": "a"}}},
            NamespaceRecord("u", "shop", (("team", "a"),)),
        ),
        ({"metadata": {"uid": "u", "name": 5, "labels": ["team"]}}, NamespaceRecord("u", "", ())),
        ({"metadata": "not a map"}, None),
        ({"metadata": {"uid": 5, "name": "shop"}}, None),
        ({"metadata": {"uid": "", "name": "shop"}}, None),
    ],
)
def test_slim_namespace(obj: dict[str, Any], kept: NamespaceRecord | None) -> None:
    assert slim_namespace(obj) == kept


def test_namespace_name_of_a_foreign_record_is_empty() -> None:
    assert namespace_name(NamespaceRecord("u", "shop", ())) == "shop"
    assert namespace_name(("u", "shop", ())) == ""


def test_a_request_without_uid_writes_no_decision_annotation() -> None:
    _, pod = run(spot_mutator(preset="allSpot"), rs_pod(), Ctx(uid=""))
    assert DECISION_ANNOTATION not in pod["metadata"].get("annotations", {})
