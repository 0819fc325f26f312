"""The engine: every mutator, in a fixed order, to a fixed point, and a proven patch.

Gatekeeper's mutation system is the model: mutators run in order, passes repeat until a whole
pass changes nothing, and a system that does not converge is an error, not a guess. The result
is then turned into a JSON Patch, the patch is applied to the original and compared with the
intended Pod, and the apiserver's extended-resource rules are checked. Anything off means the
Pod is admitted unchanged with a warning: CastSlice never sends a patch that rejects a Pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from function.config import Config
from function.configtypes import MutatorMode, OnInternalError
from function.contract import OPT_OUT_LABEL, OPT_OUT_VALUE
from function.mutators.base import Action, Mutator, MutatorDecision, MutatorResult, RequestContext
from function.mutators.registry import Neighbours, Settings
from function.patch import Operation, PatchProofError, copy_json, diff, prove, quick_diff
from function.placement import scheduling_violations
from function.pod import Pod, cap_warning, labels_of
from function.rules import introduced_violations

log = logging.getLogger("castslice.engine")

ENGINE_VERSION = "0.1.0"
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
    duration_seconds: float = field(default=0.0, compare=False)

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


class NotConverged(Exception):
    pass


class MutatorLied(Exception):
    """A mutator's reported action disagrees with what it did to the Pod: a bug, never trusted."""


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

    # -- the public entry point ------------------------------------------------------------
    def decide(self, pod: Pod, request: RequestContext) -> Decision:
        """Never raises: an unexpected exception becomes an ``error`` decision per onInternalError."""
        started = time.perf_counter()
        try:
            decision = self._decide(pod, request)
        except Exception as error:  # nothing escapes: a 500 would hand the Pod to failurePolicy
            log.exception("internal error deciding on pod (request uid %s)", request.uid)
            decision = self.internal_error(error, request)
        return replace(decision, duration_seconds=time.perf_counter() - started)

    # -- the steps -------------------------------------------------------------------------
    def _decide(self, pod: Pod, request: RequestContext) -> Decision:
        if request.namespace in self._excluded:
            return Decision("unchanged", True, f"namespace {request.namespace} is excluded")
        if labels_of(pod).get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            return Decision("unchanged", True, f"pod opted out ({OPT_OUT_LABEL}={OPT_OUT_VALUE})")

        intended, decisions = self.run_to_fixed_point(pod, request)
        decisions += self.run_shadow(intended, request)
        warnings = tuple(w for d in decisions if not d.shadow for w in d.warnings)
        denials = [d for d in decisions if d.action is Action.denied and not d.shadow]
        if denials:
            message = "; ".join(d.reason for d in denials)
            return Decision("denied", False, message, decisions=decisions, warnings=warnings, denial=message)

        patch = quick_diff(pod, intended)
        if not patch and intended is not pod:
            patch = diff(pod, intended)  # a change == cannot see (1 to true) is still a change
        if not patch:
            reasons = "; ".join(f"{d.mutator}: {d.reason}" for d in decisions if not d.shadow)
            reasons = reasons or ("no mutator enforcing" if self.shadow else "no mutator enabled")
            return Decision("unchanged", True, reasons, decisions=decisions, warnings=warnings)

        problem = self._proof_problem(pod, patch, intended)
        if problem:
            # quick_diff trusts ==, which calls 1 and true equal; diff compares as JSON does.
            exact = diff(pod, intended)
            if exact != patch:
                patch, problem = exact, self._proof_problem(pod, exact, intended)
        if problem:
            log.error("patch withheld for request uid %s: %s", request.uid, problem)
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
        acted = ", ".join(d.mutator for d in decisions if d.action is Action.mutated and not d.shadow)
        return Decision(
            "mutated",
            True,
            f"mutated by {acted}",
            patch=tuple(patch),
            decisions=decisions,
            warnings=warnings,
            mutated_pod=intended,
        )

    def run_to_fixed_point(
        self, pod: Pod, request: RequestContext
    ) -> tuple[Pod, tuple[MutatorDecision, ...]]:
        """Run every mutator in order until a whole pass changes nothing (or one denies)."""
        current = pod
        decisions: dict[str, MutatorDecision] = {}
        for _ in range(MAX_PASSES):
            pass_start = current
            for mutator in self.mutators:
                working = copy_json(current)
                result = mutator.mutate(working, request)
                # Python's == (in C) is enough to see whether a mutator touched the Pod; the
                # strict JSON comparison runs once, in the proof of the final patch.
                changed = working != current
                _check_honest(mutator, result, changed)
                previous = decisions.get(mutator.name)
                # Keep the pass where a mutator acted (a later no-op pass says nothing new); a
                # denial from any pass is final, whatever the mutator did before.
                if previous is None or previous.action is Action.unchanged or result.action is Action.denied:
                    decisions[mutator.name] = MutatorDecision(
                        mutator.name, result.action, result.reason, result.warnings
                    )
                if result.action is Action.denied:
                    return current, tuple(decisions.values())
                if changed:
                    current = working
            if current is pass_start:
                return current, tuple(decisions.values())
        raise NotConverged(f"mutators still changing the Pod after {MAX_PASSES} passes")

    def run_shadow(self, pod: Pod, request: RequestContext) -> tuple[MutatorDecision, ...]:
        """Each shadow mutator once, on a copy of the Pod the enforcing mutators produced: what it
        would do is recorded (``shadow=True``); its changes and denials go nowhere."""
        decisions = []
        for mutator in self.shadow:
            working = copy_json(pod)
            result = mutator.mutate(working, request)
            _check_honest(mutator, result, working != pod)
            decisions.append(
                MutatorDecision(mutator.name, result.action, result.reason, result.warnings, True)
            )
        return tuple(decisions)

    def _proof_problem(self, original: Pod, patch: list[Operation], intended: Pod) -> str | None:
        try:
            prove(original, patch, intended)
        except PatchProofError as error:
            return str(error)
        introduced = introduced_violations(original, intended)
        # Placement fields (labels, tolerations, nodeSelector, node affinity) are written by the spot
        # and PodMutation mutators: a patch must not break the apiserver's rules for them either.
        placement = scheduling_violations(intended)
        if placement:  # the original is walked only when the result has a violation at all
            introduced |= placement - scheduling_violations(original)
        if introduced:
            return "the apiserver would reject the result: " + "; ".join(sorted(introduced))
        return None

    def internal_error(self, error: Exception, request: RequestContext) -> Decision:
        summary = f"internal error: {type(error).__name__}"
        if self.config.onInternalError is OnInternalError.deny:
            message = f"castslice: {summary} (request uid {request.uid}); Pod denied by onInternalError: deny"
            return Decision("error", False, f"{summary}: {error}", denial=message)
        return Decision(
            "error",
            True,
            f"{summary}: {error}",
            warnings=(cap_warning(f"castslice: {summary}; Pod admitted unchanged"),),
        )


def _check_honest(mutator: Mutator, result: MutatorResult, changed: bool) -> None:
    if changed and result.action is not Action.mutated:
        raise MutatorLied(f"{mutator.name} changed the Pod but reported {result.action.value}")
    if result.action is Action.mutated and not changed:
        raise MutatorLied(f"{mutator.name} reported mutated but changed nothing")
