"""The engine: every mutator, in a fixed order, to a fixed point, and a proven patch.

Gatekeeper's mutation system is the model: mutators run in order, passes repeat until a whole
pass changes nothing, and a system that does not converge is an error, not a guess. The result
is then turned into a JSON Patch, the patch is applied to the original and compared with the
intended Pod (``json_patch``), and the apiserver's rules are checked on what it makes (``rules``).
Anything off means the Pod is admitted unchanged with a warning: CastSlice never sends a patch
that rejects a Pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import orjson

from function.contract import OPT_OUT_LABEL, OPT_OUT_VALUE
from function.core.config import Config
from function.core.configtypes import MutatorMode, OnInternalError
from function.core.json_patch import (
    Operation,
    PatchProofError,
    Path,
    Scope,
    WorkingCopy,
    changes_within,
    diff,
    exact_json,
    prove,
    quick_changes,
    scope_of,
)
from function.core.mutators.base import (
    ANYTHING,
    EVERYTHING,
    Action,
    Changed,
    Mutator,
    MutatorDecision,
    MutatorResult,
    Reads,
    RequestContext,
)
from function.core.mutators.registry import Neighbours, Settings
from function.core.pod import Pod, labels_of
from function.core.rules import introduced

MAX_PASSES = 5
"""Every mutator reaches its fixed point in one pass today; five leaves room and catches loops."""

Outcome = Literal["mutated", "unchanged", "denied", "error"]


@dataclass(frozen=True)
class Decision:
    """Everything the engine decided about one Pod: what to reply, and why."""

    outcome: Outcome
    allowed: bool
    reason: str
    patch: tuple[Operation, ...] = ()
    decisions: tuple[MutatorDecision, ...] = ()
    warnings: tuple[str, ...] = ()
    denial: str | None = None
    mutated_pod: Pod | None = field(default=None, compare=False, repr=False)

    @property
    def acting_mutators(self) -> tuple[str, ...]:
        """The mutators whose work reaches the apiserver (shadow ones never do)."""
        return tuple(d.mutator for d in self.decisions if d.action is not Action.unchanged and not d.shadow)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "allowed": self.allowed,
            "reason": self.reason,
            "patch": list(self.patch),
            "mutators": [d.as_dict() for d in self.decisions],
            "warnings": list(self.warnings),
            "denial": self.denial,
        }


class FixedPoint(NamedTuple):
    """Where the mutators left the Pod once a whole pass changed nothing."""

    pod: Pod
    """The intended Pod: the original itself when no mutator changed it."""
    decisions: tuple[MutatorDecision, ...]
    """What each mutator decided, in the engine's order."""
    pod_json: bytes | None
    """``exact_json(pod)`` when known (the proof reuses it), else None."""


class NotConverged(Exception):
    pass


class MutatorLied(Exception):
    """A mutator's reported action disagrees with what it did to the Pod: a bug, never trusted."""


class DeniedForAChange(Exception):
    """A mutator denied the Pod only for what another mutator changed: the Pod as submitted
    would not be denied. Mutators must compose (docs/engine.md): never a denial, an error."""

    def __init__(self, mutator: str, denial: str, changed_by: tuple[str, ...]) -> None:
        self.mutator = mutator
        self.denial = denial
        self.changed_by = changed_by
        super().__init__(
            f"{mutator} denies only what {', '.join(changed_by)} changed (the Pod as submitted passes): "
            f"{denial}"
        )


def build_mutators(config: Config, mode: MutatorMode = MutatorMode.enforce) -> list[Mutator]:
    """The enabled mutators of the given mode, in the plug-ins' fixed order.

    Each is built knowing the claims of every *other* enabled mutator (shadow ones included, so
    a mutator behaves the same whether its neighbour enforces or shadows): that is how GPU slicing
    learns which vGPU resources qualify the GPU count, and vGPU which name slicing renames it to,
    without pairwise code here.
    """
    enabled = config.enabled_plugins()
    claims = {plugin.name: plugin.claims(section) for plugin, section in enabled}
    settings = Settings(invalid_annotations=config.invalidAnnotations)
    mutators: list[Mutator] = []
    for plugin, section in enabled:
        if section.mode is not mode:
            continue
        neighbours = Neighbours(tuple(c for name, c in claims.items() if name != plugin.name))
        mutators.append(plugin.build(section, settings, neighbours))
    return mutators


