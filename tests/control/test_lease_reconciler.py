"""The lease reconciler over a static view with an injected clock and a fake apiserver: phases,
status applied only on change (and as Server-Side Apply, so other managers' conditions survive),
the finalizer and release on delete, ungating oldest first by priority and never past the count,
eviction after the grace period, and over-admission reported."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from function.control.reconciler import Context
from function.control.reconcilers.gpu_leases import FIELD_MANAGER, LeaseReconciler
from function.core.leases import (
    CHARGE_ANNOTATION,
    CHARGED_PODS,
    FINALIZER,
    LEASE_LABEL,
    LEASES,
    PRIORITY_ANNOTATION,
    STATE_LABEL,
    slim_charged_pod,
    slim_lease,
)
from function.core.view import StaticView
from function.kube.client import APPLY_PATCH, ApiResponse
from tests.support.fake_api import FakeApi

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
LEASE = "/apis/castops.io/v1alpha1/namespaces/ml/gpuleases/h100"


def lease_obj(finalized: bool = True, deleting: bool = False, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "h100",
        "namespace": "ml",
        "uid": "lease-uid",
        "creationTimestamp": "2026-11-25T00:00:00Z",
        "generation": 1,
    }
    if finalized:
        metadata["finalizers"] = [FINALIZER]
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-25T11:00:00Z"
    return {"metadata": metadata, "spec": {"gpuModel": "H100", "count": 4, **spec}}


def pod(
    n: int, milli: int = 1000, state: str = "charged", priority: int = 0, created: str = ""
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
        }
    }


def view(lease: dict[str, Any] | None, pods: list[dict[str, Any]] = ()) -> StaticView:
    leases = {} if lease is None else {"lease-uid": slim_lease(lease)}
    return StaticView(
        {LEASES.index: leases, CHARGED_PODS.index: {CHARGED_PODS.key(p): slim_charged_pod(p) for p in pods}},
        specs=(LEASES, CHARGED_PODS),
    )


class Api(FakeApi):
    """The fake apiserver, with the lease stored and applies answered as the apiserver would."""

    def __init__(self, status: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.objects[LEASE] = {"metadata": {"name": "h100", "resourceVersion": "1"}, "status": status or {}}
        self.handlers[("PATCH", LEASE + "/status")] = self._apply_status
        self.handlers[("PATCH", LEASE)] = lambda body, query: ApiResponse(200, body)
        self.evicted: list[str] = []
        self.patched_pods: list[tuple[str, Any]] = []

    def _apply_status(self, body: Any, query: Any) -> ApiResponse:
        assert query == {"fieldManager": FIELD_MANAGER, "force": "true"}
        self.objects[LEASE]["status"] = body["status"]
        return ApiResponse(200, self.objects[LEASE])

    def request(self, method: str, path: str, **kwargs: Any) -> ApiResponse:
        if path.endswith("/eviction"):
            self.evicted.append(path.split("/")[-2])
            return ApiResponse(201, {})
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

    def events(self) -> list[str]:
        return [body["reason"] for method, path, body, _ in self.requests if path.endswith("/events")]


def reconcile(r: LeaseReconciler, v: StaticView, now: datetime = NOW) -> Any:
    return r.reconcile("ml/h100", Context(v, now))


def test_status_is_applied_with_the_arithmetic_and_only_when_it_changes() -> None:
    api = Api()
    r = LeaseReconciler(api)
    v = view(lease_obj(duration="24h"), [pod(1), pod(2, 500)])
    reconcile(r, v)
    (applied,) = api.status_applies()
    status = applied["status"]
    assert (status["phase"], status["used"], status["pods"], status["overage"]) == ("Active", "1.5", 2, "0")
    assert status["windowEnd"] == "2026-11-26T00:00:00Z"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Active": "True",
        "OverCommitted": "False",
    }
    assert api.events() == ["Activated"]
    reconcile(r, v, NOW + timedelta(seconds=30))
    assert len(api.status_applies()) == 1  # nothing changed: no write
    reconcile(r, v, NOW + timedelta(minutes=10))  # but the GPU-hours move on every 10 minutes
    assert api.status_applies()[-1]["status"]["consumed"]["gpuHours"] == "0.250"


def test_another_managers_condition_is_not_in_our_apply() -> None:
    api = Api({"conditions": [{"type": "Audited", "status": "True"}]})
    reconcile(LeaseReconciler(api), view(lease_obj()))
    (applied,) = api.status_applies()
    # Server-Side Apply with only our conditions: the apiserver keeps the other manager's by type.
    assert [c["type"] for c in applied["status"]["conditions"]] == ["Active", "OverCommitted"]
    (status_patch,) = [r for r in api.requests if r[0] == "PATCH" and r[1].endswith("/status")]
    assert status_patch[3] == APPLY_PATCH


def test_gpu_hours_add_up_exactly_between_changes() -> None:
    api = Api()
    r = LeaseReconciler(api)
    reconcile(r, view(lease_obj(), [pod(1), pod(2)]))
    reconcile(r, view(lease_obj(), [pod(1)]), NOW + timedelta(hours=3))
    assert api.status_applies()[-1]["status"]["consumed"]["gpuHours"] == "6.000"  # 2 GPU x 3 h


def test_phases_move_with_the_clock_and_the_timer_is_the_next_boundary() -> None:
    api = Api()
    r = LeaseReconciler(api)
    lease = lease_obj(window={"start": "2026-11-25T13:00:00Z", "end": "2026-11-25T15:00:00Z"})
    requeue = reconcile(r, view(lease))
    assert api.status_applies()[-1]["status"]["phase"] == "Pending"
    assert 3600 <= requeue.after <= 3601
    requeue = reconcile(r, view(lease), NOW + timedelta(hours=1))
    assert api.status_applies()[-1]["status"]["phase"] == "Active"
    assert 7200 <= requeue.after <= 7201
    requeue = reconcile(r, view(lease), NOW + timedelta(hours=3))
    assert api.status_applies()[-1]["status"]["phase"] == "Expired"
    assert requeue.after is None
    assert api.events() == ["Activated", "Expired"]


def test_over_admission_is_reported_as_overage_condition_event_and_metric() -> None:
    api = Api()
    r = LeaseReconciler(api)
    registry = CollectorRegistry()
    r.register(registry)
    emitted: list[str] = []
    r.emit = lambda step, lease, status: emitted.append(step)
    reconcile(r, view(lease_obj(), [pod(i) for i in range(6)]))
    status = api.status_applies()[-1]["status"]
    assert status["overage"] == "2"
    over = next(c for c in status["conditions"] if c["type"] == "OverCommitted")
    assert over["status"] == "True" and "6 GPU admitted of 4 leased (2 over)" in over["message"]
    assert "OverCommitted" in api.events() and emitted == ["Activated", "OverCommitted"]
    metrics = generate_latest(registry).decode()
    assert 'castslice_gpulease_overage_gpus{lease="h100",model="H100",namespace="ml"} 2.0' in metrics


def test_queue_mode_ungates_by_priority_then_age_and_never_past_the_count() -> None:
    api = Api()
    r = LeaseReconciler(api)
    pods = [
        pod(1, 2000, "charged"),
        pod(2, 1000, "queued", created="2026-11-25T09:00:00Z"),
        pod(3, 1000, "queued", priority=10, created="2026-11-25T11:00:00Z"),
        pod(4, 1000, "queued", created="2026-11-25T10:00:00Z"),
    ]
    v = view(lease_obj(enforcement="Queue"), pods)
    reconcile(r, v)
    assert [name for name, _ in api.patched_pods] == ["p3", "p2"]  # priority first, then the oldest
    _, patch = api.patched_pods[0]
    assert patch["spec"]["schedulingGates"] == [{"$patch": "delete", "name": "castops.io/gpu-lease"}]
    assert patch["metadata"]["labels"] == {STATE_LABEL: "charged"}
    # The view does not show the ungating yet: a second reconcile must not start p4.
    reconcile(r, v, NOW + timedelta(seconds=1))
    assert [name for name, _ in api.patched_pods] == ["p3", "p2"]
    assert api.status_applies()[-1]["status"]["used"] == "4"


def test_evict_on_expiry_after_the_grace_period() -> None:
    api = Api()
    r = LeaseReconciler(api)
    lease = lease_obj(
        window={"end": "2026-11-25T12:00:00Z"}, onExpiry={"action": "Evict", "gracePeriodSeconds": 60}
    )
    requeue = reconcile(r, view(lease, [pod(1)]))
    assert api.evicted == [] and 60 <= requeue.after <= 61
    reconcile(r, view(lease, [pod(1)]), NOW + timedelta(seconds=61))
    assert api.evicted == ["p1"]


def test_stop_admitting_expiry_evicts_nothing() -> None:
    api = Api()
    reconcile(LeaseReconciler(api), view(lease_obj(window={"end": "2026-11-25T11:00:00Z"}), [pod(1)]))
    assert api.evicted == []


def test_a_new_lease_gets_our_finalizer_by_server_side_apply() -> None:
    api = Api()
    reconcile(LeaseReconciler(api), view(lease_obj(finalized=False)))
    (apply,) = [r for r in api.requests if r[0] == "PATCH" and r[1] == LEASE]
    assert apply[2]["metadata"]["finalizers"] == [FINALIZER] and apply[3] == APPLY_PATCH


def test_a_deleted_lease_evicts_its_pods_then_gives_up_its_finalizer() -> None:
    api = Api()
    r = LeaseReconciler(api)
    deleted = lease_obj(deleting=True)
    requeue = reconcile(r, view(deleted, [pod(1), pod(2, state="queued")]))
    assert sorted(api.evicted) == ["p1", "p2"] and requeue.after == 2.0
    assert not [x for x in api.requests if x[0] == "PATCH" and x[1] == LEASE]
    assert api.status_applies()[-1]["status"]["phase"] == "Released"
    reconcile(r, view(deleted, []))
    (apply,) = [x for x in api.requests if x[0] == "PATCH" and x[1] == LEASE]
    assert "finalizers" not in apply[2]["metadata"]  # applied without it: ours is removed
    assert "Released" in api.events()


def test_a_lease_gone_from_the_view_is_done() -> None:
    assert LeaseReconciler(Api()).reconcile("ml/h100", Context(view(None), NOW)).after is None


def test_triggers_map_leases_and_their_pods_to_the_lease_key() -> None:
    r = LeaseReconciler(Api())
    assert list(r.triggers(LEASES.index, slim_lease(lease_obj()))) == ["ml/h100"]
    assert list(r.triggers(CHARGED_PODS.index, slim_charged_pod(pod(1)))) == ["ml/h100"]
    assert list(r.keys(view(lease_obj()))) == ["ml/h100"]
