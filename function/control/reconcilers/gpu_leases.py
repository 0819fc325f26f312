"""The GpuLease reconciler: phases with the clock, status by Server-Side Apply, the finalizer that
releases on delete, Eviction on ``Evict`` expiry, ungating in ``Queue`` mode, and over-admission.

One key per lease (``namespace/name``), made due by the lease and by every Pod charged to it (the
watches select Pods by the label ``castops.io/gpu-lease``: all of them, and apart those bound to a
node), and by a timer at its next boundary (window start, window end, end + grace). Each reconcile
works from the view and ``ctx.now`` only, and does nothing before every watch it reads has listed
(a lease whose Pods are not listed yet would look empty: released, its Pods never evicted):

1. a deleted lease (Released): evict its Pods (Eviction API, PDBs respected), and once none is
   left remove our finalizer; otherwise make sure our finalizer is on it;
2. ``Queue`` and Active: remove the scheduling gate of queued Pods, highest priority first, then
   oldest, while they fit; what this leader ungated counts until the view shows it (so two
   reconciles in a row never ungate past the count: Queue mode is never over);
3. ``Evict`` and expired for ``gracePeriodSeconds``: evict the lease's Pods;
4. status (``phase``, ``used``, ``free``, ``queued``, ``overage``, ``pods``, the window, GPU-hours,
   the conditions ``Active``, ``OverCommitted``, ``Valid`` and ``PodsOutliveLease``) computed from
   the status the object shows and applied, at the object's resourceVersion, with field manager
   ``castslice-control`` only when it differs, so another manager's conditions survive and a
   status computed from a stale view is refused rather than written;
5. what a tenant would ask about is an Event (on the lease, or on the Pod it is about) and a
   CloudEvent on the audit stream: the lifecycle (Activated, OverCommitted, Expired, Released,
   Invalid, PodsOutliveLease), each eviction (Evicted, EvictionBlocked by a PodDisruptionBudget,
   FinalizerBlocks: a Pod's finalizer keeps it past its grace), each queued Pod (Queued: its
   position and why it waits).

GPU-hours: ``consumed`` holds the hours up to ``since`` and what was bound to a node then
(``running``); each write adds running x elapsed, so the figure is exact across writes and leaders
(nothing of it lives in a process) and counts scheduled Pods only, not Pods still Pending. A budget
(``status.budget``) is computed the same way (``function/core/budget.py``); each period that closes
is a chargeback record (the step PeriodClosed, its CloudEvent id the lease's uid and the period's
start, so a record told twice by two leaders is one record).

Time: a recurring window opens and closes at each occurrence (``Closed`` between them), a spent
budget closes the lease until the next period (``Exhausted``); at each close the lease acts as at
its end (``Evict`` after the grace period, queued Pods wait). A charged Pod carries when its time
ends (the annotation ``castops.io/gpu-lease-ends``, kept up to date here) and gets the Event
EndingSoon ``onExpiry.noticeSeconds`` before its lease ends or it is evicted; a queued Pod carries
its position and why it waits in its status (condition ``castops.io/GpuLeaseQueued``) and an Event.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from function.contract import CONTROL_EVENT_SOURCE, LEASE_EVENT_TYPES
from function.control.reconciler import DONE, Context, Emit, Permission, ReconcilerPlugin, Requeue
from function.core.budget import BudgetNow, Consumed, Period, budget_status, hours_text, time_text
from function.core.config import Config
from function.core.leases import (
    API_VERSION,
    AUDIT,
    CHARGED,
    CHARGED_PODS,
    ENDS_ANNOTATION,
    FINALIZER,
    GATE,
    GROUP,
    KIND,
    LEASE_LABEL,
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
    by_lease,
    gpu_float,
    gpus,
    parse_time,
    slim_charged_pod,
    tally_charge,
    until,
    usage_from,
)
from function.core.mutators.gpu_leases import budget_numbers, hours
from function.core.schedule import ZoneTable
from function.core.view import ClusterView, Record, WatchSpec
from function.kube.client import APPLY_PATCH, Api, ApiError, collection_path, object_path
from function.zones import ZONES

if TYPE_CHECKING:
    from function.audit.events import Event

log = logging.getLogger("castslice.control.gpuleases")

NAME = "gpu-leases"
FIELD_MANAGER = "castslice-control"
FINALIZER_MANAGER = "castslice-control-finalizer"
EVENT_SOURCE = CONTROL_EVENT_SOURCE
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
RESYNC_SECONDS = 600.0
"""Every lease is reconciled at least this often (GPU-hours move on; a missed event is repaired)."""
NOT_SYNCED_RETRY = 1.0
"""A lease reconciled while a watch it reads has not listed yet is looked at again this soon."""
CONFLICT_RETRY = 0.5
"""After a write refused at a resourceVersion the view had not caught up with (our own last one)."""
OUTLIVE_RETRY = 5.0
"""While Pods outlive their lease (eviction refused, or slow), how often the leader tries again."""
QUEUED_CONDITION = "castops.io/GpuLeaseQueued"
"""The condition on a queued Pod's status: True with its position and why it waits, False once the
controller starts it."""
QUEUED_POSITIONS = 100
"""A queued Pod's condition is rewritten when its position moves only within the first this many
(beyond, it says it is further back), so a long queue costs a bounded number of writes per start."""

BOUND_PODS = WatchSpec(
    index="gpu-lease-pods-bound",
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    metadata_only=True,
    slim=slim_charged_pod,
    key=CHARGED_PODS.key,
    group_by=by_lease,
    label_selector=LEASE_LABEL,
    field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
    tally=tally_charge,
)
"""The charged Pods bound to a node (the controller's own watch: GPU-hours accrue for these only;
a Pod leaves the selector, arriving as DELETED, when it finishes or is deleted)."""


def _mapping(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def conditions_of(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in status.get("conditions") or () if isinstance(c, Mapping)}


@dataclass(frozen=True)
class Outliving:
    """The lease's Pods still there after it ended (expired with Evict past the grace, released,
    or expired with StopAdmitting), by what keeps them."""

    pods: int = 0
    refused: int = 0
    """Evictions a PodDisruptionBudget refused."""
    finalized: int = 0
    """Pods past their deletion grace period that a finalizer keeps."""
    since: datetime | None = None
    stop_admitting: bool = False

    def message(self) -> str:
        if not self.pods:
            return "no Pod of the lease outlives it"
        when = f" since {until(self.since)}" if self.since is not None else ""
        if self.stop_admitting:
            return f"{self.pods} Pod(s) still run{when}: onExpiry StopAdmitting lets them finish"
        parts = []
        if self.refused:
            parts.append(f"{self.refused} eviction(s) refused by a PodDisruptionBudget")
        if self.finalized:
            parts.append(f"{self.finalized} held by a finalizer past their grace period")
        rest = self.pods - self.refused - self.finalized
        if rest:
            parts.append(f"{rest} being evicted")
        return f"{self.pods} Pod(s) outlive the lease{when}: " + ", ".join(parts)

    def reason(self) -> str:
        if not self.pods:
            return "NoPods"
        if self.stop_admitting:
            return "StopAdmitting"
        if self.refused:
            return "EvictionBlocked"
        return "FinalizerBlocks" if self.finalized else "Evicting"


def desired_status(
    lease: Lease,
    usage: Usage,
    running: int,
    now: datetime,
    outliving: Outliving = Outliving(),
    zones: Mapping[str, ZoneTable] = ZONES,
    pods: Iterable[ChargedPod] = (),
) -> dict[str, Any]:
    """The status fields this controller owns (pure), computed from the status the object shows
    (``lease.status``): GPU-hours add what was running since the last write."""
    # Up to the millisecond ``since`` is written at: what lies after it is added by the next write
    # (counted up to ``now`` instead, each write would count its fraction of a millisecond twice).
    moment = now.replace(microsecond=now.microsecond // 1000 * 1000)
    phase = lease.phase(moment, zones)
    hours = Consumed.of(lease.status).hours_at(moment)
    overage = max(usage.used - lease.count, 0)
    previous = conditions_of(lease.status)
    problems = lease.problems or lease.zone_problems(zones)
    reading = lease.budget_at(moment, zones)
    opens = lease.opens_at(moment, zones)
    ends = lease.ends_at(moment, zones)
    messages = {
        Phase.Pending: f"the window starts at {until(lease.start)}",
        Phase.Active: f"{gpus(usage.used)} of {gpus(lease.count)} GPU in use until {until(ends)}",
        Phase.Closed: f"the recurring window is closed until {until(opens)}",
        Phase.Exhausted: f"the budget is spent until {until(opens)}: "
        + (budget_numbers(reading) if reading is not None else ""),
        Phase.Expired: f"the window ended at {until(lease.end)}",
        Phase.Released: "the lease was deleted; its Pods are released",
        Phase.Invalid: "invalid, nothing is charged to it: " + "; ".join(problems),
    }

    def condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
        status = "True" if true else "False"
        shown = previous.get(kind) or {}
        # The transition time moves only when the status flips (a fresh one otherwise would make
        # every reconcile a change).
        moved = shown.get("status") != status or not shown.get("lastTransitionTime")
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "observedGeneration": lease.generation,
            "lastTransitionTime": whole_seconds(now) if moved else shown["lastTransitionTime"],
        }

    status: dict[str, Any] = {
        "phase": phase.value,
        "used": gpus(usage.used),
        "free": gpus(max(lease.count - usage.used, 0) if phase in (Phase.Pending, Phase.Active) else 0),
        "queued": gpus(usage.queued),
        "overage": gpus(overage),
        "overflow": gpus(usage.overflow),
        "pods": usage.pods,
        "consumed": {"gpuHours": hours_text(hours), "since": time_text(moment), "running": gpus(running)},
        "observedGeneration": lease.generation,
        "conditions": [
            condition("Active", phase == Phase.Active, phase.value, messages[phase]),
            condition(
                "OverCommitted",
                overage > 0,
                "Overage" if overage else "WithinLease",
                f"{gpus(usage.used)} GPU admitted of {gpus(lease.count)} leased ({gpus(overage)} over)"
                if overage
                else f"{gpus(usage.used)} of {gpus(lease.count)} GPU in use",
            ),
            condition(
                "Valid",
                not problems,
                "InvalidSpec" if problems else "Valid",
                messages[Phase.Invalid] if problems else "the spec is valid",
            ),
            condition("PodsOutliveLease", outliving.pods > 0, outliving.reason(), outliving.message()),
        ],
    }
    start, end = lease.start, lease.end
    span = lease.span(moment, zones)
    if span is not None and lease.recurrence is not None and phase in (Phase.Active, Phase.Closed):
        # The occurrence in force, or the next one while closed.
        start, end = (span.start, span.end) if span.open else (span.end, None)
        if not span.open and span.end is not None:
            end = span.end + lease.recurrence.duration
        if lease.end is not None and end is not None and end > lease.end:
            end = lease.end
    if start is not None:
        status["windowStart"] = whole_seconds(start)
    if end is not None:
        status["windowEnd"] = whole_seconds(end)
    if reading is not None and lease.budget is not None:
        status["budget"] = budget_status(reading, lease.budget.period == "Rolling")
    by_model = models_status(lease, pods)
    if by_model is not None:
        status["models"] = by_model
    return status


ANY_MODEL = "any"
"""``status.models``: Pods of a lease of several models that may run on any of them."""


def models_status(lease: Lease, pods: Iterable[ChargedPod]) -> list[dict[str, str]] | None:
    """``status.models`` of a lease of several models or a family (or with caps): GPU-equivalents
    in use per model, as each Pod was charged (MODEL_ANNOTATION), and each model's cap; None for
    a lease of one model whose Pods name none."""
    used: dict[str, int] = {}
    for pod in pods:
        if pod.state in (CHARGED, AUDIT):
            used[pod.model or ANY_MODEL] = used.get(pod.model or ANY_MODEL, 0) + pod.charge
    if len(lease.models) <= 1 and not lease.caps and set(used) <= {ANY_MODEL}:
        return None
    caps = dict(lease.caps)
    rows = []
    for model in [*caps, *sorted(m for m in used if m not in caps)]:
        row = {"model": model, "used": gpus(used.get(model, 0))}
        if model in caps:
            row["cap"] = gpus(caps[model])
        rows.append(row)
    return rows


def whole_seconds(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def differs(desired: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether ``desired`` is worth applying: it changes what the object shows (GPU-hours alone
    only every RESYNC_SECONDS; transition times that did not move are no change)."""
    for key, value in desired.items():
        if key == "consumed":
            shown = _mapping(current.get("consumed"))
            if shown.get("running") != value["running"]:
                return True
            # GPU-hours grow while anything runs: written with the other changes, and on their
            # own at most every RESYNC_SECONDS (exact either way: ``running`` held since ``since``).
            since = parse_time(shown.get("since"))
            now = parse_time(value["since"])
            if since is None or now is None or (now - since).total_seconds() >= RESYNC_SECONDS:
                return True
        elif key == "budget":
            # What moves with the time (hours used, left) is written with GPU-hours; a new period,
            # a spent budget or a changed limit at once.
            shown = _mapping(current.get("budget"))
            for field_name in ("periodStart", "periodEnd", "limit", "exhaustedAt", "history"):
                if shown.get(field_name) != value.get(field_name):
                    return True
        elif key == "conditions":
            shown_conditions = conditions_of(current)
            for wanted in value:
                shown = shown_conditions.get(wanted["type"]) or {}
                if any(
                    shown.get(k) != wanted[k] for k in ("status", "reason", "message", "observedGeneration")
                ):
                    return True
        elif current.get(key) != value:
            return True
    return False


