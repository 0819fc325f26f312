"""RFC 6902 JSON Patch with the two extended path segments CAST AI's pod mutation examples use.

- ``[field=value]`` selects the elements of an array (objects) whose ``field`` equals ``value``:
  ``/spec/tolerations/[key=agentpool]/key``.
- ``*`` selects every element of an array (every value of an object):
  ``/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/*/...``.

Paths are parsed once, when a PodMutation is loaded (Gatekeeper's model: the compiled form is
immutable and shared by every review). At apply time an extended path is expanded against the
Pod *as it is at that operation* (earlier operations of the list may have changed its arrays) into
zero or more plain RFC 6901 pointers, and each becomes an ordinary operation:

- it "selects" only what exists: the leaf for ``remove``/``replace``/``test``, the parent for
  ``add``; an extended path that selects nothing is skipped and recorded, never an error;
- ``remove`` runs on the selected elements from the last to the first, so indices stay valid;
- a plain path keeps RFC 6902 semantics exactly: a missing path or a failed ``test`` fails the
  whole list, which is then not applied at all (the caller keeps the Pod as it was before it).

``move`` and ``copy`` take plain pointers only: "move every matching element to one place" has no
single meaning, so such a path is refused when the PodMutation is validated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonpatch
import jsonpointer

from function.core.json_patch import copy_json, same
from function.core.pointer import escape, escape_problem, unescape

OPS = ("add", "remove", "replace", "move", "copy", "test")
Op = Literal["add", "remove", "replace", "move", "copy", "test"]

_SELECT = re.compile(r"^\[([^=\[\]]+)=([^\[\]]*)\]\Z")


class PathError(ValueError):
    """A path that cannot be parsed; the message names the path and what is accepted."""


@dataclass(frozen=True)
class Segment:
    kind: Literal["key", "all", "select"]
    key: str = ""  # kind "key": the unescaped token; kind "select": the field compared
    value: str = ""  # kind "select": the value the field must equal


@dataclass(frozen=True)
class CompiledPath:
    raw: str
    segments: tuple[Segment, ...]

    @property
    def extended(self) -> bool:
        return any(s.kind != "key" for s in self.segments)


def _unescape(token: str) -> str:
    problem = escape_problem(token)
    if problem:
        raise PathError(f"{token!r}: {problem}")
    return unescape(token)


def parse_path(raw: str) -> CompiledPath:
    """Parse a JSON pointer with the extended segments; raise PathError naming what is wrong."""
    if not isinstance(raw, str):
        raise PathError(f"{raw!r} is not a string")
    if raw == "":
        return CompiledPath(raw, ())
    if not raw.startswith("/"):
        raise PathError(f"{raw!r} does not start with '/' (a JSON pointer, RFC 6901)")
    segments: list[Segment] = []
    for token in raw[1:].split("/"):
        if token == "*":
            segments.append(Segment("all"))
        elif token.startswith("["):
            found = _SELECT.match(token)
            if not found:
                raise PathError(f"{raw!r}: segment {token!r} is not [field=value]")
            segments.append(Segment("select", _unescape(found.group(1)), _unescape(found.group(2))))
        else:
            segments.append(Segment("key", _unescape(token)))
    return CompiledPath(raw, tuple(segments))


@dataclass(frozen=True)
class CompiledOperation:
    op: Op
    path: CompiledPath
    source: CompiledPath | None = None  # ``from``
    value_json: str | None = None  # the value, frozen as JSON text (copied fresh for every Pod)

    @property
    def value(self) -> Any:
        return None if self.value_json is None else json.loads(self.value_json)

    def describe(self) -> str:
        if self.source is not None:
            return f"{self.op} {self.source.raw} -> {self.path.raw}"
        return f"{self.op} {self.path.raw}"


def compile_operation(raw: Any, where: str) -> CompiledOperation:
    """One operation, checked; a ValueError names ``where`` (e.g. ``spec.patches[2].path``)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: an operation is an object with op and path, got {raw!r}"[:200])
    unknown = sorted(set(raw) - {"op", "path", "from", "value"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (accepted: op, path, from, value)")
    op = raw.get("op")
    if op not in OPS:
        raise ValueError(f"{where}.op: {op!r} is not an operation (accepted: {', '.join(OPS)})")
    if "path" not in raw:
        raise ValueError(f"{where}.path is required")
    try:
        path = parse_path(raw["path"])
    except PathError as error:
        raise ValueError(f"{where}.path: {error}") from None
    source = None
    if op in ("move", "copy"):
        if "from" not in raw:
            raise ValueError(f"{where}.from is required for {op}")
        try:
            source = parse_path(raw["from"])
        except PathError as error:
            raise ValueError(f"{where}.from: {error}") from None
        if path.extended or source.extended:
            raise ValueError(
                f"{where}: {op} takes plain JSON pointers only ([field=value] and * select many)"
            )
        if op == "move" and (path.raw + "/").startswith(source.raw + "/"):
            raise ValueError(f"{where}: cannot move {source.raw!r} into itself ({path.raw!r})")
    elif "from" in raw:
        raise ValueError(f"{where}.from is only for move and copy")
    value_json = None
    if op in ("add", "replace", "test"):
        if "value" not in raw:
            raise ValueError(f"{where}.value is required for {op}")
        value_json = json.dumps(raw["value"], sort_keys=True)
    elif "value" in raw:
        raise ValueError(f"{where}.value is not used by {op}")
    if op == "add" and path.extended and path.segments[-1].kind != "key":
        raise ValueError(f"{where}.path: add ends in a key, an index or '-', not [field=value] or *")
    if op != "test" and not path.segments:
        raise ValueError(f"{where}.path: {op} on the whole Pod ('') is not allowed")
    return CompiledOperation(op, path, source, value_json)


def compile_operations(raw: Any, where: str) -> tuple[CompiledOperation, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"{where}: a list of JSON Patch operations is expected")
    return tuple(compile_operation(item, f"{where}[{i}]") for i, item in enumerate(raw))


# -- expansion -------------------------------------------------------------------------------------
def _field_equals(element: Any, name: str, value: str) -> bool:
    if not isinstance(element, dict) or name not in element:
        return False
    found = element[name]
    if isinstance(found, str):
        return found == value
    # [port=80], [optional=true]: a scalar compared by its JSON text
    return not isinstance(found, dict | list) and json.dumps(found) == value


def _children(node: Any, segment: Segment) -> list[tuple[str, Any]]:
    if segment.kind == "all":
        if isinstance(node, list):
            return [(str(i), item) for i, item in enumerate(node)]
        if isinstance(node, dict):
            return [(escape(k), v) for k, v in node.items()]
        return []
    if segment.kind == "select":
        if not isinstance(node, list):
            return []
        return [
            (str(i), item) for i, item in enumerate(node) if _field_equals(item, segment.key, segment.value)
        ]
    if isinstance(node, dict) and segment.key in node:
        return [(escape(segment.key), node[segment.key])]
    if isinstance(node, list) and segment.key.isdigit() and int(segment.key) < len(node):
        return [(segment.key, node[int(segment.key)])]
    return []


def expand(document: Any, path: CompiledPath, op: str) -> list[str]:
    """The plain pointers an extended path selects in ``document`` now, in document order."""
    segments = path.segments
    # ``add`` selects the parent (its last segment may name what does not exist yet, or '-').
    walk, last = (segments[:-1], segments[-1]) if op == "add" else (segments, None)
    found: list[tuple[str, Any]] = [("", document)]
    for segment in walk:
        found = [
            (f"{prefix}/{token}", child)
            for prefix, node in found
            for token, child in _children(node, segment)
        ]
        if not found:
            return []
    if last is None:
        return [prefix for prefix, _ in found]
    if last.kind != "key":
        # add at every selected element means replacing it in place: not an add, refuse quietly
        return []
    return [f"{prefix}/{escape(last.key)}" for prefix, node in found if isinstance(node, dict | list)]


# -- applying ---------------------------------------------------------------------------------------
@dataclass
class SequenceOutcome:
    """What one operation list did. ``document`` is None when the list failed and was not applied."""

    document: Any
    applied: list[dict[str, Any]] = field(default_factory=list)  # the concrete RFC 6902 operations
    skipped: list[str] = field(default_factory=list)  # extended paths that selected nothing
    error: str | None = None
    copied: list[tuple[str, Any]] = field(default_factory=list)  # (from, value) of each copy and move


def _concrete(operation: CompiledOperation, pointer: str) -> dict[str, Any]:
    concrete: dict[str, Any] = {"op": operation.op, "path": pointer}
    if operation.source is not None:
        concrete["from"] = operation.source.raw
    if operation.value_json is not None:
        concrete["value"] = operation.value
    return concrete


def _test(document: Any, pointer: str, expected: Any) -> None:
    # jsonpatch's test uses Python's ==, for which true == 1; JSON does not, so compare as JSON.
    actual = jsonpointer.resolve_pointer(document, pointer)
    if isinstance(actual, jsonpointer.EndOfList):
        raise jsonpatch.JsonPatchTestFailed("'-' (past the end of a list) names no value to test")
    if not same(actual, expected):
        raise jsonpatch.JsonPatchTestFailed(f"{json.dumps(actual)[:60]} is not {json.dumps(expected)[:60]}")


def apply_sequence(document: Any, operations: Sequence[CompiledOperation]) -> SequenceOutcome:
    """Apply the list to a copy of ``document``: all of it, or (on the first failure) none of it."""
    working = copy_json(document)
    outcome = SequenceOutcome(document=None)
    for index, operation in enumerate(operations):
        if operation.path.extended:
            pointers = expand(working, operation.path, operation.op)
            if not pointers:
                outcome.skipped.append(f"[{index}] {operation.describe()}: selects nothing")
                continue
            if operation.op == "remove":
                pointers.reverse()  # later elements first: earlier indices stay valid
        else:
            pointers = [operation.path.raw]
        for pointer in pointers:
            concrete = _concrete(operation, pointer)
            try:
                if operation.op == "test":
                    _test(working, pointer, concrete["value"])
                else:
                    if operation.source is not None:  # copy, move: what travels, for the audit
                        moved = jsonpointer.resolve_pointer(working, operation.source.raw)
                        outcome.copied.append((operation.source.raw, moved))
                    working = jsonpatch.apply_patch(working, [concrete], in_place=True)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
                outcome.error = f"[{index}] {operation.describe()}: {error}"
                return outcome
            outcome.applied.append(concrete)
    outcome.document = working
    return outcome
