"""The gpuLeases decision over a static view: every reason with its numbers and remedy, the stamp,
the model's nodeSelector, gates, overflow onto spot, the 80 % warning, and the ledger."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from function.core.families import base_model, is_family, models_of, node_values
from function.core.leases import (
    CHARGE_ANNOTATION,
    CHARGED_PODS,
    DECISION_ANNOTATION,
    ENDS_ANNOTATION,
    FORGED_ANNOTATION,
    GATE,
    LEASE_LABEL,
    LEASE_NAMESPACES,
    LEASES,
    MODEL_ANNOTATION,
    REQUIRED_LABEL,
    STAMP_ANNOTATIONS,
    STATE_LABEL,
    lease_label,
    lease_problems,
    pod_models,
    slim_charged_pod,
    slim_lease,
    slim_required_namespace,
)
from function.core.mutators.base import Action, RequestContext
from function.core.mutators.gpu_leases import (
    LEDGER_INDEX,
    GpuLeases,
    GpuLeasesConfig,
    LedgerCharge,
    ledger_charge,
)
from function.core.schedule import ZONES_INDEX
from function.core.view import IndexState, Overlay, StaticView, View
from tests.support.zones import BERLIN

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
MODEL = "nvidia.com/gpu.product"


def lease_obj(
    name: str = "h100", model: str = H100, count: Any = 8, ns: str = "ml", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"lease-{ns}-{name}",
            "creationTimestamp": spec.pop("created", "2026-11-25T00:00:00Z"),
        },
        "spec": {"gpuModel": model, "count": count, **spec},
    }


def charged(lease: str, milli: int, n: int, state: str = "charged", ns: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{lease}-{n}",
            "namespace": ns,
            "uid": f"pod-{lease}-{n}",
            "labels": {LEASE_LABEL: lease, STATE_LABEL: state},
            "annotations": {CHARGE_ANNOTATION: f"{milli}m", DECISION_ANNOTATION: f"d-{lease}-{n}"},
            "creationTimestamp": "2026-11-25T01:00:00Z",
        }
    }


def view(
    leases: list[dict[str, Any]], pods: list[dict[str, Any]] = (), now: datetime = NOW, ledger: Any = None
) -> Overlay:
    static = StaticView(
        {
            LEASES.index: {lease["metadata"]["uid"]: slim_lease(lease) for lease in leases},
            CHARGED_PODS.index: {CHARGED_PODS.key(p): slim_charged_pod(p) for p in pods},
        },
        specs=(LEASES, CHARGED_PODS),
    )
    return Overlay(static, {LEDGER_INDEX: ledger or {}}, now=now)


def pod(
    gpus: int = 1, resource: str = "nvidia.com/gpu", model: str | None = None, **meta: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "x",
                "resources": {"limits": {resource: str(gpus)}, "requests": {resource: str(gpus)}},
            }
        ]
    }
    if model:
        spec["nodeSelector"] = {MODEL: model}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "job-", "namespace": "ml", **meta},
        "spec": spec,
    }


def decide(p: dict[str, Any], v: Overlay, dry_run: bool = False, **config: Any) -> Any:
    mutator = GpuLeases(GpuLeasesConfig.model_validate({"enabled": True, **config}))
    ctx = RequestContext(uid="review-1", namespace="ml", dry_run=dry_run, cluster=v)
    return mutator.mutate(p, ctx)


def test_charged_within_the_lease_with_the_stamp_and_the_models_node_selector() -> None:
    p = pod(2)
    result = decide(p, view([lease_obj()], [charged("h100", 1000, i) for i in range(3)]))
    assert result.action == Action.mutated
    assert result.reason.startswith("Charged: gpu lease h100")
    assert "3 of 8 GPU in use, this Pod needs 2" in result.reason
    assert p["metadata"]["labels"] == {LEASE_LABEL: "h100", STATE_LABEL: "charged"}
    assert p["metadata"]["annotations"][CHARGE_ANNOTATION] == "2000m"
    assert p["metadata"]["annotations"][DECISION_ANNOTATION] == "review-1"
    assert p["spec"]["nodeSelector"] == {MODEL: H100}
    assert result.warnings == ()


def test_lease_exhausted_names_the_numbers_the_window_and_a_remedy() -> None:
    lease = lease_obj(window={"end": "2026-11-27T18:00:00Z"})
    result = decide(pod(2), view([lease], [charged("h100", 1000, i) for i in range(7)]))
    assert result.action == Action.denied
    assert result.reason.startswith("castslice: LeaseExhausted: gpu lease h100 (NVIDIA-H100-80GB-HBM3)")
    assert "7 of 8 GPU in use, this Pod needs 2, window ends 2026-11-27T18:00:00Z" in result.reason
    assert "remedy:" in result.reason


def test_a_pod_larger_than_the_whole_lease_exceeds_it() -> None:
    result = decide(pod(9), view([lease_obj()]))
    assert result.action == Action.denied
    assert "ExceedsLease" in result.reason and "needs 9 GPU, more than the whole lease (8)" in result.reason


def test_another_model_is_not_charged_to_this_lease() -> None:
    result = decide(pod(1, model=A100), view([lease_obj()]))
    assert result.action == Action.denied
    assert (
        "NoMatchingLease" in result.reason and A100 in result.reason and "h100 (NVIDIA-H100" in result.reason
    )


def test_two_models_and_no_choice_is_ambiguous() -> None:
    result = decide(pod(1), view([lease_obj(), lease_obj("a100", A100)]))
    assert result.action == Action.denied
    assert "AmbiguousModel" in result.reason and f"nodeSelector {MODEL}" in result.reason


def test_the_pods_model_picks_among_leases_of_several_models() -> None:
    p = pod(1, model=A100)
    result = decide(p, view([lease_obj(), lease_obj("a100", A100)]))
    assert result.action == Action.mutated and p["metadata"]["labels"][LEASE_LABEL] == "a100"
    assert p["spec"]["nodeSelector"] == {MODEL: A100}


def test_the_annotation_names_the_lease() -> None:
    p = pod(1, annotations={"castops.io/gpu-lease": "a100"})
    result = decide(p, view([lease_obj(), lease_obj("a100", A100)]))
    assert result.action == Action.mutated and p["metadata"]["labels"][LEASE_LABEL] == "a100"
    missing = decide(pod(1, annotations={"castops.io/gpu-lease": "v100"}), view([lease_obj()]))
    assert missing.action == Action.denied and "'v100' names no valid GpuLease" in missing.reason


def test_before_and_after_the_window() -> None:
    future = lease_obj(window={"start": "2026-11-26T00:00:00Z", "end": "2026-11-27T00:00:00Z"})
    result = decide(pod(1), view([future]))
    assert result.action == Action.denied and "LeaseNotStarted" in result.reason
    assert "starts at 2026-11-26T00:00:00Z" in result.reason
    past = lease_obj(duration="2h")  # created at midnight: ended at 02:00
    result = decide(pod(1), view([past]))
    assert result.action == Action.denied and "LeaseExpired" in result.reason
    assert "ended at 2026-11-25T02:00:00Z" in result.reason


def test_an_expired_lease_does_not_shadow_one_still_to_come_in_the_denial() -> None:
    """The expired lease was created first (it would win the tie); the denial must name the one
    whose window starts later, which says when the Pod can be created."""
    past = lease_obj("last-week", duration="2h", created="2026-11-24T00:00:00Z")
    future = lease_obj("tomorrow", window={"start": "2026-11-26T00:00:00Z", "end": "2026-11-27T00:00:00Z"})
    result = decide(pod(1), view([past, future]))
    assert result.action == Action.denied
    assert "LeaseNotStarted" in result.reason and "gpu lease tomorrow" in result.reason


def test_queue_mode_gates_every_pod_even_one_that_fits() -> None:
    p = pod(1)
    result = decide(p, view([lease_obj(enforcement="Queue")]))
    assert result.action == Action.mutated and result.reason.startswith("Queued:")
    assert p["spec"]["schedulingGates"] == [{"name": GATE}]
    assert p["metadata"]["labels"][STATE_LABEL] == "queued"


def test_queue_mode_before_the_window_gates_until_the_start() -> None:
    p = pod(1)
    future = lease_obj(enforcement="Queue", window={"start": "2026-11-26T00:00:00Z"})
    result = decide(p, view([future]))
    assert (
        result.action == Action.mutated and "until the window starts at 2026-11-26T00:00:00Z" in result.reason
    )


def test_overflow_admits_beyond_the_lease_onto_spot() -> None:
    p = pod(2)
    result = decide(
        p, view([lease_obj(overflow="Preemptible")], [charged("h100", 1000, i) for i in range(8)])
    )
    assert result.action == Action.mutated and result.reason.startswith("Overflow:")
    assert p["metadata"]["labels"][STATE_LABEL] == "overflow"
    assert p["spec"]["nodeSelector"] == {MODEL: H100, "scheduling.cast.ai/spot": "true"}
    assert {"key": "scheduling.cast.ai/spot", "operator": "Exists", "effect": "NoSchedule"} in p["spec"][
        "tolerations"
    ] or any(t.get("key") == "scheduling.cast.ai/spot" for t in p["spec"]["tolerations"])
    assert any("spot" in w for w in result.warnings)


def test_audit_mode_admits_and_warns_what_it_would_refuse() -> None:
    p = pod(2)
    result = decide(p, view([lease_obj(enforcement="Audit")], [charged("h100", 1000, i) for i in range(8)]))
    assert result.action == Action.mutated and "LeaseExhausted" in result.reason
    assert p["metadata"]["labels"][STATE_LABEL] == "audit"
    assert all(len(w) <= 120 for w in result.warnings)


def test_a_warning_when_the_lease_passes_80_percent() -> None:
    result = decide(pod(1), view([lease_obj()], [charged("h100", 1000, i) for i in range(6)]))
    assert result.action == Action.mutated
    (warning,) = result.warnings
    assert "gpu lease h100 at 87% (7 of 8 GPU)" in warning and len(warning) <= 120


def test_the_view_not_ready_refuses_and_says_retry() -> None:
    static = StaticView({}, specs=(LEASES, CHARGED_PODS))
    not_synced = Overlay(_Unsynced(static), now=NOW)
    result = decide(pod(1), not_synced)
    assert result.action == Action.denied and "ViewNotReady" in result.reason and "retry" in result.reason
    assert decide(pod(1), not_synced, whenViewNotReady="admit").action == Action.unchanged


class _Unsynced(Overlay):
    def synced(self, name: str) -> bool:
        return False


def test_a_namespace_without_a_lease_is_left_alone_unless_required() -> None:
    empty = view([lease_obj(ns="other")])
    assert decide(pod(1), empty).action == Action.unchanged
    required = decide(pod(1), empty, requireLease=True)
    assert required.action == Action.denied and "NoMatchingLease" in required.reason


def test_a_pod_without_gpus_and_a_charged_pod_are_left_alone() -> None:
    assert decide(pod(1, resource="cpu"), view([lease_obj()])).reason == "asks for no GPU"
    p = pod(1)
    v = view([lease_obj()])
    assert decide(p, v).action == Action.mutated
    assert decide(p, v).action == Action.unchanged  # the engine's second pass: idempotent


def forged() -> dict[str, Any]:
    """A stamp a tenant wrote on the Pod it creates: charged to h100 for nothing."""
    return {
        "labels": {LEASE_LABEL: "h100", STATE_LABEL: "charged"},
        "annotations": {CHARGE_ANNOTATION: "0m", DECISION_ANNOTATION: "made-up"},
    }


def test_a_stamp_the_pod_arrives_with_is_recomputed_from_its_resources() -> None:
    p = pod(2, **forged())
    result = decide(p, view([lease_obj()]))
    assert result.action == Action.mutated and result.reason.startswith("Charged: gpu lease h100")
    assert p["metadata"]["annotations"][CHARGE_ANNOTATION] == "2000m"  # not the tenant's 0m
    full = view([lease_obj()], [charged("h100", 1000, i) for i in range(7)])
    refused = decide(pod(2, **forged()), full)
    assert refused.action == Action.denied and "7 of 8 GPU in use, this Pod needs 2" in refused.reason


def test_a_forged_stamp_is_removed_where_nothing_is_charged() -> None:
    for p, v in (
        (pod(1, **forged()), view([lease_obj(ns="other")])),  # no lease in the namespace
        (pod(1, resource="cpu", **forged()), view([lease_obj()])),  # no GPU
    ):
        result = decide(p, v)
        assert result.action == Action.mutated and "stamp it came with removed" in result.reason
        assert LEASE_LABEL not in p["metadata"]["labels"]
        assert CHARGE_ANNOTATION not in p["metadata"]["annotations"]


def test_slices_are_charged_as_fractions_of_their_model() -> None:
    p = pod(4, resource="nvidia.com/gpu-shared")
    result = decide(p, view([lease_obj(count=1)]), sharedReplicas=8)
    assert result.action == Action.mutated and p["metadata"]["annotations"][CHARGE_ANNOTATION] == "500m"
    result = decide(pod(5, resource="nvidia.com/gpu-shared"), view([lease_obj(count="0.5")]))
    assert (
        result.action == Action.denied and "needs 0.625 GPU, more than the whole lease (0.5)" in result.reason
    )


def test_this_processs_recent_charges_count_until_the_view_shows_them() -> None:
    ledger = {"ml/h100": tuple(LedgerCharge(f"recent-{i}", 1000, "charged") for i in range(8))}
    assert decide(pod(1), view([lease_obj()], ledger=ledger)).action == Action.denied
    shown = [charged("h100", 1000, i) for i in range(8)]
    for i, p in enumerate(shown):
        p["metadata"]["annotations"][DECISION_ANNOTATION] = f"recent-{i}"
    result = decide(pod(1), view([lease_obj()], shown, ledger=ledger))
    assert result.action == Action.denied and "8 of 8 GPU in use" in result.reason  # not 16


def test_queued_and_overflow_pods_do_not_use_the_lease() -> None:
    pods = [charged("h100", 1000, 0, "queued"), charged("h100", 1000, 1, "overflow")]
    result = decide(pod(8), view([lease_obj()], pods))
    assert result.action == Action.mutated and "0 of 8 GPU in use" in result.reason


@pytest.mark.parametrize(
    ("spec", "needed"),
    [
        ({"initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}, "4000m"),
        (
            {
                "initContainers": [
                    {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ]
            },
            "3000m",
        ),
        ({"extra": {"nvidia.com/mig-3g.40gb": "1"}}, "2429m"),
        ({"extra": {"nvidia.com/gpumem-percentage": "25"}}, "500m"),
    ],
    ids=["init-peak", "sidecar", "mig", "vgpu-share"],
)
def test_the_charge_counts_as_the_scheduler_does(spec: dict[str, Any], needed: str) -> None:
    p = pod(2)
    extra = spec.pop("extra", None)
    if extra:
        p["spec"]["containers"][0]["resources"]["limits"].update(extra)
    p["spec"].update(spec)
    assert decide(p, view([lease_obj()])).action == Action.mutated
    assert p["metadata"]["annotations"][CHARGE_ANNOTATION] == needed


class SumsOnly(View):
    """The webhook's view, whose charged-Pods groups cannot be read: a decision must take the
    sums the view keeps per lease (kept as watch events arrive), never walk a lease's Pods."""

    def group(self, name: str, key: str) -> Any:
        if name == CHARGED_PODS.index:
            raise AssertionError(f"walked the charged Pods of {key}")
        return super().group(name, key)


