"""JSON Patch built by a structural diff, and the proof that it does what we meant.

We never trust a generic diff library to be right on lists (python-json-patch issues 124 and
138): the patch is built here, then applied to the original (RFC 6902, ``apply_patch``) and
compared with the intended Pod as canonical JSON bytes. Only a patch that passes that proof is
ever sent. Both steps run mostly in C (== and orjson), so the proof is cheap enough to run on
every review.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable
from typing import Any

import orjson

from function.core.pod import Pod
from function.core.pointer import escape, unescape

Operation = dict[str, Any]
Path = tuple[str | int, ...]
"""A place in a document, as the keys and indexes leading there from its root."""
Scope = dict[str | int, "Scope | None"]
"""Paths as a tree: each key leads to the scope below it, or to None for the whole subtree."""


def canonical(value: Any) -> bytes:
    """The JSON bytes of ``value`` with sorted keys, by orjson (C): two values are equal as JSON
    exactly when these bytes are, since orjson writes 1 as ``1``, 1.0 as ``1.0`` and True as
    ``true`` (Python's == says all three are equal)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


EXACT = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""orjson options refusing what it would otherwise write as something else (a str subclass as a
str, a datetime as a string, a dataclass as an object): JSON's own types only."""


def exact_json(value: Any) -> bytes | None:
    """The JSON bytes of ``value`` in its own key order, by orjson (in C), or
    None when orjson cannot write it (an integer beyond 64 bits, a lone surrogate, a non-string
    key, any type but JSON's own). Equal bytes mean equal JSON (1, 1.0 and true are written
    differently) with the same key order; orjson writes NaN and the infinities as null, which no
    parsed body holds."""
    try:
        return orjson.dumps(value, option=EXACT)
    except orjson.JSONEncodeError:
        return None


def same(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: True is not 1 and 1 is not 1.0 (Python's == says both are).

    Python's == (in C) rejects most differences at once; canonical bytes then tell the aliased
    scalars apart, also in C. The typed walk remains for what orjson cannot write (an integer
    beyond 64 bits, which no parsed body holds but a mutator could make)."""
    if a is b:
        return True  # the common case: no mutator touched the Pod, the engine kept the object
    if a != b:
        return False
    try:
        return canonical(a) == canonical(b)
    except orjson.JSONEncodeError:
        return _same_types(a, b)


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return all(_same_types(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return all(_same_types(x, y) for x, y in zip(a, b, strict=True))
    return True


_IMMUTABLE = (str, int, float, bool, type(None))
"""A tuple built once: ``str | int | ...`` written in the call would build a union every time."""


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data. marshal (in C) keeps every JSON type exactly (True stays
    True, 1 stays 1) in one C call each way, where a Python walk or copy.deepcopy visits every
    member in Python."""
    if isinstance(value, _IMMUTABLE):
        return value  # immutable: nothing to copy
    return marshal.loads(marshal.dumps(value))


def strings_in(value: Any, found: set[str]) -> set[str]:
    """Adds every string of JSON-shaped ``value`` (its members' at any depth, keys aside) to
    ``found``, and returns it."""
    if isinstance(value, str):
        found.add(value)
    elif isinstance(value, dict):
        for member in value.values():
            strings_in(member, found)
    elif isinstance(value, list):
        for member in value:
            strings_in(member, found)
    return found


def diff(old: Any, new: Any, path: str = "") -> list[Operation]:
    """Operations turning ``old`` into ``new``: removes before adds within an object, whole-list
    replacement unless the list only grew or shrank at its end. Each subtree is compared as JSON
    (``same``: == then canonical bytes, both in C) and skipped when equal, so the walk goes only
    down the paths a mutator changed."""
    return _diff(old, new, path, same)


def quick_changes(old: Any, new: Any) -> list[Operation]:
    """``diff`` for two values the caller knows differ as JSON (the engine, once a mutator changed
    the Pod), skipping each member Python's == calls equal (and of the same type) without looking
    inside: no serialization at all, so it costs only the walk down the changed paths. The walk
    starts at the members, without first comparing the wholes with ==, which would walk everything
    before the first difference a second time (metadata, for a Pod).

    Inside a skipped member, == cannot see a change between aliased scalars (1 to true, 1 to 1.0):
    the patch would miss it, and the proof, comparing canonical bytes, catches that; the engine
    then falls back to ``diff``. No mutator makes such a change."""
    ops: list[Operation] = []
    _quick_changes(old, new, "", ops)
    return ops


def scope_of(paths: list[Path]) -> Scope | None:
    """The tree of ``paths`` (a path inside another one is covered by it); None when one of them
    is the whole document."""
    tree: Scope = {}
    for path in paths:
        if not path:
            return None
        node: Scope | None = tree
        for key in path[:-1]:
            if node is None:
                break  # a path above this one covers it whole
            child = node.setdefault(key, {})
            node = child
        if node is not None:
            node[path[-1]] = None
    return tree


def changes_within(old: Any, new: Any, within: Scope) -> list[Operation]:
    """``quick_changes`` when only the subtrees ``within`` names can differ (what the mutators said
    they touched): the same operations in the same order, without comparing the rest (most of a
    Pod: its managedFields, its other containers, the spec's other fields). Where a named level is
    not what the scope expects (a key came or went, a list changed length, a scalar), that whole
    level is walked as ``quick_changes`` walks it. A change outside ``within`` is missed: the
    caller's proof, which compares whole documents, must catch it."""
    ops: list[Operation] = []
    _changes_within(old, new, "", ops, within)
    return ops


def _changes_within(old: Any, new: Any, path: str, ops: list[Operation], within: Scope) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        if len(old) == len(new) and old.keys() == new.keys():
            for key, value in old.items():  # the old order, as _quick_changes goes
                if key not in within:
                    continue
                other, below = new[key], within[key]
                if below is not None:
                    _changes_within(value, other, f"{path}/{escape(key)}", ops, below)
                elif not (value is other or (type(value) is type(other) and value == other)):
                    _quick_changes(value, other, f"{path}/{escape(key)}", ops)
            return
    elif isinstance(old, list) and isinstance(new, list):
        indexes = sorted(key for key in within if type(key) is int and 0 <= key < len(old))
        if len(old) == len(new) and len(indexes) == len(within):
            for i in indexes:
                a, b, below = old[i], new[i], within[i]
                if below is not None:
                    _changes_within(a, b, f"{path}/{i}", ops, below)
                elif not (a is b or (type(a) is type(b) and a == b)):
                    _quick_changes(a, b, f"{path}/{i}", ops)
            return
    if not _loosely_same(old, new):
        _quick_changes(old, new, path, ops)


def _loosely_same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def _quick_changes(old: Any, new: Any, path: str, ops: list[Operation]) -> None:
    """``_changes`` with ``_loosely_same`` written inline and the operations appended to one list:
    this walk runs on every mutated Pod, and a Python call per member compared and a list per
    level were most of its cost. Same operations, in the same order (tests compare it with
    ``diff``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if len(old) == len(new) and old.keys() == new.keys():
            # The common case (a value changed, no key came or went): one loop over the members.
            for key, value in old.items():
                other = new[key]
                if not (value is other or (type(value) is type(other) and value == other)):
                    _quick_changes(value, other, f"{path}/{escape(key)}", ops)
            return
        # Removes (in the old order), then changes, then adds (in the new order), as ``_changes``.
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in old.items():
            other = new.get(key, _ABSENT)
            if not (value is other or other is _ABSENT or (type(value) is type(other) and value == other)):
                _quick_changes(value, other, f"{path}/{escape(key)}", ops)
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": copy_json(value)})
        return
    if isinstance(old, list) and isinstance(new, list):
        shared = min(len(old), len(new))
        if len(old) == len(new) or all(_loosely_same(old[i], new[i]) for i in range(shared)):
            for i in range(shared):
                a, b = old[i], new[i]
                if not (a is b or (type(a) is type(b) and a == b)):
                    _quick_changes(a, b, f"{path}/{i}", ops)
            for i in range(shared, len(new)):
                ops.append({"op": "add", "path": f"{path}/{i}", "value": copy_json(new[i])})
            for i in reversed(range(shared, len(old))):
                ops.append({"op": "remove", "path": f"{path}/{i}"})
            return
    ops.append({"op": "replace", "path": path, "value": copy_json(new)})


_ABSENT: Any = object()
"""Marks a key missing from a dict (``None`` is a JSON value)."""


def _diff(old: Any, new: Any, path: str, equal: Callable[[Any, Any], bool]) -> list[Operation]:
    if equal(old, new):
        return []
    return _changes(old, new, path, equal)


def _changes(old: Any, new: Any, path: str, equal: Callable[[Any, Any], bool]) -> list[Operation]:
    """The operations for two values already known to differ; an equal member is skipped before
    its path is even written, so the work follows the changed paths only."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Operation] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in old.items():
            if key in new and not equal(value, new[key]):
                ops.extend(_changes(value, new[key], f"{path}/{escape(key)}", equal))
        for key in new:
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": copy_json(new[key])})
        return ops
    if isinstance(old, list) and isinstance(new, list):
        shared = min(len(old), len(new))
        if len(old) == len(new) or all(equal(old[i], new[i]) for i in range(shared)):
            ops = []
            for i in range(shared):
                if not equal(old[i], new[i]):
                    ops.extend(_changes(old[i], new[i], f"{path}/{i}", equal))
            for i in range(shared, len(new)):
                ops.append({"op": "add", "path": f"{path}/{i}", "value": copy_json(new[i])})
            for i in reversed(range(shared, len(old))):
                ops.append({"op": "remove", "path": f"{path}/{i}"})
            return ops
    return [{"op": "replace", "path": path, "value": copy_json(new)}]


class PatchProofError(Exception):
    """The patch does not turn the original into the intended object."""


def _index(token: str, size: int, op: str) -> int:
    # RFC 6901: an array index is 0 or digits without a leading zero; "-" (add) means the end.
    if op == "add" and token == "-":
        return size
    if not token.isdigit() or not token.isascii() or (token != "0" and token.startswith("0")):
        raise PatchProofError(f"{token!r} is not an array index")
    index = int(token)
    if index > size or (op != "add" and index == size):
        raise PatchProofError(f"array index {index} out of range")
    return index


def apply_patch(document: Any, patch: list[Operation]) -> Any:
    """RFC 6902 add, remove and replace applied to ``document`` without changing it: each
    container on an operation's path is copied (once), everything else is shared. What the proof
    needs at a small fraction of jsonpatch's cost and of a deep copy's (the test suite checks it
    against jsonpatch, and the fuzz and property tests apply every sent patch with jsonpatch)."""
    root: list[Any] = [document]
    # The copies made, by id, holding them: an id is only unique while its object lives. Only these
    # are written to; the document's containers and the patch's values are copied first.
    copied: dict[int, Any] = {}
    # Parent path -> the (copied) container now at that path: a patch's operations mostly share
    # parents. Every entry stays true: an operation that replaces or removes a container forgets
    # the entries at and under its path, and one that inserts into or deletes from a list forgets
    # every entry under that list (its later members moved to other indexes).
    parents: dict[str, Any] = {}
    # The last walk, as (token, container reached) from the document down: the next walk (to
    # requests, after limits) resumes at the deepest container both share. Emptied whenever
    # parents are forgotten, since a container on it may have gone or moved.
    trail: list[tuple[str, Any]] = []

    for operation in patch:
        op, path = operation.get("op"), operation.get("path")
        if op not in _OPERATIONS or not isinstance(path, str):
            raise PatchProofError(f"unsupported operation {operation!r}")
        if path == "":
            if op == "remove":
                raise PatchProofError("cannot remove the whole document")
            root[0] = operation["value"]
            parents.clear()
            trail.clear()
            continue
        if not path.startswith("/"):
            raise PatchProofError(f"path {path!r} does not start with /")
        parent_path, _, last = path.rpartition("/")
        parent = parents.get(parent_path)
        if parent is None:
            parent = parents[parent_path] = _walk(root, parent_path, copied, trail, path)
        if "~" in last:  # the test inline: most tokens have no escape, and a call costs more
            last = unescape(last)
        if isinstance(parent, dict):
            if op == "add":
                old = parent.get(last)  # an add on a present member replaces it
            elif last in parent:
                old = parent[last]
            else:
                raise PatchProofError(f"path {path!r} does not exist")
            if op == "remove":
                del parent[last]
            else:
                parent[last] = operation["value"]
            # Only a container can be a remembered parent: a scalar's path has nothing to forget.
            if isinstance(old, _CONTAINERS):
                _forget(parents, trail, path, itself=True)
        elif isinstance(parent, list):
            index = _index(last, len(parent), op)
            if op == "replace":
                old = parent[index]
                parent[index] = operation["value"]
                if isinstance(old, _CONTAINERS):
                    _forget(parents, trail, path, itself=True)
            else:
                if op == "add":
                    parent.insert(index, operation["value"])
                else:
                    del parent[index]
                _forget(parents, trail, parent_path, itself=False)
        else:
            raise PatchProofError(f"path {path!r} goes through a scalar")
    return root[0]


_OPERATIONS = ("add", "remove", "replace")
_CONTAINERS = (dict, list)


def _walk(
    root: list[Any], parent_path: str, copied: dict[int, Any], trail: list[tuple[str, Any]], path: str
) -> Any:
    """The container at ``parent_path`` in the result, each container on the way copied once."""
    tokens = parent_path.split("/")  # the first, "", stands for the step into the document
    shared = 0
    for (walked, _), token in zip(trail, tokens, strict=False):  # the shorter one ends it
        if walked != token:
            break
        shared += 1
    del trail[shared:]
    parent: Any = trail[-1][1] if trail else root
    try:
        for position in range(shared, len(tokens)):
            token = tokens[position]
            if position == 0:
                key: Any = 0
            else:
                key = unescape(token) if "~" in token else token
                if not isinstance(parent, dict):
                    key = _index(key, len(parent), "get")
            child = parent[key]
            if id(child) not in copied:
                if isinstance(child, dict):
                    child = dict(child)
                elif isinstance(child, list):
                    child = list(child)
                else:
                    raise PatchProofError(f"path {path!r} goes through a scalar")
                parent[key] = child
                copied[id(child)] = child
            trail.append((token, child))
            parent = child
    except (KeyError, IndexError):
        raise PatchProofError(f"path {path!r} does not exist") from None
    return parent


def _forget(parents: dict[str, Any], trail: list[tuple[str, Any]], path: str, *, itself: bool) -> None:
    """Drop the remembered parents under ``path`` (and at it, if ``itself``), and the trail."""
    trail.clear()
    under = path + "/"
    for stale in [known for known in parents if known.startswith(under) or (itself and known == path)]:
        del parents[stale]


def prove(
    original: dict[str, Any],
    patch: list[Operation],
    intended: dict[str, Any],
    intended_json: bytes | None = None,
) -> Any:
    """Apply ``patch`` to ``original`` as the apiserver would and require exactly ``intended``:
    the same canonical JSON bytes (so 1, 1.0 and true stay distinct).

    ``intended_json``, when the caller has it, is ``exact_json(intended)``: the engine keeps it
    from telling what the last mutator did. The result written the same way then proves the patch
    in one serialization (same bytes in the same key order: the same canonical bytes), instead of
    a walk and two sorted ones; any other bytes (the same members in another order, say) leave
    the answer to ``same``, as without it.

    Returns the patched object, which shares with ``original`` every subtree the patch leaves
    alone (the engine's rule checks skip what is the very same object)."""
    try:
        result = apply_patch(original, patch)
    except PatchProofError as error:
        raise PatchProofError(f"patch does not apply: {error}") from None
    if intended_json is not None and exact_json(result) == intended_json:
        return result
    if not same(result, intended):
        raise PatchProofError("patched object differs from the intended one")
    return result


class WorkingCopy:
    """The engine's own copy of the Pod, which the mutators edit in place one after another, and
    a record of its last accepted content, to tell what each mutator did.

    One copy per review, not one per mutator run: a deep copy per run would be most of the
    engine's cost. The record is the Pod's ``exact_json`` bytes: the same bytes after a mutator
    mean it changed nothing, as JSON sees it (1, 1.0 and true are written differently, which
    Python's == calls equal) nor even a key order, in one serialization rather than a walk. When
    orjson cannot write the Pod (an integer beyond 64 bits, a type JSON lacks), the record is a
    deep copy compared with ``same``.
    """

    __slots__ = ("_saved", "changed", "json", "pod")
    pod: Pod
    """The copy the mutators edit."""
    json: bytes | None
    """The record: ``exact_json`` of the last accepted content, or None (see ``_saved``)."""
    _saved: Pod | None
    """The record when orjson cannot write the Pod: a deep copy of the last accepted content."""
    changed: bool
    """Whether any mutator changed the Pod since the copy was made."""

    def __init__(self, original: Pod, from_json: bool = False) -> None:
        """``from_json``: ``original`` was read from JSON (orjson reads no NaN, no tuple, no
        integer beyond 64 bits), so its copy reads back the same without comparing the two (a
        walk of the whole Pod, 3 MiB for the largest reviews)."""
        self.changed = False
        data = exact_json(original)
        if data is not None:
            copy = orjson.loads(data)
            # orjson writes NaN and the infinities as null and a tuple as a list, which reads back
            # as something else: the copy is used only when Python's == finds nothing of the kind.
            if from_json or copy == original:
                self.pod, self.json, self._saved = copy, data, None
                return
        self.pod = copy_json(original)  # marshal keeps every type, or refuses (an internal error)
        self.json = None
        self._saved = copy_json(original)

    def settle(self) -> bool:
        """Whether the mutator that just ran changed the Pod as JSON sees it. A change becomes the
        record; anything else leaves no trace: a Pod equal as JSON but with its keys in another
        order is put back as it was, since the key order decides the order of the patch's
        operations."""
        if self.json is not None:
            after = exact_json(self.pod)
            if after == self.json:
                return False  # the common case: one serialization, no walk
            if after is not None and len(after) != len(self.json):
                # Other bytes of the same length may be the same members in another order; other
                # lengths are a change (the usual one: a mutator adds, removes or renames).
                self.json, self._saved, self.changed = after, None, True
                return True
            before = orjson.loads(self.json)
        else:
            after = None
            before = self._saved
        if same(before, self.pod):
            self.pod = before
            if self.json is None:
                self._saved = copy_json(before)  # the record must not be the Pod mutators edit
            return False
        self.json = after
        self._saved = None if after is not None else copy_json(self.pod)
        self.changed = True
        return True

    def intended(self, original: Pod) -> tuple[Pod, bytes | None]:
        """The intended Pod and its ``exact_json`` bytes (None when unknown): the original itself,
        and None, when no mutator changed anything (no patch to build, nothing to prove)."""
        return (self.pod, self.json) if self.changed else (original, None)
