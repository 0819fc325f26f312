"""The lease reconciler over a view with an injected clock and a fake apiserver that keeps the
lease's status as the real one does (each apply a new resourceVersion, shown by the next view):
phases, status applied only on change, at the object's resourceVersion and computed from the
object's own status (so GPU-hours stay exact across leaders, for bound Pods only), the finalizer and
release on delete, ungating oldest first by priority and never past the count, eviction after the
grace period and what refuses it, the Events a tenant reads, and nothing done from a view that
has not listed."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from function.control.reconciler import Context
from function.control.reconcilers.gpu_leases import (
    BOUND_PODS,
    CONFLICT_RETRY,
    FIELD_MANAGER,
    NOT_SYNCED_RETRY,
    LeaseReconciler,
    Step,
    lifecycle_event,
)
from function.core.leases import (
    CHARGE_ANNOTATION,
    CHARGED_PODS,
    ENDS_ANNOTATION,
    FINALIZER,
    LEASE_LABEL,
    LEASES,
    PRIORITY_ANNOTATION,
    STATE_LABEL,
    slim_charged_pod,
    slim_lease,
)
from function.core.view import IndexState, StaticView, View
from function.kube.client import APPLY_PATCH, ApiResponse
from tests.support.fake_api import FakeApi

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
LEASE = "/apis/castops.io/v1alpha1/namespaces/ml/gpuleases/h100"
SPECS = (LEASES, CHARGED_PODS, BOUND_PODS)


def lease_obj(finalized: bool = True, deleting: bool = False, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "h100",
        "namespace": "ml",
        "uid": "lease-uid",
        "creationTimestamp": "2026-11-25T00:00:00Z",
        "generation": 1,
        "resourceVersion": "1",
    }
    if finalized:
        metadata["finalizers"] = [FINALIZER]
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-25T11:00:00Z"
    return {"metadata": metadata, "spec": {"gpuModel": "H100", "count": 4, **spec}}


def pod(
    n: int,
    milli: int = 1000,
    state: str = "charged",
    priority: int = 0,
    created: str = "",
    bound: bool = True,
    **metadata: Any,
) -> dict[str, Any]:
    annotations = {CHARGE_ANNOTATION: f"{milli}m"}
    if priority:
        annotations[PRIORITY_ANNOTATION] = str(priority)
    return {
        "metadata": {
            "name": f"p{n}",
            "namespace": "ml",
            "uid": f"uid-{n}",
            "labels": {LEASE_LABEL: "h100", STATE_LABEL: state},
            "annotations": annotations,
            "creationTimestamp": created or f"2026-11-25T10:00:{n:02d}Z",
            **metadata,
        },
        "spec": {"nodeName": "gpu-1"} if bound and state != "queued" else {},
    }


class Cluster(FakeApi):
    """The fake apiserver holding the lease and its Pods; ``view()`` is what the watches show of
    them now (the bound Pods are those with a node)."""

    def __init__(self, lease: dict[str, Any] | None, pods: list[dict[str, Any]] = ()) -> None:
        super().__init__()
        self.lease = copy.deepcopy(lease)
        self.pods = [copy.deepcopy(p) for p in pods]
        self.handlers[("PATCH", LEASE + "/status")] = self._apply_status
        self.handlers[("PATCH", LEASE)] = self._apply_metadata
        self.evicted: list[str] = []
        self.refuse_eviction = ""
        self.patched_pods: list[tuple[str, Any]] = []
        self.pod_conditions: list[tuple[str, Any]] = []

    def view(self, synced: bool = True) -> View:
        leases = {} if self.lease is None else {"lease-uid": slim_lease(self.lease)}
        charged = {CHARGED_PODS.key(p): slim_charged_pod(p) for p in self.pods}
        bound = {k: r for k, r in charged.items() if self._pod(r.name)["spec"].get("nodeName")}
        states = {
            LEASES.index: IndexState.build(leases, LEASES),
            CHARGED_PODS.index: IndexState.build(charged, CHARGED_PODS),
            BOUND_PODS.index: IndexState.build(bound, BOUND_PODS, synced=synced),
        }
        return View(states)

    def _pod(self, name: str) -> dict[str, Any]:
        return next(p for p in self.pods if p["metadata"]["name"] == name)

    def _bump(self) -> None:
        assert self.lease is not None
        self.lease["metadata"]["resourceVersion"] = str(int(self.lease["metadata"]["resourceVersion"]) + 1)

    def _apply_status(self, body: Any, query: Any) -> ApiResponse:
        assert query == {"fieldManager": FIELD_MANAGER, "force": "true"}
        if self.lease is None:
            return ApiResponse(404, {"message": "not found"})
        wanted = body["metadata"].get("resourceVersion")
        if wanted and wanted != self.lease["metadata"]["resourceVersion"]:
            return ApiResponse(409, {"message": "the object has been modified"})
        self.lease["status"] = body["status"]
        self._bump()
        return ApiResponse(200, self.lease)

    def _apply_metadata(self, body: Any, query: Any) -> ApiResponse:
        if self.lease is None:
            return ApiResponse(404, {"message": "not found"})
        assert body["metadata"]["uid"] == self.lease["metadata"]["uid"]
        self.lease["metadata"]["finalizers"] = body["metadata"].get("finalizers", [])
        self._bump()
        return ApiResponse(200, self.lease)

    def request(self, method: str, path: str, **kwargs: Any) -> ApiResponse:
        if path.endswith("/eviction"):
            name = path.split("/")[-2]
            self.requests.append((method, path, kwargs.get("body"), ""))
            if self.refuse_eviction:
                return ApiResponse(429, {"message": self.refuse_eviction})
            self.evicted.append(name)
            self._pod(name)["metadata"]["deletionTimestamp"] = "2026-11-25T12:00:30Z"
            return ApiResponse(201, {})
        if method == "PATCH" and "/pods/" in path and path.endswith("/status"):
            self.pod_conditions.append((path.split("/")[-2], kwargs.get("body")))
            return ApiResponse(200, {})
        if method == "PATCH" and "/pods/" in path:
            self.patched_pods.append((path.split("/")[-1], kwargs.get("body")))
            return ApiResponse(200, {})
        if method == "POST" and path.endswith("/events"):
            self.requests.append((method, path, kwargs.get("body"), ""))
            return ApiResponse(201, {})
        return super().request(method, path, **kwargs)

    def status_applies(self) -> list[Any]:
        return [
            body for method, path, body, _ in self.requests if method == "PATCH" and path.endswith("/status")
        ]

    def events(self) -> list[dict[str, Any]]:
        return [body for method, path, body, _ in self.requests if path.endswith("/events")]

    def reasons(self) -> list[str]:
        return [event["reason"] for event in self.events()]

    def status(self) -> dict[str, Any]:
        assert self.lease is not None
        return self.lease.get("status") or {}


def reconcile(r: LeaseReconciler, cluster: Cluster, now: datetime = NOW) -> Any:
    return r.reconcile("ml/h100", Context(cluster.view(), now))


def conditions(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.status()["conditions"]}


def test_status_is_applied_with_the_arithmetic_and_only_when_it_changes() -> None:
    cluster = Cluster(lease_obj(duration="24h"), [pod(1), pod(2, 500)])
    r = LeaseReconciler(cluster)
    reconcile(r, cluster)
    (applied,) = cluster.status_applies()
    status = applied["status"]
    assert (status["phase"], status["used"], status["free"], status["pods"]) == ("Active", "1.5", "2.5", 2)
    assert status["overage"] == "0" and status["windowEnd"] == "2026-11-26T00:00:00Z"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Active": "True",
        "OverCommitted": "False",
        "Valid": "True",
        "PodsOutliveLease": "False",
    }
    assert applied["metadata"]["resourceVersion"] == "1"  # at the version the view showed
    assert cluster.reasons() == ["Activated"]
    reconcile(r, cluster, NOW + timedelta(seconds=30))
    assert len(cluster.status_applies()) == 1  # nothing changed: no write
    reconcile(r, cluster, NOW + timedelta(minutes=10))  # but the GPU-hours move on every 10 minutes
    assert cluster.status()["consumed"]["gpuHours"] == "0.250000"


def test_another_managers_condition_is_not_in_our_apply() -> None:
    cluster = Cluster({**lease_obj(), "status": {"conditions": [{"type": "Audited", "status": "True"}]}})
    reconcile(LeaseReconciler(cluster), cluster)
    (applied,) = cluster.status_applies()
    # Server-Side Apply with only our conditions: the apiserver keeps the other manager's by type.
    assert [c["type"] for c in applied["status"]["conditions"]] == [
        "Active",
        "OverCommitted",
        "Valid",
        "PodsOutliveLease",
    ]
    (status_patch,) = [r for r in cluster.requests if r[0] == "PATCH" and r[1].endswith("/status")]
    assert status_patch[3] == APPLY_PATCH


def test_gpu_hours_add_up_exactly_between_changes_for_bound_pods_only() -> None:
    cluster = Cluster(lease_obj(), [pod(1), pod(2), pod(3, bound=False)])
    r = LeaseReconciler(cluster)
    reconcile(r, cluster)
    assert cluster.status()["consumed"]["running"] == "2" and cluster.status()["used"] == "3"
    cluster.pods = cluster.pods[:1] + cluster.pods[2:]  # p2 leaves after 3 hours
    reconcile(r, cluster, NOW + timedelta(hours=3))
    # 2 GPU bound for 3 h; the Pending Pod is charged (used) but accrues nothing.
    assert cluster.status()["consumed"]["gpuHours"] == "6.000000"
    reconcile(r, cluster, NOW + timedelta(hours=4))
    assert cluster.status()["consumed"]["gpuHours"] == "7.000000"


def test_gpu_hours_count_no_fraction_of_a_second_twice() -> None:
    """``since`` is written to the millisecond: the hours of a write end there, not at the exact
    clock, so a write every 400 ms for a minute still adds up to one GPU-minute."""
    cluster = Cluster(lease_obj(), [pod(1)])
    r = LeaseReconciler(cluster)
    for tick in range(151):
        cluster.pods[0]["metadata"]["labels"]["tick"] = str(tick)
        lease = cluster.lease
        assert lease is not None
        lease.setdefault("status", {}).setdefault("conditions", [])
        # Force a write every time: each one a change of what is running.
        cluster.pods[0]["spec"]["nodeName"] = "gpu-1" if tick % 2 == 0 else ""
        reconcile(r, cluster, NOW + timedelta(milliseconds=400 * tick))
    written = Decimal(cluster.status()["consumed"]["gpuHours"])
    # Bound on every even tick, for the 400 ms after it: 75 x 0.4 s (each write rounds the hours to
    # a millionth, 3.6 ms of one GPU).
    assert abs(written * 3600 - Decimal(30)) <= Decimal("0.3")


def test_gpu_hours_stay_exact_across_leaders_whose_memory_starts_empty() -> None:
    """Each new leader is a new reconciler (nothing of the last term kept): the hours come from
    the object's status, so two handovers still add up to the true integral."""
    cluster = Cluster(lease_obj(), [pod(1), pod(2)])
    reconcile(LeaseReconciler(cluster), cluster)
    reconcile(LeaseReconciler(cluster), cluster, NOW + timedelta(hours=1))  # the second leader
    cluster.pods = cluster.pods[:1]
    reconcile(LeaseReconciler(cluster), cluster, NOW + timedelta(hours=2))  # the third: p2 left
    reconcile(LeaseReconciler(cluster), cluster, NOW + timedelta(hours=3))
    # 2 GPU x 2 h + 1 GPU x 1 h, however many leaders wrote it (the rest is RESYNC_SECONDS apart).
    assert cluster.status()["consumed"]["gpuHours"] == "5.000000"