def test_the_decision_reads_the_sums_the_view_keeps_and_never_walks_the_pods() -> None:
    pods = [charged("h100", 1000, i) for i in range(7)]
    indices = {
        LEASES.index: IndexState.build({"lease-ml-h100": slim_lease(lease_obj())}, LEASES),
        CHARGED_PODS.index: IndexState.build(
            {CHARGED_PODS.key(p): slim_charged_pod(p) for p in pods}, CHARGED_PODS
        ),
    }
    v = Overlay(SumsOnly(indices), now=NOW)
    assert decide(pod(1), v).reason.startswith(
        "Charged: gpu lease h100 (NVIDIA-H100-80GB-HBM3): charged (7 of 8"
    )
    refused = decide(pod(2), v)
    assert refused.action == Action.denied and "7 of 8 GPU in use, this Pod needs 2" in refused.reason
    # One more charged Pod, put as the watch puts it: the sums move, still without a walk.
    eighth = charged("h100", 1000, 8)
    state = indices[CHARGED_PODS.index].put(
        CHARGED_PODS.key(eighth), slim_charged_pod(eighth), CHARGED_PODS.group_by, CHARGED_PODS.tally
    )
    full = Overlay(SumsOnly({**indices, CHARGED_PODS.index: state}), now=NOW)
    assert "8 of 8 GPU in use" in decide(pod(1), full).reason


