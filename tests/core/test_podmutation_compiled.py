"""function/core/podmutation/compiled.py: what an invalid PodMutation is recorded as (name, group,
generation, problems, uid), where a bad patch is named, filterV2 matchers kept as typed, and CAST AI's
API form converted or refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from function.core.podmutation.compiled import (
    CompiledMutation,
    InvalidMutation,
    LabelRule,
    TextMatcher,
    TolerationRule,
    compile_object,
    compile_spec,
    from_api_form,
)
from function.core.podmutation.names import is_api_form, is_podmutation
from function.core.podmutation.spec import Matcher, parse_spec

OURS = "castops.io/v1alpha1"


def obj(spec: Any = None, api: str = OURS, kind: str = "PodMutation", **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": metadata, "spec": spec if spec is not None else {}}


# --- invalid objects, recorded whole -------------------------------------------------------------------


def test_a_nameless_object_is_recorded_under_its_group_generation_and_uid() -> None:
    assert compile_object(obj(generation=4, uid="u1")) == InvalidMutation(
        "", "castops.io", 4, ("metadata.name is required",), "u1"
    )


def test_an_object_of_another_kind_says_what_is_accepted() -> None:
    assert compile_object(
        obj(api="v1", kind="ConfigMap", name="m", generation=2, uid="u2")
    ) == InvalidMutation(
        "m",
        "v1",
        2,
        (
            "apiVersion 'v1' kind 'ConfigMap' is not a PodMutation "
            "(accepted: castops.io/v1alpha1, pod-mutations.cast.ai/v1)",
        ),
        "u2",
    )


def test_an_invalid_spec_keeps_every_problem() -> None:
    assert compile_object(obj({"bogus": 1, "labels": {"a": "b c"}}, name="m", generation=3, uid="u3")) == (
        InvalidMutation(
            "m",
            "castops.io",
            3,
            (
                "spec.labels: value of label 'a' 'b c' is not a label value "
                "(63 characters: A-Z a-z 0-9 - _ .)",
                "spec.bogus: unknown field",
            ),
            "u3",
        )
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"patches": [{"op": "remove", "path": "x"}]},
            "spec.patches: patches[0].path: 'x' does not start with '/' (a JSON pointer, RFC 6901)",
        ),
        (
            {"patchesV2": [{"operations": []}, {"operations": [{"op": "remove", "path": "x"}]}]},
            "spec.patchesV2[1].operations: operations[0].path: 'x' does not start with '/' "
            "(a JSON pointer, RFC 6901)",
        ),
        (
            {
                "distributionGroups": [
                    {
                        "name": "a",
                        "percentage": 10,
                        "configuration": {"patches": [{"op": "remove", "path": "x"}]},
                    }
                ]
            },
            "spec.distributionGroups[0].configuration.patches: patches[0].path: 'x' does not start with '/' "
            "(a JSON pointer, RFC 6901)",
        ),
    ],
)
def test_a_bad_patch_is_named_by_where_it_sits(spec: dict[str, Any], problem: str) -> None:
    compiled = compile_object(obj(spec, name="m", generation=1, uid="u"))
    assert compiled == InvalidMutation("m", "castops.io", 1, (problem,), "u")


def test_an_object_without_metadata_or_uid() -> None:
    nameless = {"apiVersion": OURS, "kind": "PodMutation", "metadata": "not a map"}
    assert compile_object(nameless) == InvalidMutation(
        "", "castops.io", 0, ("metadata.name is required",), "castops.io/"
    )
    offline = compile_object(obj(name="m"))
    assert isinstance(offline, CompiledMutation) and offline.uid == "castops.io/m" and offline.generation == 0
    no_api = compile_object({"kind": "PodMutation", "metadata": {"name": "m"}})
    assert isinstance(no_api, InvalidMutation) and (no_api.group, no_api.uid) == ("", "/m")


def test_is_podmutation_needs_a_mapping_of_the_kind_and_a_known_version() -> None:
    assert is_podmutation(obj(name="m"))
    assert is_podmutation(obj(api="pod-mutations.cast.ai/v1", name="m"))
    assert not is_podmutation(obj(api="castops.io/v2", name="m"))
    assert not is_podmutation(obj(kind="Pod"))
    assert not is_podmutation(["PodMutation"])


# --- compiled parts ------------------------------------------------------------------------------------


def test_compile_spec_defaults() -> None:
    compiled = compile_spec("m", parse_spec({})[0])
    assert (compiled.group, compiled.generation, compiled.uid, compiled.warnings) == ("castops.io", 0, "", ())


def test_group_patch_sequences_are_kept_in_order() -> None:
    add = {"op": "add", "path": "/metadata/labels/g", "value": "1"}
    spec = {
        "distributionGroups": [
            {
                "name": "a",
                "percentage": 10,
                "configuration": {"patches": [add], "patchesV2": [{"operations": [add, add]}]},
            }
        ]
    }
    compiled = compile_object(obj(spec, name="m"))
    assert isinstance(compiled, CompiledMutation)
    (group,) = compiled.groups
    assert [len(sequence) for sequence in group.sequences] == [1, 2]


def test_v1_exclude_labels_keep_their_operator() -> None:
    spec = {
        "filter": {
            "pod": {"excludeLabelsOperator": "or", "excludeLabelsFilter": [{"key": "a", "value": "1"}]}
        }
    }
    compiled = compile_object(obj(spec, name="m"))
    assert isinstance(compiled, CompiledMutation)
    assert compiled.exclude_labels == LabelRule("or", ((TextMatcher("a"), TextMatcher("1")),))


def test_v2_matchers_are_typed_and_keep_their_operators() -> None:
    spec = {
        "filterV2": {
            "pod": {
                "labels": {
                    "operator": "or",
                    "matchers": [
                        {
                            "keyMatcher": {"type": "regex", "value": "app.*"},
                            "valueMatcher": {"type": "exact", "value": "x"},
                        },
                        {"keyMatcher": {"type": "exact", "value": "tier"}},
                    ],
                },
                "tolerations": {
                    "operator": "or",
                    "matchers": [{"keyMatcher": {"type": "exact", "value": "gpu"}}],
                },
            }
        }
    }
    compiled = compile_object(obj(spec, name="m"))
    assert isinstance(compiled, CompiledMutation)
    labels = compiled.labels
    assert labels is not None and labels.operator == "or"
    (regex_key, exact_value), (plain_key, no_value) = labels.matchers
    assert (regex_key.value, regex_key.exact, regex_key.level("app-1"), regex_key.level("app.*")) == (
        "app.*",
        False,
        1,
        1,
    )
    assert exact_value == TextMatcher("x") and plain_key == TextMatcher("tier") and no_value is None
    assert compiled.tolerations == TolerationRule("or", ((TextMatcher("gpu"), None, None, None),))


def test_a_plain_value_is_no_regex() -> None:
    assert TextMatcher.plain_or_regex("web").regex is None
    assert TextMatcher.typed(Matcher(type="regex", value="web")).exact is False


# --- CAST AI's API form --------------------------------------------------------------------------------


def test_the_api_form_is_recognised_only_with_a_name_and_an_object_filter() -> None:
    assert is_api_form({"name": "m", "objectFilter": {}})
    assert not is_api_form({"objectFilter": {}})
    assert not is_api_form({"name": "m"})
    assert not is_api_form({"apiVersion": OURS, "name": "m", "objectFilter": {}})
    assert not is_api_form(["name", "objectFilter"])


def test_the_api_form_converts_kinds_labels_and_a_plain_node_selector() -> None:
    document = {
        "name": "m",
        "objectFilter": {"kinds": ["Deployment"], "labels": {"app": "web"}},
        "nodeSelector": {"zone": "a"},
    }
    assert from_api_form(document)["spec"] == {
        "filter": {
            "workload": {"kinds": ["Deployment"]},
            "pod": {"labelsOperator": "and", "labelsFilter": [{"key": "app", "value": "web"}]},
        },
        "nodeSelector": {"add": {"zone": "a"}},
    }


@pytest.mark.parametrize(
    "selector", [{"add": {"zone": "a"}}, {"remove": ["zone"]}, {"add": {}, "remove": []}]
)
def test_a_node_selector_change_in_the_api_form_is_kept_as_written(selector: dict[str, Any]) -> None:
    assert (
        from_api_form({"name": "m", "objectFilter": {}, "nodeSelector": selector})["spec"]["nodeSelector"]
        == selector
    )


def test_empty_labels_in_the_api_form_filter_nothing() -> None:
    assert from_api_form({"name": "m", "objectFilter": {"labels": {}}})["spec"] == {}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"name": "m", "objectFilter": ["x"]}, "objectFilter: an object is expected"),
        (
            {"name": "m", "objectFilter": {"zones": [], "images": []}},
            "objectFilter: unknown field(s) images, zones (accepted: names, namespaces, kinds, labels)",
        ),
        (
            {"name": "m", "objectFilter": {}, "spotType": "MOSTLY_SPOT"},
            "spotType: 'MOSTLY_SPOT' is not one of UNSPECIFIED_SPOT_TYPE, OPTIONAL_SPOT, USE_ONLY_SPOT, "
            "ONLY_SPOT, PREFERRED_SPOT",
        ),
    ],
)
def test_the_api_form_refuses_by_name(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        from_api_form(document)
    assert str(raised.value) == message