def test_a_status_computed_from_a_stale_view_is_refused_not_written() -> None:
    """Another writer (the leader before, or a leader now) wrote after what the view shows: the
    status computed from the view is refused, never written over the newer one."""
    cluster = Cluster(lease_obj(), [pod(1)])
    stale = cluster.view()  # before the write below
    reconcile(LeaseReconciler(cluster), cluster)
    written = copy.deepcopy(cluster.status())
    cluster.pods.append(pod(2))  # a change: the next status differs
    requeue = LeaseReconciler(cluster).reconcile("ml/h100", Context(stale, NOW + timedelta(minutes=20)))
    assert requeue.after == CONFLICT_RETRY
    assert cluster.status() == written  # the newer status stands
    reconcile(LeaseReconciler(cluster), cluster, NOW + timedelta(minutes=20))  # the view caught up
    assert cluster.status()["used"] == "2" and cluster.status()["consumed"]["gpuHours"] == "0.333333"


def test_a_leaders_own_write_not_yet_in_its_view_is_built_on_at_once() -> None:
    """The watch has not brought this leader's last write back yet: the next status is computed
    from that write and applied at its version (no refusal, no retry later that would count the
    wait at the old figure)."""
    cluster = Cluster(lease_obj(finalized=False), [pod(1)])
    r = LeaseReconciler(cluster)
    before = cluster.view()
    reconcile(r, cluster)  # the finalizer, then the status: two writes
    assert len(cluster.status_applies()) == 1
    # The view still shows the lease as it was before both writes (and one Pod, as then).
    requeue = r.reconcile("ml/h100", Context(before, NOW + timedelta(minutes=30)))
    assert requeue.after != CONFLICT_RETRY
    (_, second) = cluster.status_applies()
    assert second["metadata"]["resourceVersion"] == "3"  # after the finalizer (2) and the status (3)
    assert cluster.status()["consumed"]["gpuHours"] == "0.500000"  # 1 GPU for 30 minutes, exactly
    assert not [x for x in cluster.requests[2:] if x[0] == "PATCH" and x[1] == LEASE]  # finalizer once