# -- no way around a lease --------------------------------------------------------------------------
def required_view(leases: list[dict[str, Any]], pods: list[dict[str, Any]] = ()) -> Overlay:
    """A view in which namespace ml carries castops.io/gpu-leases=required."""
    namespace = {"metadata": {"name": "ml", "uid": "ns-ml", "labels": {REQUIRED_LABEL: "required"}}}
    static = StaticView(
        {
            LEASES.index: {lease["metadata"]["uid"]: slim_lease(lease) for lease in leases},
            CHARGED_PODS.index: {CHARGED_PODS.key(p): slim_charged_pod(p) for p in pods},
            LEASE_NAMESPACES.index: {"ml": slim_required_namespace(namespace)},
        },
        specs=(LEASES, CHARGED_PODS, LEASE_NAMESPACES),
    )
    return Overlay(static, now=NOW)


def test_a_lease_required_namespace_without_a_lease_stays_closed() -> None:
    result = decide(pod(1), required_view([]))
    assert result.action == Action.denied and "NoMatchingLease" in result.reason
    assert "castops.io/gpu-leases=required" in result.reason and "remedy" in result.reason
    assert decide(pod(1, resource="cpu"), required_view([])).action == Action.unchanged


def test_a_pod_the_apiserver_marked_as_arriving_with_a_stamp_is_refused_saying_which_keys() -> None:
    p = pod(1, annotations={FORGED_ANNOTATION: "label castops.io/gpu-lease"})
    for v in (view([lease_obj()]), view([lease_obj(ns="other")]), required_view([])):
        result = decide(p, v)
        assert result.action == Action.denied and "ForgedStamp" in result.reason
        assert "label castops.io/gpu-lease" in result.reason and "remedy" in result.reason


