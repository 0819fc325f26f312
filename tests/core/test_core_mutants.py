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