class Engine:
    skip_repeated_runs = True
    """Skip a mutator's run that can only repeat its last one (see run_to_fixed_point); False runs
    every mutator in every pass (tests hold the skip to that full run's answer)."""

    def __init__(
        self,
        config: Config,
        mutators: Sequence[Mutator] | None = None,
        shadow: Sequence[Mutator] | None = None,
    ) -> None:
        """``mutators`` and ``shadow`` override what the configuration builds (tests)."""
        self.config = config
        self.mutators = list(build_mutators(config) if mutators is None else mutators)
        self.shadow = list(build_mutators(config, MutatorMode.shadow) if shadow is None else shadow)
        self._excluded = frozenset(config.excludedNamespaces)
        self._idempotent = tuple(getattr(mutator, "idempotent", False) is True for mutator in self.mutators)

    # -- the public entry point ------------------------------------------------------------
    def decide(self, pod: Pod, request: RequestContext) -> Decision:
        """Never raises: an unexpected exception becomes an ``error`` decision per onInternalError.
        A caller that logs or times the decision calls ``decide_or_raise`` and ``internal_error``
        itself (the core reads no clock and writes no log)."""
        try:
            return self.decide_or_raise(pod, request)
        except Exception as error:  # noqa: BLE001 - a 500 would hand the Pod to failurePolicy
            return self.internal_error(error, request)

    def decide_or_raise(self, pod: Pod, request: RequestContext) -> Decision:
        """The decision; an unexpected exception (a bug in a mutator, a Pod that does not converge)
        propagates, for the caller to log and turn into ``internal_error``."""
        if request.namespace in self._excluded:
            return Decision("unchanged", True, f"namespace {request.namespace} is excluded")
        if labels_of(pod).get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            return Decision("unchanged", True, f"pod opted out ({OPT_OUT_LABEL}={OPT_OUT_VALUE})")

        try:
            (intended, decisions, intended_json), touched = self._fixed_point(pod, request)
        except DeniedForAChange as error:
            return Decision(
                "error",
                True,
                f"mutators do not compose: {error}",
                warnings=(
                    f"castslice: {error.mutator} would deny what {', '.join(error.changed_by)} added; "
                    "Pod admitted unchanged",
                ),
            )
        if self.shadow:
            decisions += self.run_shadow(intended, request)
            enforcing = tuple(d for d in decisions if not d.shadow)
        else:
            enforcing = decisions  # no shadow mutator: no filtering to pay for on every review
        warnings = tuple(w for d in enforcing for w in d.warnings)
        denials = [d for d in enforcing if d.action is Action.denied]
        if denials:
            message = "; ".join(d.reason for d in denials)
            return Decision("denied", False, message, decisions=decisions, warnings=warnings, denial=message)

        if intended is pod:
            patch = []
        elif touched is not None:
            patch = changes_within(pod, intended, touched)
        else:
            patch = quick_changes(pod, intended)
        if not patch and intended is not pod:
            patch = diff(pod, intended)  # a change == cannot see (1 to true) is still a change
        if not patch:
            reasons = "; ".join(f"{d.mutator}: {d.reason}" for d in enforcing)
            reasons = reasons or ("no mutator enforcing" if self.shadow else "no mutator enabled")
            return Decision("unchanged", True, reasons, decisions=decisions, warnings=warnings)

        problem = self._proof_problem(pod, patch, intended, intended_json)
        if problem:
            # quick_changes trusts ==, which calls 1 and true equal; diff compares as JSON does.
            exact = diff(pod, intended)
            if exact != patch:
                patch, problem = exact, self._proof_problem(pod, exact, intended, intended_json)
        if problem:
            return Decision(
                "error",
                True,
                f"patch withheld: {problem}",
                decisions=decisions,
                warnings=(
                    *warnings,
                    "castslice: mutation withheld by a safety check; Pod admitted unchanged",
                ),
            )
        acted = ", ".join(d.mutator for d in enforcing if d.action is Action.mutated)
        return Decision(
            "mutated",
            True,
            f"mutated by {acted}",
            patch=tuple(patch),
            decisions=decisions,
            warnings=warnings,
            mutated_pod=intended,
        )

    def run_to_fixed_point(self, pod: Pod, request: RequestContext) -> FixedPoint:
        """Every mutator in order until a whole pass changes nothing (or one denies); NotConverged
        when the passes run out."""
        return self._fixed_point(pod, request)[0]

    def _fixed_point(self, pod: Pod, request: RequestContext) -> tuple[FixedPoint, Scope | None]:
        """``run_to_fixed_point``, and where the runs that changed the Pod said they touched it
        (``MutatorResult.touched``): None when one of them did not say."""
        if not self.mutators:
            return FixedPoint(pod, (), None), None
        # One copy per review, which the mutators edit in place one after another (see
        # WorkingCopy); the original is never handed out.
        working = WorkingCopy(pod, from_json=request.pod_from_json)
        decisions: dict[str, MutatorDecision] = {}
        # A run is skipped when it can only repeat the last one (a mutator is a pure function of
        # what it reads of the Pod, ``Mutator.reads``, and the request): no change since that run
        # touched what the mutator reads, and that run changed nothing or the mutator is
        # idempotent (run on its own result, it reports unchanged and changes nothing). So the
        # pass confirming a fixed point costs nothing when every change was the last mutator's
        # own, and a change to metadata (a lease's stamp) runs again only the mutators reading it.
        count = len(self.mutators)
        due = [True] * count
        """Per mutator: whether its next run may differ from its last (True: not run yet)."""
        reads: list[Reads | None] = [None] * count
        """Per mutator: what it reads of the Pod, asked once per review when first needed."""
        touched: list[Path] | None = []
        idempotent = self._idempotent
        skip = self.skip_repeated_runs
        for _ in range(MAX_PASSES):
            changed_in_pass = False
            for position, mutator in enumerate(self.mutators):
                if skip and not due[position]:
                    continue
                before = working.json
                result = mutator.mutate(working.pod, request)
                changed = working.settle()
                _check_honest(mutator, result, changed)
                due[position] = changed and not idempotent[position]
                if changed and skip:
                    self._mark_due(due, reads, position, before, working, request)
                if changed and touched is not None:
                    touched = None if result.touched is None else [*touched, *result.touched]
                previous = decisions.get(mutator.name)
                # Keep the pass where a mutator acted (a later no-op pass says nothing new); a
                # denial from any pass is final, whatever the mutator did before.
                if previous is None or previous.action is Action.unchanged or result.action is Action.denied:
                    decisions[mutator.name] = MutatorDecision(
                        mutator.name, result.action, result.reason, result.warnings, copied=result.copied
                    )
                if result.action is Action.denied:
                    # An honest denial changed nothing (a change would have been a lie, raised
                    # above): the Pod is as the mutators before it left it.
                    if working.changed:
                        self._check_denial_is_the_pods(mutator, result, pod, request, decisions)
                    break
                changed_in_pass = changed_in_pass or changed
            else:
                if changed_in_pass:
                    continue  # no denial, and a change: another pass, to confirm or go on
            intended, intended_json = working.intended(pod)
            scope = scope_of(touched) if touched is not None else None
            return FixedPoint(intended, tuple(decisions.values()), intended_json), scope
        raise NotConverged(f"mutators still changing the Pod after {MAX_PASSES} passes")

    def _mark_due(
        self, due: list[bool], reads: list[Reads | None], changer: int, before: bytes | None,
        working: WorkingCopy, request: RequestContext,
    ) -> None:  # fmt: skip
        """After the mutator at ``changer`` changed the Pod (``before``: its exact JSON until then),
        every other mutator whose reads the change touched is due to run again."""
        changed: Changed | None = None
        for position, due_already in enumerate(due):
            if due_already or position == changer:
                continue
            declared = reads[position]
            if declared is None:
                declared = reads[position] = mutator_reads(self.mutators[position], request)
            if declared == EVERYTHING:
                due[position] = True
                continue
            if changed is None:
                changed = changed_parts(before, working.pod, working.json)
            due[position] = declared.touched_by(changed)

    def _check_denial_is_the_pods(
        self,
        mutator: Mutator,
        denial: MutatorResult,
        original: Pod,
        request: RequestContext,
        decisions: dict[str, MutatorDecision],
    ) -> None:
        """A denial after other mutators changed the Pod must hold for the Pod as submitted: the
        mutator is asked again on a copy of the original (only on this path, denials being rare).
        DeniedForAChange when it would not deny that Pod. A mutator denying what it changed
        itself in an earlier pass is not asked again: its denial is final."""
        changed_by = tuple(
            name
            for name, decided in decisions.items()
            if decided.action is Action.mutated and name != mutator.name
        )
        if not changed_by:
            return
        again = mutator.mutate(WorkingCopy(original).pod, request)
        if again.action is not Action.denied:
            raise DeniedForAChange(mutator.name, denial.reason, changed_by)

    def run_shadow(self, pod: Pod, request: RequestContext) -> tuple[MutatorDecision, ...]:
        """Each shadow mutator once, on its own copy of the Pod the enforcing mutators produced:
        what it would do is recorded (``shadow=True``); its changes and denials go nowhere."""
        decisions = []
        for mutator in self.shadow:
            working = WorkingCopy(pod, from_json=request.pod_from_json)
            result = mutator.mutate(working.pod, request)
            _check_honest(mutator, result, working.settle())
            decisions.append(
                MutatorDecision(mutator.name, result.action, result.reason, result.warnings, True)
            )
        return tuple(decisions)

    def _proof_problem(
        self, original: Pod, patch: list[Operation], intended: Pod, intended_json: bytes | None = None
    ) -> str | None:
        """Why the patch must not be sent, or None: it does not make the intended Pod, or the Pod
        it makes breaks a rule of the apiserver's the original kept."""
        try:
            patched = prove(original, patch, intended, intended_json)
        except PatchProofError as error:
            return str(error)
        rejected = introduced(original, patched)
        if rejected:
            return "the apiserver would reject the result: " + "; ".join(sorted(rejected))
        return None

    def internal_error(self, error: Exception, request: RequestContext) -> Decision:
        summary = f"internal error: {type(error).__name__}"
        return self._failed(summary, f"{summary}: {error}", request)

    def undecided(self, why: str, request: RequestContext) -> Decision:
        """The decision for a review the serving process could not decide in time (``why``): refused,
        whatever onInternalError says, with the reason and what to do. Admitted, it would skip every
        policy (and charge no lease) for exactly the Pods that arrive when the webhook is busiest;
        refused, it is created again (a controller retries with backoff, a user reruns the command)
        and decided then."""
        message = f"castslice: {why} (request uid {request.uid}); the webhook is busy: create the Pod again"
        return Decision("error", False, why, denial=message)

    def _failed(self, summary: str, reason: str, request: RequestContext) -> Decision:
        if self.config.onInternalError is OnInternalError.deny:
            message = f"castslice: {summary} (request uid {request.uid}); Pod denied by onInternalError: deny"
            return Decision("error", False, reason, denial=message)
        return Decision("error", True, reason, warnings=(f"castslice: {summary}; Pod admitted unchanged",))


