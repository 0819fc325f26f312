"""The audit facts Admission takes of a request once (function/admission/facts.py): what the
recorder is handed instead of the review, and the only strings of the Pod they carry."""

from __future__ import annotations

import json
import pickle
from typing import Any

from function.admission.facts import AuditFacts, OwnerFacts, PodFacts, audit_facts
from function.admission.review import Admission
from function.admission.wire import parse_review
from function.core.config import parse_config
from function.core.engine import Decision, Engine
from tests.support import load_review, pod_review

SECRET = "s3cr3t-value"


class Recorder:
    def __init__(self) -> None:
        self.got: list[tuple[Any, Decision | None]] = []

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        self.got.append((facts, decision))


def test_the_recorder_is_handed_the_facts_of_the_request_not_the_review() -> None:
    recorder = Recorder()
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}
    review = pod_review({"generateName": "web-", "ownerReferences": [owner]}, dry_run=True)
    answer = Admission(Engine(parse_config({})), recorder).review(review)
    [(facts, decision)] = recorder.got
    assert decision is answer.decision and facts is answer.facts
    assert facts == AuditFacts(
        uid="u-1",
        operation="CREATE",
        api_version="admission.k8s.io/v1",
        username="alice",
        groups=("devs", "ml"),
        dry_run=True,
        pod=PodFacts("ml", None, "web-", OwnerFacts("apps/v1", "ReplicaSet", "web", "rs", True)),
    )


def secret_review() -> Any:
    document = load_review("default-slice-inference")
    container = document["request"]["object"]["spec"]["containers"][0]
    container["env"] = [{"name": "TOKEN", "value": SECRET}, {"name": "OTHER", "value": "not-in-patch"}]
    container["args"] = ["--token", SECRET]
    return parse_review(json.dumps(document).encode())


def test_the_facts_carry_only_the_pods_secret_strings_the_patch_carries() -> None:
    review = secret_review()
    carrying = Decision(
        "mutated",
        True,
        "r",
        patch=(
            {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "X", "value": SECRET}},
            {"op": "add", "path": "/metadata/labels/x", "value": "--token"},
        ),
    )
    assert audit_facts(review, carrying).secrets == {SECRET, "--token"}
    # A patch that cannot put a string where secrets live needs no search of the Pod.
    plain = Decision(
        "mutated", True, "r", patch=({"op": "add", "path": "/metadata/labels/x", "value": SECRET},)
    )
    assert audit_facts(review, plain).secrets == frozenset()
    assert audit_facts(review, None).secrets == frozenset()


def test_the_facts_cross_a_process_boundary_whole() -> None:
    # The large-review process sends them back to the worker (function/serve/offload.py).
    answer = Admission(Engine(parse_config({}))).review(secret_review())
    assert answer.facts is not None
    assert pickle.loads(pickle.dumps(answer.facts)) == answer.facts
