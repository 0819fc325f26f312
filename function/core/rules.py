"""The apiserver's validation rules that a patch could break, as pure checks over a Pod dict.

The rules a patch from the GPU mutators could break, checked before any patch is sent
(k8s.io/kubernetes/pkg/apis/core/validation, 1.37):

- extended resources (ValidateResourceRequirements): a whole number, a request needs an equal limit;
- resource claims (validatePodResourceClaim, validateResourceClaimNames): every Pod claim has a
  unique DNS-label name and exactly one of ``resourceClaimName`` and ``resourceClaimTemplateName``,
  a DNS subdomain; a container's ``resources.claims`` names only Pod claims, each once (a claim
  and one of its requests count as the same); ephemeral containers have no resources; a static
  (mirror) Pod has no claims.
"""

from __future__ import annotations

import re
from typing import Any

from function.core.pod import iter_containers
from function.core.quantity import QuantityError, parse_quantity

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def is_dns_label(value: object) -> bool:
    """RFC 1123 label (a Pod claim's name): at most 63 lower-case letters, digits and '-'."""
    return isinstance(value, str) and len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: object) -> bool:
    """RFC 1123 subdomain (an object's name): at most 253 characters, labels joined by '.'."""
    return isinstance(value, str) and len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))


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


def resource_claim_violations(pod: dict[str, Any]) -> set[str]:
    """Every way this Pod breaks the resource-claim rules (see the module), as stable strings."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return set()
    problems: set[str] = set()
    claims = spec.get("resourceClaims")
    if claims is not None and not isinstance(claims, list):
        problems.add("spec.resourceClaims must be a list")
        claims = None
    names = _pod_claim_names(claims or [], problems)
    if claims and _is_mirror_pod(pod):
        problems.add("spec.resourceClaims: static pods do not support resource claims")
    for kind, index, container in iter_containers(pod):
        resources = container.get("resources")
        references = resources.get("claims") if isinstance(resources, dict) else None
        if references is None:
            continue
        where = f"spec.{kind}[{index}] ({container.get('name', '?')})"
        if kind == "ephemeralContainers":
            problems.add(f"{where}: resources.claims may not be set in an ephemeral container")
        elif not isinstance(references, list):
            problems.add(f"{where}: resources.claims must be a list")
        else:
            _check_references(references, names, where, problems)
    return problems


def _pod_claim_names(claims: list[Any], problems: set[str]) -> set[str]:
    """The names of the Pod's claims (every non-empty one, as the apiserver gathers them),
    adding each claim's problems to ``problems``."""
    names: set[str] = set()
    for position, claim in enumerate(claims):
        where = f"spec.resourceClaims[{position}]"
        if not isinstance(claim, dict):
            problems.add(f"{where}: must be an object")
            continue
        name = claim.get("name")
        if not name:
            problems.add(f"{where}.name: required")
        elif not isinstance(name, str) or not is_dns_label(name):
            problems.add(f"{where}.name: {name!r} is not a DNS label")
        elif name in names:
            problems.add(f"{where}.name: {name!r} is a duplicate")
        if isinstance(name, str) and name:
            names.add(name)
        sources = [
            key for key in ("resourceClaimName", "resourceClaimTemplateName") if claim.get(key) is not None
        ]
        if len(sources) != 1:
            problems.add(f"{where}: needs exactly one of resourceClaimName and resourceClaimTemplateName")
        for key in sources:
            if not is_dns_subdomain(claim[key]):
                problems.add(f"{where}.{key}: {claim[key]!r} is not a DNS subdomain")
    return names


def _check_references(references: list[Any], names: set[str], where: str, problems: set[str]) -> None:
    seen: set[str] = set()
    for position, reference in enumerate(references):
        at = f"{where}: resources.claims[{position}]"
        if not isinstance(reference, dict):
            problems.add(f"{at} must be an object")
            continue
        name, request = reference.get("name"), reference.get("request") or ""
        if not name or not isinstance(name, str):
            problems.add(f"{at}.name: required")
            continue
        if request and not is_dns_label(request):
            problems.add(f"{at}.request: {request!r} is not a DNS label")
        key = f"{name}/{request}" if request else name
        # A whole claim and one of its requests overlap: either way round is a duplicate.
        overlaps = (
            name in seen or key in seen or (not request and any(s.startswith(name + "/") for s in seen))
        )
        if overlaps:
            problems.add(f"{at}: {key!r} is a duplicate")
        seen.add(key)
        if name not in names:
            problems.add(f"{at}: {name!r} must be one of the names in spec.resourceClaims")


def _is_mirror_pod(pod: dict[str, Any]) -> bool:
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return isinstance(annotations, dict) and MIRROR_POD_ANNOTATION in annotations


def pod_violations(pod: dict[str, Any]) -> set[str]:
    """Every rule of this module the Pod breaks."""
    return extended_resource_violations(pod) | resource_claim_violations(pod)


def introduced_violations(original: dict[str, Any], result: dict[str, Any]) -> set[str]:
    """The violations ``result`` has and ``original`` has not, in containers the original kept
    within the rules. A container the apiserver rejects already (say, ``limits: 1.0``, which no
    apiserver sends but a hostile client can) is not made any more rejectable by a mutation; a
    valid container is always held to every rule."""
    after = pod_violations(result)
    if not after:
        return after  # the common case: the original's violations never needed
    before = pod_violations(original)
    broken = {problem.split(": ", 1)[0] for problem in before}
    return {problem for problem in after - before if problem.split(": ", 1)[0] not in broken}
