"""The apiserver's extended-resource rules as the proof applies them, and the quantity grammar under
them, in full: which names are extended resources, every problem of every container found however
malformed the ones before it are, zero as a valid count, what a patch is blamed for, and what a bad
quantity says. Written from a mutmut run over function/core/rules.py and function/core/quantity.py."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from function.core.quantity import QuantityError, parse_quantity
from function.core.rules import extended_resource_violations, introduced_violations, is_extended_resource


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


# -- quantities ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", 1),
        ("123456789012345678", 123456789012345678),  # the longest plain number on the fast path
        ("1234567890123456789", 1234567890123456789),  # one digit more: the grammar's path
        ("1e1000", Fraction(10) ** 1000),
        ("1e-1000", Fraction(1, 10**1000)),
        ("1.5Ki", 1536),
        ("500m", Fraction(1, 2)),
        (2, 2),
    ],
)
def test_quantities_parse_exactly(raw: object, value: Fraction | int) -> None:
    assert parse_quantity(raw) == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (True, "True is not a quantity"),
        (None, "None is not a quantity"),
        ("", "'' is not a quantity"),
        ("1e", "'1e' is not a quantity"),
        (" 1", "' 1' is not a quantity"),
        ("1e1001", "'1e1001' has an exponent out of range"),
        ("1e-1001", "'1e-1001' has an exponent out of range"),
    ],
)
def test_a_bad_quantity_says_what_it_is(raw: object, message: str) -> None:
    with pytest.raises(QuantityError) as bad:
        parse_quantity(raw)
    assert str(bad.value) == message


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