def test_phases_move_with_the_clock_and_the_timer_is_the_next_boundary() -> None:
    cluster = Cluster(lease_obj(window={"start": "2026-11-25T13:00:00Z", "end": "2026-11-25T15:00:00Z"}))
    r = LeaseReconciler(cluster)
    requeue = reconcile(r, cluster)
    assert cluster.status()["phase"] == "Pending" and cluster.status()["free"] == "4"
    assert 3600 <= requeue.after <= 3601
    requeue = reconcile(r, cluster, NOW + timedelta(hours=1))
    assert cluster.status()["phase"] == "Active"
    assert 7200 <= requeue.after <= 7201
    requeue = reconcile(r, cluster, NOW + timedelta(hours=3))
    assert cluster.status()["phase"] == "Expired" and cluster.status()["free"] == "0"
    assert requeue.after is None
    assert cluster.reasons() == ["Activated", "Expired"]


def test_over_admission_is_reported_as_overage_condition_event_and_metric() -> None:
    cluster = Cluster(lease_obj(), [pod(i) for i in range(6)])
    r = LeaseReconciler(cluster)
    registry = CollectorRegistry()
    r.register(registry)
    emitted: list[Step] = []
    r.emit = emitted.append
    reconcile(r, cluster)
    status = cluster.status()
    assert status["overage"] == "2"
    over = conditions(cluster)["OverCommitted"]
    assert over["status"] == "True" and "6 GPU admitted of 4 leased (2 over)" in over["message"]
    assert "OverCommitted" in cluster.reasons()
    assert [step.step for step in emitted] == ["Activated", "OverCommitted"]
    metrics = generate_latest(registry).decode()
    assert 'castslice_gpulease_overage_gpus{lease="h100",model="H100",namespace="ml"} 2.0' in metrics


