"""JSON Patch built by a structural diff, and the proof that it does what we meant.

We never trust a generic diff library to be right on lists (python-json-patch issues 124 and
138): the patch is built here, then applied to the original with jsonpatch and compared with the
intended Pod. Only a patch that passes that proof is ever sent.
"""

from __future__ import annotations

import marshal
from typing import Any

import jsonpatch

Operation = dict[str, Any]


def escape(token: str) -> str:
    """RFC 6901: '~' becomes '~0' and '/' becomes '~1' (so nvidia.com/gpu is nvidia.com~1gpu)."""
    return token.replace("~", "~0").replace("/", "~1")


def same(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: True is not 1 and 1 is not 1.0 (Python's == says both are).

    Python's == (in C) rejects most differences at once; the typed walk then runs only on
    values == calls equal, to tell the aliased scalars apart."""
    if a is b:
        return True  # the common case: no mutator touched the Pod, the engine kept the object
    if a != b:
        return False
    return _same_types(a, b)


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return all(_same_types(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return all(_same_types(x, y) for x, y in zip(a, b, strict=True))
    return True


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data. marshal (in C) keeps every JSON type exactly (True stays
    True, 1 stays 1) and is about twice as fast as a Python walk, four times copy.deepcopy."""
    return marshal.loads(marshal.dumps(value))


def diff(old: Any, new: Any, path: str = "") -> list[Operation]:
    """Operations turning ``old`` into ``new``: removes before adds within an object, whole-list
    replacement unless the list only grew or shrank at its end. Each equal subtree is compared
    once, so the cost is about one walk of the Pod whatever the number of changes."""
    if same(old, new):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Operation] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key in old:
            if key in new:
                ops.extend(diff(old[key], new[key], f"{path}/{escape(key)}"))
        for key in new:
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": copy_json(new[key])})
        return ops
    if isinstance(old, list) and isinstance(new, list):
        shared = min(len(old), len(new))
        if len(old) == len(new) or all(same(old[i], new[i]) for i in range(shared)):
            ops = []
            for i in range(shared):
                ops.extend(diff(old[i], new[i], f"{path}/{i}"))
            for i in range(shared, len(new)):
                ops.append({"op": "add", "path": f"{path}/{i}", "value": copy_json(new[i])})
            for i in reversed(range(shared, len(old))):
                ops.append({"op": "remove", "path": f"{path}/{i}"})
            return ops
    return [{"op": "replace", "path": path, "value": copy_json(new)}]


class PatchProofError(Exception):
    """The patch does not turn the original into the intended object."""


def prove(original: dict[str, Any], patch: list[Operation], intended: dict[str, Any]) -> None:
    """Apply ``patch`` to ``original`` as the apiserver would and require exactly ``intended``."""
    try:
        result = jsonpatch.JsonPatch(patch).apply(copy_json(original), in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
        raise PatchProofError(f"patch does not apply: {error}") from None
    if not same(result, intended):
        raise PatchProofError("patched object differs from the intended one")
