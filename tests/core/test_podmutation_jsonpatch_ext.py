"""function/core/podmutation/jsonpatch_ext.py: every message a PodMutation author reads when an
operation is refused, word for word; escapes; and the extended paths at their edges."""

from __future__ import annotations

from typing import Any

import pytest

from function.core.podmutation.jsonpatch_ext import (
    CompiledPath,
    PathError,
    Segment,
    apply_sequence,
    compile_operation,
    compile_operations,
    parse_path,
)

WHERE = "spec.patches[0]"


def refused(raw: Any) -> str:
    with pytest.raises(ValueError) as raised:
        compile_operation(raw, WHERE)
    return str(raised.value)


# --- paths ------------------------------------------------------------------------------------------


def test_escapes_are_undone_slash_first() -> None:
    assert parse_path("/a~1b/c~0d/~01") == CompiledPath(
        "/a~1b/c~0d/~01", (Segment("key", "a/b"), Segment("key", "c~d"), Segment("key", "~1"))
    )


def test_the_empty_path_is_the_whole_document() -> None:
    assert parse_path("") == CompiledPath("", ())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (5, "5 is not a string"),
        ("a/b", "'a/b' does not start with '/' (a JSON pointer, RFC 6901)"),
        ("/a~2", "'a~2': '~' must be followed by 0 or 1 (RFC 6901 escapes ~0 and ~1)"),
        ("/spec/[key]", "'/spec/[key]': segment '[key]' is not [field=value]"),
    ],
)
def test_path_errors_name_the_path(raw: Any, message: str) -> None:
    with pytest.raises(PathError) as raised:
        parse_path(raw)
    assert str(raised.value) == message


# --- operations, refused word for word -----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"op": "add", "path": "/a", "value": 1, "val": 2},
            f"{WHERE}: unknown field(s) val (accepted: op, path, from, value)",
        ),
        (
            {"op": "add", "path": "/a", "value": 1, "x": 0, "val": 2},
            f"{WHERE}: unknown field(s) val, x (accepted: op, path, from, value)",
        ),
        (
            {"op": "merge", "path": "/a"},
            f"{WHERE}.op: 'merge' is not an operation (accepted: add, remove, replace, move, copy, test)",
        ),
        ({"op": "remove"}, f"{WHERE}.path is required"),
        (
            {"op": "remove", "path": "a"},
            f"{WHERE}.path: 'a' does not start with '/' (a JSON pointer, RFC 6901)",
        ),
        ({"op": "copy", "path": "/a"}, f"{WHERE}.from is required for copy"),
        (
            {"op": "copy", "path": "/a", "from": "b"},
            f"{WHERE}.from: 'b' does not start with '/' (a JSON pointer, RFC 6901)",
        ),
        ({"op": "move", "path": "/a/b", "from": "/a"}, f"{WHERE}: cannot move '/a' into itself ('/a/b')"),
        ({"op": "move", "path": "/a", "from": "/a"}, f"{WHERE}: cannot move '/a' into itself ('/a')"),
        ({"op": "remove", "path": "/a", "from": "/b"}, f"{WHERE}.from is only for move and copy"),
        ({"op": "add", "path": "/a"}, f"{WHERE}.value is required for add"),
        ({"op": "remove", "path": "/a", "value": 1}, f"{WHERE}.value is not used by remove"),
        (
            {"op": "add", "path": "/spec/tolerations/[key=a]", "value": {}},
            f"{WHERE}.path: add ends in a key, an index or '-', not [field=value] or *",
        ),
        (
            {"op": "add", "path": "/spec/tolerations/*", "value": {}},
            f"{WHERE}.path: add ends in a key, an index or '-', not [field=value] or *",
        ),
        ({"op": "remove", "path": ""}, f"{WHERE}.path: remove on the whole Pod ('') is not allowed"),
    ],
)
def test_refused_operations_say_why(raw: dict[str, Any], message: str) -> None:
    assert refused(raw) == message


def test_a_non_object_operation_is_quoted_at_most_200_characters() -> None:
    message = refused(["x" * 500])
    assert message.startswith(f"{WHERE}: an operation is an object with op and path, got ['xxx")
    assert len(message) == 200


def test_a_non_list_of_operations_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        compile_operations({"op": "add"}, "spec.patches")
    assert str(raised.value) == "spec.patches: a list of JSON Patch operations is expected"


