"""The GpuLease reconciler: phases with the clock, status by Server-Side Apply, the finalizer that
releases on delete, Eviction on ``Evict`` expiry, ungating in ``Queue`` mode, and over-admission.

One key per lease (``namespace/name``), made due by the lease and by every Pod charged to it (the
watch selects Pods by the label ``castops.io/gpu-lease``), and by a timer at its next boundary
(window start, window end, end + grace). Each reconcile, from the view and ``ctx.now`` only:

1. a deleted lease (Released): evict its Pods (Eviction API, PDBs respected), and once none is
   left remove our finalizer; otherwise make sure our finalizer is on it;
2. ``Queue`` and Active: remove the scheduling gate of queued Pods, highest priority first, then
   oldest, while they fit; what this process ungated counts until the view shows it (so two
   reconciles in a row never ungate past the count: Queue mode is never over);
3. ``Evict`` and expired for ``gracePeriodSeconds``: evict the lease's Pods;
4. status (``phase``, ``used``, ``queued``, ``overage``, ``pods``, the window, GPU-hours, the
   ``Active`` and ``OverCommitted`` conditions) applied with field manager ``castslice-control``
   only when it differs from what the object shows, so another manager's conditions survive;
5. a lifecycle step (Activated, OverCommitted, Expired, Released) is an Event on the lease and a
   CloudEvent on the audit stream.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from function.contract import CONTROL_EVENT_SOURCE, LEASE_EVENT_TYPES
from function.control.reconciler import DONE, Context, Permission, ReconcilerPlugin, Requeue
from function.core.config import Config
from function.core.leases import (
    API_VERSION,
    CHARGED,
    CHARGED_PODS,
    FINALIZER,
    GATE,
    GROUP,
    KIND,
    LEASES,
    PLURAL,
    QUEUED,
    STATE_LABEL,
    VERSION,
    ChargedPod,
    Enforcement,
    ExpiryAction,
    Lease,
    Phase,
    Usage,
    gpus,
    parse_time,
    until,
    usage_from,
)
from function.core.view import ClusterView, Record, WatchSpec
from function.kube.client import APPLY_PATCH, Api, ApiError, collection_path, object_path

log = logging.getLogger("castslice.control.gpuleases")

NAME = "gpu-leases"
FIELD_MANAGER = "castslice-control"
FINALIZER_MANAGER = "castslice-control-finalizer"
EVENT_SOURCE = CONTROL_EVENT_SOURCE
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
RESYNC_SECONDS = 600.0
"""Every lease is reconciled at least this often (GPU-hours move on; a missed event is repaired)."""


def hours_text(value: Decimal) -> str:
    return f"{value.quantize(Decimal('0.001')):f}"


def time_text(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else ""


@dataclass(frozen=True)
class Observed:
    """What the lease's status shows now (the part this controller owns)."""

    phase: str = ""
    used: str = ""
    gpu_hours: Decimal = Decimal(0)
    since: datetime | None = None
    conditions: Mapping[str, str] = None  # type: ignore[assignment]

    @classmethod
    def of(cls, status: Any) -> Observed:
        status = status if isinstance(status, Mapping) else {}
        consumed = status.get("consumed") if isinstance(status.get("consumed"), Mapping) else {}
        assert isinstance(consumed, Mapping)
        try:
            hours = Decimal(str(consumed.get("gpuHours") or "0"))
        except ArithmeticError:
            hours = Decimal(0)
        conditions = {
            str(c.get("type")): str(c.get("status"))
            for c in status.get("conditions") or ()
            if isinstance(c, Mapping)
        }
        return cls(
            str(status.get("phase") or ""),
            str(status.get("used") or ""),
            hours,
            parse_time(consumed.get("since")),
            conditions,
        )


