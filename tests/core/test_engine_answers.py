"""The engine's and the patch helpers' answers in full: every field of a decision, every message a
refused patch gives, and the patch itself where only its speed-minded shortcuts could differ.

Written from a mutmut run over function/core/engine.py and function/core/json_patch.py: each test pins
behaviour
a surviving mutant changed without any other test noticing (see the module's git log)."""

from __future__ import annotations

from typing import Any

import pytest

from function.core.config import Config, parse_config
from function.core.engine import Decision, Engine
from function.core.json_patch import PatchProofError, apply_patch, canonical, diff, prove, quick_changes, same
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


# -- the patch helpers -----------------------------------------------------------------------------
def test_canonical_is_json_with_sorted_keys() -> None:
    assert canonical({"b": 1, "a": [True, 1.0, None]}) == b'{"a":[true,1.0,null],"b":1}'


def test_same_tells_types_apart_where_orjson_cannot_write_the_value() -> None:
    # An integer beyond 64 bits: orjson refuses it, so the typed walk decides.
    big = 2**70
    assert same({"n": big, "x": [1, "s"]}, {"n": big, "x": [1, "s"]})
    assert not same({"n": big, "x": 1}, {"n": big, "x": True})
    assert not same([big, 1], [big, 1.0])


def test_quick_changes_skips_list_members_that_are_equal_but_not_the_same_object() -> None:
    # The engine's working copy shares no object with the original: an untouched string in a list
    # is equal, not identical, and must not become an operation.
    old: dict[str, list[Any]] = {"args": ["".join(["--", "port"]), "8080"], "n": [10**6, 2.5]}
    new: dict[str, list[Any]] = {"args": ["".join(["--", "port"]), "9090"], "n": [int("1000000"), 2.5]}
    assert old["args"][0] is not new["args"][0]
    ops = quick_changes(old, new)
    assert ops == [{"op": "replace", "path": "/args/1", "value": "9090"}]
    assert ops == diff(old, new)


@pytest.mark.parametrize(
    ("document", "patch", "message"),
    [
        ({"a": 1}, [{"op": "remove", "path": ""}], "cannot remove the whole document"),
        ({"a": 1}, [{"op": "add", "path": "a", "value": 2}], "path 'a' does not start with /"),
        ({"a": [1]}, [{"op": "replace", "path": "/a/01", "value": 2}], "'01' is not an array index"),
        ({"a": [1]}, [{"op": "add", "path": "/a/5", "value": 2}], "array index 5 out of range"),
        ({"a": [1]}, [{"op": "replace", "path": "/a/1", "value": 2}], "array index 1 out of range"),
        ({"a": {}}, [{"op": "add", "path": "/a/b/c", "value": 2}], "path '/a/b/c' does not exist"),
        ({"a": {}}, [{"op": "remove", "path": "/a/b"}], "path '/a/b' does not exist"),
        ({"a": 1}, [{"op": "add", "path": "/a/b", "value": 2}], "path '/a/b' goes through a scalar"),
        ({"a": 1}, [{"op": "move", "path": "/a", "from": "/b"}], "unsupported operation"),
    ],
)
def test_a_refused_patch_says_why(document: Any, patch: list[Any], message: str) -> None:
    with pytest.raises(PatchProofError) as refused:
        apply_patch(document, patch)
    assert message in str(refused.value)


def test_an_index_through_a_list_on_the_way_is_checked_like_the_last_one() -> None:
    document = {"a": [{"b": 1}]}
    assert apply_patch(document, [{"op": "replace", "path": "/a/0/b", "value": 2}]) == {"a": [{"b": 2}]}
    with pytest.raises(PatchProofError, match="array index 1 out of range"):
        apply_patch(document, [{"op": "replace", "path": "/a/1/b", "value": 2}])
    with pytest.raises(PatchProofError, match="'-' is not an array index"):
        apply_patch(document, [{"op": "add", "path": "/a/-/b", "value": 2}])


def test_a_patch_that_applies_but_misses_the_intended_pod_says_so() -> None:
    original = {"a": 1, "b": [1]}
    with pytest.raises(PatchProofError, match=r"^patched object differs from the intended one$"):
        prove(original, [{"op": "replace", "path": "/a", "value": 2}], {"a": 2, "b": [1, 2]})
    with pytest.raises(PatchProofError, match=r"^patch does not apply: path '/c/d' does not exist$"):
        prove(original, [{"op": "add", "path": "/c/d", "value": 2}], {"a": 1})


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
