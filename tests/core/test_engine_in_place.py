"""The engine's one copy per review: mutators edit it in place, what each did is told by exact JSON
bytes, and the original is never touched (the copy itself: tests/core/test_json_patch.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from function.core.config import Config
from function.core.engine import Engine, MutatorLied, NotConverged
from function.core.mutators.base import Action, MutatorResult, RequestContext
from tests.core.support import exact, pod

REQUEST = RequestContext(uid="u1", namespace="default")


class Step:
    """A mutator made of a function: ``edit(pod)`` returns the action to report."""

    def __init__(self, name: str, edit: Callable[[dict[str, Any]], Action]) -> None:
        self.name = name
        self.edit = edit
        self.calls = 0

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        self.calls += 1
        action = self.edit(pod)
        if action is Action.denied:
            return MutatorResult.denied(f"{self.name} says no")
        return MutatorResult(action, f"{self.name} {action.value}")


def reorder_metadata(pod: dict[str, Any]) -> Action:
    metadata = pod["metadata"]
    items = list(metadata.items())
    metadata.clear()
    metadata.update(reversed(items))
    return Action.unchanged


def add_annotation(pod: dict[str, Any]) -> Action:
    annotations = pod["metadata"]["annotations"]
    if "added" in annotations:
        return Action.unchanged
    annotations["added"] = "yes"
    return Action.mutated


def engine(*mutators: Any, shadow: Any = ()) -> Engine:
    return Engine(Config(), list(mutators), list(shadow))


# -- what counts as a change ---------------------------------------------------------------------
def test_a_key_order_change_alone_is_no_change_and_leaves_no_trace() -> None:
    original = pod()
    intended, decisions, _ = engine(Step("reorder", reorder_metadata)).run_to_fixed_point(original, REQUEST)
    assert intended is original
    assert [d.action for d in decisions] == [Action.unchanged]


def test_a_key_order_change_is_undone_before_the_next_mutator_sees_the_pod() -> None:
    """The old engine dropped the reordering run's copy: the next mutator's change, and so the
    intended Pod, keeps the original key order."""
    original = pod()
    seen: list[list[str]] = []

    def look_then_add(pod: dict[str, Any]) -> Action:
        seen.append(list(pod["metadata"]))
        return add_annotation(pod)

    decision = engine(Step("reorder", reorder_metadata), Step("add", look_then_add)).decide(original, REQUEST)
    assert seen[0] == ["name", "labels", "annotations"]
    assert decision.outcome == "mutated" and decision.mutated_pod is not None
    assert list(decision.mutated_pod["metadata"]) == ["name", "labels", "annotations"]
    assert decision.patch == ({"op": "add", "path": "/metadata/annotations/added", "value": "yes"},)


def test_a_key_order_change_reported_as_mutated_is_a_lie() -> None:
    def reorder_and_boast(pod: dict[str, Any]) -> Action:
        reorder_metadata(pod)
        return Action.mutated

    with pytest.raises(MutatorLied, match="reported mutated but changed nothing"):
        engine(Step("boast", reorder_and_boast)).run_to_fixed_point(pod(), REQUEST)


@pytest.mark.parametrize("new", [True, 1.0])
def test_one_to_true_or_one_point_zero_is_a_change(new: Any) -> None:
    """Python's == calls 1, 1.0 and True equal; JSON does not, and neither does the engine."""

    def alias(pod: dict[str, Any]) -> Action:
        if type(pod["spec"]["priority"]) is type(new):
            return Action.unchanged
        pod["spec"]["priority"] = new
        return Action.mutated

    original = pod()
    decision = engine(Step("alias", alias)).decide(original, REQUEST)
    assert decision.outcome == "mutated", decision.reason
    assert decision.patch == ({"op": "replace", "path": "/spec/priority", "value": new},)
    assert type(original["spec"]["priority"]) is int


def test_one_to_true_reported_unchanged_is_a_lie() -> None:
    def sneak(pod: dict[str, Any]) -> Action:
        pod["spec"]["priority"] = True
        return Action.unchanged

    with pytest.raises(MutatorLied, match="changed the Pod but reported unchanged"):
        engine(Step("sneak", sneak)).run_to_fixed_point(pod(), REQUEST)


