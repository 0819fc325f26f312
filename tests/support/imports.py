"""What importing a package's modules does, each alone and all in one interpreter
(tests/test_layout.py).

``python -m tests.support.imports ROOT PACKAGE`` prints, as JSON, for the modules of PACKAGE (found
under the directory ROOT):

- ``alone``: each module whose import raised when it was imported alone, in an interpreter that
  had loaded no module of PACKAGE (a child forked per module, at most one per CPU at a time), with
  what it raised. Before forking, this process loads the other packages' modules that importing
  PACKAGE loads (the standard library, pydantic, the kubernetes client...): they never import
  PACKAGE, so a module of PACKAGE imports in the child exactly as in a new interpreter, without
  every child paying for them again.
- ``edges``: every import statement that runs while all the modules are imported one after
  another in one interpreter (``__import__`` wrapped), as an edge: the module whose code runs the
  statement -> the module it imports (and the packages above it, which Python initializes first,
  unless they are the importer's own). An import of a module already loaded is recorded too: that
  is the one that fails when the module is still half initialized, so a circle among these edges
  is the cause a module would fail alone in some other order (``circles``).
- ``failed``: each module whose import raised there (a bug that fails in any order).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


def module_name(path: Path, root: Path) -> str:
    """``ROOT/a/b/c.py`` -> ``a.b.c``; ``ROOT/a/b/__init__.py`` -> ``a.b``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path, root: Path) -> str:
    """The package the module's relative imports start from (a package's own, for its __init__)."""
    name = module_name(path, root)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from X import ...`` in a module of ``package`` names."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def module_names(root: Path, package: str) -> list[str]:
    base = root / package.replace(".", "/")
    return [module_name(path, root) for path in sorted(base.rglob("*.py"))]


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


def in_child(job: Callable[[], str]) -> tuple[int, int]:
    """Runs ``job`` in a forked child: (its pid, the pipe it writes to). The child writes what
    ``job`` returned and exits 0, or what it raised and exits 1; its stdout goes to stderr, so that
    only the parent prints."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    os.close(read)
    os.dup2(2, 1)
    status = 0
    try:
        said = job()
    except BaseException as error:  # noqa: BLE001 - whatever the import raised is the answer
        said, status = "".join(traceback.format_exception_only(error)).strip()[-4000:], 1
    with os.fdopen(write, "wb") as pipe:
        pipe.write(said.encode())
    os._exit(status)


def heard(read: int) -> str:
    with os.fdopen(read, "rb") as pipe:
        return pipe.read().decode()


def record_in_a_child(root: Path, package: str) -> tuple[dict[str, Any], list[str]]:
    """``record`` in a forked child, and the modules of other packages importing ``package`` loaded."""

    def job() -> str:
        recorded = record(root, package)
        top = package.split(".")[0]
        others = sorted(name for name in sys.modules if name.split(".")[0] not in (top, "__main__"))
        return json.dumps([recorded, others])

    pid, read = in_child(job)
    said = heard(read)  # before waiting: the answer is larger than a pipe holds
    _, status = os.waitpid(pid, 0)
    if status:
        raise RuntimeError(f"recording the imports of {package} failed: {said}")
    recorded, others = json.loads(said)
    return recorded, others


def import_alone(module: str) -> str:
    importlib.import_module(module)
    return ""


def failing_alone(root: Path, package: str, modules: Iterable[str]) -> dict[str, str]:
    """Each module of ``modules`` imported alone, in a child forked from this process, which has
    loaded no module of ``package``: the ones whose import raised, with what they raised."""
    top = package.split(".")[0]
    assert not [name for name in sys.modules if name.split(".")[0] == top], f"{package} is loaded here"
    sys.path.insert(0, str(root))
    at_once = len(os.sched_getaffinity(0))
    running: dict[int, tuple[str, int]] = {}
    failed: dict[str, str] = {}
    pending = list(modules)
    pending.reverse()
    while pending or running:
        while pending and len(running) < at_once:
            module = pending.pop()
            pid, read = in_child(functools.partial(import_alone, module))
            running[pid] = (module, read)

        pid, status = os.wait()
        module, read = running.pop(pid)
        said = heard(read)  # after the child exited: what it writes fits in the pipe
        if status:
            failed[module] = said or f"exit status {os.waitstatus_to_exitcode(status)}"
    return failed


def imports(root: Path, package: str) -> dict[str, Any]:
    """What ``python -m tests.support.imports ROOT PACKAGE`` prints."""
    recorded, others = record_in_a_child(root, package)
    for name in others:
        with contextlib.suppress(Exception):  # loading ahead only saves the children time
            importlib.import_module(name)
    return {**recorded, "alone": failing_alone(root, package, recorded["modules"])}


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
    print(json.dumps(imports(Path(sys.argv[1]), sys.argv[2])))