def queue_order(pod: ChargedPod) -> tuple[int, str, str]:
    return (-pod.priority, pod.created, pod.name)


class LeaseMetrics:
    """Per lease, on the leader only: a replica that stops leading removes every series (a former
    leader's figures would otherwise stay, and an alert on them keep firing)."""

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
        self.invalid = Gauge(
            "castslice_gpulease_invalid",
            "1 for a GpuLease whose spec is invalid (it skipped validation): nothing is charged to it.",
            labels,
            registry=registry,
        )
        self.outliving = Gauge(
            "castslice_gpulease_outliving_pods",
            "Pods of a GpuLease that has ended (expired, or deleted) still there.",
            labels,
            registry=registry,
        )
        self.budget = Gauge(
            "castslice_gpulease_budget_gpu_hours",
            "GPU-hours a GpuLease's budget allows per period (spec.budget.gpuHours).",
            labels,
            registry=registry,
        )
        self.budget_used = Gauge(
            "castslice_gpulease_budget_used_gpu_hours",
            "GPU-hours used of the budget in the current period (Rolling: in the window).",
            labels,
            registry=registry,
        )
        self.period_end = Gauge(
            "castslice_gpulease_budget_period_end_timestamp_seconds",
            "When the budget's current period ends (Unix time).",
            labels,
            registry=registry,
        )
        self._gauges = (
            self.capacity,
            self.used,
            self.queued,
            self.overage,
            self.invalid,
            self.outliving,
            self.budget,
            self.budget_used,
            self.period_end,
        )

    def show(
        self, lease: Lease, usage: Usage, outliving: Outliving, reading: BudgetNow | None = None
    ) -> None:
        labels = (lease.namespace, lease.name, lease.model)
        if reading is not None:
            self.budget.labels(*labels).set(float(reading.limit))
            self.budget_used.labels(*labels).set(float(reading.used))
            self.period_end.labels(*labels).set(reading.end.timestamp())
        self.capacity.labels(*labels).set(gpu_float(lease.count))
        self.used.labels(*labels).set(gpu_float(usage.used))
        self.queued.labels(*labels).set(gpu_float(usage.queued))
        self.overage.labels(*labels).set(gpu_float(max(usage.used - lease.count, 0)))
        self.invalid.labels(*labels).set(1 if lease.problems else 0)
        self.outliving.labels(*labels).set(outliving.pods)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in self._gauges:
            for labels in list(gauge._metrics):
                if labels[:2] == (namespace, name):
                    gauge.remove(*labels)

    def clear(self) -> None:
        for gauge in self._gauges:
            gauge.clear()


