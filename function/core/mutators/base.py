"""The one protocol every mutator follows.

A mutator is a pure decision over a plain Pod dict: the engine hands it a private working copy,
the mutator edits that copy in place (or leaves it alone) and returns a ``MutatorResult`` saying
what it did and why. The engine compares the copy with what it handed over, so a mutator that
claims one thing and does another is caught, not trusted. Everything a mutator may know besides
the Pod comes in the ``RequestContext``, the cluster included, as a read-only snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from function.core.json_patch import Path
from function.core.pod import Pod, fit_warning, shown
from function.core.view import EMPTY_VIEW, ClusterView


class Action(StrEnum):
    mutated = "mutated"
    unchanged = "unchanged"
    denied = "denied"


@dataclass(frozen=True)
class RequestContext:
    """What a mutator may know about the admission request besides the Pod itself."""

    uid: str = ""
    namespace: str = ""
    operation: str = "CREATE"
    dry_run: bool = False
    username: str = ""
    groups: tuple[str, ...] = ()
    cluster: ClusterView = field(default=EMPTY_VIEW, compare=False, repr=False)
    """One immutable snapshot of the cluster for the whole review (EMPTY_VIEW: none at all)."""
    pod_from_json: bool = field(default=False, compare=False, repr=False)
    """The Pod was read from JSON (an AdmissionReview's object): it holds nothing JSON cannot
    write, so the engine's own copy of it needs no check that it reads back the same."""


@dataclass(frozen=True)
class MutatorResult:
    action: Action
    reason: str
    warnings: tuple[str, ...] = ()
    copied: frozenset[str] = frozenset()
    """Strings the mutator copied out of the Pod's containers to other places (a PodMutation
    ``copy`` of an env value into an annotation): the audit event redacts them wherever they are."""
    touched: tuple[Path, ...] | None = None
    """Where a mutating run may have changed the Pod: paths from its root (``("metadata",
    "annotations")``, ``("spec", "containers", 0, "resources")``), each subtree whole; None: anywhere.
    The engine builds the patch by looking only there (``json_patch.quick_changes``'s ``within``);
    a change elsewhere would fail the proof, which compares the whole Pod, and the engine would
    then build the patch from the whole Pod: a wrong path costs time, never a wrong patch."""

    @classmethod
    def mutated(cls, reason: str, *warnings: str, touched: tuple[Path, ...] | None = None) -> MutatorResult:
        return cls(Action.mutated, reason, warnings, touched=touched)

    @classmethod
    def unchanged(cls, reason: str, *warnings: str) -> MutatorResult:
        return cls(Action.unchanged, reason, warnings)

    @classmethod
    def denied(cls, message: str) -> MutatorResult:
        """``message`` is what the kubectl user reads; it must name the input and what is accepted."""
        return cls(Action.denied, message)


@dataclass(frozen=True)
class MutatorDecision:
    """A mutator's part in one admission decision, as reported to users and audit consumers."""

    mutator: str
    action: Action
    reason: str
    warnings: tuple[str, ...] = field(default=())
    shadow: bool = False
    """Decided in shadow mode: audited only; its changes and denials were not sent."""
    copied: frozenset[str] = field(default=frozenset(), repr=False)
    """MutatorResult.copied: redacted from the audit event, never shown."""

    def as_dict(self) -> dict[str, Any]:
        decided: dict[str, Any] = {
            "mutator": self.mutator,
            "action": self.action.value,
            "reason": self.reason,
            "warnings": list(self.warnings),
        }
        if self.shadow:
            decided["shadow"] = True
        return decided


@dataclass(frozen=True)
class Keys:
    """Keys of one string map of the Pod (its labels, or its annotations): exact names, prefixes,
    tests (a PodMutation's key regex), or ``every`` key."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    tests: tuple[Callable[[str], object], ...] = ()
    every: bool = False

    def hit(self, keys: AbstractSet[str] | None) -> bool:
        """Whether any of ``keys`` is one of these (None: any key at all)."""
        if keys is None:
            return self.every or bool(self.names or self.prefixes or self.tests)
        if not keys:
            return False
        if self.every or not self.names.isdisjoint(keys):
            return True
        if self.prefixes and any(key.startswith(self.prefixes) for key in keys):
            return True
        return any(test(key) for test in self.tests for key in keys)


EVERY_KEY = Keys(every=True)
NO_KEY = Keys()

PodPath = tuple[str, ...]
"""A place in the Pod outside its labels and annotations, as JSON keys: ``("spec", "nodeSelector")``."""


@dataclass(frozen=True)
class Changed:
    """What one mutator's change touched (the engine tells it from the Pod before and after):
    label and annotation keys (None: the map itself, so any key), and every other place changed,
    ``("spec", "nodeSelector")`` (``()``: the Pod as a whole)."""

    labels: frozenset[str] | None = frozenset()
    annotations: frozenset[str] | None = frozenset()
    paths: frozenset[PodPath] = frozenset()


ANYTHING = Changed(None, None, frozenset({()}))


@dataclass(frozen=True)
class Reads:
    """What of the Pod a mutator's run depends on: what it looks at, **and every place it writes**
    (whether its write changes anything depends on what is there). Two Pods equal in these parts
    get the same result from it (action, reason, warnings) and the same edits. ``paths`` are
    places outside the labels and annotations (a change at a path, above it or below it, touches
    it); None: every place."""

    labels: Keys = EVERY_KEY
    annotations: Keys = EVERY_KEY
    paths: tuple[PodPath, ...] | None = None

    def touched_by(self, changed: Changed) -> bool:
        if self.labels.hit(changed.labels) or self.annotations.hit(changed.annotations):
            return True
        if not changed.paths:
            return False
        if self.paths is None:
            return True
        return any(
            read[: len(path)] == path or path[: len(read)] == read
            for path in changed.paths
            for read in self.paths
        )


EVERYTHING = Reads()
"""What a mutator that declares nothing reads: the whole Pod (any change runs it again)."""


class Mutator(Protocol):
    """``name`` is stable (it appears in events and metrics); ``mutate`` may edit ``pod`` in place.

    A mutator may also declare ``idempotent = True``: run on the Pod it just produced (and the
    same request), it reports ``unchanged`` and changes nothing, as Kubernetes asks of every
    mutating webhook (the apiserver may send a webhook its own output again). The engine then
    does not run it again to confirm a change that only it made (tests/core/test_any_pod.py holds
    every mutator declaring it to it).

    And it may declare ``reads(ctx) -> Reads``: what of the Pod its runs depend on, for this
    request (a mutator whose reads depend on the cluster, PodMutations' selectors, computes them
    from ``ctx.cluster``). After another mutator's change, the engine runs it again only if the
    change touched what it reads; one that declares nothing reads ``EVERYTHING``
    (tests/core/test_declared_reads.py holds each declaration to the mutator's behaviour)."""

    name: str

    def mutate(self, pod: Pod, ctx: RequestContext) -> MutatorResult: ...


class InvalidAnnotation(Exception):
    """A Pod carries an annotation value a mutator cannot act on. Under ``invalidAnnotations: deny``
    the ``message`` is the denial (it names the annotation, the value and what is accepted); under
    ``warn`` the ``warning`` says what was ignored and keeps the advice within 120 characters."""

    def __init__(
        self, annotation: str, value: object, accepted: str, accepted_short: str = "", consequence: str = ""
    ) -> None:
        self.annotation = annotation
        self.value = value
        self.accepted = accepted
        self.accepted_short = accepted_short or accepted
        self.consequence = consequence
        """What ignoring it means for the Pod ("Pod not sliced"), for the warning."""
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return (
            f"annotation {self.annotation}: {shown(self.value, 64)} is not valid; accepted: {self.accepted}"
        )

    @property
    def warning(self) -> str:
        # The head (what was found) is cut before the tail (what to do about it).
        ignored = f"castslice: {self.annotation}={shown(self.value)} ignored"
        if self.consequence:
            ignored += f", {self.consequence}"
        return fit_warning(ignored, f"; use {self.accepted_short}")
