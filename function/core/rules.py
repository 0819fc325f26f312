"""The apiserver's validation rules that a patch could break, as pure checks over a Pod dict.

The rules a patch from the GPU mutators could break (they touch only extended resources), checked
before any patch is sent (ValidateResourceRequirements in k8s.io/kubernetes/pkg/apis/core):
an extended resource must be a whole number, a request needs an equal limit.
"""

from __future__ import annotations

from typing import Any

from function.core.pod import iter_containers
from function.core.quantity import QuantityError, parse_quantity


def is_extended_resource(name: str) -> bool:
    """Mirrors v1helper.IsExtendedResourceName: prefixed, outside kubernetes.io, not quota syntax."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def extended_resource_violations(pod: dict[str, Any]) -> set[str]:
    """Every way this Pod breaks the extended-resource rules, as stable human-readable strings."""
    problems: set[str] = set()
    for kind, index, container in iter_containers(pod):
        where = f"spec.{kind}[{index}] ({container.get('name', '?')})"
        resources = container.get("resources") or {}
        if not isinstance(resources, dict):
            continue
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        if not isinstance(limits, dict) or not isinstance(requests, dict):
            problems.add(f"{where}: resources.limits and resources.requests must be maps")
            continue
        for name in set(limits) | set(requests):
            if not is_extended_resource(name):
                continue
            values = {}
            for section, quantities in (("limits", limits), ("requests", requests)):
                if name not in quantities:
                    continue
                try:
                    value = parse_quantity(quantities[name])
                except QuantityError:
                    problems.add(f"{where}: {section}[{name}] is not a valid quantity")
                    continue
                if value.denominator != 1:
                    problems.add(f"{where}: {section}[{name}] must be an integer")
                if value < 0:
                    problems.add(f"{where}: {section}[{name}] must be non-negative")
                values[section] = value
            if name in requests and name not in limits:
                problems.add(f"{where}: {name} has a request but no limit")
            elif len(values) == 2 and values["limits"] != values["requests"]:
                problems.add(f"{where}: {name} request must equal its limit")
    return problems


def introduced_violations(original: dict[str, Any], result: dict[str, Any]) -> set[str]:
    """The violations ``result`` has and ``original`` has not, in containers the original kept
    within the rules. A container the apiserver rejects already (say, ``limits: 1.0``, which no
    apiserver sends but a hostile client can) is not made any more rejectable by a mutation; a
    valid container is always held to every rule."""
    after = extended_resource_violations(result)
    if not after:
        return after  # the common case: one walk, the original's violations never needed
    before = extended_resource_violations(original)
    broken = {problem.split(": ", 1)[0] for problem in before}
    return {problem for problem in after - before if problem.split(": ", 1)[0] not in broken}
