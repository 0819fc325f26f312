"""What several of the core's test modules build the same way: a small Pod, and what must not
change about a value."""

from __future__ import annotations

from typing import Any

import orjson


def pod() -> dict[str, Any]:
    """A fresh Pod each time (no test can leak into another through a shared one)."""
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "a"}, "annotations": {"x": "1"}},
        "spec": {"containers": [{"name": "c", "image": "i"}], "priority": 1},
    }


def exact(value: Any) -> tuple[bytes, str]:
    """What must not change about a value: its JSON with key order, and its types (repr)."""
    return orjson.dumps(value), repr(value)