def test_queue_mode_ungates_by_priority_then_age_and_never_past_the_count() -> None:
    pods = [
        pod(1, 2000, "charged"),
        pod(2, 1000, "queued", created="2026-11-25T09:00:00Z"),
        pod(3, 1000, "queued", priority=10, created="2026-11-25T11:00:00Z"),
        pod(4, 1000, "queued", created="2026-11-25T10:00:00Z"),
    ]
    cluster = Cluster(lease_obj(enforcement="Queue"), pods)
    r = LeaseReconciler(cluster)
    reconcile(r, cluster)
    assert [name for name, _ in cluster.patched_pods] == ["p3", "p2"]  # priority first, then the oldest
    _, patch = cluster.patched_pods[0]
    assert patch["spec"]["schedulingGates"] == [{"$patch": "delete", "name": "castops.io/gpu-lease"}]
    assert patch["metadata"]["labels"] == {STATE_LABEL: "charged"}
    # The view does not show the ungating yet: a second reconcile must not start p4.
    reconcile(r, cluster, NOW + timedelta(seconds=1))
    assert [name for name, _ in cluster.patched_pods] == ["p3", "p2"]
    assert cluster.status()["used"] == "4"
    # p4 waits, and its Pod says so once (with its place in the queue and why).
    (queued,) = [e for e in cluster.events() if e["reason"] == "Queued"]
    assert queued["involvedObject"]["name"] == "p4" and queued["related"]["name"] == "h100"
    assert "position 1 of 1" in queued["message"] and "4 of 4 GPU in use" in queued["message"]


