"""function/core/engine.py's answers in full: every field of a decision, the request every pass and
every shadow mutator is given, an internal error under deny and under admit, a withheld patch naming
every rule it would break, an opted-out Pod, a denial with its warnings. (The engine's one working
copy per review: tests/core/test_engine_in_place.py; the patch it proves: tests/core/test_json_patch.py.)"""

from __future__ import annotations

from typing import Any

from function.core.config import Config, parse_config
from function.core.engine import Decision, Engine
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
