"""function/yamldoc.py, answer by answer: the indentation guessed from documents with comments,
block scalars and list items; JSON documents written back as JSON; long lines never folded; and
which documents of a stream are empty."""

from __future__ import annotations

import pytest

from function.yamldoc import apply_operations, guess_indent, load_documents


@pytest.mark.parametrize(
    ("text", "indent"),
    [
        ("a:\n# a comment at another indent\n    b: 1\n", (4, 4, 0)),
        ("a:\n\n# c\n\n    b:\n        c: 1\n", (4, 4, 0)),
        ("l:\n  - s: |\n      deep:\n        x\n    t: 1\n  - u: 2\n", (2, 4, 2)),
        ("l:\n  - a: 1\n    b:\n      c: 2\n", (2, 4, 2)),
        ("a:\n  l:\n  - x\n  m:\n    n: 1\n", (2, 2, 0)),
        ("a:\n  s: >-\n        folded\n  t:\n    u: 1\n", (2, 2, 0)),
        ("a:\n  s: |\n          x:\n            y: 1\n  t:\n    u: 1\n", (2, 2, 0)),
        ("l:\n    -   a: 1\n        b:\n            c: 1\n", (4, 6, 4)),
    ],
)
def test_indentation_is_what_most_of_the_document_writes(text: str, indent: tuple[int, int, int]) -> None:
    assert guess_indent(text) == indent


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
