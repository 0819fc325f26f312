"""The JSON Patch module the proof rests on: the diff that builds a patch, apply_patch (RFC 6902's
add, remove and replace, as the apiserver applies them; checked against jsonpatch), the proof
that the patch makes exactly the intended Pod, and the working copy the engine's mutators edit."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from function.core.json_patch import (
    PatchProofError,
    WorkingCopy,
    apply_patch,
    canonical,
    changes_within,
    diff,
    exact_json,
    prove,
    quick_changes,
    same,
    scope_of,
)
from function.core.pointer import unescape
from tests.core.support import exact, pod


def reorder_metadata(pod: dict[str, Any]) -> None:
    metadata = pod["metadata"]
    items = list(metadata.items())
    metadata.clear()
    metadata.update(reversed(items))


# -- JSON equality and the diff ------------------------------------------------------------------


def test_same_is_json_equality() -> None:
    assert not same(1, True) and not same(1, 1.0) and not same({"a": 1}, {"a": True})
    assert same({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]})


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"a": 1}, {"a": 2}),
        ({"a": 1, "b": 2}, {"b": 2, "c": 3}),
        ({"l": [1, 2]}, {"l": [1, 2, 3, 4]}),
        ({"l": [1, 2, 3]}, {"l": [1]}),
        ({"l": [1, 2, 3]}, {"l": [3, 2]}),
        ({"l": [{"a": 1}]}, {"l": [{"a": 1, "b/c": 2}]}),
        ({"a": {"b": 1}}, {"a": [1]}),
        ({"x": 1}, {"x": True}),
        ({"m~": {"k/": 1}}, {"m~": {}}),
    ],
)
def test_diff_patches_apply_and_reach_the_target(old: Any, new: Any) -> None:
    ops = diff(old, new)
    prove(old, ops, new)
    assert diff(new, new) == []


def test_remove_comes_before_add_in_an_object() -> None:
    ops = diff({"r": {"nvidia.com/gpu": "1"}}, {"r": {"nvidia.com/gpu-shared": "2"}})
    assert ops == [
        {"op": "remove", "path": "/r/nvidia.com~1gpu"},
        {"op": "add", "path": "/r/nvidia.com~1gpu-shared", "value": "2"},
    ]


def test_proof_rejects_a_patch_that_does_not_apply_or_misses() -> None:
    with pytest.raises(PatchProofError, match="does not apply"):
        prove({"a": 1}, [{"op": "remove", "path": "/b"}], {})
    with pytest.raises(PatchProofError, match="differs"):
        prove({"a": 1}, [{"op": "replace", "path": "/a", "value": 2}], {"a": 3})


# -- apply_patch and prove -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        {"op": "move", "from": "/a", "path": "/b"},
        {"op": "copy", "from": "/a", "path": "/b"},
        {"op": "test", "path": "/a", "value": 1},
        {"op": "add", "path": 5, "value": 1},
        {"path": "/a", "value": 1},
    ],
)
def test_apply_patch_refuses_operations_it_does_not_support(operation: dict[str, Any]) -> None:
    document = {"a": 1}
    with pytest.raises(PatchProofError, match="unsupported operation"):
        apply_patch(document, [operation])
    assert document == {"a": 1}


def test_apply_patch_refuses_to_remove_the_whole_document_but_replaces_it() -> None:
    with pytest.raises(PatchProofError, match=r"^cannot remove the whole document$"):
        apply_patch({"a": 1}, [{"op": "remove", "path": ""}])
    assert apply_patch({"a": 1}, [{"op": "replace", "path": "", "value": {"b": 2}}]) == {"b": 2}


def test_apply_patch_names_the_path_it_cannot_follow() -> None:
    with pytest.raises(PatchProofError, match=r"^path 'a/b' does not start with /$"):
        apply_patch({"a": {}}, [{"op": "add", "path": "a/b", "value": 1}])
    with pytest.raises(PatchProofError, match=r"^path '/x/y/z' does not exist$"):
        apply_patch({"a": {}}, [{"op": "add", "path": "/x/y/z", "value": 1}])


def test_prove_without_intended_bytes_still_compares_a_result_orjson_cannot_write() -> None:
    # A result beyond 64 bits has no exact_json bytes; it must still be compared with the intended.
    original: dict[str, Any] = {"a": 2**70}
    with pytest.raises(PatchProofError, match=r"^patched object differs from the intended one$"):
        prove(original, [{"op": "add", "path": "/b", "value": 1}], {"a": 2**70, "b": 2})
    assert prove(original, [{"op": "add", "path": "/b", "value": 1}], {"a": 2**70, "b": 1}) == {
        "a": 2**70,
        "b": 1,
    }


def test_canonical_sorts_keys_and_keeps_json_types_apart() -> None:
    assert canonical({"b": 1, "a": True}) == b'{"a":true,"b":1}'
    assert canonical({"a": 1}) != canonical({"a": 1.0}) != canonical({"a": True})


def test_prove_with_the_intended_bytes() -> None:
    original = {"a": {"b": 1}, "c": {"d": 1}}
    intended = {"a": {"b": 2}, "c": {"d": 1}}
    patch = [{"op": "replace", "path": "/a/b", "value": 2}]
    result = prove(original, patch, intended, exact_json(intended))
    assert result == intended and result["c"] is original["c"]
    # bytes of another key order: the proof falls back to JSON equality and still passes
    reordered = {"c": {"d": 1}, "a": {"b": 2}}
    assert prove(original, patch, reordered, exact_json(reordered)) == intended
    # wrong bytes never prove a wrong patch
    with pytest.raises(PatchProofError, match="differs"):
        prove(original, [{"op": "replace", "path": "/a/b", "value": 3}], intended, exact_json(intended))
    with pytest.raises(PatchProofError, match="differs"):
        prove(
            original,
            [{"op": "replace", "path": "/a/b", "value": True}],
            {"a": {"b": 1}, "c": {"d": 1}},
            exact_json({"a": {"b": 1}, "c": {"d": 1}}),
        )


def test_exact_json_refuses_what_it_cannot_write_as_is() -> None:
    assert exact_json({"b": 1, "a": [True, 1.0, None]}) == b'{"b":1,"a":[true,1.0,null]}'
    for odd in (2**64, "\ud800", {1: 2}, {"a": str.__new__(type("S", (str,), {}), "x")}):
        assert exact_json(odd) is None


# -- quick_changes against diff ------------------------------------------------------------------


plain_values = st.recursive(
    st.none() | st.integers(-2, 2) | st.text("ab~/", max_size=2),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text("ab~/", max_size=2), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(old=plain_values, new=plain_values)
def test_quick_changes_agrees_with_diff_without_aliased_scalars(old: Any, new: Any) -> None:
    """Without 1/true/1.0 aliases, == and JSON agree: the quick walk must give diff's operations."""
    assert quick_changes({"r": old}, {"r": new}) == diff({"r": old}, {"r": new})


