"""Which Pod a message is about, in words a user can find in ``kubectl apply`` output.

A ``kubectl apply`` of many documents prints every denial under the request that failed, but a
controller's Pods arrive with no name: only ``generateName`` and an owner. A denial therefore names
the namespace and name, or the generateName and the owning object (the controller reference when
there is one), so the user can tell which Pod of which workload was refused.
"""

from __future__ import annotations

import re
from typing import Any

from function.core.pod import shown

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")


def _part(value: object) -> str:
    """A name as is when it looks like one; anything else quoted and cut (it cannot forge text)."""
    if isinstance(value, str) and _PLAIN.match(value):
        return value
    return shown(value, 64)


def _owner(metadata: dict[str, Any]) -> str:
    listed = metadata.get("ownerReferences")
    # Only a list holds owners: anything else (no apiserver sends it) names no owner.
    owners = [o for o in listed if isinstance(o, dict)] if isinstance(listed, list) else []
    chosen = next((o for o in owners if o.get("controller") is True), owners[0] if owners else None)
    if chosen is None:
        return ""
    return f" of {_part(chosen.get('kind') or 'owner')}/{_part(chosen.get('name') or '?')}"


def describe_pod(pod: Any, namespace: str) -> str:
    """``pod ml/trainer-0``, ``pod ml/fleet-7d9c5-* of ReplicaSet/fleet-7d9c5``, ``pod in ml (no name)``."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(metadata, dict):
        metadata = {}
    space = _part(namespace) if namespace else "(no namespace)"
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return f"pod {space}/{_part(name)}"
    generate = metadata.get("generateName")
    if isinstance(generate, str) and generate:
        return f"pod {space}/{_part(generate)}*{_owner(metadata)}"
    return f"pod in {space} (no name){_owner(metadata)}"
