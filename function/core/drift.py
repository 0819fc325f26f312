"""Drift: stored Pods the webhook would change today, so it never saw them (or the policy moved).

With ``failurePolicy: Ignore`` a Pod created while the webhook was down, too slow or unreachable is
stored unchanged and nobody is told. The engine is idempotent (run on its own output it changes
nothing), so a stored Pod it would still patch is a Pod it did not see, or one admitted before the
configuration changed. This module judges one stored Pod at a time, as the webhook would judge it if
it were created now; the offline command (``castslice audit drift``) and the controller's
reconciler feed it Pods and the same cluster view, and report what it finds.

What counts, per mutator:

- GPU slicing, vGPU, PodMutations: the engine would patch the Pod (or deny it).
- Spot: a Pod the policy places but that carries no placement (``castops.io/placement``), or lacks
  what its placement means (the toleration, the selector). A placed Pod is sticky: it is never
  reported because its ReplicaSet's split moved since (scale-downs and deletions move it, and the
  webhook would not move the Pod either). The side an unplaced Pod would get today (spot or
  on-demand) is computed over its current siblings, itself left out, and only informs: the split is
  per ReplicaSet, so which of several skipped Pods would have been the spot one is not knowable.

- GPU leases: a GPU Pod in a namespace with a GpuLease that carries no charge (the webhook did not
  see it: it was down, or the Pod or its namespace opted out of it) is its own finding, with what
  the lease would decide for it now (charge it, queue it, or deny it, with the numbers), whether
  or not the webhook would be sent the Pod: a lease holds for every Pod of its namespace. A Pod
  the webhook charged is not drift: it is judged as the review that charged it (its decision uid),
  and found only when its charge is less than what it asks for (a stamp the webhook did not write).

The Pod is judged in the form the webhook would have seen, at the time given (the lease window):
the scheduler's ``spec.nodeName`` and the status are left out (a bound Pod is not denied for
having a node). Finished Pods and Pods being deleted are not judged: what they missed no longer
holds a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from function.contract import OPT_OUT_LABEL, OPT_OUT_VALUE
from function.core.engine import Decision, Engine
from function.core.json_patch import Operation
from function.core.leases import (
    CHARGE_ANNOTATION,
    DECISION_ANNOTATION,
    LEASE_LABEL,
    Lease,
    parse_charge,
    pod_charge,
)
from function.core.mutators.base import Action, RequestContext
from function.core.mutators.gpu_leases import NAME as GPU_LEASES
from function.core.mutators.gpu_leases import GpuLeases, namespace_leases
from function.core.mutators.spot import NAMESPACES, NamespaceRecord
from function.core.pod import Owner, Pod, annotations_of, controller_of, labels_of, metadata_of
from function.core.view import FINISHED_PHASES, PODS, ClusterView, Overlay

ERROR: Final = "error"
"""The mutator column of a Pod the engine could not judge (an internal error): shown, not drift."""
UNCHARGED: Final = "uncharged"
"""The outcome of a Pod the webhook was never sent (it or its namespace opted out) that a lease of
its namespace does not count: only the lease holds it to anything."""


@dataclass(frozen=True)
class Change:
    """What one mutator would do to a stored Pod."""

    mutator: str
    action: str
    """``mutated`` or ``denied``."""
    reason: str


@dataclass(frozen=True)
class Finding:
    """A stored Pod the webhook would change (``drift``), or could not judge (``error``)."""

    namespace: str
    name: str
    uid: str
    owner: Owner
    outcome: str
    """The engine's outcome: ``mutated`` or ``denied`` (drift), ``error`` (not judged)."""
    changes: tuple[Change, ...] = ()
    patch: tuple[Operation, ...] = field(default=(), compare=False)
    reason: str = ""
    """The engine's own summary (for ``error``: what went wrong)."""

    @property
    def drift(self) -> bool:
        return self.outcome in ("mutated", "denied", UNCHARGED)

    @property
    def uncharged(self) -> bool:
        """A GPU Pod its namespace's lease does not count (what the lease would decide is in
        ``changes``, as the ``gpu-leases`` change)."""
        return any(change.mutator == GPU_LEASES for change in self.changes)

    @property
    def mutators(self) -> tuple[str, ...]:
        return tuple(change.mutator for change in self.changes) or ((ERROR,) if not self.drift else ())

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "owner": {"kind": self.owner.kind, "name": self.owner.name} if self.owner.uid else None,
            "outcome": self.outcome,
            "uncharged": self.uncharged,
            "mutators": [
                {"mutator": c.mutator, "action": c.action, "reason": c.reason} for c in self.changes
            ],
            "patch": list(self.patch),
            "reason": self.reason,
        }


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def judged(pod: Mapping[str, Any]) -> bool:
    """Whether a stored Pod is judged at all: not finished, not being deleted."""
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return False
    return metadata_of(pod).get("deletionTimestamp") is None


