"""What the apiserver would reject in a Pod: every rule the engine's proof holds a patch to.

A patch is sent only when the Pod it makes breaks no rule the original kept (``introduced``).
The rules, from k8s.io/kubernetes/pkg/apis/core/validation (1.37), for what the mutators write:

- extended resources (ValidateResourceRequirements): a whole, non-negative number, a request
  needs an equal limit; the GPU mutators write these;
- resource claims (validatePodResourceClaim, validateResourceClaimNames): every Pod claim has a
  unique DNS-label name and exactly one of ``resourceClaimName`` and ``resourceClaimTemplateName``,
  a DNS subdomain; a container's ``resources.claims`` names only Pod claims, each once (a claim
  and one of its requests count as the same); ephemeral containers have no resources; a static
  (mirror) Pod has no claims; GPU slicing's dra backend writes these;
- placement fields (ValidatePod): label keys and values, annotation values, nodeSelector,
  tolerations and node affinity requirements; the spot and PodMutation mutators write these.

Pure checks over a Pod dict, as stable human-readable strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from operator import is_not
from typing import Any

from function.core.pod import Pod, iter_containers
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


# -- labels ---------------------------------------------------------------------------------------
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid Kubernetes label key, or None (apimachinery IsQualifiedName)."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "the prefix must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return "the name must be 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value, or None (apimachinery IsValidLabelValue)."""
    if len(value) > 63 or not _LABEL_NAME.match(value):
        return "a label value is at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return None


# -- extended resources and resource claims --------------------------------------------------------
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
    """Every resource rule the Pod breaks: extended resources and claims (placement fields:
    ``scheduling_violations``)."""
    return extended_resource_violations(pod) | resource_claim_violations(pod)


def introduced_violations(original: dict[str, Any], result: dict[str, Any]) -> set[str]:
    """The resource violations ``result`` has and ``original`` has not, in containers the original kept
    within the rules. A container the apiserver rejects already (say, ``limits: 1.0``, which no
    apiserver sends but a hostile client can) is not made any more rejectable by a mutation; a
    valid container is always held to every rule."""
    after = pod_violations(result)
    if not after:
        return after  # the common case: the original's violations never needed
    before = pod_violations(original)
    broken = {problem.split(": ", 1)[0] for problem in before}
    return {problem for problem in after - before if problem.split(": ", 1)[0] not in broken}


# -- placement fields -----------------------------------------------------------------------------
def _requirement_problems(where: str, requirement: object) -> set[str]:
    if not isinstance(requirement, dict):
        return {f"{where}: must be a map"}
    operator, values = requirement.get("operator"), requirement.get("values")
    problems = set()
    key = requirement.get("key")
    if not isinstance(key, str) or label_key_problem(key):
        problems.add(f"{where}: key {key!r} is not a valid label key")
    if operator in ("In", "NotIn"):
        if not isinstance(values, list) or not values:
            problems.add(f"{where}: {operator} needs values")
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            problems.add(f"{where}: {operator} takes no values")
    elif operator in ("Gt", "Lt"):
        if not isinstance(values, list) or len(values) != 1:
            problems.add(f"{where}: {operator} needs exactly one value")
    else:
        problems.add(f"{where}: operator {operator!r} is not valid")
    return problems


def placement_fields(pod: Pod) -> tuple[Any, Any, Any, Any, Any]:
    """Everything ``scheduling_violations`` reads, and all it reads (None where absent): labels,
    annotations, nodeSelector, tolerations and affinity. Two Pods holding the very same objects
    there have the same violations, which spares the engine the check when a patch leaves them
    all alone (the patched Pod shares every subtree the patch does not touch)."""
    metadata = pod.get("metadata")
    if isinstance(metadata, dict):
        labels, annotations = metadata.get("labels"), metadata.get("annotations")
    else:
        labels = annotations = None
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return labels, annotations, None, None, None
    return labels, annotations, spec.get("nodeSelector"), spec.get("tolerations"), spec.get("affinity")


def scheduling_violations(pod: Pod) -> set[str]:
    """How the Pod's placement fields (labels, tolerations, nodeSelector, node affinity) break the
    apiserver's validation (ValidatePod in k8s.io/kubernetes/pkg/apis/core/validation), as stable
    strings. The spot and PodMutation mutators write these fields."""
    labels, annotations, selector, tolerations, affinity = placement_fields(pod)
    return (
        _label_problems("metadata.labels", labels)
        | _annotation_problems(annotations)
        | _selector_problems(selector)
        | _toleration_problems(tolerations)
        | _affinity_problems(affinity)
    )


def _entries(mapping: Any, keys: Iterable[Any] | None) -> Iterator[tuple[Any, Any]]:
    """The map's entries, or only those of ``keys`` (None: all); nothing when it is no map."""
    if not isinstance(mapping, dict):
        return iter(())
    return iter(mapping.items()) if keys is None else ((key, mapping[key]) for key in keys)