def desired_status(lease: Lease, usage: Usage, now: datetime, observed: Observed) -> dict[str, Any]:
    """The status fields this controller owns (pure). GPU-hours: ``used`` has been constant since
    ``consumed.since`` (it is written whenever it changes), so adding used x elapsed is exact."""
    phase = lease.phase(now)
    hours = observed.gpu_hours
    if observed.since is not None and observed.used:
        try:
            previous = Decimal(observed.used)
        except ArithmeticError:
            previous = Decimal(0)
        elapsed = Decimal(max((now - observed.since).total_seconds(), 0.0)) / Decimal(3600)
        hours += previous * elapsed
    overage = max(usage.used - lease.count, 0)
    status: dict[str, Any] = {
        "phase": phase.value,
        "used": gpus(usage.used),
        "queued": gpus(usage.queued),
        "overage": gpus(overage),
        "free": gpus(max(lease.count - usage.used, 0) if phase in (Phase.Pending, Phase.Active) else 0),
        "overflow": gpus(usage.overflow),
        "pods": usage.pods,
        "consumed": {"gpuHours": hours_text(hours), "since": time_text(now)},
        "observedGeneration": lease.generation,
        "conditions": [
            condition(
                "Active",
                phase == Phase.Active,
                phase.value,
                {
                    Phase.Pending: f"the window starts at {until(lease.start)}",
                    Phase.Active: f"{gpus(usage.used)} of {gpus(lease.count)} GPU in use"
                    f" until {until(lease.end)}",
                    Phase.Expired: f"the window ended at {until(lease.end)}",
                    Phase.Released: "the lease was deleted; its Pods are released",
                }[phase],
                lease.generation,
                now,
                observed,
            ),
            condition(
                "OverCommitted",
                overage > 0,
                "Overage" if overage else "WithinLease",
                f"{gpus(usage.used)} GPU admitted of {gpus(lease.count)} leased ({gpus(overage)} over)"
                if overage
                else f"{gpus(usage.used)} of {gpus(lease.count)} GPU in use",
                lease.generation,
                now,
                observed,
            ),
        ],
    }
    if lease.start is not None:
        status["windowStart"] = time_text(lease.start)
    if lease.end is not None:
        status["windowEnd"] = time_text(lease.end)
    return status


def condition(
    kind: str,
    true: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
    observed: Observed,
) -> dict[str, Any]:
    status = "True" if true else "False"
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        # The transition time moves only when the status flips (a fresh one otherwise would make
        # every reconcile a change).
        "lastTransitionTime": time_text(now) if (observed.conditions or {}).get(kind) != status else "",
    }


def differs(desired: Mapping[str, Any], current: Any) -> bool:
    """Whether ``desired`` is worth applying: it changes what the object shows (GPU-hours alone
    only every RESYNC_SECONDS; transition times that did not move are no change)."""
    current = current if isinstance(current, Mapping) else {}
    for key, value in desired.items():
        if key == "consumed":
            shown = current.get("consumed") if isinstance(current.get("consumed"), Mapping) else {}
            assert isinstance(shown, Mapping)
            # GPU-hours grow while anything runs: written with the other changes, and on their
            # own at most every RESYNC_SECONDS (exact either way: ``used`` held since ``since``).
            since = parse_time(shown.get("since"))
            now = parse_time(value["since"])
            if since is None or now is None or (now - since).total_seconds() >= RESYNC_SECONDS:
                return True
        elif key == "conditions":
            shown_conditions = {
                c.get("type"): c for c in current.get("conditions") or () if isinstance(c, Mapping)
            }
            for wanted in value:
                shown = shown_conditions.get(wanted["type"]) or {}
                if any(
                    shown.get(k) != wanted[k] for k in ("status", "reason", "message", "observedGeneration")
                ):
                    return True
        elif current.get(key) != value:
            return True
    return False


def with_transition_times(desired: dict[str, Any], current: Any) -> dict[str, Any]:
    """Keep the transition time the object shows for a condition that did not flip."""
    current = current if isinstance(current, Mapping) else {}
    shown = {c.get("type"): c for c in current.get("conditions") or () if isinstance(c, Mapping)}
    for wanted in desired["conditions"]:
        if not wanted["lastTransitionTime"]:
            wanted["lastTransitionTime"] = (shown.get(wanted["type"]) or {}).get("lastTransitionTime") or ""
        if not wanted["lastTransitionTime"]:
            wanted["lastTransitionTime"] = desired["consumed"]["since"]
    return desired


def queue_order(pod: ChargedPod) -> tuple[int, str, str]:
    return (-pod.priority, pod.created, pod.name)


class LeaseMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["namespace", "lease", "model"]
        self.capacity = Gauge(
            "castslice_gpulease_capacity_gpus", "GPU-equivalents leased.", labels, registry=registry
        )
        self.used = Gauge(
            "castslice_gpulease_used_gpus", "GPU-equivalents charged.", labels, registry=registry
        )
        self.queued = Gauge(
            "castslice_gpulease_queued_gpus", "GPU-equivalents gated.", labels, registry=registry
        )
        self.overage = Gauge(
            "castslice_gpulease_overage_gpus",
            "GPU-equivalents admitted beyond the lease.",
            labels,
            registry=registry,
        )

    def show(self, lease: Lease, usage: Usage) -> None:
        labels = (lease.namespace, lease.name, lease.model)
        self.capacity.labels(*labels).set(lease.count / 1000)
        self.used.labels(*labels).set(usage.used / 1000)
        self.queued.labels(*labels).set(usage.queued / 1000)
        self.overage.labels(*labels).set(max(usage.used - lease.count, 0) / 1000)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (self.capacity, self.used, self.queued, self.overage):
            for labels in list(gauge._metrics):
                if labels[:2] == (namespace, name):
                    gauge.remove(*labels)


Emit = Callable[[str, Lease, Mapping[str, Any]], None]