def claim_pod(*claims: dict[str, Any]) -> dict[str, Any]:
    p = pod(1, resource="cpu")
    p["spec"]["resourceClaims"] = list(claims)
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": c["name"]} for c in claims]
    return p


def test_claims_of_a_known_template_are_charged_and_any_other_claim_is_refused_where_required() -> None:
    ours = {"name": "castslice-gpu", "resourceClaimTemplateName": "castslice-gpu-4-abcdef12"}
    tenant = {"name": "mine", "resourceClaimName": "eight-gpus"}
    mutator = GpuLeases(GpuLeasesConfig.model_validate({"enabled": True}), {"castslice-gpu-4-abcdef12": 500})

    def run(p: dict[str, Any], v: Overlay) -> Any:
        return mutator.mutate(p, RequestContext(uid="review-1", namespace="ml", cluster=v))

    p = claim_pod(ours)
    assert run(p, required_view([lease_obj()])).action == Action.mutated
    assert p["metadata"]["annotations"][CHARGE_ANNOTATION] == "500m"
    refused = run(claim_pod(ours, tenant), required_view([lease_obj()]))
    assert refused.action == Action.denied and "UnknownClaim" in refused.reason
    assert "mine (ResourceClaim eight-gpus)" in refused.reason and "remedy" in refused.reason
    open_ns = run(claim_pod(tenant), view([lease_obj()]))  # not required: admitted, said
    assert open_ns.action == Action.unchanged and any("mine (ResourceClaim" in w for w in open_ns.warnings)