def test_a_change_of_the_same_length_is_seen() -> None:
    """Same byte length may be a reordering only: such a change is told apart by its content."""

    def bump(pod: dict[str, Any]) -> Action:
        if pod["metadata"]["annotations"]["x"] == "2":
            return Action.unchanged
        pod["metadata"]["annotations"]["x"] = "2"
        return Action.mutated

    decision = engine(Step("bump", bump)).decide(pod(), REQUEST)
    assert decision.patch == ({"op": "replace", "path": "/metadata/annotations/x", "value": "2"},)

    def hide(pod: dict[str, Any]) -> Action:
        pod["metadata"]["annotations"]["x"] = "2"
        return Action.unchanged

    with pytest.raises(MutatorLied):
        engine(Step("hide", hide)).run_to_fixed_point(pod(), REQUEST)


def test_a_lie_about_a_change_of_another_length_is_caught() -> None:
    with pytest.raises(MutatorLied, match="liar changed the Pod but reported unchanged"):
        engine(Step("liar", lambda p: (add_annotation(p), Action.unchanged)[1])).run_to_fixed_point(
            pod(), REQUEST
        )


# -- denials, exceptions, passes ----------------------------------------------------------------
def test_a_denial_after_a_partial_change_is_a_lie_and_nothing_leaks() -> None:
    def half_then_deny(pod: dict[str, Any]) -> Action:
        pod["metadata"]["annotations"]["half"] = "done"
        return Action.denied

    original = pod()
    before = exact(original)
    decision = engine(Step("half", half_then_deny)).decide(original, REQUEST)
    assert decision.outcome == "error" and "MutatorLied" in decision.reason and not decision.patch
    assert exact(original) == before


def test_an_honest_denial_returns_the_pod_as_the_mutators_before_it_left_it() -> None:
    original = pod()
    intended, decisions, _ = engine(
        Step("add", add_annotation), Step("no", lambda p: Action.denied)
    ).run_to_fixed_point(original, REQUEST)
    assert intended is not original and intended["metadata"]["annotations"]["added"] == "yes"
    assert [d.action for d in decisions] == [Action.mutated, Action.denied]
    assert "added" not in original["metadata"]["annotations"]


def test_a_denial_before_any_change_returns_the_original() -> None:
    original = pod()
    intended, _, _ = engine(
        Step("no", lambda p: Action.denied), Step("add", add_annotation)
    ).run_to_fixed_point(original, REQUEST)
    assert intended is original


def test_a_mutator_raising_after_a_partial_change_touches_nothing() -> None:
    def half_then_raise(pod: dict[str, Any]) -> Action:
        pod["spec"]["containers"].append({"name": "half"})
        raise RuntimeError("boom")

    original = pod()
    before = exact(original)
    decision = engine(Step("add", add_annotation), Step("boom", half_then_raise)).decide(original, REQUEST)
    assert decision.outcome == "error" and "RuntimeError" in decision.reason
    assert exact(original) == before


def test_two_mutators_feeding_each_other_need_a_third_pass() -> None:
    def a_after_b(pod: dict[str, Any]) -> Action:
        annotations = pod["metadata"]["annotations"]
        if "b" in annotations and "a" not in annotations:
            annotations["a"] = "1"
            return Action.mutated
        return Action.unchanged

    def b(pod: dict[str, Any]) -> Action:
        annotations = pod["metadata"]["annotations"]
        if "b" in annotations:
            return Action.unchanged
        annotations["b"] = "1"
        return Action.mutated

    first, second = Step("a", a_after_b), Step("b", b)
    decision = engine(first, second).decide(pod(), REQUEST)
    # a: acting, acting, confirming; b: acting, confirming (nothing changed the Pod after its
    # second run, which changed nothing: a third would see the same Pod and say the same).
    assert (first.calls, second.calls) == (3, 2)
    assert decision.outcome == "mutated"
    assert [d.action for d in decision.decisions] == [Action.mutated, Action.mutated]
    assert decision.patch == (  # in the order the annotations were added
        {"op": "add", "path": "/metadata/annotations/b", "value": "1"},
        {"op": "add", "path": "/metadata/annotations/a", "value": "1"},
    )


def test_a_single_quiet_pass_is_enough() -> None:
    quiet = Step("quiet", lambda p: Action.unchanged)
    intended, _, _ = engine(quiet).run_to_fixed_point(original := pod(), REQUEST)
    assert intended is original and quiet.calls == 1


def test_a_mutator_changing_every_pass_does_not_converge() -> None:
    def count(pod: dict[str, Any]) -> Action:
        annotations = pod["metadata"]["annotations"]
        annotations["n"] = str(int(annotations.get("n", "0")) + 1)
        return Action.mutated

    counter = Step("count", count)
    with pytest.raises(NotConverged):
        engine(counter).run_to_fixed_point(pod(), REQUEST)
    assert counter.calls == 5


