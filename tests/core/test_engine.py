"""function/core/engine.py's answers in full: every field of a decision, the request every pass and
every shadow mutator is given, an internal error under deny and under admit, a withheld patch naming
every rule it would break, an opted-out Pod or namespace, a denial with its warnings; mutators that
misreport what they did, never converge or deny in a later pass; a denial only for what another
mutator added (mutators that compose: never a denial, an error); a Pod the default configuration
slices. (The engine's one working copy per review: tests/core/test_engine_in_place.py; the patch it
proves: tests/core/test_json_patch.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from function.core.config import Config, parse_config
from function.core.engine import Decision, Engine, NotConverged
from function.core.mutators.base import Action, MutatorDecision, MutatorResult, RequestContext

REQUEST = RequestContext(uid="u-42", namespace="ml", operation="CREATE")


def pod() -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]},
    }


class Edit:
    """A mutator that applies ``edit`` once (then reports unchanged) and keeps the requests it saw."""

    def __init__(self, name: str, edit: Any) -> None:
        self.name = name
        self.edit = edit
        self.seen: list[RequestContext] = []

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        self.seen.append(request)
        if self.edit(pod) is False:
            return MutatorResult(Action.unchanged, "nothing to do")
        return MutatorResult(Action.mutated, "edited", ("a warning",))


def once(change: Any) -> Any:
    done: list[bool] = []

    def edit(pod: dict[str, Any]) -> bool:
        if done:
            return False
        done.append(True)
        change(pod)
        return True

    return edit


# -- a decision, field by field -------------------------------------------------------------------
def test_a_mutated_decision_in_full_and_as_a_dict() -> None:
    mutator = Edit("labeller", once(lambda p: p["metadata"]["labels"].update(team="ml")))
    decision = Engine(Config(), [mutator], []).decide(pod(), REQUEST)
    assert decision.outcome == "mutated" and decision.allowed
    assert decision.reason == "mutated by labeller"
    assert decision.patch == ({"op": "add", "path": "/metadata/labels/team", "value": "ml"},)
    assert decision.warnings == ("a warning",)
    assert decision.as_dict() == {
        "outcome": "mutated",
        "allowed": True,
        "reason": "mutated by labeller",
        "patch": [{"op": "add", "path": "/metadata/labels/team", "value": "ml"}],
        "mutators": [
            {"mutator": "labeller", "action": "mutated", "reason": "edited", "warnings": ["a warning"]}
        ],
        "warnings": ["a warning"],
        "denial": None,
    }
    assert (
        MutatorDecision("labeller", Action.mutated, "edited", ("a warning",)).as_dict()
        == (decision.as_dict()["mutators"][0])
    )


def test_every_pass_gets_the_request_as_given() -> None:
    mutator = Edit("labeller", once(lambda p: p["metadata"]["labels"].update(team="ml")))
    intended, decisions, _ = Engine(Config(), [mutator], []).run_to_fixed_point(pod(), REQUEST)
    assert intended["metadata"]["labels"] == {"app": "a", "team": "ml"}
    assert [d.mutator for d in decisions] == ["labeller"]
    assert mutator.seen == [REQUEST, REQUEST]  # the change, then the pass that confirms it


class IdempotentEdit(Edit):
    idempotent = True


def test_an_idempotent_mutator_is_not_run_again_to_confirm_its_own_change() -> None:
    mutator = IdempotentEdit("labeller", once(lambda p: p["metadata"]["labels"].update(team="ml")))
    intended, decisions, _ = Engine(Config(), [mutator], []).run_to_fixed_point(pod(), REQUEST)
    assert intended["metadata"]["labels"] == {"app": "a", "team": "ml"}
    assert [(d.mutator, d.action) for d in decisions] == [("labeller", Action.mutated)]
    assert mutator.seen == [REQUEST]


def test_an_idempotent_mutator_runs_again_once_a_later_one_changed_the_pod() -> None:
    first = IdempotentEdit("labeller", once(lambda p: p["metadata"]["labels"].update(team="ml")))
    second = IdempotentEdit("annotator", once(lambda p: p["metadata"].update(annotations={"a": "b"})))
    Engine(Config(), [first, second], []).run_to_fixed_point(pod(), REQUEST)
    assert first.seen == [REQUEST, REQUEST]  # the annotator changed what the labeller read
    assert second.seen == [REQUEST]


def test_a_mutator_that_changed_nothing_is_not_run_again_while_nothing_changed() -> None:
    changer = Edit("labeller", once(lambda p: p["metadata"]["labels"].update(team="ml")))
    idle = Edit("idle", lambda p: False)
    _, decisions, _ = Engine(Config(), [changer, idle], []).run_to_fixed_point(pod(), REQUEST)
    assert changer.seen == [REQUEST, REQUEST]  # not idempotent: the pass that confirms its change
    assert idle.seen == [REQUEST]  # it saw the changed Pod already, and nothing changed since
    assert [(d.mutator, d.action) for d in decisions] == [
        ("labeller", Action.mutated),
        ("idle", Action.unchanged),
    ]


def test_an_internal_error_under_deny_is_a_denial_that_names_the_error_and_the_request() -> None:
    engine = Engine(parse_config({"onInternalError": "deny"}), [], [])
    decision = engine.internal_error(RuntimeError("boom"), REQUEST)
    assert decision == Decision(
        "error",
        False,
        "internal error: RuntimeError: boom",
        denial=(
            "castslice: internal error: RuntimeError (request uid u-42); Pod denied by onInternalError: deny"
        ),
    )
    assert decision.warnings == () and decision.patch == ()


def test_an_internal_error_under_admit_admits_with_a_warning_and_no_detail() -> None:
    engine = Engine(parse_config({"onInternalError": "admit"}), [], [])
    decision = engine.internal_error(RuntimeError("secret detail"), REQUEST)
    assert decision == Decision(
        "error",
        True,
        "internal error: RuntimeError: secret detail",
        warnings=("castslice: internal error: RuntimeError; Pod admitted unchanged",),
    )
    assert decision.denial is None


def test_a_withheld_patch_names_every_rule_it_would_break() -> None:
    # Both kinds at once: an extended-resource rule (a request above its limit) and a placement rule
    # (a label key the apiserver refuses). Neither may hide the other.
    def breaks_both(p: dict[str, Any]) -> None:
        p["spec"]["containers"][0]["resources"] = {
            "limits": {"example.com/foo": "1"},
            "requests": {"example.com/foo": "2"},
        }
        p["metadata"]["labels"]["bad key!"] = "v"

    decision = Engine(Config(), [Edit("breaker", once(breaks_both))], []).decide(pod(), REQUEST)
    assert decision.outcome == "error" and decision.allowed and not decision.patch
    assert "spec.containers[0] (c): example.com/foo request must equal its limit" in decision.reason
    assert "metadata.labels" in decision.reason


# -- opted out, denied, shadowed ---------------------------------------------------------------
def test_an_opted_out_pod_is_admitted_unchanged_without_running_a_mutator() -> None:
    mutator = Edit("labeller", once(lambda p: p["metadata"]["labels"].update(team="ml")))
    opted_out = pod()
    opted_out["metadata"]["labels"]["castops.io/webhook"] = "ignore"
    decision = Engine(Config(), [mutator], []).decide(opted_out, REQUEST)
    assert decision == Decision("unchanged", True, "pod opted out (castops.io/webhook=ignore)")
    assert mutator.seen == []


class Denier:
    def __init__(self, name: str) -> None:
        self.name = name

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        return MutatorResult(Action.denied, f"{self.name} says no", (f"{self.name} warns",))


def test_a_denial_is_the_message_and_its_warnings_are_kept() -> None:
    # The first denial ends the pass: the second denier never runs.
    quiet = Edit("quiet", lambda p: False)
    decision = Engine(Config(), [quiet, Denier("first"), Denier("second")], []).decide(pod(), REQUEST)
    assert (decision.outcome, decision.allowed) == ("denied", False)
    assert decision.denial == decision.reason == "first says no"
    assert decision.warnings == ("first warns",)


def test_shadow_mutators_get_the_request_as_given() -> None:
    shadow = Edit("shadow", lambda p: False)
    Engine(Config(), [], [shadow]).decide(pod(), REQUEST)
    assert shadow.seen == [REQUEST]


# -- a Pod the default configuration slices, and mutators that misbehave ------------------------
GPU_POD = {
    "kind": "Pod",
    "metadata": {"annotations": {"castops.io/optimize": "true"}},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


class Liar:
    name = "liar"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        pod["spec"]["nodeName"] = "sneaky"
        return MutatorResult.unchanged("did nothing, honest")


class Boaster:
    name = "boaster"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        return MutatorResult.mutated("changed everything")


class Counter:
    """Never converges: bumps an annotation on every pass."""

    name = "counter"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
        annotations["n"] = str(int(annotations.get("n", "0")) + 1)
        return MutatorResult.mutated("bumped")


class BreaksTheRules:
    """Produces a request without a limit: the apiserver would reject the Pod."""

    name = "rule-breaker"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        resources = pod["spec"]["containers"][0]["resources"]
        if "requests" in resources:
            return MutatorResult.unchanged("already done")
        resources["requests"] = {"example.com/fpga": "1"}
        return MutatorResult.mutated("added an fpga request")


class MutatesThenDenies:
    """Adds a marker, then denies the Pod carrying it: the second pass's denial must win."""

    name = "second-thoughts"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        metadata = pod.setdefault("metadata", {})
        if "marker" in metadata:
            return MutatorResult.denied("second-thoughts: the marker is not allowed")
        metadata["marker"] = "x"
        return MutatorResult.mutated("added a marker")