def _located(path: str, document: Any) -> tuple[str | int, ...]:
    """A patch path as the keys and indexes it goes through in ``document``."""
    keys: list[str | int] = []
    for token in path.split("/")[1:]:
        key: str | int = int(token) if isinstance(document, list) else unescape(token)
        keys.append(key)
        document = _child(document, key)
    return tuple(keys)


def _child(document: Any, key: str | int) -> Any:
    if isinstance(document, dict):
        return document.get(key)
    if isinstance(document, list) and isinstance(key, int) and key < len(document):
        return document[key]
    return None


@settings(max_examples=300, deadline=None)
@given(old=plain_values, new=plain_values, data=st.data())
def test_changes_within_a_scope_covering_every_change_gives_quick_changes_operations(
    old: Any, new: Any, data: st.DataObject
) -> None:
    """Looking only where the changes are (each operation's place, or any level above it, as a
    mutator says it touched a subtree) gives the whole walk's operations, in the same order."""
    whole = quick_changes({"r": old}, {"r": new})
    paths = [_located(op["path"], {"r": old}) for op in whole]
    cut = [path[: data.draw(st.integers(1, len(path)))] for path in paths]
    scope = scope_of(cut)
    assert scope is not None
    assert changes_within({"r": old}, {"r": new}, scope) == whole


def test_changes_within_misses_what_its_scope_leaves_out() -> None:
    """What the proof catches (the engine then builds the patch from the whole Pod)."""
    old, new = {"a": {"x": 1}, "b": 1}, {"a": {"x": 2}, "b": 2}
    assert changes_within(old, new, {"a": None}) == [{"op": "replace", "path": "/a/x", "value": 2}]
    assert scope_of([("a", "x"), ()]) is None


