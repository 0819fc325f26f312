"""function/core/rules.py, the apiserver's rules the proof applies. The proof's question: which rules
does the patched Pod break that the original kept (extended resources and placement fields, one
answer). The extended-resource rules in full: which names are extended resources, every problem of
every container however malformed the ones before it, zero as a valid count, what a patch is blamed
for, and the quantities they read. (The placement fields' rules word for word:
tests/core/test_placement.py; the quantity grammar: tests/core/test_quantity.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from function.core.json_patch import apply_patch
from function.core.rules import (
    extended_resource_violations,
    introduced,
    introduced_violations,
    is_extended_resource,
    placement_fields,
)
from tests.core.support import pod


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


# -- extended resources in full: names, every problem of every container, what a patch is blamed for
@pytest.mark.parametrize(
    ("name", "extended"),
    [
        ("nvidia.com/gpu", True),
        ("example.com/foo", True),
        ("cpu", False),
        ("requests.nvidia.com/gpu", False),  # quota syntax
        ("kubernetes.io/foo", False),
        ("sub.kubernetes.io/foo", False),
        ("kubernetes.io/a/b", False),  # the domain is what comes before the first slash
        ("notkubernetes.io/foo", True),
    ],
)
def test_what_is_an_extended_resource(name: str, extended: bool) -> None:
    assert is_extended_resource(name) is extended


def pod_of(*containers: Any) -> dict[str, Any]:
    return {"spec": {"containers": list(containers)}}


def resources(limits: Any = None, requests: Any = None, name: str | None = "c") -> dict[str, Any]:
    container: dict[str, Any] = {"resources": {}}
    if name is not None:
        container["name"] = name
    if limits is not None:
        container["resources"]["limits"] = limits
    if requests is not None:
        container["resources"]["requests"] = requests
    return container


BROKEN_SECOND = resources({"example.com/foo": "1"}, {"example.com/foo": "2"}, name="second")
SECOND_PROBLEM = "spec.containers[1] (second): example.com/foo request must equal its limit"


@pytest.mark.parametrize(
    "first",
    [
        {"name": "first", "resources": "not a map"},
        resources("not a map", {"example.com/foo": "1"}, name="first"),
        resources({"example.com/foo": "1"}, ["not", "a", "map"], name="first"),
        resources({"example.com/foo": "one"}, name="first"),
    ],
    ids=["resources", "limits", "requests", "quantity"],
)
def test_a_malformed_container_does_not_hide_the_next_ones_problems(first: dict[str, Any]) -> None:
    assert SECOND_PROBLEM in extended_resource_violations(pod_of(first, BROKEN_SECOND))


def test_either_section_not_a_map_is_named() -> None:
    for container in (
        resources("not a map", {"example.com/foo": "1"}),
        resources({"example.com/foo": "1"}, "not a map"),
    ):
        assert extended_resource_violations(pod_of(container)) == {
            "spec.containers[0] (c): resources.limits and resources.requests must be maps"
        }


def test_every_problem_of_a_container_is_reported_and_a_nameless_one_is_marked() -> None:
    container = resources({"a.io/x": "bad", "b.io/y": "1.5", "c.io/z": "-1"}, {"a.io/x": "0.5"}, name=None)
    assert extended_resource_violations(pod_of(container)) == {
        "spec.containers[0] (?): limits[a.io/x] is not a valid quantity",
        "spec.containers[0] (?): requests[a.io/x] must be an integer",
        "spec.containers[0] (?): limits[b.io/y] must be an integer",
        "spec.containers[0] (?): limits[c.io/z] must be non-negative",
    }


def test_zero_is_a_valid_count() -> None:
    container = resources({"nvidia.com/gpu": "0"}, {"nvidia.com/gpu": "0"})
    assert extended_resource_violations(pod_of(container)) == set()


def test_a_patch_is_blamed_only_in_containers_it_found_valid() -> None:
    already_broken = resources({"a.io/x": "1.5"}, name="old")
    valid = resources({"a.io/x": "1"}, name="fine")
    original = pod_of(already_broken, valid)
    result = pod_of(
        resources({"a.io/x": "1.5", "b.io/y": "2.5"}, name="old"),  # worse, but it was broken already
        resources({"a.io/x": "1"}, {"a.io/x": "2"}, name="fine"),  # broken by the patch
    )
    assert introduced_violations(original, result) == {
        "spec.containers[1] (fine): a.io/x request must equal its limit"
    }
    assert introduced_violations(original, original) == set()


# -- quantities the extended-resource rules read -----------------------------------------------
def test_resources_that_are_not_extended_do_not_end_the_check() -> None:
    # Names come from a set, in no fixed order: ten ordinary names among ten broken extended ones,
    # so a check that stopped at the first ordinary name would miss some in all but one order of
    # 184,756.
    ordinary = {name: "1" for name in ("cpu", "memory", "ephemeral-storage", "pods", "storage")}
    ordinary |= {f"hugepages-{size}": "1" for size in ("1Gi", "2Mi", "32Mi", "64Ki", "16Gi")}
    broken = {f"x{n}.io/r": "1.5" for n in range(10)}
    container = resources({**ordinary, **broken})
    assert extended_resource_violations(pod_of(container)) == {
        f"spec.containers[0] (c): limits[{name}] must be an integer" for name in broken
    }


def test_a_request_without_a_limit_is_still_checked_as_a_quantity() -> None:
    assert extended_resource_violations(pod_of(resources(requests={"a.io/x": "1.5"}))) == {
        "spec.containers[0] (c): requests[a.io/x] must be an integer",
        "spec.containers[0] (c): a.io/x has a request but no limit",
    }


# -- extended resources, in brief ---------------------------------------------------------------
def pod_with(resources: dict[str, Any], kind: str = "containers") -> dict[str, Any]:
    return {"kind": "Pod", "spec": {kind: [{"name": "c", "resources": resources}]}}


def test_extended_resource_names() -> None:
    assert is_extended_resource("nvidia.com/gpu")
    assert not is_extended_resource("cpu")
    assert not is_extended_resource("hugepages-2Mi")
    assert not is_extended_resource("kubernetes.io/something")
    assert not is_extended_resource("requests.nvidia.com/gpu")


@pytest.mark.parametrize(
    ("resources", "problem"),
    [
        ({"requests": {"nvidia.com/gpu": "1"}}, "has a request but no limit"),
        ({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}, "must equal its limit"),
        ({"limits": {"nvidia.com/gpu": "1.5"}}, "must be an integer"),
        (
            {"limits": {"nvidia.com/gpu": "500m"}, "requests": {"nvidia.com/gpu": "500m"}},
            "must be an integer",
        ),
        ({"limits": {"nvidia.com/gpu": "-1"}}, "must be non-negative"),
        ({"limits": {"nvidia.com/gpu": "x"}}, "not a valid quantity"),
    ],
)
def test_extended_resource_violations(resources: dict[str, Any], problem: str) -> None:
    found = extended_resource_violations(pod_with(resources, "initContainers"))
    assert any(problem in p for p in found), found


def test_valid_extended_resources_have_no_violations() -> None:
    assert not extended_resource_violations(pod_with({"limits": {"nvidia.com/gpu": "1"}}))
    assert not extended_resource_violations(
        pod_with(
            {"limits": {"nvidia.com/gpu": "1", "cpu": "500m"}, "requests": {"nvidia.com/gpu": 1, "cpu": "1"}}
        )
    )


_LABEL_KEYS = st.sampled_from(["app", "tier", "bad key!", "x.io/ok", "-no", "a" * 64, "castops.io/p"])
_LABEL_VALUES = st.one_of(st.sampled_from(["v", "", "not valid!", "b" * 64]), st.integers(0, 2), st.none())
_MAPS = st.one_of(st.none(), st.just([]), st.dictionaries(_LABEL_KEYS, _LABEL_VALUES, max_size=5))


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries({"labels": _MAPS, "annotations": _MAPS, "nodeSelector": _MAPS}),
    st.fixed_dictionaries({"labels": _MAPS, "annotations": _MAPS, "nodeSelector": _MAPS}),
    st.sampled_from(["labels", "annotations", "nodeSelector"]),
)
def test_only_the_entries_a_patch_changed_are_judged_and_the_answer_is_the_whole_walks(
    before: dict[str, Any], after: dict[str, Any], kept: str
) -> None:
    """A patch that adds one annotation does not walk every label and annotation of the Pod (a
    3 MiB Pod's labels were most of its review), and the answer is still exactly the whole
    walks' difference, whatever the maps hold; a map the patch kept is the very same object."""
    from function.core.rules import scheduling_violations

    def made(fields: dict[str, Any]) -> dict[str, Any]:
        metadata = {key: fields[key] for key in ("labels", "annotations") if fields[key] is not None}
        spec: dict[str, Any] = {"containers": [{"name": "c"}]}
        if fields["nodeSelector"] is not None:
            spec["nodeSelector"] = fields["nodeSelector"]
        return {"metadata": metadata, "spec": spec}

    original, result = made(before), made(after)
    where = result["spec"] if kept == "nodeSelector" else result["metadata"]
    source = original["spec"] if kept == "nodeSelector" else original["metadata"]
    if kept in source:
        where[kept] = source[kept]  # the very object, as a patch that leaves it alone shares it
    else:
        where.pop(kept, None)
    whole = introduced_violations(original, result) | (
        scheduling_violations(result) - scheduling_violations(original)
    )
    assert introduced(original, result) == whole
