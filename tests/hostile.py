"""Hostile and oversized AdmissionReviews, shared by the fuzz tests, the server tests and the
benchmark: built from the recorded reviews so everything else in them stays realistic."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.support import load_review

APISERVER_REQUEST_LIMIT = 3 * 1024 * 1024
"""The apiserver refuses requests larger than 3 MiB, so no legal Pod review is larger."""


def large_review(
    size: int = APISERVER_REQUEST_LIMIT - 64 * 1024, base: str = "default-slice-inference"
) -> bytes:
    """A mutating review of about ``size`` bytes, made of many small env entries and labels: many
    small objects are what costs the engine most (the worst legal case, not one big string)."""
    review = load_review(base)
    pod = review["request"]["object"]
    container = pod["spec"]["containers"][0]
    env = container.setdefault("env", [])
    labels = pod["metadata"].setdefault("labels", {})
    current = len(json.dumps(review))
    index = 0
    while current < size:
        entry = {"name": f"VAR_{index}", "value": f"value-{index}"}
        env.append(entry)
        labels[f"example.com/l{index}"] = f"v{index}"
        current += len(json.dumps(entry)) + len(f"example.com/l{index}") + len(f"v{index}") + 12
        index += 1
    return json.dumps(review, separators=(",", ":")).encode()


def nested(depth: int) -> Any:
    """A JSON value ``depth`` arrays deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def with_pod(name: str, change: Any) -> dict[str, Any]:
    """A recorded review with ``change(pod)`` applied to a deep copy of its Pod."""
    review = copy.deepcopy(load_review(name))
    change(review["request"]["object"])
    return review