def test_no_mutator_returns_the_original_without_copying() -> None:
    original = pod()
    assert engine().run_to_fixed_point(original, REQUEST) == (original, (), None)


def test_mutators_never_receive_the_original_and_it_never_changes() -> None:
    received: list[dict[str, Any]] = []

    def record(pod: dict[str, Any]) -> Action:
        received.append(pod)
        return add_annotation(pod)

    original = pod()
    before = exact(original)
    decision = engine(Step("record", record)).decide(original, REQUEST)
    assert decision.outcome == "mutated"
    assert all(r is not original for r in received)
    assert all(r["metadata"] is not original["metadata"] for r in received)
    assert exact(original) == before


# -- the copy and its record ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "odd",
    [float("inf"), (1, 2), 2**70],
    ids=["infinity", "tuple", "big-int"],
)
def test_what_orjson_cannot_copy_exactly_is_copied_with_its_type(odd: Any) -> None:
    """orjson writes infinity as null and a tuple as a list, and cannot write a big integer: the
    mutators must still see the value the Pod holds."""
    original = pod()
    original["spec"]["odd"] = odd
    seen: list[Any] = []

    def look(pod: dict[str, Any]) -> Action:
        seen.append(pod["spec"]["odd"])
        return add_annotation(pod)

    decision = engine(Step("look", look)).decide(original, REQUEST)
    assert type(seen[0]) is type(odd) and seen[0] == odd
    assert decision.outcome == "mutated", decision.reason
    assert decision.patch == ({"op": "add", "path": "/metadata/annotations/added", "value": "yes"},)
    assert original["spec"]["odd"] is odd and "added" not in original["metadata"]["annotations"]


def test_without_bytes_a_lie_and_a_reordering_are_still_told_apart() -> None:
    original = pod()
    original["spec"]["big"] = 2**70
    with pytest.raises(MutatorLied):
        engine(Step("liar", lambda p: (add_annotation(p), Action.unchanged)[1])).run_to_fixed_point(
            original, REQUEST
        )
    intended, _, _ = engine(Step("reorder", reorder_metadata)).run_to_fixed_point(original, REQUEST)
    assert intended is original
    seen: list[list[str]] = []

    def look_then_add(pod: dict[str, Any]) -> Action:
        seen.append(list(pod["metadata"]))
        return add_annotation(pod)

    intended, _, _ = engine(Step("reorder", reorder_metadata), Step("add", look_then_add)).run_to_fixed_point(
        original, REQUEST
    )
    assert seen[0] == ["name", "labels", "annotations"] and list(intended["metadata"]) == seen[0]
    assert seen[1] == seen[0]  # the confirming pass: the record was not the Pod the mutators edit


def test_a_mutator_writing_what_orjson_cannot_is_a_change_and_later_ones_are_still_seen() -> None:
    def big(pod: dict[str, Any]) -> Action:
        if pod["spec"].get("big") == 2**70:
            return Action.unchanged
        pod["spec"]["big"] = 2**70
        return Action.mutated

    original = pod()
    intended, decisions, _ = engine(Step("big", big), Step("add", add_annotation)).run_to_fixed_point(
        original, REQUEST
    )
    assert [d.action for d in decisions] == [Action.mutated, Action.mutated]
    assert intended["spec"]["big"] == 2**70 and intended["metadata"]["annotations"]["added"] == "yes"
    assert "big" not in original["spec"]


# -- shadow mutators ---------------------------------------------------------------------------
def test_a_shadow_mutator_works_on_its_own_copy() -> None:
    edited: list[dict[str, Any]] = []

    def shadow_edit(pod: dict[str, Any]) -> Action:
        edited.append(pod)
        return add_annotation(pod)

    original = pod()
    decision = engine(
        Step(
            "enforce",
            lambda p: (
                (p["metadata"]["labels"].update(b="2"), Action.mutated)[1]
                if "b" not in p["metadata"]["labels"]
                else Action.unchanged
            ),
        ),
        shadow=[Step("shadow", shadow_edit)],
    ).decide(original, REQUEST)
    assert decision.outcome == "mutated" and decision.mutated_pod is not None
    assert edited[0] is not decision.mutated_pod
    assert "added" not in decision.mutated_pod["metadata"]["annotations"]
    assert decision.patch == ({"op": "add", "path": "/metadata/labels/b", "value": "2"},)
    assert [(d.mutator, d.action, d.shadow) for d in decision.decisions] == [
        ("enforce", Action.mutated, False),
        ("shadow", Action.mutated, True),
    ]