@dataclass(frozen=True)
class Subject:
    """What an Event is about: the lease, or one of its Pods."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def of_lease(cls, lease: Lease) -> Subject:
        return cls(KIND, API_VERSION, lease.namespace, lease.name, lease.uid)

    @classmethod
    def of_pod(cls, pod: ChargedPod) -> Subject:
        return cls("Pod", "v1", pod.namespace, pod.name, pod.uid)

    def reference(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


def write_event(
    api: Api, subject: Subject, reason: str, message: str, kind: str, related: Subject | None = None
) -> None:
    """An Event on ``subject`` (a lease, or a Pod ``related`` to its lease); one not written is
    logged, never retried (the condition or status it tells of holds the same)."""
    now = time_text(datetime.now(UTC))
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{subject.name}.", "namespace": subject.namespace},
        "involvedObject": subject.reference(),
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": "castslice-control"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": "castslice-control",
        "reportingInstance": "castslice-control",
    }
    if related is not None:
        body["related"] = related.reference()
    response = api.request("POST", collection_path("", "v1", "events", subject.namespace), body=body)
    if not response.ok:
        log.warning(
            "event %s on %s %s/%s not written: %s",
            reason,
            subject.kind,
            subject.namespace,
            subject.name,
            response.message(),
        )


Tell = Callable[["Step"], None]


@dataclass(frozen=True)
class Step:
    """One thing that happened to a lease or one of its Pods: an Event and a CloudEvent."""

    step: str
    lease: Lease
    status: Mapping[str, Any]
    message: str
    pod: ChargedPod | None = None
    gist: str = ""
    """What makes it news (told once per gist); "" is the message itself."""
    period: Period | None = None
    """PeriodClosed: the period closed (the chargeback record)."""
    event_id: str = ""
    """The CloudEvent's id when it must be the same whoever tells it (a chargeback record)."""