def test_queued_pods_before_the_window_say_they_wait_for_its_start() -> None:
    lease = lease_obj(enforcement="Queue", window={"start": "2026-11-25T13:00:00Z"})
    cluster = Cluster(lease, [pod(1, state="queued"), pod(2, state="queued")])
    reconcile(LeaseReconciler(cluster), cluster)
    assert cluster.patched_pods == []
    messages = {
        e["involvedObject"]["name"]: e["message"] for e in cluster.events() if e["reason"] == "Queued"
    }
    assert "position 1 of 2" in messages["p1"] and "position 2 of 2" in messages["p2"]
    assert all("window starts at 2026-11-25T13:00:00Z" in m for m in messages.values())


def test_evict_on_expiry_after_the_grace_period_with_an_event_on_the_pod() -> None:
    lease = lease_obj(
        window={"end": "2026-11-25T12:00:00Z"}, onExpiry={"action": "Evict", "gracePeriodSeconds": 60}
    )
    cluster = Cluster(lease, [pod(1)])
    r = LeaseReconciler(cluster)
    emitted: list[Step] = []
    r.emit = emitted.append
    requeue = reconcile(r, cluster)
    assert cluster.evicted == [] and 60 <= requeue.after <= 61
    reconcile(r, cluster, NOW + timedelta(seconds=61))
    assert cluster.evicted == ["p1"]
    (evicted,) = [e for e in cluster.events() if e["reason"] == "Evicted"]
    assert evicted["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p1",
        "uid": "uid-1",
    }
    assert "window ended at 2026-11-25T12:00:00Z" in evicted["message"]
    assert any(step.step == "Evicted" and step.pod is not None for step in emitted)


def test_an_eviction_a_pdb_refuses_is_told_once_and_shown_until_the_pods_go() -> None:
    lease = lease_obj(
        window={"end": "2026-11-25T11:00:00Z"}, onExpiry={"action": "Evict", "gracePeriodSeconds": 0}
    )
    cluster = Cluster(lease, [pod(1), pod(2)])
    cluster.refuse_eviction = "Cannot evict pod as it would violate the pod's disruption budget."
    r = LeaseReconciler(cluster)
    for seconds in (0, 5, 10):
        requeue = reconcile(r, cluster, NOW + timedelta(seconds=seconds))
        assert requeue.after is not None and requeue.after <= 5.1  # tried again soon
    assert cluster.reasons().count("EvictionBlocked") == 2  # one per Pod, not one per try
    outlive = conditions(cluster)["PodsOutliveLease"]
    assert outlive["status"] == "True" and outlive["reason"] == "EvictionBlocked"
    assert "2 eviction(s) refused by a PodDisruptionBudget" in outlive["message"]
    assert cluster.status()["used"] == "2"  # what runs is still counted
    assert cluster.reasons().count("PodsOutliveLease") == 1
    cluster.refuse_eviction = ""
    reconcile(r, cluster, NOW + timedelta(seconds=15))
    cluster.pods = []
    reconcile(r, cluster, NOW + timedelta(seconds=20))
    assert conditions(cluster)["PodsOutliveLease"]["status"] == "False"