def _check_honest(mutator: Mutator, result: MutatorResult, changed: bool) -> None:
    if changed and result.action is not Action.mutated:
        raise MutatorLied(f"{mutator.name} changed the Pod but reported {result.action.value}")
    if result.action is Action.mutated and not changed:
        raise MutatorLied(f"{mutator.name} reported mutated but changed nothing")


def mutator_reads(mutator: Mutator, request: RequestContext) -> Reads:
    """What ``mutator`` declares it reads of the Pod for this request (``Mutator.reads``), or
    EVERYTHING when it declares nothing."""
    declared = getattr(mutator, "reads", None)
    return declared(request) if declared is not None else EVERYTHING


LARGE_POD_BYTES = 256 * 1024
"""Above this, what a change touched is not worked out (the Pod read back from its JSON and
walked section by section): for a Pod that large it costs more than the runs it could save."""
_ABSENT = object()


def changed_parts(before: bytes | None, after: Pod, after_json: bytes | None = None) -> Changed:
    """What differs between the Pod whose exact JSON is ``before`` and ``after`` (whose exact
    JSON is ``after_json``, when known): label and annotation keys, and the other places one level
    into ``metadata`` and ``spec`` (a top-level key elsewhere). Found with == (in C), then held to
    JSON's exactness (1 is not true) in one serialization: the Pod before, with what was found
    changed brought level with ``after``, must write ``after_json``; ANYTHING when it does not, or
    when ``before`` is unknown."""
    if before is None or len(before) > LARGE_POD_BYTES:
        return ANYTHING
    old = orjson.loads(before)
    if not isinstance(old, dict) or not isinstance(after, dict):
        return ANYTHING
    labels: frozenset[str] | None = frozenset()
    annotations: frozenset[str] | None = frozenset()
    paths: set[tuple[str, ...]] = set()
    for key in old.keys() | after.keys():
        was, now = old.get(key, _ABSENT), after.get(key, _ABSENT)
        if was == now:
            continue
        if key in ("metadata", "spec") and isinstance(was, dict) and isinstance(now, dict):
            for part in was.keys() | now.keys():
                part_was, part_now = was.get(part, _ABSENT), now.get(part, _ABSENT)
                if part_was == part_now:
                    continue
                if key == "metadata" and part == "labels":
                    labels = _changed_keys(part_was, part_now)
                elif key == "metadata" and part == "annotations":
                    annotations = _changed_keys(part_was, part_now)
                else:
                    paths.add((key, part))
                _level(was, part, part_now)
        else:
            paths.add((key,))
            if key == "metadata":
                labels = annotations = None
            _level(old, key, now)
    if after_json is None or exact_json(old) != after_json:
        return ANYTHING  # a difference == cannot see (1 and true), or keys in another order
    return Changed(labels, annotations, frozenset(paths))


def _level(parent: dict[str, Any], key: str, value: Any) -> None:
    """``parent[key]`` made ``value`` (absent: removed), as in the Pod after the change."""
    if value is _ABSENT:
        parent.pop(key, None)
    else:
        parent[key] = value


def _changed_keys(was: Any, now: Any) -> frozenset[str] | None:
    """The keys of a string map that differ (an absent map counts as an empty one); None when
    either side is not a map (null, a list): then any key may read differently."""
    was = {} if was is _ABSENT else was
    now = {} if now is _ABSENT else now
    if not isinstance(was, dict) or not isinstance(now, dict):
        return None
    return frozenset(key for key in was.keys() | now.keys() if was.get(key, _ABSENT) != now.get(key, _ABSENT))