class LeaseReconciler:
    name: str = NAME
    watches: tuple[WatchSpec, ...] = (LEASES, CHARGED_PODS, BOUND_PODS)
    permissions: tuple[Permission, ...] = (
        # patch: our finalizer, by apply (the view has the lease; no get).
        Permission(GROUP, PLURAL, ("patch",)),
        Permission(GROUP, f"{PLURAL}/status", ("patch",)),
        Permission("", "pods", ("patch",)),  # ungating: the gate and the state label; the end
        Permission("", "pods/status", ("patch",)),  # a queued Pod's condition
        Permission("", "pods/eviction", ("create",)),
        Permission("", "events", ("create",)),
    )
    resync_seconds: float = RESYNC_SECONDS

    def __init__(self, api: Api, emit: Tell | None = None, zones: Mapping[str, ZoneTable] = ZONES) -> None:
        self.api = api
        self.emit: Tell = emit or (lambda step: None)
        self.zones = zones
        self.metrics: LeaseMetrics | None = None
        # Memory of this term only (``forget_term`` drops it when the lead is lost): what a new
        # leader needs is on the objects themselves.
        self._ungated: dict[str, tuple[str, int]] = {}
        """Pod uid -> (lease key, charge) ungated by this leader, until the view shows them charged."""
        self._told: dict[str, dict[tuple[str, str], str]] = {}
        """Lease key -> (object uid, reason) -> what the last Event of that reason said (one
        Event per change), kept for the lease and the Pods the view shows of it."""
        self._written: dict[str, tuple[str, frozenset[str], str, Mapping[str, Any], bool]] = {}
        """Lease key -> (uid, the versions our writes replaced, the version and status our last
        write made, whether it holds our finalizer): until the view shows our last write."""
        self._refused: dict[str, str] = {}
        """Pod uid -> the key of its lease, while its last eviction was refused (a
        PodDisruptionBudget said no)."""
        self._marked: dict[str, tuple[str, int, str]] = {}
        """Pod uid -> (lease key, position, why) its queued condition says (written in this term)."""
        self._term_began: datetime | None = None
        """The first reconcile of this term: a Pod created before it may carry a previous leader's
        queued condition."""

    def register(self, registry: CollectorRegistry) -> None:
        self.metrics = LeaseMetrics(registry)

    def forget_term(self) -> None:
        """The lead is lost: nothing of this term may be trusted by the next."""
        self._ungated.clear()
        self._told.clear()
        self._written.clear()
        self._refused.clear()
        self._marked.clear()
        self._term_began = None
        if self.metrics is not None:
            self.metrics.clear()

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
        if not all(ctx.view.synced(spec.index) for spec in self.watches):
            return Requeue(NOT_SYNCED_RETRY)  # a lease whose Pods are not listed yet looks empty
        # A charged Pod names its lease by LEASE_LABEL: the name, or lease_label of a long one.
        lease = next(
            (
                record
                for record in ctx.view.group(LEASES.index, namespace).values()
                if isinstance(record, Lease) and name in (record.name, record.label)
            ),
            None,
        )
        if lease is not None and lease.key != key:
            return self.reconcile(lease.key, ctx)
        if lease is None:
            self._told.pop(key, None)
            self._written.pop(key, None)
            if self.metrics is not None:
                self.metrics.forget(namespace, name)
            return DONE
        lease = self._as_written(lease)
        pods = sorted(
            (
                p
                for p in ctx.view.group(CHARGED_PODS.index, lease.charged_key).values()
                if isinstance(p, ChargedPod)
            ),
            key=queue_order,
        )
        if self._term_began is None:
            self._term_began = ctx.now
        self._forget_pods_gone(lease, pods)
        usage = self._usage(lease, ctx.view, pods)
        running = self._running(lease, ctx.view)
        zones = self.zones
        phase = lease.phase(ctx.now, zones)
        steps: list[Step] = []
        if lease.deleting:
            steps += self._evict_all(lease, pods, ctx.now)
        else:
            if not lease.finalized and not lease.problems:
                lease = self._apply_finalizer(lease, keep=True)
            if phase == Phase.Active:
                self._keep_ends(lease, pods, ctx.now)
            if lease.enforcement == Enforcement.Queue and phase in (
                Phase.Active,
                Phase.Pending,
                Phase.Closed,
                Phase.Exhausted,
            ):
                usage, queued_steps = self._ungate(lease, pods, usage, phase, ctx.now)
                steps += queued_steps
            evict_at = self._evict_at(lease)
            if evict_at is not None and ctx.now >= evict_at:
                steps += self._evict_all(lease, pods, ctx.now)
            else:
                closed_since = self._closed_since(lease, ctx.now)
                if (
                    closed_since is not None
                    and lease.on_expiry == ExpiryAction.Evict
                    and ctx.now >= closed_since + timedelta(seconds=lease.grace_seconds)
                ):
                    steps += self._evict_all(lease, [p for p in pods if p.state != QUEUED], ctx.now)
            steps += self._notices(lease, pods, running, ctx.now)
        outliving = self._outliving(lease, pods, ctx.now)
        desired = desired_status(lease, usage, running, ctx.now, outliving, zones, pods)
        steps = self._lifecycle(lease, desired) + self._closed_periods(lease, desired, ctx.now) + steps
        for step in steps:
            self._tell(step)
        if self.metrics is not None:
            self.metrics.show(lease, usage, outliving, lease.budget_at(ctx.now, zones))
        if differs(desired, lease.status) and not self._apply_status(lease, desired):
            return Requeue(CONFLICT_RETRY)
        if lease.deleting and not pods:
            if lease.finalized:
                self._apply_finalizer(lease, keep=False)
            self._told.pop(key, None)
            self._written.pop(key, None)
            if self.metrics is not None:
                self.metrics.forget(lease.namespace, lease.name)
            return DONE
        return Requeue(self._next_boundary(lease, ctx.now, pods, running))

    # -- time ------------------------------------------------------------------------------------
    def _closed_since(self, lease: Lease, now: datetime) -> datetime | None:
        """While a recurring window is closed or the budget spent: since when (the grace of
        ``Evict`` counts from it); None otherwise."""
        phase = lease.phase(now, self.zones)
        if phase == Phase.Closed:
            span = lease.span(now, self.zones)
            return span.start if span is not None else None
        if phase == Phase.Exhausted:
            reading = lease.budget_at(now, self.zones)
            return reading.exhausted_at if reading is not None else None
        return None

    def _deadline(self, lease: Lease, now: datetime, running: int) -> tuple[datetime, str] | None:
        """When the lease's running Pods meet its end (evicted, with ``Evict``; the lease ends,
        with ``StopAdmitting``), and what that is: the notice's subject."""
        evict = lease.on_expiry == ExpiryAction.Evict
        grace = timedelta(seconds=lease.grace_seconds)
        phase = lease.phase(now, self.zones)
        if phase == Phase.Active:
            found: list[tuple[datetime, str]] = []
            ends = lease.ends_at(now, self.zones)
            if ends is not None:
                what = "ends" if ends == lease.end else "closes (recurring window)"
                said = f"the lease {what} at {until(ends)}"
                found.append(
                    (ends + grace, f"{said}; the Pod is evicted at {until(ends + grace)}")
                    if evict
                    else (ends, said)
                )
            reading = lease.budget_at(now, self.zones)
            spent = reading.exhausts_at(now) if reading is not None else None
            if spent is not None and evict:
                found.append(
                    (
                        spent + grace,
                        f"the budget runs out at about {until(spent)} at the current use; the Pod is "
                        f"evicted at about {until(spent + grace)}",
                    )
                )
            return min(found) if found else None
        if evict and phase in (Phase.Closed, Phase.Exhausted, Phase.Expired):
            since = lease.end if phase == Phase.Expired else self._closed_since(lease, now)
            if since is not None and now < since + grace:
                evicted = until(since + grace)
                return since + grace, f"the lease stopped at {until(since)}; the Pod is evicted at {evicted}"
        return None

    def _notices(self, lease: Lease, pods: list[ChargedPod], running: int, now: datetime) -> list[Step]:
        """EndingSoon on each running Pod ``noticeSeconds`` before its deadline."""
        deadline = self._deadline(lease, now, running) if lease.notice_seconds else None
        if deadline is None:
            return []
        moment, what = deadline
        if not moment - timedelta(seconds=lease.notice_seconds) <= now < moment:
            return []
        seconds = int((moment - now).total_seconds())
        return [
            Step(
                "EndingSoon",
                lease,
                {},
                f"gpu lease {lease.name}: {what} (in {seconds}s): checkpoint now",
                pod,
                gist=what.split(";")[0].split(" at about ")[0] if "budget" in what else what,
            )
            for pod in pods
            if pod.state != QUEUED and not pod.terminating
        ]

    def _keep_ends(self, lease: Lease, pods: list[ChargedPod], now: datetime) -> None:
        """Each running Pod's ENDS_ANNOTATION says when its lease's time ends now (the window was
        moved, or the next occurrence of a recurring window holds it)."""
        ends = lease.ends_at(now, self.zones)
        text = until(ends) if ends is not None else ""
        for pod in pods:
            if pod.state == QUEUED or pod.terminating or pod.ends == text or pod.uid in self._ungated:
                continue
            patch = {"metadata": {"annotations": {ENDS_ANNOTATION: text or None}}}
            path = object_path("", "v1", "pods", pod.namespace, pod.name)
            response = self.api.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE)
            if not response.ok and response.status != 404:
                raise ApiError(f"annotate pod {pod.namespace}/{pod.name}", response)

    def _closed_periods(self, lease: Lease, desired: Mapping[str, Any], now: datetime) -> list[Step]:
        """PeriodClosed for each budget period that ended since the status's (a chargeback record)."""
        moment = now.replace(microsecond=now.microsecond // 1000 * 1000)
        reading = lease.budget_at(moment, self.zones)
        if reading is None or lease.budget is None:
            return []
        steps = []
        for period in reading.closed:
            limit = "" if lease.budget.period == "Rolling" else f" of {hours(reading.limit)} budgeted"
            steps.append(
                Step(
                    "PeriodClosed",
                    lease,
                    desired,
                    f"budget period {until(period.start)} .. {until(period.end)} closed: "
                    f"{hours(period.gpu_hours)} GPU-hours used{limit}",
                    period=period,
                    gist=time_text(period.start),
                    event_id=f"{lease.uid}/{time_text(period.start)}",
                )
            )
        return steps

    # -- counting --------------------------------------------------------------------------------
    def _usage(self, lease: Lease, view: ClusterView, pods: list[ChargedPod]) -> Usage:
        usage = usage_from(view.tally(CHARGED_PODS.index, lease.charged_key))
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

    def _running(self, lease: Lease, view: ClusterView) -> int:
        """milli-GPU of the lease's Pods bound to a node (charged or admitted by Audit)."""
        return usage_from(view.tally(BOUND_PODS.index, lease.charged_key)).used

    def _forget_pods_gone(self, lease: Lease, pods: list[ChargedPod]) -> None:
        """Per-Pod memory of Pods of this lease no longer in the view (bounded by the Pods there)."""
        here = {pod.uid for pod in pods}
        told = self._told.get(lease.key)
        if told:
            for said in [said for said in told if said[0] not in here and said[0] != lease.uid]:
                del told[said]
        for uid in [uid for uid, key in self._refused.items() if key == lease.key and uid not in here]:
            del self._refused[uid]

    # -- Queue mode ------------------------------------------------------------------------------
    def _ungate(
        self, lease: Lease, pods: list[ChargedPod], usage: Usage, phase: Phase, now: datetime
    ) -> tuple[Usage, list[Step]]:
        waiting = [p for p in pods if p.state == QUEUED and p.uid not in self._ungated and not p.terminating]
        left: list[tuple[ChargedPod, str]] = []
        opens = lease.opens_at(now, self.zones) if phase != Phase.Active else None
        for pod in waiting:
            if left or phase != Phase.Active or usage.used + pod.charge > lease.count:
                # Strict order: a large Pod at the head is not starved by smaller ones behind it.
                if phase == Phase.Pending:
                    why = f"the lease's window starts at {until(lease.start)}"
                elif phase == Phase.Closed:
                    why = f"the lease's recurring window opens at {until(opens)}"
                elif phase == Phase.Exhausted:
                    why = f"the lease's budget is spent until its next period at {until(opens)}"
                elif left:
                    why = "a Pod ahead of it waits for room"
                else:
                    why = (
                        f"{gpus(usage.used)} of {gpus(lease.count)} GPU in use, "
                        f"this Pod needs {gpus(pod.charge)}"
                    )
                left.append((pod, why))
            elif self._start(lease, pod, now):
                usage = usage.plus(Usage(used=pod.charge, queued=-pod.charge))
        for position, (pod, why) in enumerate(left, start=1):
            self._mark_queued(lease, pod, position, len(left), why)
        steps = [
            Step(
                "Queued",
                lease,
                {},
                f"queued by gpu lease {lease.name}: position {position} of {len(left)} "
                f"(priority, then age); waits because {why}",
                pod,
            )
            for position, (pod, why) in enumerate(left, start=1)
        ]
        return usage, steps

    def _start(self, lease: Lease, pod: ChargedPod, now: datetime) -> bool:
        ends = lease.ends_at(now, self.zones)
        metadata: dict[str, Any] = {"labels": {STATE_LABEL: CHARGED}}
        if ends is not None:
            metadata["annotations"] = {ENDS_ANNOTATION: until(ends)}
        patch = {"metadata": metadata, "spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}}
        path = object_path("", "v1", "pods", pod.namespace, pod.name)
        response = self.api.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE)
        if response.status == 404:
            return False
        if not response.ok:
            raise ApiError(f"ungate pod {pod.namespace}/{pod.name}", response)
        self._ungated[pod.uid] = (lease.key, pod.charge)
        log.info("gpu lease %s: started %s/%s (%s GPU)", lease.key, pod.namespace, pod.name, gpus(pod.charge))
        marked = self._marked.pop(pod.uid, None)
        earlier_term = self._term_began is not None and pod.created < time_text(self._term_began)
        if marked is not None or earlier_term:
            self._queued_condition(pod, False, "Started", f"started by gpu lease {lease.name}: it fits")
        return True

    def _mark_queued(self, lease: Lease, pod: ChargedPod, position: int, total: int, why: str) -> None:
        """The queued Pod's condition: its position and why it waits, rewritten when either moves
        (a position only within the first QUEUED_POSITIONS)."""
        shown = min(position, QUEUED_POSITIONS + 1)
        if self._marked.get(pod.uid) == (lease.key, shown, why):
            return
        where = (
            f"position {position} of {total}"
            if position <= QUEUED_POSITIONS
            else f"position {QUEUED_POSITIONS + 1} or later of {total}"
        )
        message = f"queued by gpu lease {lease.name}: {where} (priority, then age); waits because {why}"
        if self._queued_condition(pod, True, _queued_reason(why), message):
            self._marked[pod.uid] = (lease.key, shown, why)

    def _queued_condition(self, pod: ChargedPod, queued: bool, reason: str, message: str) -> bool:
        condition = {
            "type": QUEUED_CONDITION,
            "status": "True" if queued else "False",
            "reason": reason,
            "message": message[:1024],
            "lastTransitionTime": whole_seconds(datetime.now(UTC)),
        }
        path = object_path("", "v1", "pods", pod.namespace, pod.name, "status")
        body = {"status": {"conditions": [condition]}}
        response = self.api.request("PATCH", path, body=body, content_type=STRATEGIC_MERGE)
        if not response.ok and response.status != 404:
            log.warning(
                "condition of queued pod %s/%s not written: %s", pod.namespace, pod.name, response.message()
            )
        return response.ok

    # -- expiry and release ----------------------------------------------------------------------
    def _evict_at(self, lease: Lease) -> datetime | None:
        if lease.on_expiry != ExpiryAction.Evict or lease.end is None or lease.problems:
            return None
        return lease.end + timedelta(seconds=lease.grace_seconds)

    def _evict_all(self, lease: Lease, pods: list[ChargedPod], now: datetime) -> list[Step]:
        steps: list[Step] = []
        why = (
            "the lease was deleted"
            if lease.deleting
            else f"the lease's window ended at {until(lease.end)} (+{lease.grace_seconds}s grace)"
        )
        for pod in pods:
            if pod.terminating:
                blocked = self._finalizer_blocks(pod, now)
                if blocked:
                    steps.append(
                        Step(
                            "FinalizerBlocks",
                            lease,
                            {},
                            f"evicted ({why}), but finalizer(s) {', '.join(pod.finalizers)} keep the Pod "
                            f"past its grace period (deletion at {pod.deleted_at})",
                            pod,
                        )
                    )
                continue
            steps += self._evict(lease, pod, why)
        return steps

    @staticmethod
    def _finalizer_blocks(pod: ChargedPod, now: datetime) -> bool:
        deadline = parse_time(pod.deleted_at)
        return bool(pod.finalizers) and deadline is not None and now > deadline

    def _evict(self, lease: Lease, pod: ChargedPod, why: str) -> list[Step]:
        path = object_path("", "v1", "pods", pod.namespace, pod.name, "eviction")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        }
        response = self.api.request("POST", path, body=body)
        if response.status == 429:  # a PodDisruptionBudget said no (for now)
            detail = response.message()
            self._refused[pod.uid] = lease.key
            return [
                Step(
                    "EvictionBlocked",
                    lease,
                    {},
                    f"eviction ({why}) refused by a PodDisruptionBudget: {detail}; retried",
                    pod,
                )
            ]
        if response.status == 404:
            return []
        if not response.ok:
            raise ApiError(f"evict pod {pod.namespace}/{pod.name}", response)
        self._refused.pop(pod.uid, None)
        return [Step("Evicted", lease, {}, f"evicted by gpu lease {lease.name}: {why}", pod)]

    def _outliving(self, lease: Lease, pods: list[ChargedPod], now: datetime) -> Outliving:
        if lease.deleting:
            since = None
        elif lease.phase(now) == Phase.Expired:
            if lease.on_expiry == ExpiryAction.StopAdmitting:
                return Outliving(len(pods), since=lease.end, stop_admitting=True) if pods else Outliving()
            since = self._evict_at(lease)
            if since is None or now < since:
                return Outliving()
        else:
            return Outliving()
        if not pods:
            return Outliving()
        refused = sum(1 for pod in pods if pod.uid in self._refused and not pod.terminating)
        finalized = sum(1 for pod in pods if pod.terminating and self._finalizer_blocks(pod, now))
        return Outliving(len(pods), refused, finalized, since)

    def _as_written(self, lease: Lease) -> Lease:
        """The lease as this leader last wrote it, when the view still shows the version that
        write was made at (the watch has not brought our own write back yet): the next status is
        computed from, and applied at, what the apiserver holds, not refused and delayed."""
        known = self._written.get(lease.key)
        if known is not None and lease.uid == known[0] and lease.version in known[1]:
            return dataclasses.replace(lease, version=known[2], status=known[3], finalized=known[4])
        self._written.pop(lease.key, None)  # caught up, or another wrote since: the view holds
        return lease

    def _wrote(self, lease: Lease, response: Any) -> Lease:
        """Remember what a write of ours made of the lease (its answer: the object as stored)."""
        body = response.body if isinstance(response.body, Mapping) else {}
        metadata = _mapping(body.get("metadata"))
        version = metadata.get("resourceVersion")
        if not isinstance(version, str) or not version:
            return lease
        stored = body.get("status")
        status: Mapping[str, Any] = stored if isinstance(stored, Mapping) else lease.status
        finalizers = metadata.get("finalizers")
        finalized = isinstance(finalizers, list) and FINALIZER in finalizers
        known = self._written.get(lease.key)
        older = known[1] if known is not None and known[0] == lease.uid else frozenset()
        self._written[lease.key] = (lease.uid, older | {lease.version}, version, status, finalized)
        return dataclasses.replace(lease, version=version, status=status, finalized=finalized)

    def _apply_finalizer(self, lease: Lease, keep: bool) -> Lease:
        """Our finalizer, by Server-Side Apply under its own field manager: applying without it
        removes only ours (finalizers is a set; another controller's stay). The apply names the
        object's uid, so an apply that comes after the lease was deleted cannot create another."""
        metadata: dict[str, Any] = {"name": lease.name, "namespace": lease.namespace, "uid": lease.uid}
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
        if response.status in (404, 409):  # gone, or another object under the name now
            return lease
        if not response.ok:
            raise ApiError(f"apply finalizer on gpulease {lease.key}", response)
        return self._wrote(lease, response)

    # -- status ----------------------------------------------------------------------------------
    def _apply_status(self, lease: Lease, desired: Mapping[str, Any]) -> bool:
        """Apply at the resourceVersion the view shows: False when the object moved on since (the
        view has not caught up with a write, ours or another's): computed again once it has."""
        metadata: dict[str, Any] = {"name": lease.name, "namespace": lease.namespace}
        if lease.version:
            metadata["resourceVersion"] = lease.version
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "status": desired}
        path = object_path(GROUP, VERSION, PLURAL, lease.namespace, lease.name, "status")
        response = self.api.request(
            "PATCH",
            path,
            body=body,
            content_type=APPLY_PATCH,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        if response.status == 404:
            return True
        if response.status == 409:
            self._written.pop(lease.key, None)
            return False
        if response.status == 422 and lease.problems:
            # A stored lease the schema refuses may refuse any write of it, status included: the
            # Event, the metric and the log say it is invalid.
            log.warning(
                "gpu lease %s is invalid and its status cannot be written: %s", lease.key, response.message()
            )
            return True
        if not response.ok:
            raise ApiError(f"apply status of gpulease {lease.key}", response)
        self._wrote(lease, response)
        return True

    def _lifecycle(self, lease: Lease, desired: Mapping[str, Any]) -> list[Step]:
        """The lease's steps this status makes (told before it is applied: a leader that dies in
        between leaves them to the next one to tell again, never untold)."""
        steps: list[Step] = []
        phase, shown = desired["phase"], lease.status.get("phase")
        conditions = {c["type"]: c for c in desired["conditions"]}
        if phase != shown:
            step = {
                "Active": "Activated",
                "Closed": "Closed",
                "Exhausted": "Exhausted",
                "Expired": "Expired",
                "Released": "Released",
                "Invalid": "Invalid",
            }
            if phase in step:
                message = conditions["Active"]["message"]
                if phase == "Invalid":
                    message = conditions["Valid"]["message"]
                steps.append(Step(step[phase], lease, desired, f"lease {phase.lower()}: {message}"))
        for kind in ("OverCommitted", "PodsOutliveLease"):
            wanted = conditions[kind]
            before = conditions_of(lease.status).get(kind) or {}
            if wanted["status"] == "True" and (
                before.get("status") != "True" or before.get("reason") != wanted["reason"]
            ):
                steps.append(Step(kind, lease, desired, wanted["message"]))
        return steps

    def _tell(self, step: Step) -> None:
        """An Event (on the Pod for a Pod's step, else on the lease) and a CloudEvent, once per
        change of what it says in this term."""
        subject = Subject.of_pod(step.pod) if step.pod is not None else Subject.of_lease(step.lease)
        told = self._told.setdefault(step.lease.key, {})
        # A queued Pod's position moves with every Pod started ahead of it: told again when why it
        # waits changes, not for each position.
        gist = step.gist or (
            step.message.split("; waits because ", 1)[-1] if step.step == "Queued" else step.message
        )
        if told.get((subject.uid, step.step)) == gist:
            return
        told[(subject.uid, step.step)] = gist
        warning = step.step in (
            "OverCommitted",
            "Invalid",
            "EvictionBlocked",
            "FinalizerBlocks",
            "Exhausted",
            "EndingSoon",
        )
        self._event(subject, step, "Warning" if warning else "Normal")
        self.emit(step)

    def _event(self, subject: Subject, step: Step, kind: str) -> None:
        related = Subject.of_lease(step.lease) if step.pod is not None else None
        write_event(self.api, subject, step.step, step.message, kind, related)

    def _next_boundary(
        self, lease: Lease, now: datetime, pods: list[ChargedPod], running: int = 0
    ) -> float | None:
        moments = [lease.start, lease.end]
        span = lease.span(now, self.zones)
        if span is not None:
            moments.append(span.end)  # the occurrence ends, or the next one starts
        reading = lease.budget_at(now, self.zones)
        if reading is not None:
            moments += [reading.end, reading.exhausts_at(now)]  # a new period; the budget spent
        closed_since = self._closed_since(lease, now)
        if closed_since is not None and pods:
            moments.append(closed_since + timedelta(seconds=lease.grace_seconds))
        deadline = self._deadline(lease, now, running)
        if deadline is not None and pods:
            moments += [deadline[0], deadline[0] - timedelta(seconds=lease.notice_seconds)]
        evict_at = self._evict_at(lease)
        if evict_at is not None and pods:
            moments.append(evict_at if evict_at > now else now + timedelta(seconds=OUTLIVE_RETRY))
        if lease.deleting and pods:
            moments.append(now + timedelta(seconds=OUTLIVE_RETRY))
        ahead = [m for m in moments if m is not None and m > now]
        if not ahead:
            return None
        return max((min(ahead) - now).total_seconds(), 0.0) + 0.05


def _queued_reason(why: str) -> str:
    """The queued condition's reason, from why the Pod waits (Kueue's words where they fit)."""
    if "window starts" in why:
        return "LeaseNotStarted"
    if "recurring window" in why:
        return "WindowClosed"
    if "budget" in why:
        return "BudgetExhausted"
    return "WaitingForQuota"


def lifecycle_event(step: Step, source: str = EVENT_SOURCE) -> Event:
    """A step as an event for the audit stream (the same sinks as admission decisions): the
    lease, the step, the status applied with it (a lease's step) or the Pod it is about."""
    from function.audit.events import LEASE_DATASCHEMA_URI, Event

    lease = step.lease
    data: dict[str, Any] = {
        "lease": {"namespace": lease.namespace, "name": lease.name, "uid": lease.uid, "model": lease.model},
        "step": step.step,
        "count": gpus(lease.count),
        "status": {
            k: step.status.get(k) for k in ("phase", "used", "queued", "overage", "pods", "windowEnd")
        },
        "message": step.message[:1024],
    }
    if step.pod is not None:
        data["pod"] = {"namespace": step.pod.namespace, "name": step.pod.name, "uid": step.pod.uid}
    if step.period is not None and lease.budget is not None:
        data["period"] = {
            "start": time_text(step.period.start),
            "end": time_text(step.period.end),
            "gpuHours": hours_text(step.period.gpu_hours),
            "kind": lease.budget.period,
            "budgetGpuHours": hours_text(lease.budget.limit),
        }
    return Event(
        type=LEASE_EVENT_TYPES[step.step],
        source=source,
        subject=f"{lease.namespace}/{lease.name}",
        data=data,
        dataschema=LEASE_DATASCHEMA_URI,
        filters={"podnamespace": lease.namespace},
        # A chargeback record is the same whoever tells it, and when: its id names the lease and
        # the period, its time is the period's end (a consumer keeps one record per id).
        time=step.period.end if step.period is not None else None,
        id=step.event_id or None,
    )


def build(config: Config, api: Api, emit: Emit) -> LeaseReconciler | None:
    if not config.section("gpuLeases").enabled:
        return None
    return LeaseReconciler(api, lambda step: emit(lifecycle_event(step)))


PLUGIN = ReconcilerPlugin(name=NAME, build=build)
