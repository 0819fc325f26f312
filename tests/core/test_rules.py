"""The proof's question, asked of rules.py: which of the apiserver's rules does the patched Pod
break that the original kept (extended resources and placement fields, one answer)."""

from __future__ import annotations

from typing import Any

from function.core.json_patch import apply_patch
from function.core.rules import introduced, placement_fields


def pod() -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "a"}, "annotations": {"x": "1"}},
        "spec": {"containers": [{"name": "c", "image": "i"}], "priority": 1},
    }


def patched(original: dict[str, Any], *operations: dict[str, Any]) -> Any:
    return apply_patch(original, list(operations))


def test_a_broken_extended_resource_and_a_broken_label_are_both_named() -> None:
    original = pod()
    result = patched(
        original,
        {"op": "add", "path": "/spec/containers/0/resources", "value": {"requests": {"x.io/gpu": "1"}}},
        {"op": "add", "path": "/metadata/labels/bad key!", "value": "v"},
    )
    assert introduced(original, result) == {
        "spec.containers[0] (c): x.io/gpu has a request but no limit",
        "metadata.labels[bad key!]: not a valid label",
    }


def test_what_the_original_breaks_already_is_not_introduced() -> None:
    original = pod()
    original["metadata"]["labels"]["bad key!"] = "v"
    result = patched(original, {"op": "add", "path": "/metadata/labels/b", "value": "2"})
    assert introduced(original, result) == set()


def test_placement_fields_the_patch_leaves_alone_are_not_walked() -> None:
    # The very same objects in both Pods: their violations are the original's, so none is new,
    # however bad (a patch touching only resources never looks at them).
    original = pod()
    original["spec"]["tolerations"] = [{"operator": "Sometimes"}]
    result = patched(original, {"op": "replace", "path": "/spec/priority", "value": 2})
    assert placement_fields(result)[3] is original["spec"]["tolerations"]
    assert introduced(original, result) == set()


def test_a_good_patch_introduces_nothing() -> None:
    original = pod()
    limits = {"limits": {"x.io/gpu": "1"}, "requests": {"x.io/gpu": "1"}}
    result = patched(
        original,
        {"op": "add", "path": "/spec/containers/0/resources", "value": limits},
        {"op": "add", "path": "/spec/nodeSelector", "value": {"pool": "gpu"}},
    )
    assert introduced(original, result) == set()


def test_placement_fields_are_what_scheduling_violations_reads() -> None:
    full = pod()
    full["spec"].update(nodeSelector={"n": "1"}, tolerations=[], affinity={})
    fields = placement_fields(full)
    assert fields == ({"app": "a"}, {"x": "1"}, {"n": "1"}, [], {})
    assert fields[0] is full["metadata"]["labels"] and fields[4] is full["spec"]["affinity"]
    assert placement_fields({"metadata": "x", "spec": []}) == (None, None, None, None, None)
    assert placement_fields({"spec": {"tolerations": [1]}}) == (None, None, None, [1], None)
