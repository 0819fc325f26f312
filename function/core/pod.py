"""Shared helpers over a raw Pod dict, for every mutator and the engine's rules.

The Pod stays a plain dict from the apiserver (a typed model would drop fields it does not know,
and a patch built from it would remove them). These helpers read defensively (any field may hold
any JSON type in hostile input) and write only through the few functions below, so "walk every
container" and "write a quantity into limits and requests" exist once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

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


def remove_resource(container: dict[str, Any], name: str) -> None:
    """Remove a resource from limits and requests (sections that are not maps are left alone)."""
    for _, section in resource_sections(container):
        section.pop(name, None)


def fit_warning(head: str, tail: str) -> str:
    """``head + tail`` within WARNING_LIMIT, cutting the head (what was found) rather than the
    tail (what to do about it), which is the part the user needs."""
    if len(head) + len(tail) <= WARNING_LIMIT:
        return head + tail
    room = max(WARNING_LIMIT - len(tail) - 3, 0)
    return (head[:room] + "..." + tail)[:WARNING_LIMIT]


def cap_warning(warning: str) -> str:
    """A warning as the apiserver will pass it on: at most WARNING_LIMIT characters."""
    return warning[:WARNING_LIMIT]


def shown(value: object, limit: int = 24) -> str:
    """A user-supplied value quoted for a message (JSON-escaped, so a newline shows as \\n and
    cannot forge a line of output), cut short so warnings stay under 120 chars."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return json.dumps(text, ensure_ascii=False)
