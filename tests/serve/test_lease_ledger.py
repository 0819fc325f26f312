"""One serving process never charges past a lease: its ledger counts what the view does not show
yet, and the turns keep concurrent reviews from reading the same count."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from function.admission.gpuleases import review_gpulease
from function.admission.wire import AdmissionReview
from function.core.leases import CHARGED_PODS, LEASES, slim_lease
from function.core.mutators.base import Action, RequestContext
from function.core.mutators.gpu_leases import GpuLeases, GpuLeasesConfig
from function.core.view import StaticView
from function.serve.lease_ledger import LeaseLedger
from function.serve.ledger import DecisionTurns, with_ledgers

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def lease(count: Any, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "h100",
            "namespace": "ml",
            "uid": "l1",
            "creationTimestamp": "2026-11-25T00:00:00Z",
        },
        "spec": {"gpuModel": "H100", "count": count, **spec},
    }


def lagging_view(count: Any, **spec: Any) -> StaticView:
    """The view as it is during a burst: the lease, and none of the Pods just admitted."""
    return StaticView(
        {LEASES.index: {"l1": slim_lease(lease(count, **spec))}, CHARGED_PODS.index: {}},
        specs=(LEASES, CHARGED_PODS),
    )


def gpu_pod(n: int, gpus: int, shared: bool) -> dict[str, Any]:
    resource = "nvidia.com/gpu-shared" if shared else "nvidia.com/gpu"
    return {
        "metadata": {"generateName": "w-", "namespace": "ml", "name": f"w-{n}"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)}}}]},
    }


def admit(mutator: GpuLeases, ledger: LeaseLedger, snapshot: Any, pod: dict[str, Any], n: int) -> int:
    """One review as the webhook runs it: snapshot (+ ledger), decide, record what was admitted."""
    result = mutator.mutate(pod, RequestContext(uid=f"r{n}", namespace="ml", cluster=snapshot()))
    if (
        result.action != Action.mutated
        or pod["metadata"]["labels"]["castops.io/gpu-lease-state"] != "charged"
    ):
        return 0
    ledger.observe_admitted(pod)
    return int(pod["metadata"]["annotations"]["castops.io/gpu-lease-charge"].rstrip("m"))


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=16),
    pods=st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=40),
)
def test_one_process_never_charges_past_a_lease(count: int, pods: list[tuple[int, bool]]) -> None:
    mutator = GpuLeases(GpuLeasesConfig(enabled=True))
    ledger = LeaseLedger()
    view = lagging_view(count)
    snapshot = with_ledgers(lambda: view, [ledger], now=lambda: NOW)
    charged = sum(admit(mutator, ledger, snapshot, gpu_pod(n, g, s), n) for n, (g, s) in enumerate(pods))
    assert charged <= count * 1000


def test_concurrent_reviews_take_turns_and_stay_within_the_lease() -> None:
    mutator = GpuLeases(GpuLeasesConfig(enabled=True))
    ledger, turns = LeaseLedger(), DecisionTurns(wait_seconds=5)
    view = lagging_view(8)
    snapshot = with_ledgers(lambda: view, [ledger], turns, now=lambda: NOW)
    charged: list[int] = []

    def review(n: int) -> None:
        try:
            charged.append(admit(mutator, ledger, snapshot, gpu_pod(n, 1, False), n))
        finally:
            turns.end()

    threads = [threading.Thread(target=review, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(charged) == 8000 and charged.count(1000) == 8


def test_the_validating_webhook_denies_naming_every_field() -> None:
    obj = lease(-1, duration="soon", enforcement="Maybe")
    obj.update({"apiVersion": "castops.io/v1alpha1", "kind": "GpuLease"})
    review = AdmissionReview.model_validate(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": "castops.io", "version": "v1alpha1", "kind": "GpuLease"},
                "resource": {"group": "castops.io", "version": "v1alpha1", "resource": "gpuleases"},
                "operation": "CREATE",
                "namespace": "ml",
                "userInfo": {"username": "admin"},
                "object": obj,
            },
        }
    )
    response = review_gpulease(review)
    assert response.allowed is False
    message = response.denial or ""
    assert message.startswith("GpuLease h100 is invalid: ")
    for field in ("spec.count", "spec.duration", "spec.enforcement"):
        assert field in message


def test_a_charge_leaves_the_ledger_when_the_watch_delivers_its_pod_even_if_already_deleted() -> None:
    from function.core.leases import slim_charged_pod
    from function.core.mutators.gpu_leases import LedgerCharge

    ledger = LeaseLedger()
    ledger.add("ml/h100", LedgerCharge("d1", 1000, "charged"))
    ledger.add("ml/h100", LedgerCharge("d2", 1000, "charged"))
    pod = slim_charged_pod(
        {
            "metadata": {
                "name": "p",
                "namespace": "ml",
                "uid": "u",
                "labels": {"castops.io/gpu-lease": "h100"},
                "annotations": {"castops.io/gpu-lease-decision": "d1"},
            }
        }
    )
    ledger.watched("pods", None, pod)  # another index: ignored
    assert len(ledger.snapshot()["ml/h100"]) == 2
    ledger.watched(CHARGED_PODS.index, pod, None)  # a DELETED event no review saw the ADDED of
    assert [entry.decision for entry in ledger.snapshot()["ml/h100"]] == ["d2"]
