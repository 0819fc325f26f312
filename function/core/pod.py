"""The vocabulary for a Pod: one raw dict, read the same way by every mutator, rule and message.

The Pod stays a plain dict from the apiserver (a typed model would drop fields it does not know,
and a patch built from it would remove them). These helpers read defensively (any field may hold
any JSON type in hostile input) and write only through the few functions below, so "walk every
container", "who controls this Pod" and "write a quantity into limits and requests" exist once.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

Pod = dict[str, Any]

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
"""Every list of containers in a Pod spec, in the order the kubelet knows them."""
RESOURCE_SECTIONS = ("limits", "requests")

WARNING_LIMIT = 120
"""The apiserver passes at most 120 characters of a warning on to kubectl."""


def iter_containers(
    pod: Pod, kinds: tuple[str, ...] = CONTAINER_LISTS
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(list name, index, container) for every container of the given lists in the Pod spec."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    for kind in kinds:
        containers = spec.get(kind)
        if isinstance(containers, list):
            for index, container in enumerate(containers):
                if isinstance(container, dict):
                    yield kind, index, container


def container_label(kind: str, index: int, container: dict[str, Any]) -> str:
    """``containers/server``: how decisions name a container (its index when it has no name)."""
    return f"{kind}/{container.get('name', index)}"


NOTHING: Mapping[str, Any] = MappingProxyType({})
"""What absent metadata, or an index the view does not hold, reads as (read-only, equal to {})."""


def metadata_of(obj: Any) -> Mapping[str, Any]:
    """The object's ``metadata`` map, or NOTHING when it has none (or holds something else)."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    return metadata if isinstance(metadata, Mapping) else NOTHING


# -- who owns it ----------------------------------------------------------------------------------
class Owner(NamedTuple):
    """An object's controller, as its ownerReference names it; NO_OWNER when none does."""

    uid: str = ""
    kind: str = ""
    name: str = ""


NO_OWNER = Owner()


def _interned(value: object) -> str:
    # Owner uids, kinds and names repeat across thousands of Pods in the view: one string each.
    return sys.intern(value) if isinstance(value, str) else ""


def controller_of(metadata: Mapping[str, Any]) -> Owner:
    """The controller: the ownerReference with ``controller: true`` that names a kind and a uid
    (the apiserver allows one, and requires both), else NO_OWNER (a bare Pod, to every reader).

    The one answer to "who owns this Pod": spot placement (bare Pods, DaemonSets, the split per
    ReplicaSet), PodMutation workloads, the view's sibling groups and a denial's wording read it
    here, so a Pod is never one workload's to one of them and bare to another. A reference without
    ``controller: true`` (garbage collection only) makes no owner."""
    references = metadata.get("ownerReferences")
    if not isinstance(references, list):
        return NO_OWNER
    for reference in references:
        if not isinstance(reference, Mapping) or reference.get("controller") is not True:
            continue
        uid, kind = reference.get("uid"), reference.get("kind")
        if isinstance(uid, str) and uid and isinstance(kind, str) and kind:
            return Owner(_interned(uid), _interned(kind), _interned(reference.get("name")))
    return NO_OWNER


def first_owner(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference a record names when it names one: the controller's, else the first
    listed (a map), else None. Only for reports that say which it is (the audit event's
    ``owner.controller``): decisions and denials go by ``controller_of``."""
    references = metadata.get("ownerReferences")
    listed = [r for r in references if isinstance(r, Mapping)] if isinstance(references, list) else []
    return next((r for r in listed if r.get("controller") is True), listed[0] if listed else None)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")


def _name_part(value: object) -> str:
    """A name as is when it looks like one; anything else quoted and cut (it cannot forge text)."""
    if isinstance(value, str) and _PLAIN_NAME.match(value):
        return value
    return shown(value, 64)


def describe_pod(pod: Any, namespace: str) -> str:
    """Which Pod a message is about, in words a user can find in ``kubectl apply`` output:
    ``pod ml/trainer-0``, ``pod ml/fleet-7d9c5-* of ReplicaSet/fleet-7d9c5``, ``pod in ml (no name)``.

    A controller's Pods arrive with no name, only ``generateName``: the controller (as
    ``controller_of`` reads it, the owner every decision went by) tells which workload's Pod it is."""
    metadata = metadata_of(pod)
    space = _name_part(namespace) if namespace else "(no namespace)"
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return f"pod {space}/{_name_part(name)}"
    owner = controller_of(metadata)
    of = f" of {_name_part(owner.kind)}/{_name_part(owner.name or '?')}" if owner.uid else ""
    generate = metadata.get("generateName")
    if isinstance(generate, str) and generate:
        return f"pod {space}/{_name_part(generate)}*{of}"
    return f"pod in {space} (no name){of}"


# -- what it holds --------------------------------------------------------------------------------
def annotations_of(pod: Pod) -> dict[str, Any]:
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def labels_of(pod: Pod) -> dict[str, Any]:
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return labels if isinstance(labels, dict) else {}


def ensure_map(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]`` as a dict, created (or replacing a null) when absent."""
    child = parent.get(key)
    if not isinstance(child, dict):
        child = parent[key] = {}
    return child


def resource_sections(container: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(section name, quantities) for the container's limits and requests that are maps."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return []
    return [(name, section) for name in RESOURCE_SECTIONS if isinstance(section := resources.get(name), dict)]


def asked_resources(container: dict[str, Any]) -> set[str]:
    """Every resource name in the container's limits or requests."""
    return {name for _, section in resource_sections(container) for name in section}


def set_resource(container: dict[str, Any], name: str, quantity: str) -> None:
    """Set an extended resource in limits *and* requests: the apiserver rejects an extended
    resource with a request but no equal limit, so the two are always written together."""
    resources = ensure_map(container, "resources")
    for section in RESOURCE_SECTIONS:
        ensure_map(resources, section)[name] = quantity


def fit_warning(head: str, tail: str = "") -> str:
    """``head + tail`` within WARNING_LIMIT, cutting the head (what was found) rather than the
    tail (what to do about it), which is the part the user needs; a cut is marked "...".

    A mutator words its own warnings to fit; ``cap_warning`` is the reply's guarantee."""
    if len(head) + len(tail) <= WARNING_LIMIT:
        return head + tail
    room = max(WARNING_LIMIT - len(tail) - 3, 0)
    return (head[:room] + "..." + tail)[:WARNING_LIMIT]


def cap_warning(warning: str) -> str:
    """A warning as the apiserver will pass it on: at most WARNING_LIMIT characters. Applied once
    per path, where a warning leaves: the AdmissionResponse and the audit event."""
    return warning[:WARNING_LIMIT]


def shown(value: object, limit: int = 24) -> str:
    """A user-supplied value quoted for a message (JSON-escaped, so a newline shows as \\n and
    cannot forge a line of output), cut short so warnings stay under 120 chars."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return json.dumps(text, ensure_ascii=False)