def test_quick_changes_sees_a_member_of_another_type() -> None:
    assert quick_changes({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert quick_changes({"a": 1}, {"a": 1}) == []


def test_quick_changes_orders_removes_changes_adds() -> None:
    old = {"x": 1, "keep": {"v": 1}, "gone/": 2}
    new = {"new~": {"n": [1]}, "keep": {"v": 2}, "x": 1}
    assert quick_changes(old, new) == [
        {"op": "remove", "path": "/gone~1"},
        {"op": "replace", "path": "/keep/v", "value": 2},
        {"op": "add", "path": "/new~0", "value": {"n": [1]}},
    ]
    assert quick_changes(old, new)[2]["value"] is not new["new~"]  # values are copies
    assert quick_changes({"l": [1, 2]}, {"l": [1, 2, 3]}) == [{"op": "add", "path": "/l/2", "value": 3}]
    assert quick_changes({"l": [1, 2, 3]}, {"l": [1]}) == [
        {"op": "remove", "path": "/l/2"},
        {"op": "remove", "path": "/l/1"},
    ]
    assert quick_changes({"l": [1, 2]}, {"l": [2]}) == [{"op": "replace", "path": "/l", "value": [2]}]
    assert quick_changes({"l": [{"a": 1}]}, {"l": [{"a": 2}]}) == [
        {"op": "replace", "path": "/l/0/a", "value": 2}
    ]


# -- apply_patch against jsonpatch: remembered parents stay true ----------------------------------


def jsonpatch_result(document: Any, patch: list[Any]) -> Any:
    try:
        return jsonpatch.JsonPatch(copy.deepcopy(patch)).apply(document, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError, TypeError):
        return PatchProofError


def ours(document: Any, patch: list[Any]) -> Any:
    try:
        return apply_patch(document, copy.deepcopy(patch))
    except PatchProofError:
        return PatchProofError


@pytest.mark.parametrize(
    "patch",
    [
        # a remembered parent under a list that shifted must not be reused
        [
            {"op": "add", "path": "/l/1/x", "value": 1},
            {"op": "remove", "path": "/l/0"},
            {"op": "add", "path": "/l/1/y", "value": 2},
        ],
        [
            {"op": "add", "path": "/l/0/x", "value": 1},
            {"op": "add", "path": "/l/0", "value": {"new": True}},
            {"op": "add", "path": "/l/0/y", "value": 2},
        ],
        # the trail to a sibling must not survive a replaced ancestor, the document included
        [
            {"op": "add", "path": "/m/a/x", "value": 1},
            {"op": "replace", "path": "", "value": {"m": {"a": {}}}},
            {"op": "add", "path": "/m/a/z", "value": 3},
        ],
        [
            {"op": "add", "path": "/m/k", "value": 1},
            {"op": "add", "path": "/m/a/x", "value": 1},
            {"op": "replace", "path": "/m/a", "value": {"b": {}}},
            {"op": "add", "path": "/m/a/z", "value": 3},
        ],
        [
            {"op": "add", "path": "/m/a/x", "value": 1},
            {"op": "replace", "path": "/m", "value": {"a": {}, "b": {}}},
            {"op": "add", "path": "/m/b/y", "value": 2},
            {"op": "add", "path": "/m/a/z", "value": 3},
        ],
        [
            {"op": "add", "path": "/m/a/x", "value": 1},
            {"op": "add", "path": "/m/b/y", "value": 2},
            {"op": "remove", "path": "/m/a/k"},
            {"op": "add", "path": "/m/a/w", "value": 4},
        ],
        [
            {"op": "add", "path": "/l/1/x", "value": 1},
            {"op": "replace", "path": "/l/1", "value": {"r": 1}},
            {"op": "add", "path": "/l/1/y", "value": 2},
        ],
        [
            {"op": "add", "path": "/m/a/x", "value": 1},
            {"op": "add", "path": "/m/a", "value": {"fresh": 1}},
            {"op": "add", "path": "/m/a/y", "value": 2},
        ],
        [
            {"op": "add", "path": "/m/a/x", "value": 1},
            {"op": "remove", "path": "/m"},
            {"op": "add", "path": "/m/a/y", "value": 2},
        ],
    ],
)
def test_apply_patch_matches_jsonpatch_when_parents_move_or_go(patch: list[Any]) -> None:
    document = {"l": [{"a": 0}, {"a": 1}], "m": {"a": {"k": 1}, "b": {}}}
    before = exact(document)
    assert same(ours(document, patch), jsonpatch_result(document, patch)) or ours(
        document, patch
    ) == jsonpatch_result(document, patch)
    assert exact(document) == before


paths = st.lists(st.sampled_from(["l", "m", "0", "1", "2", "a", "b", "-"]), min_size=1, max_size=3).map(
    lambda tokens: "/" + "/".join(tokens)
)


operations = st.builds(
    lambda op, path, value: {"op": op, "path": path, "value": value},
    st.sampled_from(["add", "remove", "replace"]),
    paths,
    st.sampled_from([1, "v", {}, {"a": 1}, [], [0]]),
)


@settings(max_examples=400, deadline=None)
@given(patch=st.lists(operations, max_size=6))
def test_apply_patch_matches_jsonpatch_on_any_patch(patch: list[Any]) -> None:
    document = {"l": [{"a": 0}, {"a": 1}, [2]], "m": {"a": {"b": 1}, "b": [1]}}
    before = exact(document)
    mine, theirs = ours(document, patch), jsonpatch_result(document, patch)
    if theirs is PatchProofError or mine is PatchProofError:
        assert mine is theirs
    else:
        assert same(mine, theirs)
    assert exact(document) == before


# -- the working copy -----------------------------------------------------------------------------


def test_the_copy_equals_the_original_exactly_and_shares_nothing_mutable() -> None:
    original = pod()
    working = WorkingCopy(original)
    assert exact(working.pod) == exact(original)
    assert (
        working.pod is not original
        and working.pod["spec"]["containers"] is not original["spec"]["containers"]
    )
    assert working.json == exact_json(original)


def test_settle_keeps_the_record_in_step_with_the_pod() -> None:
    working = WorkingCopy(pod())
    assert working.settle() is False
    working.pod["metadata"]["annotations"]["y"] = "2"
    assert working.settle() is True
    assert working.json == exact_json(working.pod)
    assert working.settle() is False  # the change became the record
    working.pod["metadata"]["annotations"]["y"] = "3"  # same length
    assert working.settle() is True and working.json == exact_json(working.pod)
    reorder_metadata(working.pod)
    assert working.settle() is False
    assert working.json == exact_json(working.pod)  # put back exactly as recorded


# -- the patch helpers at their edges: canonical bytes, typed equality, every refusal's words -----
def test_canonical_is_json_with_sorted_keys() -> None:
    assert canonical({"b": 1, "a": [True, 1.0, None]}) == b'{"a":[true,1.0,null],"b":1}'


def test_same_tells_types_apart_where_orjson_cannot_write_the_value() -> None:
    # An integer beyond 64 bits: orjson refuses it, so the typed walk decides.
    big = 2**70
    assert same({"n": big, "x": [1, "s"]}, {"n": big, "x": [1, "s"]})
    assert not same({"n": big, "x": 1}, {"n": big, "x": True})
    assert not same([big, 1], [big, 1.0])


def test_quick_changes_skips_list_members_that_are_equal_but_not_the_same_object() -> None:
    # The engine's working copy shares no object with the original: an untouched string in a list
    # is equal, not identical, and must not become an operation.
    old: dict[str, list[Any]] = {"args": ["".join(["--", "port"]), "8080"], "n": [10**6, 2.5]}
    new: dict[str, list[Any]] = {"args": ["".join(["--", "port"]), "9090"], "n": [int("1000000"), 2.5]}
    assert old["args"][0] is not new["args"][0]
    ops = quick_changes(old, new)
    assert ops == [{"op": "replace", "path": "/args/1", "value": "9090"}]
    assert ops == diff(old, new)


@pytest.mark.parametrize(
    ("document", "patch", "message"),
    [
        ({"a": 1}, [{"op": "remove", "path": ""}], "cannot remove the whole document"),
        ({"a": 1}, [{"op": "add", "path": "a", "value": 2}], "path 'a' does not start with /"),
        ({"a": [1]}, [{"op": "replace", "path": "/a/01", "value": 2}], "'01' is not an array index"),
        ({"a": [1]}, [{"op": "add", "path": "/a/5", "value": 2}], "array index 5 out of range"),
        ({"a": [1]}, [{"op": "replace", "path": "/a/1", "value": 2}], "array index 1 out of range"),
        ({"a": {}}, [{"op": "add", "path": "/a/b/c", "value": 2}], "path '/a/b/c' does not exist"),
        ({"a": {}}, [{"op": "remove", "path": "/a/b"}], "path '/a/b' does not exist"),
        ({"a": 1}, [{"op": "add", "path": "/a/b", "value": 2}], "path '/a/b' goes through a scalar"),
        ({"a": 1}, [{"op": "move", "path": "/a", "from": "/b"}], "unsupported operation"),
    ],
)
def test_a_refused_patch_says_why(document: Any, patch: list[Any], message: str) -> None:
    with pytest.raises(PatchProofError) as refused:
        apply_patch(document, patch)
    assert message in str(refused.value)


def test_an_index_through_a_list_on_the_way_is_checked_like_the_last_one() -> None:
    document = {"a": [{"b": 1}]}
    assert apply_patch(document, [{"op": "replace", "path": "/a/0/b", "value": 2}]) == {"a": [{"b": 2}]}
    with pytest.raises(PatchProofError, match="array index 1 out of range"):
        apply_patch(document, [{"op": "replace", "path": "/a/1/b", "value": 2}])
    with pytest.raises(PatchProofError, match="'-' is not an array index"):
        apply_patch(document, [{"op": "add", "path": "/a/-/b", "value": 2}])


def test_a_patch_that_applies_but_misses_the_intended_pod_says_so() -> None:
    original = {"a": 1, "b": [1]}
    with pytest.raises(PatchProofError, match=r"^patched object differs from the intended one$"):
        prove(original, [{"op": "replace", "path": "/a", "value": 2}], {"a": 2, "b": [1, 2]})
    with pytest.raises(PatchProofError, match=r"^patch does not apply: path '/c/d' does not exist$"):
        prove(original, [{"op": "add", "path": "/c/d", "value": 2}], {"a": 1})
