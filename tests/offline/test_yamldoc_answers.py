"""function/offline/yamldoc.py, answer by answer: JSON documents written back as JSON, long lines never
folded, empty documents, and operations in the document's own style. (The guessed indentation is
tested in tests/test_yamldoc.py.)"""

from __future__ import annotations

import pytest

from function.offline.yamldoc import apply_operations, load_documents


def test_a_json_object_after_a_blank_line_is_written_back_as_json() -> None:
    [chunk] = load_documents('\n{"a": {"b": 1}}\n', "t")
    apply_operations(chunk.tree, [("add", ["a", "c"], "é")])
    assert chunk.dump() == '{\n  "a": {\n    "b": 1,\n    "c": "é"\n  }\n}\n'


def test_a_json_list_is_written_back_as_json() -> None:
    [chunk] = load_documents("[1, 2]\n", "t")
    apply_operations(chunk.tree, [("add", [2], 3)])
    assert chunk.dump() == "[\n  1,\n  2,\n  3\n]\n"


def test_a_changed_yaml_document_keeps_its_indentation() -> None:
    [chunk] = load_documents("a:\n    b: 1\n    l:\n      - x\n", "t")
    apply_operations(chunk.tree, [("add", ["a", "c"], "2")])
    assert chunk.dump() == 'a:\n    b: 1\n    l:\n      - x\n    c: "2"\n'


def test_a_long_line_is_never_folded() -> None:
    long = "v" * 200
    [chunk] = load_documents(f"a: {long}\n", "t")
    apply_operations(chunk.tree, [("add", ["b"], "2")])
    assert chunk.dump() == f'a: {long}\nb: "2"\n'


def test_a_document_without_a_final_newline_gets_one() -> None:
    [chunk] = load_documents("a: 1", "t")
    apply_operations(chunk.tree, [("add", ["b"], "2")])
    assert chunk.dump() == 'a: 1\nb: "2"\n'


def test_empty_documents_are_marked_empty() -> None:
    chunks = load_documents("---\n---\na: 1\n---\n# only a comment\n", "t")
    assert [(chunk.prefix, chunk.empty) for chunk in chunks] == [
        ("---\n", True),
        ("---\n", False),
        ("---\n", True),
    ]


def edited(text: str, *operations: tuple[str, list[str | int], object]) -> str:
    [chunk] = load_documents(text, "t")
    apply_operations(chunk.tree, list(operations))
    return chunk.dump()


def test_list_items_are_replaced_in_their_quote_style_and_removed() -> None:
    text = "l:\n- a\n- 'b'\n- c\n"
    assert edited(
        text, ("replace", ["l", 1], "x"), ("remove", ["l", 2], None), ("replace", ["l", 0], "yes")
    ) == ("l:\n- \"yes\"\n- 'x'\n")


def test_map_values_are_replaced_in_their_quote_style_and_removed() -> None:
    text = "m:\n  a: 'q'\n  b: 1\n  c: 2\n"
    assert edited(
        text, ("replace", ["m", "a"], "new"), ("remove", ["m", "c"], None), ("replace", ["m", "b"], "true")
    ) == ("m:\n  a: 'new'\n  b: \"true\"\n")


def test_a_new_map_is_flow_style_only_beside_flow_style_maps() -> None:
    flow = "r:\n  limits: {cpu: 1}\n"
    assert (
        edited(flow, ("add", ["r", "requests"], {"cpu": "1"}))
        == 'r:\n  limits: {cpu: 1}\n  requests: {cpu: "1"}\n'
    )
    mixed = "r:\n  limits: {cpu: 1}\n  other:\n    x: 1\n"
    assert edited(mixed, ("add", ["r", "requests"], {"cpu": "1"})) == (
        'r:\n  limits: {cpu: 1}\n  other:\n    x: 1\n  requests:\n    cpu: "1"\n'
    )


def test_an_added_list_quotes_what_kubectl_would_misread() -> None:
    assert (
        edited("a: 1\n", ("add", ["l"], ["yes", "x", {"k": "no"}])) == 'a: 1\nl:\n- "yes"\n- x\n- k: "no"\n'
    )


@pytest.mark.parametrize(
    ("operation", "message"),
    [
        (("add", [], 1), "an operation on the whole document"),
        (("add", ["a", "b"], 1), "add under a scalar"),
        (("replace", ["a", "b"], 1), "replace under a scalar"),
    ],
)
def test_impossible_operations_say_why(operation: tuple[str, list[str | int], object], message: str) -> None:
    [chunk] = load_documents("a: 1\n", "t")
    with pytest.raises(ValueError) as raised:
        apply_operations(chunk.tree, [operation])
    assert str(raised.value) == message


def test_a_missing_parent_names_the_missing_key() -> None:
    [chunk] = load_documents("a: 1\n", "t")
    with pytest.raises(KeyError) as raised:
        apply_operations(chunk.tree, [("remove", ["x", "y"], None)])
    assert raised.value.args == ("x",)
    with pytest.raises(KeyError) as raised:
        apply_operations(chunk.tree, [("remove", ["a", "b", "c"], None)])
    assert raised.value.args == ("b",)


def test_a_value_pyyaml_cannot_read_is_double_quoted() -> None:
    assert edited("a: 1\n", ("add", ["b"], "a: b: c")) == 'a: 1\nb: "a: b: c"\n'
