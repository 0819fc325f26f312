"""The pure event builder: attributes, data, schema validity, and what must never be in an event."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import pytest
from cloudevents.conversion import to_binary, to_dict, to_structured
from jsonschema import Draft202012Validator

from function.admission.facts import audit_facts
from function.admission.review import Admission, request_context
from function.admission.wire import AdmissionReview, parse_review
from function.audit.consumer import decision_schema, event_problems
from function.audit.events import (
    DATASCHEMA_URI,
    MAX_PATCH_BYTES,
    NO_MUTATORS,
    REDACTED,
    build_event,
    parse_extension_overrides,
    redact_patch,
)
from function.contract import ENGINE_VERSION, EVENT_EXTENSIONS, EVENT_TYPES
from function.core.config import Config, parse_config
from function.core.engine import Decision, Engine
from function.core.mutators.base import Action, MutatorDecision
from tests.support import load_review, review_names

SECRET = "s3cr3t-do-not-leak"
MOMENT = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def decide(
    name: str, config: Config | None = None
) -> tuple[AdmissionReview, Decision | None, dict[str, Any]]:
    review = parse_review(json.dumps(load_review(name)).encode())
    answer, decision, _ = Admission(Engine(config or Config())).review(review)
    return review, decision, answer.review(review.apiVersion)


def event_for(name: str, config: Config | None = None, **overrides: Any) -> Any:
    config = config or Config()
    review, decision, _ = decide(name, config)
    assert decision is not None
    options: dict[str, Any] = {
        "event_id": "id-1",
        "decided_at": MOMENT,
        "source": "/castslice/test",
        "config_digest": config.digest(),
    }
    options.update(overrides)
    return build_event(audit_facts(review, decision), decision, **options)


def sent_patch(answer: dict[str, Any]) -> list[Any]:
    encoded = answer["response"].get("patch")
    return json.loads(base64.b64decode(encoded)) if encoded else []


def test_mutated_event_attributes() -> None:
    event = event_for("default-slice-inference")
    assert event["specversion"] == "1.0"
    assert event["type"] == "io.castops.castslice.admission.mutated.v1" == EVENT_TYPES["mutated"]
    assert event["source"] == "/castslice/test"
    assert event["id"] == "id-1"
    assert event["subject"] == "namespaces/default/pods/slice-inference"
    assert event["time"] == "2025-03-04T05:06:07.890123Z"
    assert event["datacontenttype"] == "application/json"
    assert event["dataschema"] == DATASCHEMA_URI
    assert (event["outcome"], event["podnamespace"], event["mutators"]) == (
        "mutated",
        "default",
        "gpu-slicing",
    )
    assert set(EVENT_EXTENSIONS) <= set(to_dict(event))


def test_mutated_event_data_carries_the_exact_patch_and_the_reasons() -> None:
    config = Config()
    review = parse_review(json.dumps(load_review("default-slice-inference")).encode())
    reply, decision, facts = Admission(Engine(config)).review(review)  # the facts it measured
    answer = reply.review(review.apiVersion)
    assert decision is not None and facts is not None
    data = build_event(
        facts,
        decision,
        event_id="e",
        decided_at=MOMENT,
        source="/s",
        config_digest=config.digest(),
    ).data
    assert data["patch"] == sent_patch(answer) and data["patch"]
    assert data["patchRedactions"] == 0 and data["patchOmitted"] is None
    assert data["reason"] == decision.reason == "mutated by gpu-slicing"
    assert data["mutators"] == [d.as_dict() for d in decision.decisions]
    assert data["request"] == {
        "uid": review.request.uid,
        "operation": "CREATE",
        "apiVersion": review.apiVersion,
    }
    assert data["user"]["username"] == review.request.userInfo.username
    assert data["user"]["groups"] == review.request.userInfo.groups
    assert data["pod"] == {
        "namespace": "default",
        "name": "slice-inference",
        "generateName": None,
        "owner": None,
    }
    assert data["configDigest"] == config.digest()
    assert data["engineVersion"] == ENGINE_VERSION
    assert data["decidedAt"] == "2025-03-04T05:06:07.890123Z"
    assert data["durationSeconds"] == pytest.approx(facts.duration_seconds, abs=1e-9)


def test_controller_made_pod_is_named_by_generate_name_and_owner() -> None:
    event = event_for("default-inference-fleet-64d4bcc9b8")
    assert event["subject"] == "namespaces/default/pods/inference-fleet-64d4bcc9b8-"
    pod = event.data["pod"]
    assert pod["name"] is None and pod["generateName"] == "inference-fleet-64d4bcc9b8-"
    assert pod["owner"]["kind"] == "ReplicaSet" and pod["owner"]["name"] == "inference-fleet-64d4bcc9b8"
    assert pod["owner"]["controller"] is True


@pytest.mark.parametrize(
    ("name", "outcome", "reason_words", "mutators"),
    [
        ("default-not-opted-in", "unchanged", "not opted in", NO_MUTATORS),
        ("default-no-gpu-opted-in", "unchanged", "no container requests nvidia.com/gpu", NO_MUTATORS),
        ("kube-system-coredns-like", "unchanged", "namespace kube-system is excluded", NO_MUTATORS),
        ("default-bad-ratio", "denied", "castops.io/slice-ratio", "gpu-slicing"),
    ],
)
def test_every_outcome_has_its_type_and_reason(
    name: str, outcome: str, reason_words: str, mutators: str
) -> None:
    event = event_for(name)
    assert event["type"] == EVENT_TYPES[outcome]
    assert event["outcome"] == event.data["outcome"] == outcome
    assert reason_words in event.data["reason"]
    assert event["mutators"] == mutators
    if outcome == "denied":
        assert event.data["allowed"] is False and reason_words in event.data["denial"]
    else:
        assert event.data["allowed"] is True and event.data["patch"] == []


def test_internal_error_has_its_own_type() -> None:
    review = parse_review(json.dumps(load_review("default-slice-inference")).encode())
    engine = Engine(Config())
    decision = engine.internal_error(RuntimeError("boom"), request_context(review))
    event = build_event(
        audit_facts(review, decision),
        decision,
        event_id="e",
        decided_at=MOMENT,
        source="/s",
        config_digest="sha256:" + "0" * 16,
    )
    assert event["type"] == "io.castops.castslice.admission.error.v1"
    assert event["outcome"] == "error" and event.data["reason"] == "internal error: RuntimeError: boom"
    assert event_problems(to_dict(event)) == []


@pytest.mark.parametrize("name", [n for n in review_names() if n != "default-dry-run-probe"])
@pytest.mark.parametrize("config_name", ["default", "warn"])
def test_every_recorded_review_gives_a_schema_valid_event(name: str, config_name: str) -> None:
    config = Config() if config_name == "default" else parse_config({"invalidAnnotations": "warn"})
    event = event_for(name, config)
    document = json.loads(to_structured(event)[1])
    Draft202012Validator(decision_schema()).validate(document["data"])
    assert event_problems(document) == []
    assert len(to_structured(event)[1]) < 16 * 1024, "events stay far below broker limits"


def test_the_secret_env_value_never_reaches_the_event() -> None:
    raw = json.dumps(load_review("default-init-and-sidecar"))
    assert SECRET in raw, "the recorded review holds the secret (in env and in last-applied-configuration)"
    event = event_for("default-init-and-sidecar")
    headers, binary_body = to_binary(event)
    _, structured = to_structured(event)
    for serialized in (json.dumps(headers), binary_body.decode(), structured.decode()):
        assert SECRET not in serialized
        assert "API_TOKEN" not in serialized
        assert "last-applied-configuration" not in serialized


def test_no_event_holds_any_env_value_or_annotation_value_of_its_pod() -> None:
    for name in review_names():
        pod = load_review(name)["request"]["object"]
        env_values = {
            env["value"]
            for kind in ("containers", "initContainers")
            for container in pod["spec"].get(kind, [])
            for env in container.get("env", [])
            if "value" in env
        }
        annotations = (pod["metadata"].get("annotations") or {}).get(
            "kubectl.kubernetes.io/last-applied-configuration"
        )
        serialized = to_structured(event_for(name))[1].decode()
        for value in env_values:
            assert value not in serialized, (name, value)
        if annotations:
            assert annotations not in serialized


def _replace_containers_decision(pod: dict[str, Any], reason: str = "test") -> tuple[Decision, list[Any]]:
    """A decision whose patch replaces the whole containers list (as a list diff can)."""
    containers = copy.deepcopy(pod["spec"]["containers"])
    containers[1]["env"].append({"name": "CUDA_TASK_PRIORITY", "value": "1"})
    containers[1]["args"] = ["--token", SECRET]
    patch = [
        {"op": "replace", "path": "/spec/containers", "value": containers},
        {"op": "add", "path": "/spec/containers/1/env/0/value", "value": SECRET},
    ]
    decision = Decision(
        "mutated",
        True,
        "mutated by test",
        patch=tuple(patch),
        decisions=(MutatorDecision("test", Action.mutated, reason),),
    )
    return decision, patch


def test_env_values_copied_into_a_patch_are_redacted_and_counted() -> None:
    document = load_review("default-init-and-sidecar")
    document["request"]["object"]["spec"]["containers"][1]["args"] = ["--token", SECRET]
    review = parse_review(json.dumps(document).encode())
    decision, _ = _replace_containers_decision(review.request.object)
    event = build_event(
        audit_facts(review, decision),
        decision,
        event_id="e",
        decided_at=MOMENT,
        source="/s",
        config_digest="sha256:" + "0" * 16,
    )
    serialized = to_structured(event)[1].decode()
    assert SECRET not in serialized
    data = event.data
    assert data["patchRedactions"] == 4  # the env value, both args entries, the direct env value op
    replaced = data["patch"][0]["value"][1]
    assert replaced["env"][0] == {"name": "API_TOKEN", "value": REDACTED}
    # A value CastSlice itself sets is not the user's: it stays, so the patch stays useful.
    assert replaced["env"][1] == {"name": "CUDA_TASK_PRIORITY", "value": "1"}
    assert replaced["args"] == [REDACTED, REDACTED]  # every args entry copied from the user's Pod
    assert data["patch"][1]["value"] == REDACTED
    assert event_problems(to_dict(event)) == []
    # The decision itself is untouched (the reply to the apiserver uses it).
    assert decision.patch[0]["value"][1]["env"][0]["value"] == SECRET


def test_redaction_leaves_ordinary_patches_exact() -> None:
    pod = load_review("default-init-and-sidecar")["request"]["object"]
    patch = [
        {"op": "add", "path": "/spec/nodeSelector", "value": {"scheduling.cast.ai/spot": "true"}},
        {"op": "add", "path": "/metadata/annotations/x", "value": SECRET},
    ]
    # Not at an env/command/args position: an annotation CastSlice would set is not redacted.
    assert redact_patch(patch, pod) == (patch, 0)


def test_a_huge_patch_is_left_out_with_the_reason() -> None:
    review = parse_review(json.dumps(load_review("default-slice-inference")).encode())
    big = [
        {"op": "add", "path": f"/metadata/labels/l{i}", "value": "v" * 60}
        for i in range(MAX_PATCH_BYTES // 60)
    ]
    decision = Decision("mutated", True, "mutated by test", patch=tuple(big))
    event = build_event(
        audit_facts(review, decision),
        decision,
        event_id="e",
        decided_at=MOMENT,
        source="/s",
        config_digest="sha256:" + "0" * 16,
    )
    assert event.data["patch"] == []
    assert "larger than" in event.data["patchOmitted"]
    assert len(to_structured(event)[1]) < 8 * 1024
    assert event_problems(to_dict(event)) == []


def test_extension_overrides_from_k_ce_overrides() -> None:
    overrides = parse_extension_overrides('{"extensions": {"cluster": "prod-eu", "tier": 2}}')
    assert overrides == {"cluster": "prod-eu", "tier": "2"}
    event = event_for("default-slice-inference", extensions=overrides)
    assert event["cluster"] == "prod-eu" and event["type"] == EVENT_TYPES["mutated"]
    assert event_problems(to_dict(event)) == [], "consumers accept the extra extensions"
    assert parse_extension_overrides("") == {} and parse_extension_overrides(None) == {}
    assert parse_extension_overrides('{"extensions": null}') == {}
    for bad in (
        "not json",
        "[]",
        '{"extensions": []}',
        '{"extensions": {"Bad-Name": "x"}}',
        '{"extensions": {"outcome": "x"}}',
        '{"extensions": {"type": "x"}}',
    ):
        with pytest.raises(ValueError, match="K_CE_OVERRIDES"):
            parse_extension_overrides(bad)


def test_the_schema_ships_in_the_package_and_names_the_dataschema_uri() -> None:
    text = resources.files("function").joinpath("schemas/decision-event.v1.json").read_text()
    schema = json.loads(text)
    Draft202012Validator.check_schema(schema)
    assert schema["$id"] == DATASCHEMA_URI
    assert DATASCHEMA_URI.endswith("/function/schemas/decision-event.v1.json")


def test_the_schema_rejects_a_pod_smuggled_into_the_data() -> None:
    data = event_for("default-slice-inference").data
    validator = Draft202012Validator(decision_schema())
    assert validator.is_valid(data)
    assert not validator.is_valid(
        {**data, "object": load_review("default-slice-inference")["request"]["object"]}
    )
    assert not validator.is_valid({**data, "pod": {**data["pod"], "spec": {}}})


def test_an_env_entry_appended_with_dash_is_redacted_too() -> None:
    from function.audit.events import REDACTED, redact_patch

    pod = {"spec": {"containers": [{"name": "c", "env": [{"name": "TOKEN", "value": "s3cr3t"}]}]}}
    patch = [{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "TOKEN", "value": "s3cr3t"}}]
    redacted, count = redact_patch(patch, pod)
    assert count == 1 and redacted[0]["value"] == {"name": "TOKEN", "value": REDACTED}


def test_a_huge_uid_username_and_groups_make_no_huge_event() -> None:
    """6 MB in through request.uid and userInfo.username must not be 6 MB out: each is cut at
    MAX_IDENTITY characters (and marked), groups past MAX_GROUPS are left out."""
    from function.audit.events import MAX_GROUPS, MAX_IDENTITY, build_wire_event

    document = load_review("default-slice-inference")
    request = document["request"]
    request["uid"] = "u" * 3_000_000
    request["userInfo"] = {"username": "n" * 3_000_000, "groups": ["g" * 1_000] * 5_000}
    review = parse_review(json.dumps(document).encode())
    decision = Decision("unchanged", True, "nothing to do")
    wire = build_wire_event(
        audit_facts(review, decision),
        decision,
        event_id="e",
        decided_at=MOMENT,
        source="/s",
        config_digest="sha256:" + "0" * 16,
    )
    assert len(wire.data) < 16 * 1024
    data = json.loads(wire.data)
    assert data["request"]["uid"] == "u" * (MAX_IDENTITY - 3) + "..."
    assert data["user"]["username"] == "n" * (MAX_IDENTITY - 3) + "..."
    assert data["user"]["groups"] == ["g" * (MAX_IDENTITY - 3) + "..."] * MAX_GROUPS
    assert (
        event_problems(
            to_dict(
                build_event(
                    audit_facts(review, decision),
                    decision,
                    event_id="e",
                    decided_at=MOMENT,
                    source="/s",
                    config_digest="sha256:" + "0" * 16,
                )
            )
        )
        == []
    )