def as_admitted(stored: Mapping[str, Any]) -> Pod:
    """The stored Pod as the webhook would see it at creation: a shallow copy without the
    scheduler's ``spec.nodeName`` and with an empty status (what a create request carries).
    Everything else is kept: the mutators never read server-set metadata, and the defaults and
    admission plugins that ran before the webhook ran before it then too."""
    pod: Pod = dict(stored)
    spec = pod.get("spec")
    if isinstance(spec, Mapping) and "nodeName" in spec:
        pod["spec"] = {key: value for key, value in spec.items() if key != "nodeName"}
    if "status" in pod:
        pod["status"] = {}
    return pod


class WithoutPod(Overlay):
    """A cluster view that does not show one Pod: a stored Pod is judged as if it were being created,
    so it must not count as its own sibling (the view holds it; a review's view would not yet).
    The base's sums (a lease's use) stand: the Pod left out is never among them, since a charged
    Pod is judged as charged before anything counts."""

    __slots__ = ("uid",)

    def __init__(self, base: ClusterView, uid: str) -> None:
        super().__init__(base)
        self.uid = uid

    def index(self, name: str) -> Mapping[str, Any]:
        records = self.base.index(name)
        return _Without(records, self.uid) if name == PODS.index and self.uid in records else records

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        members = self.base.group(name, key)
        return _Without(members, self.uid) if name == PODS.index and self.uid in members else members


class _Without(Mapping[str, Any]):
    """``records`` minus one key, without copying them (an index may hold 100,000 Pods)."""

    __slots__ = ("_key", "_records")

    def __init__(self, records: Mapping[str, Any], key: str) -> None:
        self._records, self._key = records, key

    def __getitem__(self, key: str) -> Any:
        if key == self._key:
            raise KeyError(key)
        return self._records[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._records if key != self._key)

    def __len__(self) -> int:
        return len(self._records) - 1  # built only when the key is present


def lease_mutator(engine: Engine) -> GpuLeases | None:
    """The engine's gpu-leases mutator (enforcing), when the configuration enables it."""
    return next((m for m in engine.mutators if isinstance(m, GpuLeases)), None)


def judge(
    engine: Engine,
    stored: Mapping[str, Any],
    view: ClusterView,
    now: datetime | None = None,
    sent: bool = True,
) -> Finding | None:
    """What the webhook would do to ``stored`` if it were created ``now``, over ``view`` (the Pod
    itself left out of it); None when it would change nothing (or the Pod is not judged, see
    ``judged``). ``sent``: whether the registration sends the Pod's namespace to the webhook at all
    (not an opted-out namespace); a Pod not sent is held only to its namespace's GpuLeases. Without
    ``now`` no lease is judged (the GPU leases mutator then says the view is not ready)."""
    if not judged(stored):
        return None
    metadata = metadata_of(stored)
    namespace, uid = _text(metadata.get("namespace")), _text(metadata.get("uid"))
    cluster: ClusterView = WithoutPod(view, uid) if uid else view
    if now is not None:
        cluster = Overlay(cluster, now=now)
    pod = as_admitted(stored)
    context = RequestContext(
        # The uid of the review that charged the Pod: judged as that review, a charged Pod reads as
        # charged. None for other Pods: a spot decision writes no uid, so a placed Pod reads as
        # decided.
        uid=_charged_by(pod),
        namespace=namespace,
        operation="CREATE",
        cluster=cluster,
    )
    owner, name = controller_of(metadata), _text(metadata.get("name"))
    leases = lease_mutator(engine) if now is not None else None
    if sent and labels_of(pod).get(OPT_OUT_LABEL) != OPT_OUT_VALUE and namespace not in _excluded(engine):
        decision = engine.decide(pod, context)
        if decision.outcome != "unchanged":
            return _finding(namespace, name, uid, owner, decision)
        if leases is None:
            return None
        undercharged = _undercharged(pod, leases, context)
        return (
            None if undercharged is None else Finding(namespace, name, uid, owner, UNCHARGED, (undercharged,))
        )
    if leases is None:
        return None
    change = _undercharged(pod, leases, context) if _charged_by(pod) else _lease_would(pod, leases, context)
    return None if change is None else Finding(namespace, name, uid, owner, UNCHARGED, (change,))


def _excluded(engine: Engine) -> frozenset[str]:
    return frozenset(engine.config.excludedNamespaces)


def _charged_by(pod: Pod) -> str:
    """The decision uid of the review that charged the Pod ("" when it carries no charge)."""
    if not labels_of(pod).get(LEASE_LABEL):
        return ""
    return _text(annotations_of(pod).get(DECISION_ANNOTATION))


def _lease_would(pod: Pod, leases: GpuLeases, context: RequestContext) -> Change | None:
    """What the namespace's lease would decide for an uncharged Pod; None when it asks for no GPU
    or no lease here would count it."""
    if not namespace_leases(context.cluster, context.namespace) and not leases.config.requireLease:
        return None
    verdict = leases.decide(pod, context)
    if verdict is None or (verdict.admit and not verdict.state):
        return None
    action = "denied" if not verdict.admit else "mutated"
    return Change(GPU_LEASES, action, f"uncharged: {verdict.message}")