class LeaseReconciler:
    name: str = NAME
    watches: tuple[WatchSpec, ...] = (LEASES, CHARGED_PODS)
    permissions: tuple[Permission, ...] = (
        # get: the status once per lease (the view keeps none); patch: our finalizer, by apply.
        Permission(GROUP, PLURAL, ("get", "patch")),
        Permission(GROUP, f"{PLURAL}/status", ("patch",)),
        Permission("", "pods", ("patch",)),  # ungating: the gate and the state label
        Permission("", "pods/eviction", ("create",)),
        Permission("", "events", ("create",)),
    )
    resync_seconds: float = RESYNC_SECONDS

    def __init__(self, api: Api, emit: Emit | None = None) -> None:
        self.api = api
        self.emit = emit or (lambda step, lease, data: None)
        self.metrics: LeaseMetrics | None = None
        self._ungated: dict[str, tuple[str, int]] = {}
        """Pod uid -> (lease key, charge) this process ungated, until the view shows them charged."""
        self._statuses: dict[str, Any] = {}
        """Lease key -> the status as last read or applied (the view keeps no status)."""

    def register(self, registry: CollectorRegistry) -> None:
        self.metrics = LeaseMetrics(registry)

    # -- the protocol ----------------------------------------------------------------------------
    def triggers(self, index: str, record: Record) -> Iterable[str]:
        if isinstance(record, Lease):
            return (record.key,)
        if isinstance(record, ChargedPod):
            return (record.lease_key,)
        return ()

    def keys(self, view: ClusterView) -> Iterable[str]:
        return [lease.key for lease in view.index(LEASES.index).values() if isinstance(lease, Lease)]

    def reconcile(self, key: str, ctx: Context) -> Requeue:
        namespace, _, name = key.partition("/")
        lease = next(
            (
                record
                for record in ctx.view.group(LEASES.index, namespace).values()
                if isinstance(record, Lease) and record.name == name
            ),
            None,
        )
        if lease is None:
            self._statuses.pop(key, None)
            if self.metrics is not None:
                self.metrics.forget(namespace, name)
            return DONE
        pods = [p for p in ctx.view.group(CHARGED_PODS.index, key).values() if isinstance(p, ChargedPod)]
        if lease.deleting:
            return self._release(lease, pods, ctx)
        if not lease.finalized:
            self._apply_finalizer(lease, keep=True)
        usage = self._usage(lease, ctx.view, pods)
        if lease.enforcement == Enforcement.Queue and lease.phase(ctx.now) == Phase.Active:
            usage = self._ungate(lease, pods, usage)
        evict_at = self._evict_at(lease)
        if evict_at is not None and ctx.now >= evict_at:
            for pod in pods:
                if not pod.terminating:
                    self._evict(pod)
        self._write_status(lease, usage, ctx.now)
        if self.metrics is not None:
            self.metrics.show(lease, usage)
        return Requeue(self._next_boundary(lease, ctx.now, pods))

    # -- counting --------------------------------------------------------------------------------
    def _usage(self, lease: Lease, view: ClusterView, pods: list[ChargedPod]) -> Usage:
        tally = getattr(view, "tally", None)
        usage = usage_from(tally(CHARGED_PODS.index, lease.key)) if callable(tally) else Usage()
        if not callable(tally):
            for pod in pods:
                usage = usage.plus(usage_from(CHARGED_PODS.tally(pod) if CHARGED_PODS.tally else ()))
        states = {pod.uid: pod.state for pod in pods}
        for uid, (lease_key, charge) in list(self._ungated.items()):
            if lease_key != lease.key:
                continue
            state = states.get(uid)
            if state is None or state != QUEUED:  # shown as charged (or gone): the view counts it now
                del self._ungated[uid]
            else:
                usage = usage.plus(Usage(used=charge, queued=-charge))
        return usage

    # -- Queue mode ------------------------------------------------------------------------------
    def _ungate(self, lease: Lease, pods: list[ChargedPod], usage: Usage) -> Usage:
        waiting = sorted(
            (p for p in pods if p.state == QUEUED and p.uid not in self._ungated and not p.terminating),
            key=queue_order,
        )
        for pod in waiting:
            if usage.used + pod.charge > lease.count:
                break  # strict order: a large Pod at the head is not starved by smaller ones behind it
            patch = {
                "metadata": {"labels": {STATE_LABEL: CHARGED}},
                "spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]},
            }
            path = object_path("", "v1", "pods", pod.namespace, pod.name)
            response = self.api.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE)
            if response.status == 404:
                continue
            if not response.ok:
                raise ApiError(f"ungate pod {pod.namespace}/{pod.name}", response)
            self._ungated[pod.uid] = (lease.key, pod.charge)
            usage = usage.plus(Usage(used=pod.charge, queued=-pod.charge))
            log.info(
                "gpu lease %s: started %s/%s (%s GPU)", lease.key, pod.namespace, pod.name, gpus(pod.charge)
            )
        return usage

    # -- expiry and release ----------------------------------------------------------------------
    def _evict_at(self, lease: Lease) -> datetime | None:
        if lease.on_expiry != ExpiryAction.Evict or lease.end is None:
            return None
        return lease.end + timedelta(seconds=lease.grace_seconds)

    def _evict(self, pod: ChargedPod) -> None:
        path = object_path("", "v1", "pods", pod.namespace, pod.name, "eviction")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        }
        response = self.api.request("POST", path, body=body)
        if response.status == 429:
            log.info("eviction of %s/%s refused by a PodDisruptionBudget; retried", pod.namespace, pod.name)
        elif not response.ok and response.status != 404:
            raise ApiError(f"evict pod {pod.namespace}/{pod.name}", response)

    def _release(self, lease: Lease, pods: list[ChargedPod], ctx: Context) -> Requeue:
        self._write_status(lease, Usage(), ctx.now)
        remaining = [pod for pod in pods if not pod.terminating]
        for pod in remaining:
            self._evict(pod)
        if pods:
            return Requeue(2.0)  # until the view shows them gone
        if lease.finalized:
            self._apply_finalizer(lease, keep=False)
        if self.metrics is not None:
            self.metrics.forget(lease.namespace, lease.name)
        return DONE

    def _apply_finalizer(self, lease: Lease, keep: bool) -> None:
        """Our finalizer, by Server-Side Apply under its own field manager: applying without it
        removes only ours (finalizers is a set; another controller's stay)."""
        metadata: dict[str, Any] = {"name": lease.name, "namespace": lease.namespace}
        if keep:
            metadata["finalizers"] = [FINALIZER]
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata}
        path = object_path(GROUP, VERSION, PLURAL, lease.namespace, lease.name)
        response = self.api.request(
            "PATCH",
            path,
            body=body,
            content_type=APPLY_PATCH,
            query={"fieldManager": FINALIZER_MANAGER, "force": "true"},
        )
        if response.status == 404:
            return
        if not response.ok:
            raise ApiError(f"apply finalizer on gpulease {lease.key}", response)

    # -- status ----------------------------------------------------------------------------------
    def _write_status(self, lease: Lease, usage: Usage, now: datetime) -> None:
        current = self._status_of(lease)
        observed = Observed.of(current)
        desired = desired_status(lease, usage, now, observed)
        if not differs(desired, current):
            return
        desired = with_transition_times(desired, current)
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": lease.name, "namespace": lease.namespace},
            "status": desired,
        }
        path = object_path(GROUP, VERSION, PLURAL, lease.namespace, lease.name, "status")
        response = self.api.request(
            "PATCH",
            path,
            body=body,
            content_type=APPLY_PATCH,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        if response.status == 404:
            return
        if not response.ok:
            raise ApiError(f"apply status of gpulease {lease.key}", response)
        self._statuses[lease.key] = response.body.get("status") or desired
        self._lifecycle(lease, observed, desired)

    def _status_of(self, lease: Lease) -> Any:
        """The status the object shows: read once per lease (the view keeps no status), then what
        the last apply returned."""
        known = self._statuses.get(lease.key)
        if known is not None:
            return known
        response = self.api.request("GET", object_path(GROUP, VERSION, PLURAL, lease.namespace, lease.name))
        status = response.body.get("status") if response.ok else None
        self._statuses[lease.key] = status or {}
        return self._statuses[lease.key]

    def _lifecycle(self, lease: Lease, observed: Observed, desired: Mapping[str, Any]) -> None:
        steps: list[tuple[str, str, str]] = []
        phase = desired["phase"]
        if phase != observed.phase:
            step = {"Active": "Activated", "Expired": "Expired", "Released": "Released"}.get(phase)
            if step:
                steps.append(
                    (step, "Normal", f"lease {phase.lower()}: {desired['conditions'][0]['message']}")
                )
        over = desired["conditions"][1]
        if over["status"] == "True" and (observed.conditions or {}).get("OverCommitted") != "True":
            steps.append(("OverCommitted", "Warning", over["message"]))
        for step, kind, message in steps:
            self._event(lease, step, kind, message)
            self.emit(step, lease, desired)

    def _event(self, lease: Lease, reason: str, kind: str, message: str) -> None:
        now = time_text(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{lease.name}.", "namespace": lease.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": lease.name,
                "namespace": lease.namespace,
                "uid": lease.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "castslice-control"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "castslice-control",
        }
        response = self.api.request("POST", collection_path("", "v1", "events", lease.namespace), body=body)
        if not response.ok:
            log.warning("event %s on gpulease %s not written: %s", reason, lease.key, response.message())

    def _next_boundary(self, lease: Lease, now: datetime, pods: list[ChargedPod]) -> float | None:
        moments = [lease.start, lease.end]
        evict_at = self._evict_at(lease)
        if evict_at is not None and pods:
            moments.append(evict_at if evict_at > now else now + timedelta(seconds=5))
        ahead = [m for m in moments if m is not None and m > now]
        if not ahead:
            return None
        return max((min(ahead) - now).total_seconds(), 0.0) + 0.05


def lifecycle_event(step: str, lease: Lease, status: Mapping[str, Any], source: str = EVENT_SOURCE) -> Any:
    """A lifecycle CloudEvent for the audit stream (the same sinks as admission decisions)."""
    from function.audit.events import LEASE_DATASCHEMA_URI, format_time
    from function.audit.sinks import WireEvent, compact_json

    event_id = str(uuid.uuid4())
    data = {
        "lease": {"namespace": lease.namespace, "name": lease.name, "uid": lease.uid, "model": lease.model},
        "step": step,
        "count": gpus(lease.count),
        "status": {k: status.get(k) for k in ("phase", "used", "queued", "overage", "pods", "windowEnd")},
    }
    attributes = {
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": LEASE_EVENT_TYPES[step],
        "subject": f"{lease.namespace}/{lease.name}",
        "time": format_time(datetime.now(UTC)),
        "datacontenttype": "application/json",
        "dataschema": LEASE_DATASCHEMA_URI,
        "podnamespace": lease.namespace,
    }
    return WireEvent(event_id, attributes, compact_json(data))


def build(config: Config, api: Api) -> LeaseReconciler | None:
    if not config.section("gpuLeases").enabled:
        return None
    emit = None
    if config.audit.sink != "none":
        import os

        from function.audit.recorder import build_recorder

        recorder = build_recorder(config, os.environ)
        sender = recorder.sender
        if sender is not None:

            def emit(step: str, lease: Lease, status: Mapping[str, Any]) -> None:
                sender.submit(lifecycle_event(step, lease, status))

    return LeaseReconciler(api, emit)


PLUGIN = ReconcilerPlugin(name=NAME, build=build)