def test_another_vendors_gpus_are_refused_where_a_lease_is_required() -> None:
    result = decide(pod(1, resource="amd.com/gpu"), required_view([lease_obj()]))
    assert result.action == Action.denied and "UnknownGpuResource" in result.reason
    assert "amd.com/gpu" in result.reason


def test_the_model_is_the_intersection_of_a_terms_expressions_and_the_pod_is_pinned() -> None:
    def with_terms(*terms: list[dict[str, Any]]) -> dict[str, Any]:
        p = pod(1)
        p["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
                }
            }
        }
        return p

    both = [lease_obj(), lease_obj("a100", A100)]
    p = with_terms(
        [
            {"key": MODEL, "operator": "In", "values": [H100, A100]},
            {"key": MODEL, "operator": "In", "values": [A100]},
        ]
    )
    assert decide(p, view(both)).action == Action.mutated
    assert p["metadata"]["labels"][LEASE_LABEL] == "a100"
    assert "nodeSelector" not in p["spec"]  # it may run on A100 only: nothing to pin
    either = with_terms([{"key": MODEL, "operator": "In", "values": [H100, A100]}])
    assert decide(either, view([lease_obj()])).action == Action.mutated
    assert either["spec"]["nodeSelector"] == {MODEL: H100}  # pinned to its lease's model
    elsewhere = with_terms([{"key": MODEL, "operator": "NotIn", "values": [H100]}])
    refused = decide(elsewhere, view([lease_obj()]))
    assert refused.action == Action.denied and "any model but NVIDIA-H100" in refused.reason


def test_a_memory_size_is_charged_for_the_chosen_leases_model() -> None:
    p = pod(1)
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "20480"
    config = {"memoryMiBByModel": {A100: 40960, H100: 81920}}
    assert decide(p, view([lease_obj("a100", A100)]), **config).action == Action.mutated
    assert p["metadata"]["annotations"][CHARGE_ANNOTATION] == "500m"  # half an A100, not a whole GPU


def test_any_lease_name_works_and_its_pods_count() -> None:
    name = "team-a-" + "h100-" * 40 + "reserved"
    lease = lease_obj(name, count=2)
    p = pod(1)
    assert decide(p, view([lease])).action == Action.mutated
    value = p["metadata"]["labels"][LEASE_LABEL]
    assert len(value) <= 63 and value == lease_label(name)
    stored = {**p, "metadata": {**p["metadata"], "name": "x", "uid": "pod-x"}}
    two = view([lease], [stored, {**stored, "metadata": {**stored["metadata"], "uid": "pod-y"}}])
    assert "2 of 2 GPU in use" in decide(pod(1), two).reason


