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

The Pod is judged in the form the webhook would have seen: the scheduler's ``spec.nodeName`` and
the status are left out (a bound Pod is not denied for having a node). Finished Pods and Pods being
deleted are not judged: what they missed no longer holds a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from function.contract import OPT_OUT_LABEL, OPT_OUT_VALUE
from function.core.engine import Decision, Engine
from function.core.json_patch import Operation
from function.core.mutators.base import Action, RequestContext
from function.core.pod import Owner, Pod, controller_of
from function.core.view import FINISHED_PHASES, PODS, ClusterView

ERROR: Final = "error"
"""The mutator column of a Pod the engine could not judge (an internal error): shown, not drift."""


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
        return self.outcome in ("mutated", "denied")

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
            "mutators": [
                {"mutator": c.mutator, "action": c.action, "reason": c.reason} for c in self.changes
            ],
            "patch": list(self.patch),
            "reason": self.reason,
        }


def _metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = pod.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def judged(pod: Mapping[str, Any]) -> bool:
    """Whether a stored Pod is judged at all: not finished, not being deleted."""
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return False
    return _metadata(pod).get("deletionTimestamp") is None


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


class WithoutPod:
    """A cluster view that does not show one Pod: a stored Pod is judged as if it were being created,
    so it must not count as its own sibling (the view holds it; a review's view would not yet)."""

    def __init__(self, base: ClusterView, uid: str) -> None:
        self._base, self._uid = base, uid

    @property
    def available(self) -> bool:
        return self._base.available

    def index(self, name: str) -> Mapping[str, Any]:
        records = self._base.index(name)
        return _Without(records, self._uid) if name == PODS.index and self._uid in records else records

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        members = self._base.group(name, key)
        return _Without(members, self._uid) if name == PODS.index and self._uid in members else members

    def synced(self, name: str) -> bool:
        return self._base.synced(name)


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


def judge(engine: Engine, stored: Mapping[str, Any], view: ClusterView) -> Finding | None:
    """What the webhook would do to ``stored`` if it were created now, over ``view`` (the Pod itself
    left out of it); None when it would change nothing (or the Pod is not judged, see ``judged``)."""
    if not judged(stored):
        return None
    metadata = _metadata(stored)
    namespace, uid = _text(metadata.get("namespace")), _text(metadata.get("uid"))
    context = RequestContext(
        uid="",  # no admission uid: a spot decision writes none, so a placed Pod reads as decided
        namespace=namespace,
        operation="CREATE",
        cluster=WithoutPod(view, uid) if uid else view,
    )
    decision = engine.decide(as_admitted(stored), context)
    if decision.outcome == "unchanged":
        return None
    return _finding(namespace, _text(metadata.get("name")), uid, controller_of(metadata), decision)


def _finding(namespace: str, name: str, uid: str, owner: Owner, decision: Decision) -> Finding:
    changes = tuple(
        Change(d.mutator, d.action.value, d.reason)
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
    by_mutator_namespace: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, finding: Finding | None) -> None:
        self.judged += 1
        if finding is None:
            return
        if finding.drift:
            self.drifted += 1
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
        return (
            f"drift: {self.judged} Pod(s) judged, {self.drifted} the webhook would change{errors} ({parts})"
        )


def opted_out_namespaces(namespaces: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The names of the namespaces labelled ``castops.io/webhook: ignore``: the registration's
    namespaceSelector never sends their Pods to the webhook, so they cannot have skipped it."""
    names = set()
    for namespace in namespaces:
        metadata = _metadata(namespace)
        labels = metadata.get("labels")
        if isinstance(labels, Mapping) and labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            names.add(_text(metadata.get("name")))
    return frozenset(names)


def findings(
    engine: Engine,
    pods: Iterable[Mapping[str, Any]],
    view: ClusterView,
    tally: Tally | None = None,
    opted_out: frozenset[str] = frozenset(),
) -> Iterator[Finding]:
    """Each stored Pod judged in turn (one at a time: a paged list stays a page in memory); the
    findings, and every judged Pod counted in ``tally``."""
    for pod in pods:
        if not judged(pod) or _text(_metadata(pod).get("namespace")) in opted_out:
            continue
        finding = judge(engine, pod, view)
        if tally is not None:
            tally.add(finding)
        if finding is not None:
            yield finding