def test_a_pod_a_finalizer_keeps_past_its_grace_is_told() -> None:
    stuck = pod(1, deletionTimestamp="2026-11-25T11:30:00Z", finalizers=["example.com/keep"])
    cluster = Cluster(lease_obj(deleting=True), [stuck])
    r = LeaseReconciler(cluster)
    reconcile(r, cluster)
    (blocked,) = [e for e in cluster.events() if e["reason"] == "FinalizerBlocks"]
    assert "example.com/keep" in blocked["message"] and blocked["type"] == "Warning"
    assert conditions(cluster)["PodsOutliveLease"]["reason"] == "FinalizerBlocks"
    assert cluster.lease is not None and cluster.lease["metadata"]["finalizers"] == [FINALIZER]


def test_stop_admitting_expiry_evicts_nothing_and_says_the_pods_run_on() -> None:
    cluster = Cluster(lease_obj(window={"end": "2026-11-25T11:00:00Z"}), [pod(1)])
    reconcile(LeaseReconciler(cluster), cluster)
    assert cluster.evicted == []
    outlive = conditions(cluster)["PodsOutliveLease"]
    assert outlive["status"] == "True" and outlive["reason"] == "StopAdmitting"


def test_a_new_lease_gets_our_finalizer_by_server_side_apply_naming_its_uid() -> None:
    cluster = Cluster(lease_obj(finalized=False))
    reconcile(LeaseReconciler(cluster), cluster)
    (apply,) = [r for r in cluster.requests if r[0] == "PATCH" and r[1] == LEASE]
    assert apply[2]["metadata"]["finalizers"] == [FINALIZER] and apply[3] == APPLY_PATCH
    assert apply[2]["metadata"]["uid"] == "lease-uid"


def test_a_deleted_lease_evicts_its_pods_then_gives_up_its_finalizer() -> None:
    cluster = Cluster(lease_obj(deleting=True), [pod(1), pod(2, state="queued")])
    r = LeaseReconciler(cluster)
    requeue = reconcile(r, cluster)
    assert sorted(cluster.evicted) == ["p1", "p2"] and requeue.after is not None
    assert not [x for x in cluster.requests if x[0] == "PATCH" and x[1] == LEASE]
    status = cluster.status()
    assert status["phase"] == "Released" and status["used"] == "1"  # not 0 while its Pods are there
    assert conditions(cluster)["PodsOutliveLease"]["status"] == "True"
    cluster.pods = []
    reconcile(r, cluster)
    (apply,) = [x for x in cluster.requests if x[0] == "PATCH" and x[1] == LEASE]
    assert "finalizers" not in apply[2]["metadata"]  # applied without it: ours is removed
    assert "Released" in cluster.reasons()


def test_nothing_is_released_evicted_or_ungated_from_a_view_that_has_not_listed() -> None:
    cluster = Cluster(lease_obj(deleting=True), [pod(1)])
    r = LeaseReconciler(cluster)
    requeue = r.reconcile("ml/h100", Context(cluster.view(synced=False), NOW))
    assert requeue.after == NOT_SYNCED_RETRY
    assert cluster.requests == []


def test_an_invalid_lease_is_reported_and_never_acted_on() -> None:
    bad = lease_obj(
        finalized=False,
        enforcement="Queue",
        duration="87600000h",
        onExpiry={"action": "Evict", "gracePeriodSeconds": 0},
    )
    cluster = Cluster(bad, [pod(1, state="queued")])
    r = LeaseReconciler(cluster)
    registry = CollectorRegistry()
    r.register(registry)
    reconcile(r, cluster, NOW + timedelta(days=3650 * 2))
    assert cluster.status()["phase"] == "Invalid" and cluster.status()["free"] == "0"
    valid = conditions(cluster)["Valid"]
    assert valid["status"] == "False" and "spec.duration" in valid["message"]
    assert cluster.reasons() == ["Invalid"]
    assert cluster.patched_pods == [] and cluster.evicted == []
    assert not [x for x in cluster.requests if x[0] == "PATCH" and x[1] == LEASE]  # no finalizer
    assert 'castslice_gpulease_invalid{lease="h100",model="H100",namespace="ml"} 1.0' in (
        generate_latest(registry).decode()
    )