def _label_problems(where: str, labels: Any, keys: Iterable[Any] | None = None) -> set[str]:
    return {
        f"{where}[{key}]: not a valid label"
        for key, value in _entries(labels, keys)
        if label_key_problem(str(key)) or not isinstance(value, str) or label_value_problem(value)
    }


def _annotation_problems(annotations: Any, keys: Iterable[Any] | None = None) -> set[str]:
    return {
        f"metadata.annotations[{key}]: must be a string"
        for key, value in _entries(annotations, keys)
        if not isinstance(value, str)
    }


def _selector_problems(selector: Any, keys: Iterable[Any] | None = None) -> set[str]:
    problems = _label_problems("spec.nodeSelector", selector, keys)
    if selector is not None and not isinstance(selector, dict):
        problems.add("spec.nodeSelector: must be a map")
    return problems


def _toleration_problems(tolerations: Any) -> set[str]:
    problems: set[str] = set()
    for index, toleration in enumerate(tolerations if isinstance(tolerations, list) else ()):
        where = f"spec.tolerations[{index}]"
        if not isinstance(toleration, dict):
            problems.add(f"{where}: must be a map")
            continue
        operator = toleration.get("operator")  # absent or "" means Equal
        if operator not in ("Equal", "Exists", None, ""):
            problems.add(f"{where}: operator {operator!r} is not valid")
        if operator == "Exists" and toleration.get("value"):
            problems.add(f"{where}: Exists takes no value")
        if not toleration.get("key") and operator != "Exists":
            problems.add(f"{where}: an empty key needs operator Exists")
    return problems


def _affinity_problems(affinity: Any) -> set[str]:
    problems: set[str] = set()
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if not isinstance(node_affinity, dict):
        return problems
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
        if not isinstance(terms, list) or not terms:
            problems.add("spec.affinity.nodeAffinity.required: needs at least one nodeSelectorTerm")
        for index, term in enumerate(terms if isinstance(terms, list) else ()):
            expressions = term.get("matchExpressions") if isinstance(term, dict) else None
            for number, requirement in enumerate(expressions if isinstance(expressions, list) else ()):
                where = f"spec.affinity.nodeAffinity.required.terms[{index}].matchExpressions[{number}]"
                problems |= _requirement_problems(where, requirement)
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    for index, term in enumerate(preferred if isinstance(preferred, list) else ()):
        where = f"spec.affinity.nodeAffinity.preferred[{index}]"
        weight = term.get("weight") if isinstance(term, dict) else None
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            problems.add(f"{where}: weight must be 1-100")
        preference = term.get("preference") if isinstance(term, dict) else None
        expressions = preference.get("matchExpressions") if isinstance(preference, dict) else None
        for number, requirement in enumerate(expressions if isinstance(expressions, list) else ()):
            problems |= _requirement_problems(f"{where}.matchExpressions[{number}]", requirement)
    return problems


def _per_key_introduced(check: Callable[..., set[str]], new: Any, old: Any) -> set[str]:
    """``check(new) - check(old)`` for a map of per-entry rules, looking only at the entries of
    ``new`` that are not in ``old`` as they were: an entry kept as it was breaks the same rule in
    both (a patch adding one annotation does not walk all the Pod's labels and annotations)."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return check(new) - check(old)
    changed = [
        key
        for key, value in new.items()
        if (was := old.get(key, _ABSENT)) is not value and not (type(was) is type(value) and was == value)
    ]
    if not changed:
        return set()
    return check(new, changed) - check(old, [key for key in changed if key in old])


_ABSENT: Any = object()


# -- the proof's question -------------------------------------------------------------------------
def introduced(original: Pod, patched: Pod) -> set[str]:
    """Every rule above that ``patched`` breaks and ``original`` kept: what the proof refuses.

    ``patched`` is the patch applied to the original (``json_patch.prove``), which shares every
    subtree the patch leaves alone with it: when the very same placement fields are there, they
    have the original's violations, so they are not walked (a GPU patch never touches them), and
    the original is walked only when the result has a violation at all."""
    found = introduced_violations(original, patched)
    after, before = placement_fields(patched), placement_fields(original)
    if not any(map(is_not, after, before)):
        return found
    labels, annotations, selector, tolerations, affinity = zip(after, before, strict=True)
    if labels[0] is not labels[1]:
        found |= _per_key_introduced(partial(_label_problems, "metadata.labels"), *labels)
    if annotations[0] is not annotations[1]:
        found |= _per_key_introduced(_annotation_problems, *annotations)
    if selector[0] is not selector[1]:
        found |= _per_key_introduced(_selector_problems, *selector)
    if tolerations[0] is not tolerations[1]:
        found |= _toleration_problems(tolerations[0]) - _toleration_problems(tolerations[1])
    if affinity[0] is not affinity[1]:
        found |= _affinity_problems(affinity[0]) - _affinity_problems(affinity[1])
    return found