class Recorder:
    """A mutator that changes nothing and remembers the request it was handed."""

    name = "recorder"

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        self.requests.append(request)
        return MutatorResult(Action.unchanged, "nothing")


class Liar:
    """A shadow mutator that changes the Pod and says it did not, with a warning."""

    name = "liar"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        pod["metadata"]["labels"]["lie"] = "1"
        return MutatorResult(Action.unchanged, "says nothing")


class Warner:
    name = "warner"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        return MutatorResult(Action.unchanged, "fine", ("careful",))


def test_run_to_fixed_point_hands_the_request_to_every_mutator() -> None:
    recorder = Recorder()
    engine(recorder).run_to_fixed_point(pod(), REQUEST)
    assert recorder.requests == [REQUEST]


def test_a_lying_shadow_mutator_is_named_as_a_liar() -> None:
    with pytest.raises(MutatorLied, match="liar changed the Pod but reported unchanged"):
        engine(shadow=[Liar()]).run_shadow(pod(), REQUEST)


def test_a_shadow_mutators_warnings_are_recorded_but_not_sent() -> None:
    (recorded,) = engine(shadow=[Warner()]).run_shadow(pod(), REQUEST)
    assert (recorded.mutator, recorded.shadow, recorded.warnings) == ("warner", True, ("careful",))
    decision = engine(shadow=[Warner()]).decide(pod(), REQUEST)
    assert decision.warnings == ()


def test_a_shadow_reordering_is_no_change() -> None:
    decision = engine(shadow=[Step("reorder", reorder_metadata)]).decide(pod(), REQUEST)
    assert decision.outcome == "unchanged" and decision.decisions[0].action is Action.unchanged


# -- the proof's rule checks ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("where", "edit"),
    [
        ("metadata.labels", lambda p: p["metadata"]["labels"].update({"bad key!": "v"})),
        ("metadata.annotations", lambda p: p["metadata"]["annotations"].update({"n": 1})),
        ("spec.nodeSelector", lambda p: p["spec"].update(nodeSelector={"k": "bad value!"})),
        ("spec.tolerations", lambda p: p["spec"].update(tolerations=[{"operator": "Sometimes"}])),
        (
            "spec.affinity",
            lambda p: p["spec"].update(
                affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
            ),
        ),
    ],
)
def test_a_patch_breaking_any_placement_rule_is_withheld(where: str, edit: Callable[[Any], None]) -> None:
    done: list[bool] = []

    def breaker(pod: dict[str, Any]) -> Action:
        if done:
            return Action.unchanged
        done.append(True)
        edit(pod)
        return Action.mutated

    decision = engine(Step("breaker", breaker)).decide(pod(), REQUEST)
    assert decision.outcome == "error" and not decision.patch, decision.reason
    assert where in decision.reason


def test_placement_violations_the_original_has_already_are_not_blamed_on_the_patch() -> None:
    original = pod()
    original["metadata"]["labels"]["bad key!"] = "v"
    decision = engine(
        Step(
            "labeller",
            lambda p: (
                Action.unchanged
                if "b" in p["metadata"]["labels"]
                else (p["metadata"]["labels"].update(b="2"), Action.mutated)[1]
            ),
        )
    ).decide(original, REQUEST)
    assert decision.outcome == "mutated", decision.reason


# -- where a mutator says it changed the Pod -----------------------------------------------------
class Scoped(Step):
    """A Step reporting ``touched`` when it mutates."""

    def __init__(self, name: str, edit: Callable[[dict[str, Any]], Action], touched: Any) -> None:
        super().__init__(name, edit)
        self.touched = touched

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        result = super().mutate(pod, request)
        if result.action is not Action.mutated:
            return result
        return MutatorResult.mutated(result.reason, touched=self.touched)


@pytest.mark.parametrize(
    "touched",
    [(("metadata", "annotations"),), (("metadata",),), (("spec",),), ((),), None],
    ids=["the-right-subtree", "above-it", "elsewhere-so-the-proof-catches-it", "everywhere", "not-said"],
)
def test_the_patch_is_the_same_wherever_the_mutator_says_it_touched_the_pod(touched: Any) -> None:
    """The patch is built by looking only where the mutators said they changed the Pod; a wrong
    place fails the proof (it compares the whole Pod) and the patch is built from the whole Pod."""
    decision = engine(Scoped("add", add_annotation, touched)).decide(pod(), REQUEST)
    assert decision.outcome == "mutated"
    assert decision.patch == ({"op": "add", "path": "/metadata/annotations/added", "value": "yes"},)