def test_a_lost_lead_drops_the_terms_memory_and_gauges() -> None:
    cluster = Cluster(lease_obj(enforcement="Queue"), [pod(1, state="queued")])
    r = LeaseReconciler(cluster)
    registry = CollectorRegistry()
    r.register(registry)
    reconcile(r, cluster)
    assert r._ungated and "castslice_gpulease_used_gpus{" in generate_latest(registry).decode()
    r.forget_term()
    assert not r._ungated and not r._told
    assert "castslice_gpulease_used_gpus{" not in generate_latest(registry).decode()


def test_a_lease_gone_from_the_view_is_done() -> None:
    cluster = Cluster(None)
    assert LeaseReconciler(cluster).reconcile("ml/h100", Context(cluster.view(), NOW)).after is None


def test_triggers_map_leases_and_their_pods_to_the_lease_key() -> None:
    r = LeaseReconciler(Cluster(None))
    assert list(r.triggers(LEASES.index, slim_lease(lease_obj()))) == ["ml/h100"]
    assert list(r.triggers(CHARGED_PODS.index, slim_charged_pod(pod(1)))) == ["ml/h100"]
    assert list(r.triggers(BOUND_PODS.index, slim_charged_pod(pod(1)))) == ["ml/h100"]
    assert list(r.keys(StaticView({LEASES.index: {"u": slim_lease(lease_obj())}}, specs=SPECS))) == [
        "ml/h100"
    ]


# -- budgets, recurring windows, notice ---------------------------------------------------------
def test_a_budget_is_written_and_each_closed_period_is_one_chargeback_record_whoever_leads() -> None:
    """1.5 GPU-minutes every two minutes from 12:00; two GPUs bound. The period closing at 12:02 is
    told once with what ran in it (id: the lease's uid and the period's start), by whichever leader
    reconciles first after it, and a new leader tells it with the same id."""
    spec = {
        "window": {"start": "2026-11-25T12:00:00Z"},
        "budget": {"gpuHours": "0.025", "period": "Fixed", "length": "2m"},
    }
    cluster = Cluster(lease_obj(**spec), [pod(1), pod(2)])
    first = LeaseReconciler(cluster)
    told: list[Step] = []
    first.emit = told.append
    reconcile(first, cluster)
    budget = cluster.status()["budget"]
    assert (budget["periodStart"], budget["periodEnd"], budget["used"]) == (
        "2026-11-25T12:00:00Z",
        "2026-11-25T12:02:00Z",
        "0.000000",
    )
    requeue = reconcile(first, cluster, NOW + timedelta(seconds=30))
    # Spent at 12:00:45 at two GPUs: the leader looks again then.
    assert 14 < requeue.after < 16
    reconcile(first, cluster, NOW + timedelta(seconds=45, milliseconds=100))
    assert cluster.status()["phase"] == "Exhausted"
    assert cluster.status()["budget"]["exhaustedAt"] == "2026-11-25T12:00:45Z"
    # 12:02:30: the period closed; a new leader (nothing of the last term kept) tells the record.
    second = LeaseReconciler(cluster)
    second.emit = told.append
    reconcile(second, cluster, NOW + timedelta(minutes=2, seconds=30))
    (closed,) = [step for step in told if step.step == "PeriodClosed"]
    assert closed.period is not None
    # 2 GPUs for 2 minutes (each write rounds to a millionth of an hour).
    assert abs(closed.period.gpu_hours - Decimal(4) / 60) < Decimal("0.000001")
    assert closed.event_id == "lease-uid/2026-11-25T12:00:00Z"
    assert cluster.status()["phase"] == "Active" and cluster.status()["budget"]["used"] == "0.016667"
    assert "Exhausted" in cluster.reasons() and cluster.reasons().count("PeriodClosed") == 1
    event = lifecycle_event(closed)
    assert event.id == closed.event_id and event.time == datetime(2026, 11, 25, 12, 2, tzinfo=UTC)
    assert event.data["period"] == {
        "start": "2026-11-25T12:00:00Z",
        "end": "2026-11-25T12:02:00Z",
        "gpuHours": "0.066667",
        "kind": "Fixed",
        "budgetGpuHours": "0.025000",
    }


