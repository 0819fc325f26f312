"""The one protocol every mutator follows.

A mutator is a pure decision over a plain Pod dict: the engine hands it a private working copy,
the mutator edits that copy in place (or leaves it alone) and returns a ``MutatorResult`` saying
what it did and why. The engine compares the copy with what it handed over, so a mutator that
claims one thing and does another is caught, not trusted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

Pod = dict[str, Any]


class Action(StrEnum):
    mutated = "mutated"
    unchanged = "unchanged"
    denied = "denied"


@dataclass(frozen=True)
class RequestInfo:
    """What a mutator may know about the admission request besides the Pod itself."""

    uid: str = ""
    namespace: str = ""
    operation: str = "CREATE"
    dry_run: bool = False
    username: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class MutatorResult:
    action: Action
    reason: str
    warnings: tuple[str, ...] = ()

    @classmethod
    def mutated(cls, reason: str, *warnings: str) -> MutatorResult:
        return cls(Action.mutated, reason, warnings)

    @classmethod
    def unchanged(cls, reason: str, *warnings: str) -> MutatorResult:
        return cls(Action.unchanged, reason, warnings)

    @classmethod
    def denied(cls, message: str) -> MutatorResult:
        """``message`` is what the kubectl user reads; it must name the input and what is accepted."""
        return cls(Action.denied, message)


@dataclass(frozen=True)
class MutatorDecision:
    """A mutator's part in one admission decision, as reported to users and audit consumers."""

    mutator: str
    action: Action
    reason: str
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "mutator": self.mutator,
            "action": self.action.value,
            "reason": self.reason,
            "warnings": list(self.warnings),
        }


class Mutator(Protocol):
    """``name`` is stable (it appears in events and metrics); ``mutate`` may edit ``pod`` in place."""

    name: str

    def mutate(self, pod: Pod, request: RequestInfo) -> MutatorResult: ...


def annotations_of(pod: Pod) -> dict[str, Any]:
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def labels_of(pod: Pod) -> dict[str, Any]:
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return labels if isinstance(labels, dict) else {}


WARNING_LIMIT = 120
"""The apiserver passes at most 120 characters of a warning on to kubectl."""


def fit_warning(head: str, tail: str) -> str:
    """``head + tail`` within WARNING_LIMIT, cutting the head (what was found) rather than the
    tail (what to do about it), which is the part the user needs."""
    if len(head) + len(tail) <= WARNING_LIMIT:
        return head + tail
    room = max(WARNING_LIMIT - len(tail) - 3, 0)
    return (head[:room] + "..." + tail)[:WARNING_LIMIT]


def shown(value: object, limit: int = 24) -> str:
    """A user-supplied value quoted for a message (JSON-escaped, so a newline shows as \\n and
    cannot forge a line of output), cut short so warnings stay under 120 chars."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return json.dumps(text, ensure_ascii=False)
