"""The round trip of castslice mutate: documents cut exactly, untouched ones byte for byte, changed
ones keep comments, order, flow style and quoting."""

from __future__ import annotations

import io
import json
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from function import cli
from function.offline import mutate
from function.offline.yamldoc import (
    DateText,
    DocumentError,
    apply_operations,
    guess_indent,
    load_documents,
    split_documents,
    to_plain,
)
from tests.support import ROOT

GOLDEN = ROOT / "tests" / "golden"

LINES = st.sampled_from(
    [
        "---",
        "--- # doc",
        "---x",
        "a: 1",
        "  b: '---'",
        "- c",
        "# ---",
        "",
        "...",
        "key: |",
        "  --- not",
        "  x",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(LINES, max_size=12), st.booleans())
def test_documents_concatenate_back_to_the_text(lines: list[str], final_newline: bool) -> None:
    text = "\n".join(lines) + ("\n" if final_newline else "")
    pieces = split_documents(text)
    assert "".join(prefix + body for prefix, body in pieces) == text
    for prefix, _ in pieces[1:]:
        assert prefix.startswith("---")
    for _, body in pieces:
        assert not any(line == "---" or line.startswith("--- ") for line in body.splitlines())


def test_a_separator_with_content_stays_in_the_body() -> None:
    assert split_documents("a: 1\n--- {b: 2}\n") == [("", "a: 1\n"), ("", "--- {b: 2}\n")]


def test_invalid_yaml_names_the_document() -> None:
    with pytest.raises(DocumentError, match=r"x\.yaml: document 2 is not valid YAML"):
        load_documents("a: 1\n---\nb: [1\n", "x.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a:\n  b:\n    c: 1\nl:\n- x\n", (2, 2, 0)),
        ("a:\n    b: 1\nl:\n    - x\n", (4, 6, 4)),
        ("a:\n  l:\n    - x\n    - y\n  m:\n    n: 1\n", (2, 4, 2)),
        # a block scalar's content says nothing about the document's indentation
        ("a:\n  s: |\n      deep:\n        deeper\n  l:\n  - x\n", (2, 2, 0)),
        ("just: scalar\n", (2, 2, 0)),
        ("a:\n# a comment at another indent\n    b: 1\n", (4, 4, 0)),
        ("a:\n\n# c\n\n    b:\n        c: 1\n", (4, 4, 0)),
        ("l:\n  - s: |\n      deep:\n        x\n    t: 1\n  - u: 2\n", (2, 4, 2)),
        ("l:\n  - a: 1\n    b:\n      c: 2\n", (2, 4, 2)),
        ("a:\n  l:\n  - x\n  m:\n    n: 1\n", (2, 2, 0)),
        ("a:\n  s: >-\n        folded\n  t:\n    u: 1\n", (2, 2, 0)),
        ("a:\n  s: |\n          x:\n            y: 1\n  t:\n    u: 1\n", (2, 2, 0)),
        ("l:\n    -   a: 1\n        b:\n            c: 1\n", (4, 6, 4)),
        # a list item's next key after its block scalar counts again
        ("l:\n  - s: |\n      x\n    t:\n        u: 1\n", (4, 4, 2)),
        # a block scalar's content never votes, however many keys it seems to hold
        (
            "a:\n  s: |\n      k1:\n          v: 1\n      k2:\n          v: 1\n"
            "      k3:\n          v: 1\n  t: 1\n",
            (2, 2, 0),
        ),
        ("l:\n  - a:\n      b: 1\n  - c:\n      d: 1\n", (2, 4, 2)),
        # the majority wins even when the minority comes first
        ("b:\n  - y\na:\n- x\nc:\n- z\n", (2, 2, 0)),
        ("a:\n    b: 1\nc:\n  d: 1\ne:\n  f: 1\n", (2, 2, 0)),
        # an empty key followed by a sibling says nothing about indentation
        ("a:\nb:\n  c: 1\n", (2, 2, 0)),
    ],
)
def test_indentation_is_guessed_from_the_document(text: str, expected: tuple[int, int, int]) -> None:
    mapping, sequence, offset = guess_indent(text)
    assert (mapping, sequence, offset) == expected
    assert sequence == max(offset + 2, mapping)


def test_to_plain_gives_json_values() -> None:
    [chunk] = load_documents('a: "1"\nb: 1\nc: 1.5\nd: true\ne: 2024-01-01\nf: [x, {g: null}]\n', "t")
    plain = to_plain(chunk.tree)
    assert plain == {"a": "1", "b": 1, "c": 1.5, "d": True, "e": "2024-01-01", "f": ["x", {"g": None}]}
    assert json.loads(json.dumps(plain)) == plain
    assert type(plain["a"]) is str and type(plain["b"]) is int and type(plain["d"]) is bool
    assert isinstance(chunk.tree["e"], DateText)


def test_dates_keep_their_text_in_json_and_in_a_changed_document() -> None:
    [chunk] = load_documents("a: 2024-01-01T10:00:00Z  # when\nb: 2024-01-01 10:00:00.5 +02:00\n", "t")
    assert to_plain(chunk.tree) == {"a": "2024-01-01T10:00:00Z", "b": "2024-01-01 10:00:00.5 +02:00"}
    apply_operations(chunk.tree, [("add", ["c"], "x")])
    assert chunk.dump() == "a: 2024-01-01T10:00:00Z  # when\nb: 2024-01-01 10:00:00.5 +02:00\nc: x\n"
    [tagged] = load_documents("a: !!timestamp 2024-01-01\n", "t")
    assert to_plain(tagged.tree) == {"a": "2024-01-01"}