def test_a_quantity_beyond_a_float_is_an_answer_not_an_error() -> None:
    result = decide(pod(1), view([lease_obj()]))
    huge = pod(1)
    huge["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1e400"
    huge["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1e400"
    refused = decide(huge, view([lease_obj()]))
    assert result.action == Action.mutated
    assert refused.action == Action.denied and "ExceedsLease" in refused.reason


def test_a_reinvocation_keeps_its_earlier_passs_stamp_and_counts_the_pod_once() -> None:
    """The apiserver calls the webhook again, with a new uid, after another webhook changed the
    Pod: the stamp of the first call is this Pod's, and so is its entry in the ledger."""
    lease = lease_obj(count=2)
    p = pod(1)
    assert decide(p, view([lease], [charged("h100", 1000, 0)])).action == Action.mutated
    assert p["metadata"]["annotations"][DECISION_ANNOTATION] == "review-1"
    p["spec"]["containers"].append({"name": "sidecar", "image": "istio/proxyv2"})  # the other webhook
    ledger = {"ml/h100": (LedgerCharge("review-1", 1000, "charged"),)}
    mutator = GpuLeases(GpuLeasesConfig.model_validate({"enabled": True}))
    again = mutator.mutate(
        p,
        RequestContext(
            uid="review-2", namespace="ml", cluster=view([lease], [charged("h100", 1000, 0)], ledger=ledger)
        ),
    )
    assert again.action == Action.unchanged, again.reason  # 2 of 2, not 3: counted once
    assert p["metadata"]["annotations"][DECISION_ANNOTATION] == "review-1"


# -- budgets and recurring windows ------------------------------------------------------------------
def budgeted(
    limit: str = "0.05",
    since: str = "2026-11-25T11:59:00Z",
    hours: str = "0.02",
    running: str = "2",
    **spec: Any,
) -> dict[str, Any]:
    """A lease of 8 with a budget of ``limit`` GPU-hours every 10 minutes from 11:55, whose status says
    ``hours`` were used by ``since`` and ``running`` GPUs run since."""
    lease = lease_obj(
        window={"start": "2026-11-25T11:55:00Z"},
        budget={"gpuHours": limit, "period": "Fixed", "length": "10m"},
        **spec,
    )
    lease["status"] = {
        "consumed": {"gpuHours": "5", "since": since, "running": running},
        "budget": {"periodStart": "2026-11-25T11:55:00Z", "gpuHours": hours},
    }
    return lease


def test_a_budget_left_admits_and_names_what_is_used_and_left() -> None:
    # 0.02 h by 11:59, then 2 GPUs for 15 s:
    result = decide(pod(1), view([budgeted()], now=datetime(2026, 11, 25, 11, 59, 15, tzinfo=UTC)))
    assert result.action == Action.mutated
    numbers = "0.0283 of 0.05 GPU-hours used this period, 0.0217 left, period ends 2026-11-25T12:05:00Z"
    assert numbers in result.reason


def test_a_spent_budget_refuses_with_the_numbers_until_the_next_period() -> None:
    result = decide(pod(1), view([budgeted(hours="0.04")]))
    assert result.action == Action.denied
    assert result.reason.startswith("castslice: BudgetExhausted: gpu lease h100")
    numbers = "0.0733 of 0.05 GPU-hours used this period, 0 left, period ends 2026-11-25T12:05:00Z"
    assert numbers in result.reason
    assert "remedy:" in result.reason
    # The next period begins at 12:05: admitted again, with what has run since.
    later = decide(pod(1), view([budgeted(hours="0.04")], now=datetime(2026, 11, 25, 12, 5, 30, tzinfo=UTC)))
    assert later.action == Action.mutated and "budget 0.0167 of 0.05 GPU-hours used" in later.reason


def test_a_spent_budget_queues_in_queue_mode_and_audit_admits_with_a_warning() -> None:
    p = pod(1)
    queued = decide(p, view([budgeted(hours="0.04", enforcement="Queue")]))
    assert queued.action == Action.mutated
    assert "queued until the budget's next period at 2026-11-25T12:05:00Z" in queued.reason
    assert p["spec"]["schedulingGates"] == [{"name": GATE}]
    audited = decide(pod(1), view([budgeted(hours="0.04", enforcement="Audit")]))
    assert audited.action == Action.mutated and "would be refused: BudgetExhausted" in audited.reason


def weekdays(**spec: Any) -> dict[str, Any]:
    """Open on weekdays from 09:00 for 9 hours, in Berlin (NOW is Wednesday 13:00 there)."""
    return lease_obj(
        window={"recurrence": {"schedule": "0 9 * * 1-5", "duration": "9h", "timeZone": "Europe/Berlin"}},
        **spec,
    )


def zoned(leases: list[dict[str, Any]], now: datetime = NOW) -> Overlay:
    return Overlay(view(leases, now=now), {ZONES_INDEX: {"Europe/Berlin": BERLIN}})


def test_a_recurring_window_admits_inside_with_its_end_on_the_pod_and_refuses_outside() -> None:
    p = pod(1)
    inside = decide(p, zoned([weekdays()]))
    assert inside.action == Action.mutated and "window ends 2026-11-25T17:00:00Z" in inside.reason
    assert p["metadata"]["annotations"][ENDS_ANNOTATION] == "2026-11-25T17:00:00Z"  # 18:00 in Berlin
    evening = datetime(2026, 11, 25, 19, 0, tzinfo=UTC)
    outside = decide(pod(1), zoned([weekdays()], evening))
    assert outside.action == Action.denied
    assert outside.reason.startswith("castslice: WindowClosed: gpu lease h100")
    assert "closed until 2026-11-26T08:00:00Z" in outside.reason and "Europe/Berlin" in outside.reason


def test_a_recurring_window_queues_until_it_opens_and_an_unknown_zone_charges_nothing() -> None:
    p = pod(1)
    saturday = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    queued = decide(p, zoned([weekdays(enforcement="Queue")], saturday))
    assert "queued until the window opens at 2026-11-30T08:00:00Z" in queued.reason
    assert ENDS_ANNOTATION not in p["metadata"]["annotations"]  # the controller writes it when it starts
    unknown = decide(pod(1), view([weekdays()]))  # a view whose edge knows no zone but UTC
    assert unknown.action == Action.denied and "NoMatchingLease" in unknown.reason


# -- leases of several models or a family ---------------------------------------------------------
H200 = "NVIDIA-H200"
FAMILIES = {"modelFamilies": {"h100-class": [H100, H200]}}


def family_lease(count: Any = 4, **spec: Any) -> dict[str, Any]:
    obj = lease_obj("hopper", count=count, **spec)
    del obj["spec"]["gpuModel"]
    obj["spec"]["gpuModels"] = [H100, H200]
    return obj


def on(model: str, milli: int, n: int, lease: str = "hopper", state: str = "charged") -> dict[str, Any]:
    annotations = {CHARGE_ANNOTATION: f"{milli}m", DECISION_ANNOTATION: f"d-{n}"}
    if model:
        annotations[MODEL_ANNOTATION] = model
    return {
        "metadata": {
            "name": f"{lease}-{n}",
            "namespace": "ml",
            "uid": f"pod-{n}",
            "labels": {LEASE_LABEL: lease, STATE_LABEL: state},
            "annotations": annotations,
            "creationTimestamp": "2026-11-25T01:00:00Z",
        }
    }


def test_gfd_suffixes_name_the_gpu_they_come_from() -> None:
    assert base_model("NVIDIA-A100-SXM4-40GB-SHARED") == A100
    assert base_model("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == A100
    assert base_model("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb-SHARED") == A100
    assert base_model(H100) == H100


def test_models_of_expands_families_from_the_object_its_spec_and_the_views_record() -> None:
    families = {"h100-class": (H100, H200)}
    one = lease_obj(model="h100-class")
    assert models_of(one, families) == (H100, H200) == models_of(one["spec"], families)
    assert models_of(slim_lease(one), families) == (H100, H200)
    assert models_of(one) == ("h100-class",)  # without the configuration, a name is a model
    listed = family_lease()
    listed["spec"]["gpuModels"] = ["h100-class", A100, H200]
    assert models_of(listed, families) == (H100, H200, A100)
    assert is_family(listed) and is_family(one, families) and not is_family(lease_obj())
    assert node_values((H100,)) == (H100, f"{H100}-SHARED")


def test_the_spec_takes_one_model_or_several_never_both_and_caps_of_counts() -> None:
    assert lease_problems(family_lease(caps={H200: 2})) == []
    both = family_lease()
    both["spec"]["gpuModel"] = H100
    assert any(p.startswith("spec.gpuModels: give spec.gpuModel or") for p in lease_problems(both))
    neither = family_lease()
    del neither["spec"]["gpuModels"]
    assert any(p.startswith("spec.gpuModel: required") for p in lease_problems(neither))
    bad = family_lease(caps={H200: "lots", "no way": 1})
    bad["spec"]["gpuModels"] = [H100, H100, ""]
    problems = lease_problems(bad)
    assert any(p.startswith("spec.gpuModels[2]:") for p in problems)
    assert any(p.startswith("spec.gpuModels: names a model twice") for p in problems)
    assert any(p.startswith(f"spec.caps.{H200}:") for p in problems)
    assert any(p.startswith("spec.caps.no way:") for p in problems)
    # With the configuration, a cap names one of the lease's models.
    capped = lease_obj(model="h100-class", caps={A100: 1})
    assert lease_problems(capped) == []
    assert [p for p in lease_problems(capped, families={"h100-class": (H100, H200)})] == [
        f"spec.caps.{A100}: not one of the lease's models ({H100}, {H200})"
    ]


def test_the_configuration_refuses_a_nested_family_and_a_bad_name() -> None:
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilies": {"a": ["b"], "b": [H100]}})
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilies": {"a": ["not a label"]}})
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilies": {"a": []}})
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilys": {}})


@pytest.mark.parametrize("model", [H100, H200, f"{H200}-SHARED", f"{H100}-MIG-1g.10gb"])
def test_pods_on_either_model_are_charged_to_one_count(model: str) -> None:
    p = pod(1, model=model)
    result = decide(p, view([family_lease()], [on(H100, 2000, 1), on(H200, 1000, 2)]))
    assert result.action == Action.mutated, result.reason
    assert "3 of 4 GPU in use, this Pod needs 1" in result.reason
    assert p["metadata"]["annotations"][MODEL_ANNOTATION] == base_model(model)
    assert p["spec"]["nodeSelector"] == {MODEL: model} and "affinity" not in p["spec"]  # not pinned
    full = decide(pod(1, model=model), view([family_lease()], [on(H100, 3000, 1), on(H200, 1000, 2)]))
    assert full.action == Action.denied and "LeaseExhausted" in full.reason
    assert "4 of 4 GPU in use" in full.reason


def test_a_family_of_the_configuration_is_a_lease_of_its_models() -> None:
    lease = lease_obj("hopper", model="h100-class", count=2)
    assert decide(pod(1, model=H200), view([lease]), **FAMILIES).action == Action.mutated
    refused = decide(pod(1, model=A100), view([lease]), **FAMILIES)
    assert refused.action == Action.denied and "NoMatchingLease" in refused.reason
    # Without the family in the configuration the name is a model no Pod asks for.
    assert decide(pod(1, model=H200), view([lease])).action == Action.denied


def test_a_pod_naming_no_model_is_pinned_to_the_family_with_its_shared_forms() -> None:
    p = pod(1)
    result = decide(p, view([family_lease()]))
    assert result.action == Action.mutated
    assert MODEL_ANNOTATION not in p["metadata"]["annotations"]  # any model of the lease
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": MODEL, "operator": "In", "values": list(node_values((H100, H200)))}
                ]
            }
        ]
    }


