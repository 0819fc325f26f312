"""Round-trip YAML for ``castslice mutate``: what the engine does not change comes out byte for byte.

The input text is cut into its documents at the ``---`` lines (YAML forbids a document marker at
column 0 inside a scalar, so a line cut is exact). A document the engine leaves alone is written
back as its original text. A changed document is loaded with ruamel.yaml's round-trip loader and
the engine's patch is applied to that tree, operation by operation, so every part the patch does
not touch keeps its comments, key order, flow style and quoting; only then is it dumped, with the
indentation guessed from the document itself.
"""

from __future__ import annotations

import datetime
import difflib
import io
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import YAMLError
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, ScalarString

_SEPARATOR = re.compile(r"^---(?=[ \t\r]|$)", re.M)
_SEPARATOR_ONLY = re.compile(r"^---[ \t]*(#.*)?\r?$")
_BLOCK_KEY = re.compile(r"^(\s*)(?:- )?[^\s#-][^#]*:\s*(#.*)?$")

_TRUE_WORDS = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_FALSE_WORDS = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
YAML11_BOOLEANS = frozenset((*_TRUE_WORDS, *_FALSE_WORDS))
"""Plain scalars kubectl reads as booleans (sigs.k8s.io/yaml follows YAML 1.1); ruamel (YAML 1.2)
reads most of them as strings, so they are checked by their text."""


class DocumentError(Exception):
    """A document that is not valid YAML; the message says where."""


@dataclass
class Chunk:
    """One document of the input: its original text (separator line included) and its tree."""

    text: str
    prefix: str
    """The ``---`` line that opens it (kept verbatim when the document is rewritten), or ''."""
    body: str
    tree: Any
    empty: bool

    def dump(self) -> str:
        """The document with the tree's current content (call only when the tree was changed)."""
        if self.body.lstrip().startswith(("{", "[")):
            # A JSON document (-f x.json) stays JSON: ruamel would write a YAML flow mapping
            # mixing quoted and bare keys. Its layout is JSON's usual indented form.
            return self.prefix + json.dumps(to_plain(self.tree), indent=2, ensure_ascii=False) + "\n"
        mapping, sequence, offset = guess_indent(self.body)
        writer = _yaml()
        writer.indent(mapping=mapping, sequence=sequence, offset=offset)
        out = io.StringIO()
        writer.dump(self.tree, out)
        text = out.getvalue()
        # ruamel drops the blank lines around a document: put the original ones back.
        leading = self.body[: len(self.body) - len(self.body.lstrip("\n"))]
        trailing = self.body[len(self.body.rstrip("\n")) :]
        dumped = leading + text.strip("\n") + (trailing or "\n")
        return self.prefix + keep_untouched_lines(self.body, dumped)


def keep_untouched_lines(original: str, dumped: str) -> str:
    """``dumped`` with the lines the change did not touch as they were written in ``original``.

    ruamel re-indents what it writes: a Helm-rendered document's lines that hold only spaces, or
    list items at another indentation, would all show up in a diff beside the one line that
    changed. Lines equal but for their surrounding whitespace, and blank lines, are taken from the
    original; the rest from the dump. The splice is kept only if it reads back as exactly the
    dumped document (a changed line indented the dump's way inside a block indented another way
    could misread): otherwise the whole dump is returned, correct if noisier."""
    before, after = original.splitlines(keepends=True), dumped.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(
        None, [line.strip() for line in before], [line.strip() for line in after], autojunk=False
    )
    spliced: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        # Blank lines the dump dropped or added are layout too (a block scalar's blank lines are
        # content: the check below catches that and falls back to the dump).
        blank = all(not line.strip() for line in before[i1:i2] + after[j1:j2])
        if tag == "equal" or blank:
            spliced.extend(before[i1:i2])
            continue
        spliced.extend(after[j1:j2])
        if after[j2 - 1 : j2] and after[j2 - 1].strip():  # blank lines that closed the original part
            spliced.extend(_trailing_blanks(before[i1:i2]))
    text = "".join(spliced)
    if text == dumped:
        return dumped
    try:
        reader = YAML(typ="safe", pure=True)
        same = list(reader.load_all(text)) == list(reader.load_all(dumped))
    except YAMLError:
        same = False
    return text if same else dumped


def _trailing_blanks(lines: list[str]) -> list[str]:
    blanks: list[str] = []
    for line in reversed(lines):
        if line.strip():
            break
        blanks.insert(0, line)
    return blanks


class DateText(str):
    """An unquoted date or time, kept as the text the user wrote (``2026-12-31``).

    kubectl's YAML decoder keeps timestamps as text, so -o json must print them as written, not as
    Python's isoformat; the checks still see that it was an unquoted date."""

    __slots__ = ()


class _Constructor(RoundTripConstructor):
    pass


class _Representer(RoundTripRepresenter):
    pass


def _date_text(constructor: Any, node: Any) -> DateText:
    return DateText(node.value)


def _represent_date_text(representer: Any, data: DateText) -> Any:
    # Tagged as a timestamp, so the emitter writes it plain, as it was.
    return representer.represent_scalar("tag:yaml.org,2002:timestamp", str(data))


# On subclasses: ruamel's registries are per class, so other users of ruamel are not affected.
_Constructor.add_constructor("tag:yaml.org,2002:timestamp", _date_text)
_Representer.add_representer(DateText, _represent_date_text)


def _yaml() -> YAML:
    loader = YAML(typ="rt")
    loader.Constructor = _Constructor
    loader.Representer = _Representer
    loader.preserve_quotes = True
    loader.width = 4096  # never fold a long line the user wrote on one line
    return loader