def test_a_denial_in_a_later_pass_is_final() -> None:
    decision = Engine(Config(), [MutatesThenDenies()]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "denied" and not decision.allowed and not decision.patch
    assert decision.denial == "second-thoughts: the marker is not allowed"


class AddsAResource:
    """Adds ``example.com/added`` to the first container (once)."""

    name = "adds"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        resources = pod["spec"]["containers"][0].setdefault("resources", {})
        limits = resources.setdefault("limits", {})
        if "example.com/added" in limits:
            return MutatorResult.unchanged("already added")
        limits["example.com/added"] = "1"
        return MutatorResult.mutated("added example.com/added")


class DeniesTheResource:
    """Denies a Pod asking for ``example.com/added``: what its neighbour adds."""

    name = "strict"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
        if "example.com/added" in limits:
            return MutatorResult.denied("strict: example.com/added is not allowed")
        return MutatorResult.unchanged("nothing to refuse")


@pytest.mark.parametrize(
    "order", [(AddsAResource(), DeniesTheResource()), (DeniesTheResource(), AddsAResource())]
)
def test_a_pod_is_never_denied_for_what_another_mutator_added(order: tuple[Any, Any]) -> None:
    """In the same pass or the next: the Pod as submitted passes, so the mutators do not compose on
    it; it is admitted unchanged with a warning, and the reason names both."""
    decision = Engine(Config(), list(order)).decide(pod(), REQUEST)
    assert decision.outcome == "error" and decision.allowed and not decision.patch
    assert "strict denies only what adds changed" in decision.reason
    assert decision.warnings == ("castslice: strict would deny what adds added; Pod admitted unchanged",)


def test_a_denial_the_submitted_pod_earns_stands_after_a_neighbour_changed_it() -> None:
    submitted = pod()
    submitted["spec"]["containers"][0]["resources"] = {"limits": {"example.com/added": "2"}}
    decision = Engine(
        Config(), [Edit("notes", once(lambda p: p["metadata"].update(note="x"))), DeniesTheResource()]
    ).decide(submitted, REQUEST)
    assert decision.outcome == "denied" and decision.denial == "strict: example.com/added is not allowed"


@pytest.mark.parametrize("mutator", [Liar(), Boaster()])
def test_a_mutator_misreporting_its_action_is_an_internal_error(mutator: Any) -> None:
    decision = Engine(Config(), [mutator]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "error" and decision.allowed and not decision.patch
    assert "MutatorLied" in decision.reason


def test_non_converging_mutators_are_an_internal_error() -> None:
    decision = Engine(Config(), [Counter()]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "error" and "NotConverged" in decision.reason and not decision.patch


def test_a_patch_breaking_apiserver_rules_is_withheld() -> None:
    decision = Engine(Config(), [BreaksTheRules()]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "error" and decision.allowed and not decision.patch
    assert "request but no limit" in decision.reason
    assert decision.warnings == ("castslice: mutation withheld by a safety check; Pod admitted unchanged",)


def test_run_to_fixed_point_raises_not_converged() -> None:
    with pytest.raises(NotConverged):
        Engine(Config(), [Counter()]).run_to_fixed_point(GPU_POD, REQUEST)


def test_engine_never_mutates_its_input() -> None:
    import copy

    before = copy.deepcopy(GPU_POD)
    decision = Engine(Config()).decide(GPU_POD, REQUEST)
    assert decision.outcome == "mutated" and before == GPU_POD


def test_decisions_say_which_mutator_did_what() -> None:
    decision = Engine(Config()).decide(GPU_POD, REQUEST)
    assert [(d.mutator, d.action) for d in decision.decisions] == [("gpu-slicing", Action.mutated)]
    assert decision.acting_mutators == ("gpu-slicing",)
    assert "nvidia.com/gpu -> nvidia.com/gpu-shared: 1 (default)" in decision.decisions[0].reason
    assert decision.as_dict()["mutators"][0]["mutator"] == "gpu-slicing"


def test_excluded_namespace_and_opt_out_label() -> None:
    engine = Engine(Config())
    assert (
        engine.decide(GPU_POD, RequestContext(namespace="kube-system")).reason
        == "namespace kube-system is excluded"
    )
    labelled = {**GPU_POD, "metadata": {**GPU_POD["metadata"], "labels": {"castops.io/webhook": "ignore"}}}
    assert "opted out" in engine.decide(labelled, REQUEST).reason


def test_an_opted_in_pod_whose_first_container_has_resources_but_no_gpu() -> None:
    """The first container has resources without the source resource: it is passed over (not
    stopped at), untouched, and the GPU container after it is sliced."""
    pod = {
        "kind": "Pod",
        "metadata": {"annotations": {"castops.io/optimize": "true"}},
        "spec": {
            "containers": [
                {"name": "sidecar", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}},
                {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]
        },
    }
    decision = Engine(Config()).decide(pod, REQUEST)
    assert decision.outcome == "mutated"
    assert decision.mutated_pod is not None
    sidecar, gpu = decision.mutated_pod["spec"]["containers"]
    assert sidecar == pod["spec"]["containers"][0]
    assert gpu["resources"] == {
        "limits": {"nvidia.com/gpu-shared": "1"},
        "requests": {"nvidia.com/gpu-shared": "1"},
    }
    assert decision.decisions[0].reason.endswith("in containers/gpu")
