"""What an audit event says about the Pod: which strings of the patch are redacted and which are
not (the places a secret can sit, env values and command and args entries, found however the Pod
around them is shaped, and nothing else), and who the Pod is (name, namespace, owner). Written
from a mutmut run over function/audit/events.py, where the audit facts were then taken
(function/admission/facts.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from function.admission.facts import audit_facts, may_carry_secrets
from function.audit.events import (
    MAX_TEXT,
    REDACTED,
    build_event,
    event_data,
    format_time,
    mutators_attribute,
    parse_extension_overrides,
    redact_patch,
    subject_for,
)
from function.core.engine import Decision
from function.core.mutators.base import Action, MutatorDecision
from tests.support import pod_review

SECRET = "s3cret-token"


def pod_identity(review: Any) -> dict[str, Any]:
    """The event's ``pod``, from the facts Admission takes of the review."""
    return audit_facts(review).pod.as_dict()


def pod_with(*containers: Any, field: str = "containers") -> dict[str, Any]:
    return {"kind": "Pod", "spec": {field: list(containers)}}


def env_of(value: str) -> dict[str, Any]:
    return {"name": "c", "env": [{"name": "TOKEN", "value": value}]}


# -- where the user's Pod holds secrets ------------------------------------------------------------
@pytest.mark.parametrize(
    "pod",
    [
        # A malformed container or env entry before the real one does not end the search.
        pod_with("not a container", env_of(SECRET)),
        pod_with({"name": "c", "env": ["not an env var", {"name": "TOKEN", "value": SECRET}]}),
        pod_with({"name": "c", "env": [{"name": "FROM_SECRET", "valueFrom": {}}, {"value": SECRET}]}),
        pod_with({"name": "c", "command": ["run", SECRET]}),
        pod_with({"name": "c", "args": [7, SECRET]}),
        pod_with(env_of(SECRET), field="initContainers"),
        pod_with(env_of(SECRET), field="ephemeralContainers"),
    ],
)
def test_a_secret_anywhere_it_can_sit_in_the_pod_is_redacted_from_the_patch(pod: dict[str, Any]) -> None:
    patch = [{"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET}]
    assert redact_patch(patch, pod) == ([{**patch[0], "value": REDACTED}], 1)


@pytest.mark.parametrize("pod", ["not a pod", None, {"spec": "not a spec"}, {"spec": {"containers": "x"}}])
def test_a_pod_of_the_wrong_shape_holds_no_secret(pod: Any) -> None:
    patch = [{"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET}]
    assert redact_patch(patch, pod) == (patch, 0)


def test_without_secrets_the_patch_comes_back_as_copies_and_a_count_of_zero() -> None:
    patch = [{"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET}]
    redacted, count = redact_patch(patch, pod_with({"name": "c"}))
    assert (redacted, count) == (patch, 0)
    assert redacted[0] is not patch[0]


def test_redact_patch_without_secrets_returns_copies_and_no_count() -> None:
    patch = ({"op": "add", "path": "/spec/containers/0/env/0/value", "value": "v"},)
    redacted, count = redact_patch(patch, {"spec": {"containers": [{"name": "c"}]}})
    assert (redacted, count) == ([{"op": "add", "path": "/spec/containers/0/env/0/value", "value": "v"}], 0)
    assert redacted[0] is not patch[0]


# -- which places in a patch are secret places ----------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/env/0/value",  # the shortest: a patch's own paths are relative to the Pod, not a container
        "/env/-/value",
        "/command/0",
        "/args/-",
        "/spec/containers/3/env/12/value",
        "/spec/initContainers/0/args/2",
    ],
)
def test_a_secret_string_at_a_secret_place_is_redacted(path: str) -> None:
    patch = [{"op": "add", "path": path, "value": SECRET}]
    assert redact_patch(patch, pod_with(env_of(SECRET))) == ([{**patch[0], "value": REDACTED}], 1)
    assert may_carry_secrets(patch)


@pytest.mark.parametrize(
    "path",
    [
        "/metadata/labels/value",  # ends in "value", not an env var's
        "/spec/containers/0/ports/0/value",  # an index then "value", not under env
        "/metadata/finalizers/0",  # a list entry, not of command or args
        "/spec/containers/0/env/name/value",  # env, but no index before value
        "/spec/containers/0/command",  # the whole list as a string: not an entry
        "/value",
        "/0",
    ],
)
def test_the_same_string_elsewhere_is_kept(path: str) -> None:
    patch = [{"op": "add", "path": path, "value": SECRET}]
    assert redact_patch(patch, pod_with(env_of(SECRET))) == (patch, 0)


# -- when the Pod need not be searched at all --------------------------------------------------------
def test_may_redact_looks_past_operations_without_a_value() -> None:
    patch = [
        {"op": "remove", "path": "/metadata/labels/a"},
        {"op": "add", "path": "/spec/containers/0/env/0/value", "value": SECRET},
    ]
    assert may_carry_secrets(patch)


@pytest.mark.parametrize(
    "patch",
    [
        [],
        [{"op": "remove", "path": "/spec/containers/0/env/0"}],
        [{"op": "add", "path": "/metadata/labels/env", "value": "x"}],
        [{"op": "replace", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "1"}],
        [{"op": "add", "path": "/spec/priority", "value": 5}],
        [{"op": "add", "value": "no path at all"}],
        [{"op": "add", "path": 5, "value": "a path that is not a string"}],
    ],
)
def test_no_string_at_a_secret_place_means_nothing_to_redact(patch: list[Any]) -> None:
    assert not may_carry_secrets(patch)


@pytest.mark.parametrize(
    "value", [{"name": "TOKEN", "value": SECRET}, [SECRET], {"containers": []}, []], ids=repr
)
def test_an_object_or_array_value_may_hold_a_secret_place_inside(value: Any) -> None:
    assert may_carry_secrets([{"op": "add", "path": "/spec/containers/0/env/0", "value": value}])


# -- who the event is about -----------------------------------------------------------------------
RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-uid", "controller": True}


def test_the_pod_is_named_by_the_request_then_its_metadata() -> None:
    identity = pod_identity(
        pod_review({"name": "from-metadata", "generateName": "web-"}, name="from-request")
    )
    assert identity == {"namespace": "ml", "name": "from-request", "generateName": "web-", "owner": None}
    identity = pod_identity(pod_review({"name": "from-metadata", "namespace": "other"}, namespace=""))
    assert identity == {"namespace": "other", "name": "from-metadata", "generateName": None, "owner": None}
    identity = pod_identity(pod_review({"generateName": ""}, namespace=""))
    assert identity == {"namespace": "", "name": None, "generateName": None, "owner": None}


def test_the_owner_is_the_controller_reference_in_full() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "cm-uid"}
    identity = pod_identity(pod_review({"generateName": "web-1-", "ownerReferences": ["junk", other, RS]}))
    assert identity["owner"] == {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "web-1",
        "uid": "rs-uid",
        "controller": True,
    }


def test_without_a_controller_the_first_reference_stands_with_its_gaps_filled() -> None:
    first = {"kind": "Thing", "name": 7, "controller": "yes"}
    identity = pod_identity(pod_review({"ownerReferences": [first, {**RS, "controller": False}]}))
    assert identity["owner"] == {
        "apiVersion": "",
        "kind": "Thing",
        "name": "7",
        "uid": "",
        "controller": False,
    }


@pytest.mark.parametrize("references", [None, "web", {}, [], ["junk", 3]])
def test_no_usable_reference_means_no_owner(references: Any) -> None:
    assert pod_identity(pod_review({"ownerReferences": references}))["owner"] is None


@pytest.mark.parametrize("metadata", ["not metadata", None, []])
def test_metadata_of_the_wrong_shape_names_nothing(metadata: Any) -> None:
    assert pod_identity(pod_review(metadata)) == {
        "namespace": "ml",
        "name": None,
        "generateName": None,
        "owner": None,
    }


def test_a_name_that_is_not_a_non_empty_string_is_no_name() -> None:
    identity = pod_identity(pod_review({"name": 7, "generateName": ["web-"]}, namespace=""))
    assert identity == {"namespace": "", "name": None, "generateName": None, "owner": None}


# -- the event's own fields ------------------------------------------------------------------------
MOMENT = datetime(2026, 11, 24, 19, 0, 0, 123456, tzinfo=UTC)


def test_subject_names_the_pod_or_what_it_will_be_named_from() -> None:
    assert subject_for("ml", "web-1", "web-") == "namespaces/ml/pods/web-1"
    assert subject_for("ml", None, "web-") == "namespaces/ml/pods/web-"
    assert subject_for("ml", None, None) == "namespaces/ml/pods/"


def test_the_mutators_attribute_lists_the_acting_mutators() -> None:
    decisions = (
        MutatorDecision("gpu-slicing", Action.mutated, "r"),
        MutatorDecision("vgpu", Action.mutated, "r"),
        MutatorDecision("spot", Action.unchanged, "r"),
    )
    assert mutators_attribute(Decision("mutated", True, "r", decisions=decisions)) == "gpu-slicing,vgpu"


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (MOMENT, "2026-11-24T19:00:00.123456Z"),
        (
            datetime(2026, 11, 24, 21, 0, 0, tzinfo=timezone(timedelta(hours=2))),
            "2026-11-24T19:00:00.000000Z",
        ),
        (datetime(1000, 1, 1, tzinfo=UTC), "1000-01-01T00:00:00.000000Z"),
    ],
)
def test_times_are_utc_with_microseconds(moment: datetime, text: str) -> None:
    assert format_time(moment) == text


def data_for(decision: Decision, username: str = "alice", duration_seconds: float = 0.0) -> dict[str, Any]:
    review = pod_review(user={"username": username})
    facts = audit_facts(review, decision, duration_seconds)
    return event_data(facts, decision, config_digest="d", decided_at=MOMENT, engine_version="9.9.9")


def test_long_reasons_are_cut_to_max_text_and_say_so() -> None:
    exact = data_for(Decision("unchanged", True, "r" * MAX_TEXT))
    assert exact["reason"] == "r" * MAX_TEXT
    cut = data_for(Decision("unchanged", True, "r" * (MAX_TEXT + 1), denial="d" * (MAX_TEXT + 1)))
    assert cut["reason"] == "r" * (MAX_TEXT - 3) + "..."
    assert cut["denial"] == "d" * (MAX_TEXT - 3) + "..."


def test_the_data_keeps_an_empty_username_the_engine_version_and_nine_digits_of_duration() -> None:
    decision = Decision("unchanged", True, "r")
    data = data_for(decision, username="", duration_seconds=1.234567891234)
    assert data["user"]["username"] == ""
    assert data["engineVersion"] == "9.9.9"
    assert data["durationSeconds"] == 1.234567891
    event = build_event(
        audit_facts(pod_review({"name": "p"}), decision),
        decision,
        event_id="e",
        decided_at=MOMENT,
        source="/s",
        config_digest="d",
        engine_version="9.9.9",
    )
    assert event.get_data()["engineVersion"] == "9.9.9"  # type: ignore[index]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[]", "K_CE_OVERRIDES must be a JSON object"),
        ('{"extensions": []}', "K_CE_OVERRIDES.extensions must be an object"),
        ("{", "K_CE_OVERRIDES is not JSON"),
    ],
)
def test_bad_overrides_say_what_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(ValueError) as bad:
        parse_extension_overrides(raw)
    assert str(bad.value).startswith(message)