@pytest.mark.parametrize(
    "raw",
    [
        {"op": "copy", "path": "/a/b", "from": "/a"},
        {"op": "move", "path": "/a/bc", "from": "/a/b"},
        {"op": "test", "path": "", "value": {}},
        {"op": "add", "path": "/spec/containers/*/env", "value": []},
    ],
)
def test_operations_that_compile(raw: dict[str, Any]) -> None:
    assert compile_operation(raw, WHERE).path.raw == raw["path"]


def test_a_copy_keeps_its_source() -> None:
    operation = compile_operation({"op": "copy", "path": "/b", "from": "/a"}, WHERE)
    assert operation.source == parse_path("/a")
    assert operation.describe() == "copy /a -> /b"


def test_values_are_frozen_with_sorted_keys() -> None:
    one = compile_operation({"op": "add", "path": "/a", "value": {"b": 1, "a": 2}}, WHERE)
    other = compile_operation({"op": "add", "path": "/a", "value": {"a": 2, "b": 1}}, WHERE)
    assert one == other and one.value_json == '{"a": 2, "b": 1}'


# --- applying extended paths at their edges --------------------------------------------------------


def apply(document: Any, *operations: dict[str, Any]) -> Any:
    return apply_sequence(document, compile_operations(list(operations), "patches"))


def test_a_star_over_a_map_reaches_keys_that_need_escaping() -> None:
    document = {"labels": {"a/b": "1", "c~d": "2"}}
    outcome = apply(document, {"op": "replace", "path": "/labels/*", "value": "x"})
    assert outcome.document == {"labels": {"a/b": "x", "c~d": "x"}}
    assert [op["path"] for op in outcome.applied] == ["/labels/a~1b", "/labels/c~0d"]


def test_an_index_after_a_star_selects_only_what_exists() -> None:
    document = {"containers": [{"args": ["a", "b"]}, {"args": ["c"]}, {"args": {"0": "d"}}]}
    outcome = apply(document, {"op": "replace", "path": "/containers/*/args/1", "value": "z"})
    assert outcome.error is None
    assert outcome.document == {"containers": [{"args": ["a", "z"]}, {"args": ["c"]}, {"args": {"0": "d"}}]}
    outcome = apply(document, {"op": "replace", "path": "/containers/*/args/0", "value": "y"})
    assert [op["path"] for op in outcome.applied] == [
        "/containers/0/args/0",
        "/containers/1/args/0",
        "/containers/2/args/0",
    ]


def test_a_numeric_key_under_a_star_on_maps_is_a_key_not_an_index() -> None:
    outcome = apply({"m": {"a": {"x": 1}}}, {"op": "remove", "path": "/m/*/0"})
    assert outcome.error is None
    assert outcome.skipped == ["[0] remove /m/*/0: selects nothing"]


def test_select_compares_scalars_by_json_and_never_matches_a_map() -> None:
    document = {"ports": [{"port": 80}, {"port": {"x": 1}}, {"port": "80"}, {"port": True}]}
    outcome = apply(document, {"op": "remove", "path": "/ports/[port=80]"})
    assert outcome.document == {"ports": [{"port": {"x": 1}}, {"port": True}]}
    outcome = apply(document, {"op": "remove", "path": "/ports/[port=true]"})
    assert outcome.document == {"ports": [{"port": 80}, {"port": {"x": 1}}, {"port": "80"}]}


def test_add_under_a_star_creates_the_key_in_every_element() -> None:
    document = {"containers": [{"name": "a"}, {"name": "b"}]}
    outcome = apply(document, {"op": "add", "path": "/containers/*/tty", "value": True})
    assert outcome.document == {"containers": [{"name": "a", "tty": True}, {"name": "b", "tty": True}]}


def test_failed_tests_say_what_was_found_cut_to_60_characters() -> None:
    long = "v" * 100
    outcome = apply({"a": long}, {"op": "test", "path": "/a", "value": "w" * 100})
    assert outcome.document is None
    assert outcome.error == f'[0] test /a: "{"v" * 59} is not "{"w" * 59}'
    outcome = apply({"a": [1]}, {"op": "test", "path": "/a/-", "value": 1})
    assert outcome.error == "[0] test /a/-: '-' (past the end of a list) names no value to test"