def test_operations_keep_styles() -> None:
    text = (
        "# head\n"
        "spec:   # eol\n"
        '  quoted: "old"\n'
        "  single: 'old'\n"
        "  flow: {limits: {a: 1}}\n"
        "  list: [1, 2]\n"
    )
    [chunk] = load_documents(text, "t")
    apply_operations(
        chunk.tree,
        [
            ("replace", ["spec", "quoted"], "new"),
            ("replace", ["spec", "single"], "new"),
            ("add", ["spec", "flow", "requests"], {"b": "2"}),
            ("add", ["spec", "yes"], "yes"),
            ("add", ["spec", "list", "-"], 3),
            ("remove", ["spec", "list", "0"], None),
            ("add", ["spec", "made", "deep"], "x"),  # a missing parent map is created
        ],
    )
    out = chunk.dump()
    assert out.startswith("# head\nspec:   # eol\n")
    assert '  quoted: "new"\n' in out
    assert "  single: 'new'\n" in out
    assert '  flow: {limits: {a: 1}, requests: {b: "2"}}\n' in out
    assert '  yes: "yes"\n' in out, "a word kubectl reads as a boolean is quoted"
    assert "  list: [2, 3]\n" in out
    assert yaml.safe_load(out)["spec"]["made"] == {"deep": "x"}


def test_a_changed_json_document_stays_json() -> None:
    [chunk] = load_documents('{"a": {"b": 1}}\n', "t.json")
    apply_operations(chunk.tree, [("add", ["a", "c"], "2")])
    assert json.loads(chunk.dump()) == {"a": {"b": 1, "c": "2"}}


def test_an_operation_on_the_whole_document_or_under_a_scalar_is_refused() -> None:
    [chunk] = load_documents("a: 1\n", "t")
    with pytest.raises(ValueError, match="whole document"):
        apply_operations(chunk.tree, [("replace", [], {})])
    with pytest.raises(ValueError, match="under a scalar"):
        apply_operations(chunk.tree, [("replace", ["a", "b"], 2)])


def run_mutate(monkeypatch: pytest.MonkeyPatch, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(["mutate", *args])
    return code, out.getvalue(), err.getvalue()


def test_a_commented_helm_file_nothing_changes_is_byte_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    source = (GOLDEN / "helm-passthrough" / "input.yaml").read_bytes()
    code, out, _ = run_mutate(monkeypatch, "-f", str(GOLDEN / "helm-passthrough" / "input.yaml"))
    assert code == 0
    assert out.encode() == source


def test_documents_around_a_changed_one_are_byte_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    path = GOLDEN / "helm-commented" / "input.yaml"
    code, out, _ = run_mutate(monkeypatch, "-f", str(path))
    assert code == 0
    before = [p + b for p, b in split_documents(path.read_text())]
    after = [p + b for p, b in split_documents(out)]
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == [2], "only the Deployment (the third document) changed"
    deployment = after[2]
    for kept in (
        "# Source: inference/templates/deployment.yaml",
        "# rolled when the ConfigMap changes",
        "# from .Values.gpuSlicing.enabled",
        'image: "ghcr.io/example/inference:1.16.0"',
        """args: ["--port", "8080", '--log-level=info']""",
    ):
        assert kept in deployment


def test_stdin_without_a_trailing_newline_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}  # no newline at the end"
    code, out, _ = run_mutate(monkeypatch, "-f", "-", stdin=text)
    assert (code, out) == (0, text)


def test_windows_line_endings_are_cut_and_passed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "apiVersion: v1\r\nkind: ConfigMap\r\nmetadata: {name: a}\r\n"
    text += "---\r\napiVersion: v1\r\nkind: ConfigMap\r\n"
    assert [prefix for prefix, _ in split_documents(text)] == ["", "---\r\n"]
    code, out, _ = run_mutate(monkeypatch, "-f", "-", stdin=text)
    assert (code, out) == (0, text)


def test_blank_lines_around_a_changed_document_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    pod = (
        'apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {castops.io/optimize: "true"}\n'
        "spec:\n  containers:\n  - {name: c, resources: {limits: {nvidia.com/gpu: 1}}}\n"
    )
    code, out, _ = run_mutate(monkeypatch, "-f", "-", stdin="\n\n" + pod + "\n\n---\nkind: ConfigMap\n")
    assert code == 0
    assert out.startswith("\n\napiVersion: v1\n")
    assert "nvidia.com/gpu-shared" in out
    assert out.endswith("}}}\n\n\n---\nkind: ConfigMap\n")


def test_files_are_joined_into_one_stream() -> None:
    assert "".join(mutate._stream([["a: 1\n"], ["b: 2"], ["---\nc: 3\n", "---\nd: 4\n"]])) == (
        "a: 1\n---\nb: 2\n---\nc: 3\n---\nd: 4\n"
    )
    assert "".join(mutate._stream([[""], ["b: 2\n"]])) == "b: 2\n"


# -- JSON written back as JSON, long lines never folded, empty documents, the document's style ----
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