def test_overrides_skip_unset_extensions_and_default_to_none() -> None:
    assert parse_extension_overrides('{"extensions": {"a": null, "cluster": "east", "n": 2}}') == {
        "cluster": "east",
        "n": "2",
    }
    assert parse_extension_overrides('{"other": 1}') == {}
    assert parse_extension_overrides('{"extensions": null}') == {}


def test_a_reference_missing_its_fields_gets_empty_ones() -> None:
    identity = pod_identity(pod_review({"ownerReferences": [{"uid": "u1"}]}))
    assert identity["owner"] == {"apiVersion": "", "kind": "", "name": "", "uid": "u1", "controller": False}


# -- issue 25: copies out of the containers, and Secret names ------------------------------------
@pytest.mark.parametrize(
    "env",
    [
        {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-credentials", "key": "password"}}},
        {"name": "DB", "valueFrom": {"secretKeyRef": {"key": "password", "name": "db-credentials"}}},
    ],
)
def test_secret_names_and_keys_in_a_replaced_env_list_are_redacted(env: dict[str, Any]) -> None:
    """A whole-list replacement carries the Secret references the user wrote: which Secret, and
    which key in it, are redacted; the env var's own name is kept."""
    patch = [{"op": "replace", "path": "/spec/containers/0/env", "value": [env]}]
    redacted, count = redact_patch(patch, pod_with({"name": "c"}))
    assert count == 2
    assert redacted[0]["value"] == [
        {"name": "DB", "valueFrom": {"secretKeyRef": {"name": REDACTED, "key": REDACTED}}}
    ]
    env_from = [{"op": "add", "path": "/spec/containers/0/envFrom", "value": [{"secretRef": {"name": "s"}}]}]
    assert may_carry_secrets(env_from)
    assert redact_patch(env_from, pod_with({"name": "c"}))[0][0]["value"] == [
        {"secretRef": {"name": REDACTED}}
    ]


def test_strings_a_mutator_copied_are_redacted_wherever_they_landed() -> None:
    patch = [
        {"op": "add", "path": "/metadata/annotations/copied", "value": SECRET},
        {"op": "add", "path": "/metadata/labels/kept", "value": "web"},
    ]
    redacted, count = redact_patch(patch, pod_with(env_of(SECRET)), copied=frozenset({SECRET}))
    assert count == 1 and [op["value"] for op in redacted] == [REDACTED, "web"]