def split_documents(text: str) -> list[tuple[str, str]]:
    """(separator line, body) per document; the concatenation is the text, byte for byte."""
    starts = [m.start() for m in _SEPARATOR.finditer(text)]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    pieces = []
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        piece = text[begin:end]
        prefix = ""
        if piece.startswith("---"):
            newline = piece.find("\n")
            first = piece if newline < 0 else piece[: newline + 1]
            if _SEPARATOR_ONLY.match(first.rstrip("\n")):
                prefix = first
        pieces.append((prefix, piece[len(prefix) :]))
    return pieces


def load_documents(text: str, origin: str) -> list[Chunk]:
    chunks = []
    for number, (prefix, body) in enumerate(split_documents(text)):
        try:
            tree = _yaml().load(body) if body.strip() else None
        except YAMLError as error:
            raise DocumentError(f"{origin}: document {number + 1} is not valid YAML: {error}") from None
        chunks.append(Chunk(prefix + body, prefix, body, tree, tree is None))
    return chunks


_BLOCK_SCALAR = re.compile(r"[|>][-+0-9]*\s*(#.*)?$")


def _structure_lines(text: str) -> list[str]:
    """The lines that carry structure: no blanks, no comments, no block scalar contents."""
    lines: list[str] = []
    scalar_indent: int | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if scalar_indent is not None:
            if indent > scalar_indent:
                continue
            scalar_indent = None
        lines.append(line)
        if _BLOCK_SCALAR.search(line) and ":" in line:
            scalar_indent = indent + (2 if line.lstrip().startswith("- ") else 0)
    return lines


def guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as most of the document writes them."""
    lines = _structure_lines(text)
    mappings: Counter[int] = Counter()
    offsets: Counter[int] = Counter()
    for line, following in pairwise(lines):
        match = _BLOCK_KEY.match(line)
        if not match:
            continue
        parent = len(match[1]) + (2 if line.lstrip().startswith("- ") else 0)
        child = len(following) - len(following.lstrip())
        if following.lstrip().startswith("- ") and child >= parent:
            offsets[child - parent] += 1
        elif child > parent:
            mappings[child - parent] += 1
    mapping = mappings.most_common(1)[0][0] if mappings else 2
    offset = offsets.most_common(1)[0][0] if offsets else 0
    return mapping, max(offset + 2, mapping), offset


# -- from the round-trip tree to plain JSON values -----------------------------------------------
def to_plain(node: Any) -> Any:
    """The tree as JSON-shaped values (what the engine judges). Dates are their text already."""
    if isinstance(node, dict):
        return {str(key): to_plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [to_plain(value) for value in node]
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, datetime.datetime | datetime.date):  # an explicit !!timestamp tag
        return node.isoformat()
    return node


def is_plain_scalar(value: Any) -> bool:
    """An unquoted string scalar (ruamel keeps quoted ones as ScalarString subclasses)."""
    return isinstance(value, str) and not isinstance(value, ScalarString)


# -- the engine's patch applied to the round-trip tree ----------------------------------------------
def _needs_quotes(text: str) -> bool:
    """Would kubectl (YAML 1.1) read this text, unquoted, as something other than a string?"""
    try:
        return not isinstance(pyyaml.safe_load(text), str)
    except pyyaml.YAMLError:
        return True


def _styled(value: Any, like: Any = None) -> Any:
    """A value to put in the tree: strings kubectl would misread are double-quoted (the style of
    Kubernetes' own manifests), and a replaced quoted string keeps its quote style."""
    if isinstance(value, dict):
        styled = CommentedMap()
        for key, item in value.items():
            styled[key] = _styled(item)
        return styled
    if isinstance(value, list):
        return CommentedSeq([_styled(item) for item in value])
    if isinstance(value, str):
        if isinstance(like, ScalarString):
            return type(like)(value)
        if _needs_quotes(value):
            return DoubleQuotedScalarString(value)
    return value


def _flow_like_siblings(parent: Any, value: Any) -> Any:
    """A new map beside flow-style maps (``limits: {nvidia.com/gpu: 1}``) is written in flow style."""
    if isinstance(value, CommentedMap):
        siblings = [v for v in parent.values() if isinstance(v, CommentedMap) and v is not value]
        if siblings and all(v.fa.flow_style() for v in siblings):
            value.fa.set_flow_style()
    return value


def _container(tree: Any, path: Sequence[str | int], create: bool) -> Any:
    node = tree
    for part in path:
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node or node[part] is None:
                if not create:
                    raise KeyError(part)
                # The engine's Pod had this (empty) map, the document had not: a template with
                # no metadata, a KServe component with no annotations.
                node[part] = CommentedMap()
            node = node[part]
        else:
            raise KeyError(part)
    return node


def apply_operations(tree: Any, operations: Sequence[tuple[str, Sequence[str | int], Any]]) -> None:
    """Apply (op, document path, value) operations in place: add, remove and replace, the only
    ones the engine's diff produces. The engine proved the patch on its own copy of the Pod."""
    for op, path, value in operations:
        if not path:
            raise ValueError("an operation on the whole document")
        parent = _container(tree, path[:-1], create=op == "add")
        key = path[-1]
        if isinstance(parent, list):
            index = len(parent) if key == "-" else int(key)
            if op == "add":
                parent.insert(index, _styled(value))
            elif op == "remove":
                del parent[index]
            else:
                parent[index] = _styled(value, parent[index])
        elif isinstance(parent, dict):
            if op == "remove":
                del parent[key]
            elif op == "replace":
                parent[key] = _styled(value, parent.get(key))
            else:
                parent[key] = _flow_like_siblings(parent, _styled(value))
        else:
            raise ValueError(f"{op} under a scalar")