def test_a_spent_budget_evicts_after_the_grace_with_evict_and_keeps_queued_pods() -> None:
    spec = {
        "window": {"start": "2026-11-25T12:00:00Z"},
        "budget": {"gpuHours": "0.025", "period": "Fixed", "length": "2m"},
        "onExpiry": {"action": "Evict", "gracePeriodSeconds": 10},
        "enforcement": "Queue",
        "count": 2,
    }
    cluster = Cluster(lease_obj(**spec), [pod(1), pod(2), pod(3, state="queued")])
    r = LeaseReconciler(cluster)
    reconcile(r, cluster)
    reconcile(r, cluster, NOW + timedelta(seconds=46))
    assert cluster.evicted == []  # spent at 12:00:45, evicted 10 s later
    reconcile(r, cluster, NOW + timedelta(seconds=56))
    assert sorted(cluster.evicted) == ["p1", "p2"]
    queued = [body for name, body in cluster.pod_conditions if name == "p3"]
    assert queued and queued[-1]["status"]["conditions"][0]["reason"] == "BudgetExhausted"
    assert "position 1 of 1" in queued[-1]["status"]["conditions"][0]["message"]


def test_a_recurring_window_closes_and_opens_with_evictions_notice_and_the_end_on_each_pod() -> None:
    """Open the first 20 s of every minute (UTC), Evict without grace, notice 5 s before."""
    spec = {
        "window": {"recurrence": {"schedule": "* * * * *", "duration": "20s"}},
        "onExpiry": {"action": "Evict", "gracePeriodSeconds": 0, "noticeSeconds": 5},
    }
    cluster = Cluster(lease_obj(**spec), [pod(1)])
    r = LeaseReconciler(cluster)
    assert reconcile(r, cluster, NOW + timedelta(seconds=2)).after == pytest.approx(13.05, abs=0.01)
    assert cluster.status()["windowEnd"] == "2026-11-25T12:00:20Z"
    (annotated,) = [body for name, body in cluster.patched_pods if name == "p1"]
    assert annotated["metadata"]["annotations"] == {ENDS_ANNOTATION: "2026-11-25T12:00:20Z"}
    reconcile(r, cluster, NOW + timedelta(seconds=16))
    (notice,) = [e for e in cluster.events() if e["reason"] == "EndingSoon"]
    assert notice["involvedObject"]["name"] == "p1" and "2026-11-25T12:00:20Z" in notice["message"]
    reconcile(r, cluster, NOW + timedelta(seconds=20, milliseconds=50))
    assert cluster.status()["phase"] == "Closed" and cluster.evicted == ["p1"]
    assert cluster.status()["windowStart"] == "2026-11-25T12:01:00Z"  # the next occurrence
    reconcile(r, cluster, NOW + timedelta(seconds=60, milliseconds=50))
    assert cluster.status()["phase"] == "Active"
    assert cluster.reasons().count("Activated") == 2 and "Closed" in cluster.reasons()


def test_an_invalid_lease_whose_status_the_apiserver_refuses_is_still_reported() -> None:
    """A stored lease the schema refuses may refuse its status too (a 422): the Event and the
    metric say it is invalid all the same, and the reconcile does not fail over and over."""
    cluster = Cluster(lease_obj(finalized=False, duration="87600000h"))
    cluster.handlers[("PATCH", LEASE + "/status")] = lambda body, query: ApiResponse(
        422, {"message": 'GpuLease.castops.io "h100" is invalid: spec.duration'}
    )
    r = LeaseReconciler(cluster)
    registry = CollectorRegistry()
    r.register(registry)
    assert reconcile(r, cluster).after is None
    assert cluster.reasons() == ["Invalid"]
    assert 'castslice_gpulease_invalid{lease="h100",model="H100",namespace="ml"} 1.0' in (
        generate_latest(registry).decode()
    )
