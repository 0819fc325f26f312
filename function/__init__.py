"""CastSlice, laid out as ``func create -l python`` lays out a Knative Function.

Knative Functions' scaffolding does ``from function import new``. ``new`` is resolved lazily
(PEP 562): importing any ``function.*`` module (the CLI, the pure core) must not load the web
stack (functions-framework, Starlette, the servers) that ``function.func`` imports.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "new":
        from function.func import new

        return new
    raise AttributeError(f"module 'function' has no attribute {name!r}")
