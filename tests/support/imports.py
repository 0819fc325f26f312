"""What importing a package's modules does, recorded in a fresh interpreter (tests/test_layout.py).

``python -m tests.support.imports ROOT PACKAGE`` imports every module of PACKAGE (found under the
directory ROOT) one after another in this fresh interpreter, with ``__import__`` wrapped so every
import statement that runs meanwhile is recorded as an edge: the module whose code runs the
statement -> the module it imports (and the packages above it, which Python initializes first,
unless they are the importer's own). An import of a module already loaded is recorded too: that
is the one that fails when the module is still half initialized. Printed as JSON: the modules,
the edges, and each module whose import raised.

Why this stands for importing each module alone in its own interpreter: a module imported alone
fails (other than by a bug that fails in any order) only when an import runs while a module it
leads back to is half initialized, that is when the modules form a circle of import-time edges.
The recorded edges are those of every module's own initialization, which runs once here as it
would alone, so a circle among them is found by ``circles`` without a hundred interpreters.
"""

from __future__ import annotations

import builtins
import importlib
import json
import sys
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def module_names(root: Path, package: str) -> list[str]:
    base = root / package.replace(".", "/")
    names = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def record(root: Path, package: str) -> dict[str, Any]:
    """Import every module of ``package`` here, recording the import-time edges."""
    sys.path.insert(0, str(root))
    edges: set[tuple[str, str]] = set()
    original = builtins.__import__

    def importing(
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Iterable[str] = (),
        level: int = 0,
    ) -> Any:
        importer = str((globals or {}).get("__name__") or "")
        target = name
        if level:
            anchor = (globals or {}).get("__package__") or importer.rpartition(".")[0]
            target = importlib.util.resolve_name("." * level + name, anchor)
        try:
            return original(name, globals, locals, fromlist, level)
        finally:
            if importer.split(".")[0] == package.split(".")[0] and target:
                # ``from x import a``: the module x.a when there is one, else the name a of x.
                items = [item for item in fromlist or () if item != "*"] or [""]
                for item in items:
                    submodule = f"{target}.{item}"
                    module = submodule if item and submodule in sys.modules else target
                    edges.update(edges_to(importer, module))

    failed: dict[str, str] = {}
    builtins.__import__ = importing
    try:
        for module in module_names(root, package):
            try:
                importlib.import_module(module)
            except Exception as error:  # noqa: BLE001 - every failure is reported, not the first
                failed[module] = "".join(traceback.format_exception_only(error)).strip()
    finally:
        builtins.__import__ = original
    return {"modules": module_names(root, package), "edges": sorted(edges), "failed": failed}


def edges_to(importer: str, module: str) -> Iterable[tuple[str, str]]:
    """The module itself, and the packages above it Python initializes first: not the importer's
    own packages, which were initialized before it (a submodule imported while its package's
    ``__init__`` runs finds the package half initialized, by design)."""
    parts, own = module.split("."), importer.split(".")
    for depth in range(1, len(parts) + 1):
        above = depth < len(parts)
        if above and own[:depth] == parts[:depth]:
            continue
        target = ".".join(parts[:depth])
        if target != importer:
            yield importer, target


def circles(edges: Iterable[tuple[str, str]], within: str) -> list[list[str]]:
    """The strongly connected components of more than one module among the modules under
    ``within`` (Tarjan's algorithm, iterative), each sorted."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        if _under(source, within) and _under(target, within):
            graph.setdefault(source, set()).add(target)
            graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


if __name__ == "__main__":
    print(json.dumps(record(Path(sys.argv[1]), sys.argv[2])))
