"""What the audit trail is told of one request, taken from the AdmissionReview once.

``Admission`` builds the facts after the decision (Gatekeeper's one request carrier); the
recorder, the spot ledger and the large-review process (function/serve/offload.py, which sends
them back across a process boundary) pass them on, and none of them sees the envelope or the Pod.

An event never carries the Pod, but its JSON Patch may carry strings copied from the Pod where
secrets live (env values, command and args): the facts hold those strings, and only those the
patch carries, so the event's patch can be redacted against them (function/audit/events.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from function.admission.wire import AdmissionReview
from function.core.engine import Decision
from function.core.json_patch import Operation, strings_in
from function.core.pod import CONTAINER_LISTS, first_owner, metadata_of


@dataclass(frozen=True, slots=True)
class OwnerFacts:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str | None
    generate_name: str | None
    owner: OwnerFacts | None

    def as_dict(self) -> dict[str, Any]:
        """The event's ``pod`` (decision-event.v1.json)."""
        owner = self.owner
        return {
            "namespace": self.namespace,
            "name": self.name,
            "generateName": self.generate_name,
            "owner": None
            if owner is None
            else {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
                "controller": owner.controller,
            },
        }


@dataclass(frozen=True, slots=True)
class AuditFacts:
    uid: str
    operation: str
    api_version: str
    """Of the AdmissionReview (the reply's version)."""
    username: str
    groups: tuple[str, ...]
    dry_run: bool
    pod: PodFacts
    secrets: frozenset[str] = frozenset()
    """Strings of the Pod at places where secrets live that the decision's patch also carries."""
    duration_seconds: float = field(default=0.0, compare=False)
    """How long the engine took to decide, by the adapter's clock (the engine reads none); 0 when
    nothing was decided. Not part of what makes two requests' facts the same."""


def audit_facts(
    review: AdmissionReview, decision: Decision | None = None, duration_seconds: float = 0.0
) -> AuditFacts:
    request = review.request
    return AuditFacts(
        uid=request.uid,
        operation=request.operation,
        api_version=review.apiVersion,
        username=request.userInfo.username or "",
        groups=tuple(request.userInfo.groups or ()),
        dry_run=bool(request.dryRun),
        pod=pod_facts(review),
        secrets=frozenset() if decision is None else secrets_in_patch(decision.patch, request.object),
        duration_seconds=duration_seconds,
    )


# -- the Pod's identity ---------------------------------------------------------------------------
def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _owner(metadata: Mapping[str, Any]) -> OwnerFacts | None:
    chosen = first_owner(metadata)
    if chosen is None:
        return None
    return OwnerFacts(
        api_version=str(chosen.get("apiVersion", "")),
        kind=str(chosen.get("kind", "")),
        name=str(chosen.get("name", "")),
        uid=str(chosen.get("uid", "")),
        controller=chosen.get("controller") is True,
    )


def pod_facts(review: AdmissionReview) -> PodFacts:
    request = review.request
    metadata = metadata_of(request.object)
    return PodFacts(
        namespace=request.namespace or _text(metadata.get("namespace")) or "",
        name=_text(request.name) or _text(metadata.get("name")),
        generate_name=_text(metadata.get("generateName")),
        owner=_owner(metadata),
    )


# -- where secrets live -----------------------------------------------------------------------------
def secret_strings(pod: Any) -> set[str]:
    """Strings in the user's Pod that sit where secrets live: env values, command and args."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    found: set[str] = set()
    if not isinstance(spec, dict):
        return found
    for listed in CONTAINER_LISTS:
        containers = spec.get(listed)
        for container in containers if isinstance(containers, list) else []:
            if not isinstance(container, dict):
                continue
            for env in container.get("env") or []:
                if isinstance(env, dict) and isinstance(env.get("value"), str):
                    found.add(env["value"])
            for key in ("command", "args"):
                items = container.get(key)
                if isinstance(items, list):
                    found.update(item for item in items if isinstance(item, str))
    return found


_SECRET_PLACES = ("/env/", "/command/", "/args/", "/secretKeyRef/", "/secretRef/")
_SECRET_PLACE = re.compile("|".join(re.escape(place) for place in _SECRET_PLACES))


def may_carry_secrets(patch: Sequence[Operation]) -> bool:
    """Whether ``patch`` can put a string where a secret lives; when not, the Pod need not be
    searched for secrets (a walk of every container, per review).

    Only a string at ``.../env/<i>/value``, in ``.../command`` or ``.../args``, or naming a Secret
    (``.../secretKeyRef/name``) is ever redacted (copied strings aside), and such a path holds the
    literal text of one of _SECRET_PLACES (an escaped token never unescapes to those names); an
    object or array value can hold such a place inside.
    """
    for op in patch:
        if "value" not in op:
            continue
        value = op["value"]
        if isinstance(value, str):
            path = op.get("path", "")
            if _SECRET_PLACE.search(path if isinstance(path, str) else str(path)):
                return True
        elif isinstance(value, dict | list):
            return True
    return False


def secrets_in_patch(patch: Sequence[Operation], pod: Any) -> frozenset[str]:
    """The Pod's secret strings (``secret_strings``) that ``patch`` carries anywhere in its values."""
    if not may_carry_secrets(patch):
        return frozenset()
    secrets = secret_strings(pod)
    if not secrets:
        return frozenset()
    carried: set[str] = set()
    for op in patch:
        if "value" in op:
            strings_in(op["value"], carried)
    return frozenset(secrets & carried)
