"""function/core/mutators/spot.py, the spot placement mutator: presets, every rule and every
precedence step, overrides, bad input, every reason word for word, the namespace a Pod is judged in,
the plug-in as the registry builds it, and the records its watches keep."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from function.contract import FUNCTION_NAMESPACE
from function.core.configtypes import OnInvalidAnnotation
from function.core.mutators.base import Action, MutatorResult
from function.core.mutators.registry import Neighbours, Settings
from function.core.mutators.spot import (
    LIFECYCLE,
    PLUGIN,
    POD_DELETION_COST,
    SPOT_PERCENTAGE,
    NamespaceRecord,
    SpotConfig,
    namespace_name,
    sibling_counts,
    slim_namespace,
)
from function.core.placement import DECISION_ANNOTATION, PLACEMENT_LABEL, LedgerEntry, SiblingCounts
from function.core.pod import Owner
from function.core.view import PodRecord, slim_pod
from tests.support import PodGroupView
from tests.support.spot import (
    NO_VIEW,
    RS_UID,
    Ctx,
    make_pod,
    owner,
    placement,
    run,
    siblings,
    spot_mutator,
    view_with,
)

SPOT_TOLERATION = {"key": "scheduling.cast.ai/spot", "operator": "Exists"}
SPOT_SELECTOR = {"scheduling.cast.ai/spot": "true"}
TOLERATION = "toleration scheduling.cast.ai/spot Exists"
SELECTOR = "nodeSelector scheduling.cast.ai/spot=true"


def rs_pod(**kwargs: Any) -> dict[str, Any]:
    return make_pod(owner(), **kwargs)


# --- what a placement writes ----------------------------------------------------------------------


def test_all_spot_writes_toleration_selector_label_decision_and_cost() -> None:
    result, pod = run(spot_mutator(preset="allSpot"), rs_pod())
    assert result.action.value == "mutated"
    assert result.reason.startswith("spot: rule defaultToSpot; ")
    assert pod["spec"]["tolerations"] == [SPOT_TOLERATION]
    assert pod["spec"]["nodeSelector"] == SPOT_SELECTOR
    assert pod["metadata"]["labels"] == {PLACEMENT_LABEL: "spot"}
    assert pod["metadata"]["annotations"] == {DECISION_ANNOTATION: "req-1", POD_DELETION_COST: "-100"}


def test_on_demand_with_castai_labels_needs_no_affinity_but_karpenter_does() -> None:
    annotations = {LIFECYCLE: "on-demand"}
    _, castai = run(spot_mutator(), rs_pod(annotations=annotations))
    assert "tolerations" not in castai["spec"] and "affinity" not in castai["spec"]
    assert castai["metadata"]["annotations"][POD_DELETION_COST] == "100"
    _, karpenter = run(spot_mutator(labelScheme="karpenter"), rs_pod(annotations=annotations))
    required = karpenter["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]}]}
    ]


@pytest.mark.parametrize(
    ("scheme", "key", "value"),
    [
        ("karpenter", "karpenter.sh/capacity-type", "spot"),
        ("gke", "cloud.google.com/gke-spot", "true"),
        ("eks", "eks.amazonaws.com/capacityType", "SPOT"),
        ("aks", "kubernetes.azure.com/scalesetpriority", "spot"),
    ],
)
def test_each_label_scheme_selects_its_own_label(scheme: str, key: str, value: str) -> None:
    _, pod = run(spot_mutator(labelScheme=scheme), rs_pod())
    assert pod["spec"]["nodeSelector"] == {key: value}
    assert pod["spec"]["tolerations"] == [{"key": key, "operator": "Exists"}]


def test_custom_label_scheme() -> None:
    custom = {"key": "example.com/capacity", "spotValue": "cheap", "tainted": False}
    _, pod = run(spot_mutator(labelScheme="custom", customLabelScheme=custom), rs_pod())
    assert pod["spec"]["nodeSelector"] == {"example.com/capacity": "cheap"}


def test_a_user_deletion_cost_is_kept_and_costs_can_be_switched_off() -> None:
    _, pod = run(spot_mutator(), rs_pod(annotations={POD_DELETION_COST: "7"}))
    assert pod["metadata"]["annotations"][POD_DELETION_COST] == "7"
    _, pod = run(spot_mutator(podDeletionCost=None), rs_pod())
    assert POD_DELETION_COST not in pod["metadata"]["annotations"]


def test_no_request_uid_means_no_decision_annotation() -> None:
    _, pod = run(spot_mutator(podDeletionCost=None), rs_pod(), Ctx(uid=""))
    assert "annotations" not in pod["metadata"]


# --- what is left alone ---------------------------------------------------------------------------


def unchanged(mutator: Any, pod: dict[str, Any], ctx: Ctx | None = None) -> str:
    result, after = run(mutator, pod, ctx)
    assert result.action.value == "unchanged", result
    assert after == pod
    return str(result.reason)


def test_bare_pods_are_left_alone_unless_configured() -> None:
    assert "bare Pod" in unchanged(spot_mutator(), make_pod())
    result, pod = run(spot_mutator(placeBarePods=True), make_pod())
    assert placement(pod) == "spot" and result.reason.startswith("spot: rule defaultToSpot")


def test_bare_pod_placed_under_partial_spot_uses_default_not_percentage() -> None:
    _, pod = run(spot_mutator(placeBarePods=True, preset="partialSpot"), make_pod())
    assert placement(pod) == "spot"


def test_the_webhook_namespace_is_left_alone() -> None:
    reason = unchanged(
        spot_mutator(own_namespace="castslice-system"), rs_pod(), Ctx(namespace="castslice-system")
    )
    assert "webhook's own" in reason


def test_a_pod_template_is_left_alone_even_with_a_controller() -> None:
    template = rs_pod()
    del template["metadata"]["generateName"]
    assert "a Pod template" in unchanged(spot_mutator(), template)
    template["metadata"]["name"] = "web-0"  # a StatefulSet's Pod has a name: placed
    assert decide(spot_mutator(), template)[0] == "spot"


def test_only_create_is_placed() -> None:
    assert "UPDATE" in unchanged(spot_mutator(), rs_pod(), Ctx(operation="UPDATE"))


def test_topology_spread_on_the_lifecycle_key_is_left_alone() -> None:
    spread = [{"maxSkew": 1, "topologyKey": "scheduling.cast.ai/spot", "whenUnsatisfiable": "DoNotSchedule"}]
    assert "spreads itself" in unchanged(spot_mutator(), rs_pod(topologySpreadConstraints=spread))
    other = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]
    _, pod = run(spot_mutator(), rs_pod(topologySpreadConstraints=other))
    assert placement(pod) == "spot"


def test_daemonset_pods_get_the_toleration_only() -> None:
    pod = make_pod(owner("DaemonSet", "agent", "ds-1"))
    result, after = run(spot_mutator(preset="partialSpot"), pod)
    assert after["spec"]["tolerations"] == [SPOT_TOLERATION]
    assert "nodeSelector" not in after["spec"] and "labels" not in after["metadata"]
    assert result.reason.startswith("DaemonSet Pod: spot toleration only")
    # even when a force-on-demand rule matches it: it must run on every node
    _, forced = run(spot_mutator(forcePodsToOnDemand=[{"namespaces": ["default"]}]), pod)
    assert forced["spec"]["tolerations"] == [SPOT_TOLERATION]


def test_ignore_pods_with_node_selectors_affinities() -> None:
    mutator = spot_mutator(ignorePodsWithNodeSelectorsAffinities=True)
    assert "own nodeSelector" in unchanged(mutator, rs_pod(nodeSelector={"zone": "a"}))
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert "own nodeSelector" in unchanged(mutator, rs_pod(affinity=affinity))
    _, pod = run(mutator, rs_pod(affinity={"podAntiAffinity": {}}))
    assert placement(pod) == "spot"
    _, pod = run(spot_mutator(), rs_pod(nodeSelector={"zone": "a"}))
    assert pod["spec"]["nodeSelector"] == {"zone": "a", **SPOT_SELECTOR}


def test_default_to_spot_false_leaves_unmatched_pods_alone() -> None:
    assert "defaultToSpot is false" in unchanged(spot_mutator(defaultToSpot=False), rs_pod())


# --- precedence: ignore > daemonset > force on-demand > force spot > annotation > percentage > default


APP_WEB = {"labelSelector": {"matchLabels": {"app": "web"}}}


def decide(mutator: Any, pod: dict[str, Any], ctx: Ctx | None = None) -> tuple[str | None, str]:
    result, after = run(mutator, pod, ctx)
    return placement(after), str(result.reason)


def test_ignore_beats_force_on_demand() -> None:
    mutator = spot_mutator(ignorePods=[APP_WEB], forcePodsToOnDemand=[APP_WEB])
    assert "ignorePods[0]" in unchanged(mutator, rs_pod(labels={"app": "web"}))


def test_force_on_demand_beats_force_spot() -> None:
    mutator = spot_mutator(forcePodsToOnDemand=[APP_WEB], forcePodsToSpot=[APP_WEB])
    assert decide(mutator, rs_pod(labels={"app": "web"})) == (
        "on-demand",
        "on-demand: rule forcePodsToOnDemand[0]; label castops.io/placement=on-demand, "
        "controller.kubernetes.io/pod-deletion-cost=100",
    )


def test_force_spot_beats_the_workload_annotation() -> None:
    mutator = spot_mutator(forcePodsToSpot=[APP_WEB])
    got, reason = decide(mutator, rs_pod(labels={"app": "web"}, annotations={LIFECYCLE: "on-demand"}))
    assert (got, reason.split(";")[0]) == ("spot", "spot: rule forcePodsToSpot[0]")


def test_force_on_demand_beats_the_workload_annotation() -> None:
    mutator = spot_mutator(forcePodsToOnDemand=[APP_WEB])
    got, _ = decide(mutator, rs_pod(labels={"app": "web"}, annotations={LIFECYCLE: "spot"}))
    assert got == "on-demand"


def test_the_workload_annotation_beats_the_percentage() -> None:
    mutator = spot_mutator(preset="partialSpot")
    ctx = Ctx(cluster=view_with(siblings(on_demand=9)))  # the split alone would say spot
    got, reason = decide(mutator, rs_pod(annotations={LIFECYCLE: "on-demand", SPOT_PERCENTAGE: "50"}), ctx)
    assert got == "on-demand" and "rule workload annotation scheduling.cast.ai/lifecycle=on-demand" in reason
    got, _ = decide(spot_mutator(spotPercentageOfReplicaSet=100), rs_pod(annotations={LIFECYCLE: "spot"}))
    assert got == "spot"


def test_the_percentage_beats_default_to_spot() -> None:
    mutator = spot_mutator(preset="partialSpot")
    got, reason = decide(mutator, rs_pod(), Ctx(cluster=view_with()))
    assert got == "on-demand"  # a single Pod at 40 %: floor(0.4) = 0 spot
    assert "rule spotPercentageOfReplicaSet=40 for ReplicaSet web-58c67d7989" in reason


def test_the_percentage_annotation_overrides_the_configured_one() -> None:
    mutator = spot_mutator(preset="partialSpot")
    ctx = Ctx(cluster=view_with(siblings(spot=1, on_demand=2)))  # n = 4
    got, reason = decide(mutator, rs_pod(), ctx)  # 40 %: floor(1.6) = 1 -> on-demand
    assert got == "on-demand"
    got, reason = decide(mutator, rs_pod(annotations={SPOT_PERCENTAGE: "50"}), ctx)  # floor(2) = 2 -> spot
    assert got == "spot" and "rule scheduling.cast.ai/spot-percentage=50" in reason
    assert "spot target floor(4x50/100)=2" in reason
    # and it works without a configured percentage
    got, _ = decide(spot_mutator(defaultToSpot=False), rs_pod(annotations={SPOT_PERCENTAGE: "50"}), ctx)
    assert got == "spot"


def test_percentage_applies_to_statefulsets_but_not_to_jobs() -> None:
    mutator = spot_mutator(defaultToSpot=False, spotPercentageOfReplicaSet=100)
    got, _ = decide(mutator, make_pod(owner("StatefulSet", "db", RS_UID)), Ctx(cluster=view_with()))
    assert got == "spot"
    reason = unchanged(mutator, make_pod(owner("Job", "batch", "job-1")), Ctx(cluster=view_with()))
    assert "defaultToSpot is false" in reason


def test_sticky_placement_beats_every_rule_but_ignore() -> None:
    mutator = spot_mutator(forcePodsToSpot=[APP_WEB])
    already = rs_pod(labels={"app": "web", PLACEMENT_LABEL: "on-demand"})
    got, reason = decide(mutator, already)
    assert got == "on-demand" and reason.startswith("on-demand: already placed")


def test_a_placed_pod_is_a_fixed_point() -> None:
    mutator = spot_mutator(preset="partialSpot")
    ctx = Ctx(cluster=view_with(siblings(on_demand=4)))
    _, first = run(mutator, rs_pod(), ctx)
    # a different view on reinvocation changes nothing either
    result, again = run(mutator, first, Ctx(cluster=view_with(siblings(spot=9))))
    assert again == first and result.action.value == "unchanged"


# --- selectors --------------------------------------------------------------------------------------


def test_namespaces_and_label_expressions() -> None:
    mutator = spot_mutator(
        forcePodsToOnDemand=[
            {
                "labelSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]},
                "namespaces": ["prod"],
            }
        ]
    )
    assert (
        decide(mutator, rs_pod(labels={"tier": "db"}, namespace="prod"), Ctx(namespace="prod"))[0]
        == "on-demand"
    )
    assert decide(mutator, rs_pod(labels={"tier": "db"}))[0] == "spot"  # wrong namespace
    assert (
        decide(mutator, rs_pod(labels={"tier": "web"}, namespace="prod"), Ctx(namespace="prod"))[0] == "spot"
    )


@pytest.mark.parametrize(
    ("operator", "values", "labels", "matches"),
    [
        ("In", ["a"], {"k": "a"}, True),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {"k": "b"}, True),
        ("NotIn", ["a"], {}, True),
        ("NotIn", ["a"], {"k": "a"}, False),
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {}, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", [], {"k": "a"}, False),
    ],
)
def test_label_selector_operators(
    operator: str, values: list[str], labels: dict[str, str], matches: bool
) -> None:
    term = {"labelSelector": {"matchExpressions": [{"key": "k", "operator": operator, "values": values}]}}
    got, _ = decide(spot_mutator(forcePodsToOnDemand=[term]), rs_pod(labels=labels))
    assert (got == "on-demand") is matches


def test_namespace_selector_reads_namespace_labels_from_the_view() -> None:
    term = {"namespaceSelector": {"matchLabels": {"env": "prod"}}}
    mutator = spot_mutator(forcePodsToOnDemand=[term])
    prod = Ctx(cluster=view_with(namespaces={"default": {"env": "prod"}}))
    assert decide(mutator, rs_pod(), prod)[0] == "on-demand"
    dev = Ctx(cluster=view_with(namespaces={"default": {"env": "dev"}}))
    assert decide(mutator, rs_pod(), dev)[0] == "spot"
    assert decide(mutator, rs_pod(), Ctx(cluster=NO_VIEW))[0] == "spot"  # labels unknown: no match


def test_all_spot_except_kube_system_forces_kube_system_on_demand() -> None:
    mutator = spot_mutator(preset="allSpotExceptKubeSystem")
    got, reason = decide(mutator, rs_pod(namespace="kube-system"), Ctx(namespace="kube-system"))
    assert got == "on-demand" and "preset allSpotExceptKubeSystem (kube-system)" in reason
    assert decide(mutator, rs_pod())[0] == "spot"


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "value", "accepted"),
    [
        (LIFECYCLE, "ondemand", '"spot" or "on-demand"'),
        (LIFECYCLE, "Spot", '"spot" or "on-demand"'),
        (SPOT_PERCENTAGE, "100", "a whole number from 1 to 99"),
        (SPOT_PERCENTAGE, "0", "a whole number from 1 to 99"),
        (SPOT_PERCENTAGE, "050", "a whole number from 1 to 99"),
        (SPOT_PERCENTAGE, "40\n", "a whole number from 1 to 99"),
        (SPOT_PERCENTAGE, "-5", "a whole number from 1 to 99"),
    ],
)
def test_bad_annotations_are_bad_input(annotation: str, value: str, accepted: str) -> None:
    pod = rs_pod(annotations={annotation: value})
    result, after = run(spot_mutator(deny_invalid=True), pod)
    assert result.action.value == "denied"
    assert annotation in result.reason and accepted in result.reason
    assert '"' + value.replace("\n", "\\n") + '"' in result.reason
    warned, after = run(spot_mutator(deny_invalid=False), pod)
    assert warned.action.value == "unchanged" and after == pod
    assert len(warned.warnings) == 1 and annotation in warned.warnings[0] and len(warned.warnings[0]) <= 120
    assert "Pod not placed" in warned.warnings[0]


# --- partial spot: counting -------------------------------------------------------------------------


def test_terminating_siblings_do_not_count() -> None:
    counts, pending = sibling_counts(
        view_with(siblings(spot=1, on_demand=2, unplaced=1, terminating=3)), RS_UID
    )
    assert counts == SiblingCounts(1, 2, 1) and pending == 0


def test_recent_decisions_the_view_does_not_show_are_counted_once() -> None:
    ledger = (LedgerEntry("d-0", "spot"), LedgerEntry("new-1", "spot"), LedgerEntry("new-2", "on-demand"))
    counts, pending = sibling_counts(view_with(siblings(spot=1, terminating=0), ledger=ledger), RS_UID)
    assert counts == SiblingCounts(2, 1, 0) and pending == 2


def test_a_decision_of_a_terminating_pod_is_not_pending() -> None:
    pods = siblings(terminating=1)
    counts, pending = sibling_counts(view_with(pods, ledger=(LedgerEntry("d-0", "spot"),)), RS_UID)
    assert counts == SiblingCounts() and pending == 0


def test_burst_with_the_ledger_does_not_overshoot() -> None:
    mutator = spot_mutator(preset="partialSpot")
    ledger: tuple[LedgerEntry, ...] = ()
    for number in range(10):
        ctx = Ctx(uid=f"req-{number}", cluster=view_with(ledger=ledger))  # the view never catches up
        _, pod = run(mutator, rs_pod(), ctx)
        got = placement(pod)
        assert got in ("spot", "on-demand")
        ledger = (*ledger, LedgerEntry(f"req-{number}", got))
    assert sum(entry.placement == "spot" for entry in ledger) == 4


def test_without_a_synced_view_the_hash_split_decides_and_says_so() -> None:
    mutator = spot_mutator(preset="partialSpot")
    spot = 0
    for number in range(200):
        got, reason = decide(mutator, rs_pod(), Ctx(uid=f"req-{number}", cluster=NO_VIEW))
        assert "by hash split (no cluster view)" in reason
        spot += got == "spot"
    assert 50 <= spot <= 110  # 40 % of 200 = 80
    unsynced = view_with(pods_synced=False)
    assert "hash split (cluster view not synced)" in decide(mutator, rs_pod(), Ctx(cluster=unsynced))[1]


def test_the_reason_names_counts_and_rule() -> None:
    mutator = spot_mutator(spotPercentageOfReplicaSet=50)
    ctx = Ctx(cluster=view_with(siblings(spot=1, on_demand=2), ledger=(LedgerEntry("x", "on-demand"),)))
    _, reason = decide(mutator, rs_pod(), ctx)
    assert reason.startswith(
        "spot: rule spotPercentageOfReplicaSet=50 for ReplicaSet web-58c67d7989: "
        "siblings 1 spot, 3 on-demand, 0 unplaced (of which 1 recent decisions not yet in view); "
        "spot target floor(5x50/100)=2"
    )


# --- configuration ----------------------------------------------------------------------------------


def test_config_is_off_by_default_and_pastes_castai_values() -> None:
    assert SpotConfig().enabled is False
    pasted = SpotConfig.model_validate(
        {
            "enabled": True,
            "defaultToSpot": True,
            "spotPercentageOfReplicaSet": 0,
            "cacheTTLSeconds": 60,
            "ignorePods": [{"labelSelector": {"matchLabels": {"app.kubernetes.io/name": "ignored-pod"}}}],
            "forcePodsToSpot": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": "app.kubernetes.io/name", "operator": "In", "values": ["spot-pod-1"]}
                        ]
                    }
                }
            ],
            "forcePodsToOnDemand": [{"namespaces": ["kube-system"], "topologyKey": "ignored"}],
        }
    )
    assert pasted.percentage == 0 and pasted.default_to_spot


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"preset": "partialSpot", "spotPercentageOfReplicaSet": 70},
            "preset partialSpot sets spotPercentage",
        ),
        ({"preset": "everything"}, "preset"),
        ({"spotPercentageOfReplicaSet": 101}, "less than or equal to 100"),
        ({"ignorePods": [{}]}, "an empty term would match every Pod"),
        ({"ignorePods": [{"labelSelector": {"matchLabel": {}}}]}, "Extra inputs are not permitted"),
        (
            {"forcePodsToSpot": [{"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]},
            "operator In needs at least one value",
        ),
        ({"labelScheme": "custom"}, "customLabelScheme is needed"),
        (
            {
                "labelScheme": "custom",
                "customLabelScheme": {"key": "Bad Key", "spotValue": "x", "tainted": True},
            },
            "not a valid node label key",
        ),
        ({"podDeletionCost": {"spot": 5, "onDemand": 1}}, "spot must be lower than onDemand"),
        ({"ignorePods": [{"labelSelector": {"matchLabels": {"bad key": "x"}}}]}, "not a valid label key"),
        ({"mode": "audit"}, "enforce"),
    ],
)
def test_config_errors_name_the_problem(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SpotConfig.model_validate({"enabled": True, **values})


def test_a_preset_with_agreeing_keys_is_fine() -> None:
    config = SpotConfig.model_validate({"preset": "partialSpot", "spotPercentageOfReplicaSet": 40})
    assert config.percentage == 40


# --- slim records -------------------------------------------------------------------------------------


def test_slim_records() -> None:
    pod = make_pod(owner(), labels={PLACEMENT_LABEL: "spot"}, annotations={DECISION_ANNOTATION: "abc"})
    pod["metadata"].update(uid="p1", name="web-1", deletionTimestamp="2026-01-01T00:00:00Z")
    record = slim_pod(pod)
    assert record is not None
    assert (record.owner.uid, record.placement, record.decision, record.terminating) == (
        RS_UID,
        "spot",
        "abc",
        True,
    )
    namespace = slim_namespace(
        {"metadata": {"uid": "u", "name": "prod", "labels": {"env": "prod", "a": "b"}}}
    )
    assert namespace == ("u", "prod", (("a", "b"), ("env", "prod")))
    assert slim_namespace({"metadata": {"name": "x"}}) is None


def test_watches_declare_namespaces_only_for_namespace_selectors() -> None:
    from function.core.mutators.spot import PLUGIN

    plain = SpotConfig(enabled=True)
    assert [spec.index for spec in PLUGIN.watches(plain)] == ["pods", "replicasets"]
    selective = SpotConfig.model_validate(
        {"ignorePods": [{"namespaceSelector": {"matchLabels": {"a": "b"}}}]}
    )
    specs = PLUGIN.watches(selective)
    assert [spec.index for spec in specs] == ["pods", "replicasets", "namespaces"]
    assert specs[0].metadata_only and specs[0].group_by is not None
    assert specs[2].namespaced is False and specs[2].metadata_only


def test_the_reason_names_the_replicaset_desired_count() -> None:
    from function.core.view import PODS as PODS_SPEC
    from function.core.view import REPLICASETS, IndexState, ReplicaSetRecord, View

    view = View(
        {
            "pods": IndexState.build([], PODS_SPEC),
            "replicasets": IndexState.build(
                [ReplicaSetRecord("default", "web-58c67d7989", RS_UID, owner(), 10, False)], REPLICASETS
            ),
        }
    )
    _, reason = decide(spot_mutator(spotPercentageOfReplicaSet=40), rs_pod(), Ctx(cluster=view))
    assert "for ReplicaSet web-58c67d7989 (wants 10): siblings 0 spot" in reason


def test_malformed_labels_or_annotations_leave_the_pod_to_the_apiserver() -> None:
    for field in ("labels", "annotations"):
        pod = rs_pod()
        pod["metadata"][field] = "junk"
        assert f"metadata.{field} is not a map" in unchanged(spot_mutator(), pod)


def test_a_sticky_pod_missing_only_its_decision_uid_says_what_changed() -> None:
    pod = rs_pod(
        labels={PLACEMENT_LABEL: "spot"},
        annotations={POD_DELETION_COST: "-100"},
        tolerations=[SPOT_TOLERATION],
        nodeSelector=SPOT_SELECTOR,
    )
    result, after = run(spot_mutator(), pod)
    assert result.action.value == "mutated"
    assert result.reason.endswith("annotation castops.io/placement-decision")
    assert after["metadata"]["annotations"][DECISION_ANNOTATION] == "req-1"


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
