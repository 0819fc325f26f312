"""From a parsed review to the reply, in full: what the mutators are told about the request, how
a denial names the Pod, that warnings reach the reply whatever the outcome, and what happens when
building the reply itself fails (function/admission/review.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

import function.admission.review as admission
from function.admission.facts import AuditFacts
from function.admission.review import Admission, naming_pod, request_context, response_for
from function.admission.wire import parse_review
from function.core.config import parse_config
from function.core.engine import Decision, Engine
from function.core.mutators.base import Action, MutatorDecision
from function.core.view import EMPTY_VIEW
from tests.support import pod_review


class View:
    """A cluster snapshot that is only itself."""

    available = True


def test_the_context_carries_every_field_of_the_request() -> None:
    view: Any = View()
    ctx = request_context(pod_review(dry_run=True), view)
    assert (ctx.uid, ctx.namespace, ctx.operation, ctx.dry_run) == ("u-1", "ml", "CREATE", True)
    assert (ctx.username, ctx.groups) == ("alice", ("devs", "ml"))
    assert ctx.cluster is view
    plain = request_context(pod_review(user={}))
    assert (plain.dry_run, plain.username, plain.groups, plain.cluster) == (False, "", (), EMPTY_VIEW)


@pytest.mark.parametrize(
    ("metadata", "namespace", "expected"),
    [
        ({"name": "p", "namespace": "other"}, "ml", "ml"),  # the request's namespace wins
        ({"name": "p", "namespace": "other"}, None, "other"),  # else the Pod's own
        ({"name": "p", "namespace": "other"}, "", "other"),
        ({"name": "p"}, None, ""),
        ({"name": "p", "namespace": 7}, None, ""),  # not a string: no namespace
        ("not metadata", None, ""),
    ],
)
def test_the_namespace_comes_from_the_request_then_the_pod(
    metadata: Any, namespace: str | None, expected: str
) -> None:
    assert request_context(pod_review(metadata, namespace=namespace)).namespace == expected


@pytest.mark.parametrize(
    ("message", "pod", "named"),
    [
        ("castslice: ratio bad", "pod ml/p", "castslice: pod ml/p: ratio bad"),
        ("ratio bad", "pod ml/p", "castslice: pod ml/p: ratio bad"),
        ("vgpu: castslice: nested", "pod ml/p", "castslice: pod ml/p: vgpu: castslice: nested"),
        ("castslice: a; castslice: b", "pod ml/p", "castslice: pod ml/p: a; castslice: b"),
        ("castslice: ratio bad", "", "castslice: ratio bad"),
    ],
)
def test_a_denial_names_the_pod_first(message: str, pod: str, named: str) -> None:
    assert naming_pod(message, pod) == named


DECISIONS = (
    MutatorDecision("gpu-slicing", Action.mutated, "r"),
    MutatorDecision("vgpu", Action.mutated, "r"),
)


def test_warnings_reach_the_reply_whatever_the_outcome() -> None:
    patch = ({"op": "add", "path": "/metadata/labels/a", "value": "b"},)
    mutated = Decision("mutated", True, "r", patch=patch, decisions=DECISIONS, warnings=("w1",))
    reply = response_for("u", mutated).as_dict()
    assert reply["warnings"] == ["w1"] and reply["patchType"] == "JSONPatch"
    assert reply["auditAnnotations"] == {"outcome": "mutated", "mutators": "gpu-slicing,vgpu"}
    denied = Decision("denied", False, "no", decisions=DECISIONS, warnings=("w2",), denial="castslice: no")
    reply = response_for("u", denied).as_dict()
    assert reply["warnings"] == ["w2"] and reply["status"]["message"] == "castslice: no"
    unchanged = Decision("unchanged", True, "r", warnings=("w3",))
    assert response_for("u", unchanged).as_dict()["warnings"] == ["w3"]


class Recorder:
    def __init__(self) -> None:
        self.decisions: list[Decision | None] = []

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        self.decisions.append(decision)


def test_a_failure_building_the_reply_is_an_internal_error_for_this_request(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(pod: Any, namespace: str) -> str:
        raise RuntimeError("describe failed")

    monkeypatch.setattr(admission, "describe_pod", broken)
    recorder = Recorder()
    seen: list[Any] = []

    def cluster() -> Any:
        seen.append(True)
        return EMPTY_VIEW

    subject = Admission(Engine(parse_config({})), recorder, cluster)
    with caplog.at_level(logging.ERROR, logger="castslice.admission"):
        answer = subject.review(pod_review({"name": "p", "annotations": {"castops.io/optimize": "true"}}))
    expected = Decision(
        "error",
        True,
        "internal error: RuntimeError: describe failed",
        warnings=("castslice: internal error: RuntimeError; Pod admitted unchanged",),
    )
    assert answer.decision == expected and recorder.decisions == [expected]
    assert answer.review("admission.k8s.io/v1")["response"] == {
        "uid": "u-1",
        "allowed": True,
        "warnings": ["castslice: internal error: RuntimeError; Pod admitted unchanged"],
        "auditAnnotations": {"outcome": "error"},
    }
    assert seen == [True]
    assert caplog.records[0].getMessage() == "internal error answering request uid u-1"


def test_under_deny_a_failure_building_the_reply_denies_and_names_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(pod: Any, namespace: str) -> str:
        raise RuntimeError("describe failed")

    monkeypatch.setattr(admission, "describe_pod", broken)
    answer = Admission(Engine(parse_config({"onInternalError": "deny"}))).review(pod_review())
    response: Any = answer.review("admission.k8s.io/v1")["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "castslice: internal error: RuntimeError (request uid u-1); Pod denied by onInternalError: deny"
    )


def test_a_request_that_is_not_a_pod_create_is_recorded_as_no_decision() -> None:
    recorder = Recorder()
    document = json.loads(pod_review().model_dump_json(exclude_none=True))
    document["request"]["operation"] = "UPDATE"
    answer = Admission(Engine(parse_config({})), recorder).review(parse_review(json.dumps(document).encode()))
    assert answer.decision is None and recorder.decisions == [None]
    assert answer.review("admission.k8s.io/v1")["response"] == {"uid": "u-1", "allowed": True}


def test_a_failing_recorder_never_fails_the_answer_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    class Failing:
        def record(self, facts: AuditFacts, decision: Decision | None) -> None:
            raise RuntimeError("sink exploded")

    with caplog.at_level(logging.ERROR, logger="castslice.admission"):
        answer = Admission(Engine(parse_config({})), Failing()).review(pod_review())
    assert answer.decision is not None and answer.decision.outcome == "unchanged"
    assert [r.getMessage() for r in caplog.records] == ["recording the decision failed (request uid u-1)"]