def test_a_pod_that_may_run_beyond_the_family_is_pinned_within_each_of_its_terms() -> None:
    p = pod(1)
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": MODEL, "operator": "In", "values": [H100, A100]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                ]
            }
        }
    }
    assert decide(p, view([family_lease()])).action == Action.mutated
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        assert term["matchExpressions"][-1]["values"] == list(node_values((H100, H200)))


def test_a_cap_holds_one_model_within_the_count() -> None:
    lease = family_lease(caps={H200: 2})
    pods = [on(H200, 1000, 1), on(H200, 1000, 2)]
    refused = decide(pod(1, model=H200), view([lease], pods))
    assert refused.action == Action.denied and "LeaseExhausted" in refused.reason
    assert f"the cap of {H200} is 2 GPU, 2 in use, this Pod needs 1" in refused.reason
    assert decide(pod(1, model=H100), view([lease], pods)).action == Action.mutated
    # A Pod that may run on either goes where no cap holds it: pinned to H100, charged as "any".
    either = pod(1)
    assert decide(either, view([lease], pods)).action == Action.mutated
    values = either["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert values["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == list(node_values((H100,)))
    assert either["metadata"]["annotations"][MODEL_ANNOTATION] == H100


def test_every_model_capped_takes_the_first_with_room() -> None:
    lease = family_lease(caps={H100: 1, H200: 2})
    p = pod(1)
    assert decide(p, view([lease], [on(H100, 1000, 1)])).action == Action.mutated
    assert p["metadata"]["annotations"][MODEL_ANNOTATION] == H200
    full = decide(pod(1), view([lease], [on(H100, 1000, 1), on(H200, 2000, 2)]))
    assert full.action == Action.denied and f"the cap of {H100} is 1 GPU" in full.reason


def test_this_processs_charges_count_against_a_cap_until_the_view_shows_them() -> None:
    lease = family_lease(caps={H200: 1})
    ledger = {"ml/hopper": (LedgerCharge("d-9", 1000, "charged", H200),)}
    refused = decide(pod(1, model=H200), view([lease], ledger=ledger))
    assert refused.action == Action.denied and "cap of" in refused.reason
    p = pod(1, model=H200)
    assert decide(p, view([lease])).action == Action.mutated
    p["metadata"].update(namespace="ml", uid="u")
    assert ledger_charge(p) == ("ml/hopper", LedgerCharge("review-1", 1000, "charged", H200))


def test_the_model_is_part_of_the_stamp() -> None:
    assert MODEL_ANNOTATION in STAMP_ANNOTATIONS
    record = slim_charged_pod(on(H200, 1000, 1))
    assert record is not None and record.model == H200


def _runs_on(p: dict[str, Any]) -> set[str]:
    """The models of the family a Pod may be scheduled on, as the scheduler reads its selectors."""
    models = pod_models(p, MODEL)
    return {model for model in (H100, H200) if any(models.allows(v) for v in node_values((model,)))}


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=8),
    st.dictionaries(st.sampled_from([H100, H200]), st.integers(min_value=0, max_value=4), max_size=2),
    st.lists(
        st.tuples(st.sampled_from([H100, H200, f"{H200}-SHARED", None]), st.integers(1, 3)), max_size=12
    ),
)
def test_a_family_lease_never_admits_beyond_its_count_or_a_cap_and_each_pod_runs_where_charged(
    count: int, caps: dict[str, int], asks: list[tuple[str | None, int]]
) -> None:
    """Pods on either model or none, one after another, each admitted one recorded as the view
    would show it: the count and every cap hold, and a Pod charged as a model may run only there."""
    lease = family_lease(
        count, **({"caps": {m: c for m, c in caps.items() if c}} if any(caps.values()) else {})
    )
    admitted: list[dict[str, Any]] = []
    for n, (model, gpus) in enumerate(asks):
        p = pod(gpus, model=model)
        result = decide(p, view([lease], admitted))
        if result.action != Action.mutated:
            continue
        annotations = p["metadata"]["annotations"]
        charged_as = annotations.get(MODEL_ANNOTATION, "")
        runs_on = _runs_on(p)
        assert runs_on and (not charged_as or runs_on == {charged_as}), (charged_as, runs_on)
        admitted.append(on(charged_as, gpus * 1000, n))
        capped = {m for m, c in caps.items() if c}
        # A Pod "any" never lands on a capped model.
        assert charged_as or not (runs_on & capped), (runs_on, capped)
    assert sum(int(a["metadata"]["annotations"][CHARGE_ANNOTATION][:-1]) for a in admitted) <= count * 1000
    for model, cap in caps.items():
        if cap:
            used = sum(
                int(a["metadata"]["annotations"][CHARGE_ANNOTATION][:-1])
                for a in admitted
                if a["metadata"]["annotations"].get(MODEL_ANNOTATION) == model
            )
            assert used <= cap * 1000, (model, used, cap)
