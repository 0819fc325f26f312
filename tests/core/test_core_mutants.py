"""Behaviour the recent engine, patch and audit changes rely on that no other test pinned down:
each test here kills a mutant mutmut found surviving (the request handed to mutators, shadow
honesty and warnings, apply_patch's refusals, prove with unwritable results, redaction after a
remove)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from function.admission.facts import audit_facts
from function.audit.events import event_data, redact_patch
from function.core.engine import Decision, MutatorLied
from function.core.json_patch import PatchProofError, apply_patch, canonical, prove
from function.core.mutators.base import Action, MutatorResult, RequestContext
from tests.audit.test_audit_fastpath import MOMENT, SECRET, secret_review
from tests.core.test_engine_in_place import REQUEST, engine, pod


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


# -- engine ------------------------------------------------------------------------------------
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


# -- apply_patch and prove -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "operation",
    [
        {"op": "move", "from": "/a", "path": "/b"},
        {"op": "copy", "from": "/a", "path": "/b"},
        {"op": "test", "path": "/a", "value": 1},
        {"op": "add", "path": 5, "value": 1},
        {"path": "/a", "value": 1},
    ],
)
def test_apply_patch_refuses_operations_it_does_not_support(operation: dict[str, Any]) -> None:
    document = {"a": 1}
    with pytest.raises(PatchProofError, match="unsupported operation"):
        apply_patch(document, [operation])
    assert document == {"a": 1}


def test_apply_patch_refuses_to_remove_the_whole_document_but_replaces_it() -> None:
    with pytest.raises(PatchProofError, match=r"^cannot remove the whole document$"):
        apply_patch({"a": 1}, [{"op": "remove", "path": ""}])
    assert apply_patch({"a": 1}, [{"op": "replace", "path": "", "value": {"b": 2}}]) == {"b": 2}


def test_apply_patch_names_the_path_it_cannot_follow() -> None:
    with pytest.raises(PatchProofError, match=r"^path 'a/b' does not start with /$"):
        apply_patch({"a": {}}, [{"op": "add", "path": "a/b", "value": 1}])
    with pytest.raises(PatchProofError, match=r"^path '/x/y/z' does not exist$"):
        apply_patch({"a": {}}, [{"op": "add", "path": "/x/y/z", "value": 1}])


def test_prove_without_intended_bytes_still_compares_a_result_orjson_cannot_write() -> None:
    # A result beyond 64 bits has no exact_json bytes; it must still be compared with the intended.
    original: dict[str, Any] = {"a": 2**70}
    with pytest.raises(PatchProofError, match=r"^patched object differs from the intended one$"):
        prove(original, [{"op": "add", "path": "/b", "value": 1}], {"a": 2**70, "b": 2})
    assert prove(original, [{"op": "add", "path": "/b", "value": 1}], {"a": 2**70, "b": 1}) == {
        "a": 2**70,
        "b": 1,
    }


def test_canonical_sorts_keys_and_keeps_json_types_apart() -> None:
    assert canonical({"b": 1, "a": True}) == b'{"a":true,"b":1}'
    assert canonical({"a": 1}) != canonical({"a": 1.0}) != canonical({"a": True})


# -- audit redaction -----------------------------------------------------------------------------
def test_a_secret_after_a_remove_is_still_redacted() -> None:
    decision = Decision(
        "mutated",
        True,
        "r",
        patch=(
            {"op": "remove", "path": "/metadata/labels/x"},
            {"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET},
        ),
    )
    data = event_data(audit_facts(secret_review(), decision), decision, config_digest="d", decided_at=MOMENT)
    assert data["patchRedactions"] == 1
    assert SECRET not in json.dumps(data)


def test_redact_patch_without_secrets_returns_copies_and_no_count() -> None:
    patch = ({"op": "add", "path": "/spec/containers/0/env/0/value", "value": "v"},)
    redacted, count = redact_patch(patch, {"spec": {"containers": [{"name": "c"}]}})
    assert (redacted, count) == ([{"op": "add", "path": "/spec/containers/0/env/0/value", "value": "v"}], 0)
    assert redacted[0] is not patch[0]