def _undercharged(pod: Pod, leases: GpuLeases, context: RequestContext) -> Change | None:
    """A charged Pod whose charge is less than what it asks for (its lease's model decides a
    slice's size): a stamp the webhook did not write, counted for less than it holds."""
    charged_to = labels_of(pod).get(LEASE_LABEL)
    if not charged_to:
        return None
    leased = namespace_leases(context.cluster, context.namespace)
    lease = next((lease for lease in leased if lease.label == charged_to), None)
    model = lease.model if isinstance(lease, Lease) else ""
    needs = pod_charge(pod, leases.units, model)
    family = leases.family_of(lease) if isinstance(lease, Lease) else None
    if family:
        # The webhook charged one of the lease's models, at least the least of them.
        needs = min(pod_charge(pod, leases.units, member) for member in family)
    stamped = parse_charge(annotations_of(pod).get(CHARGE_ANNOTATION))
    if stamped >= needs:
        return None
    return Change(
        GPU_LEASES,
        "mutated",
        f"undercharged: charged {stamped}m to gpu lease {charged_to}, but the Pod asks for {needs}m",
    )


def _finding(namespace: str, name: str, uid: str, owner: Owner, decision: Decision) -> Finding:
    # The GPU leases mutator acts on a stored Pod only when the Pod carries no charge of its own.
    changes = tuple(
        Change(d.mutator, d.action.value, f"uncharged: {d.reason}" if d.mutator == GPU_LEASES else d.reason)
        for d in decision.decisions
        if not d.shadow and d.action is not Action.unchanged
    )
    return Finding(namespace, name, uid, owner, decision.outcome, changes, decision.patch, decision.reason)


@dataclass
class Tally:
    """Counts of one pass over the cluster, by (mutator, namespace): what the metric shows. Bounded
    by the number of mutators and namespaces, never by the number of Pods."""

    judged: int = 0
    drifted: int = 0
    errors: int = 0
    uncharged: int = 0
    """Of the drifted: GPU Pods a lease of their namespace does not count."""
    by_mutator_namespace: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, finding: Finding | None) -> None:
        self.judged += 1
        if finding is None:
            return
        if finding.drift:
            self.drifted += 1
            self.uncharged += finding.uncharged
        else:
            self.errors += 1
        for mutator in finding.mutators:
            self.by_mutator_namespace[(mutator, finding.namespace)] += 1

    def summary(self) -> str:
        """One line for a log: how many Pods were judged and found, and where."""
        if not self.drifted and not self.errors:
            return f"drift: {self.judged} Pod(s) judged, none the webhook would change"
        parts = ", ".join(
            f"{mutator} in {namespace}: {count}"
            for (mutator, namespace), count in sorted(self.by_mutator_namespace.items())
        )
        errors = f", {self.errors} not judged (internal error)" if self.errors else ""
        uncharged = f" ({self.uncharged} uncharged by their namespace's GPU lease)" if self.uncharged else ""
        return (
            f"drift: {self.judged} Pod(s) judged, {self.drifted} the webhook would change{uncharged}"
            f"{errors} ({parts})"
        )


def opted_out_namespaces(namespaces: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The names of the namespaces labelled ``castops.io/webhook: ignore``: the registration's
    namespaceSelector never sends their Pods to the webhook, so they cannot have skipped it."""
    names = set()
    for namespace in namespaces:
        metadata = metadata_of(namespace)
        labels = metadata.get("labels")
        if isinstance(labels, Mapping) and labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            names.add(_text(metadata.get("name")))
    return frozenset(names)


def opted_out_in(view: ClusterView) -> frozenset[str]:
    """The namespaces labelled ``castops.io/webhook: ignore``, from a view's Namespaces index."""
    return frozenset(
        record.name
        for record in view.index(NAMESPACES.index).values()
        if isinstance(record, NamespaceRecord) and (OPT_OUT_LABEL, OPT_OUT_VALUE) in record.labels
    )


def findings(
    engine: Engine,
    pods: Iterable[Mapping[str, Any]],
    view: ClusterView,
    tally: Tally | None = None,
    opted_out: frozenset[str] = frozenset(),
    now: datetime | None = None,
) -> Iterator[Finding]:
    """Each stored Pod judged in turn at ``now`` (one at a time: a paged list stays a page in
    memory); the findings, and every judged Pod counted in ``tally``. A Pod of an ``opted_out``
    namespace is held to its namespace's GpuLeases only (the webhook is never sent it)."""
    leases = now is not None and lease_mutator(engine) is not None
    for pod in pods:
        if not judged(pod):
            continue
        namespace = _text(metadata_of(pod).get("namespace"))
        if namespace in opted_out and not leases:
            continue  # never sent to the webhook, and no lease to hold it to
        finding = judge(engine, pod, view, now, sent=namespace not in opted_out)
        if tally is not None:
            tally.add(finding)
        if finding is not None:
            yield finding
