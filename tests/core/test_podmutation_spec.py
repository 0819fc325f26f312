"""function/core/podmutation/spec.py: what a PodMutation author is told, word for word, and the limits
(qualified-name prefix, regex length) at their edges."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core.podmutation.spec import InvalidSpec, Toleration, check_qualified_name, parse_spec


def problems(raw: Any) -> str:
    with pytest.raises(InvalidSpec) as raised:
        parse_spec(raw)
    return str(raised.value)


@pytest.mark.parametrize(
    "key",
    ["a" * 253 + "/x", "a" * 200 + "/" + "x" * 60, "example.com/" + "x" * 63, "x" * 63],
)
def test_qualified_names_up_to_their_limits_are_accepted(key: str) -> None:
    assert check_qualified_name(key, "key") == key


@pytest.mark.parametrize("key", ["a" * 254 + "/x", "x" * 64, "Example.com/x", "/x"])
def test_qualified_names_past_their_limits_are_refused(key: str) -> None:
    with pytest.raises(ValueError) as raised:
        check_qualified_name(key, "key")
    assert str(raised.value) == f"key {key!r} is not a Kubernetes qualified name (e.g. 'example.com/name')"


def test_a_bad_label_value_is_named_with_what_is_accepted() -> None:
    assert problems({"labels": {"a": "b c"}}) == (
        "spec.labels: value of label 'a' 'b c' is not a label value (63 characters: A-Z a-z 0-9 - _ .)"
    )


def test_filter_patterns_up_to_256_characters() -> None:
    parse_spec({"filter": {"workload": {"names": ["x" * 256]}}})
    assert problems({"filter": {"workload": {"names": ["y" * 257]}}}) == (
        f"spec.filter.workload.names: {'y' * 40!r}... is longer than 256 characters"
    )


@pytest.mark.parametrize(
    ("operation", "field"),
    [
        ({"op": "move", "from": "/metadata/name", "path": "/x"}, "from"),
        ({"op": "copy", "from": "/metadata/uid", "path": "/metadata/labels/uid"}, "from"),
        ({"op": "remove", "path": "/metadata/name/x"}, "path"),
        ({"op": "replace", "path": "/kind", "value": "x"}, "path"),
    ],
)
def test_patches_never_touch_the_pods_identity(operation: dict[str, Any], field: str) -> None:
    value = operation[field]
    assert problems({"patches": [operation]}) == (
        f"spec.patches: patches[0].{field}: {value!r} is the Pod's identity, which the apiserver keeps"
    )


def test_a_path_that_only_starts_like_an_identity_field_is_allowed() -> None:
    parse_spec({"patches": [{"op": "add", "path": "/metadata/namespaceHint", "value": "x"}]})


def test_a_toleration_keeps_its_seconds_for_no_execute() -> None:
    toleration = Toleration(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=30)
    assert toleration.as_pod_field() == {
        "key": "k",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 30,
    }


def test_every_problem_is_joined_in_one_message() -> None:
    error = InvalidSpec(["spec.a: x", "spec.b: y"])
    assert str(error) == "spec.a: x; spec.b: y" and error.problems == ["spec.a: x", "spec.b: y"]


def test_our_objects_refuse_unknown_fields_by_default() -> None:
    assert problems({"bogus": 1}) == "spec.bogus: unknown field"


def test_an_absent_spec_is_the_empty_one_and_a_non_object_is_named() -> None:
    spec, warnings = parse_spec(None)
    assert spec == parse_spec({})[0] and warnings == []
    assert problems([1]) == "spec: an object is expected, got list"


def test_lenient_parsing_drops_unknown_fields_from_a_copy() -> None:
    raw = {"labels": {"a": "1"}, "filter": {"workload": {"bogus": 1}}, "extra": {"deep": True}}
    before = copy.deepcopy(raw)
    spec, warnings = parse_spec(raw, lenient=True)
    assert raw == before
    assert spec.labels == {"a": "1"}
    assert sorted(warnings) == [
        "spec.extra: unknown field ignored",
        "spec.filter.workload.bogus: unknown field ignored",
    ]


def test_accepted_but_inert_fields_warn() -> None:
    _, warnings = parse_spec({"podEviction": {"enabled": True}, "restartPolicy": "immediate"})
    assert warnings == [
        "spec.restartPolicy: immediate is accepted, but CastSlice restarts nothing",
        "spec.podEviction.enabled is accepted, but CastSlice evicts nothing",
    ]
