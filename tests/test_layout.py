"""The walls between the folders of function/, read from the source (every import, at any depth,
including the ones inside functions and under TYPE_CHECKING):

- ``core/`` decides purely: of this project it imports only itself and ``contract``, so not the
  serving edge, the adapter, ``offline/``, ``audit/`` or ``control/``; of the standard library,
  nothing that does I/O, reads the environment or a clock, or starts a thread or a process; of
  other packages, only the data libraries it is built on. It calls no ``open``, ``print`` or
  ``input`` either, nor a clock (``datetime.now()``): dates are data, the time is given.
- ``admission/`` (AdmissionReview <-> engine) imports no serving, offline or control module.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FUNCTION = Path(__file__).resolve().parent.parent / "function"

CORE_MAY_IMPORT = ("function.core", "function.contract")
"""Of this project: the core itself and the names shared with manifests and tests."""

CORE_PACKAGES = frozenset({"pydantic", "orjson", "immutables", "yaml", "jsonpatch", "jsonpointer", "re2"})
"""Packages beyond the standard library the core is built on: models, JSON, persistent maps, the
RFC 6902 implementation the PodMutation patches go through, and RE2 for the regular expressions
users write in them. None of them does I/O as used."""

CORE_FORBIDDEN_STDLIB = frozenset(
    {
        # files, processes and the environment
        "os", "io", "pathlib", "shutil", "tempfile", "glob", "fileinput", "subprocess", "multiprocessing",
        "signal", "resource", "pty", "fcntl", "mmap", "sqlite3", "dbm", "shelve", "importlib", "runpy",
        "pkgutil", "site", "sysconfig", "platform", "getpass", "pwd", "grp",
        # clocks, chance, and the time zone files (datetime is data; its clock is CORE_CLOCK_CALLS)
        "time", "zoneinfo", "random", "secrets", "uuid",
        # threads and event loops
        "threading", "_thread", "concurrent", "asyncio", "sched", "queue",
        # the network
        "socket", "ssl", "select", "selectors", "http", "urllib", "smtplib", "ftplib", "socketserver",
        "xmlrpc", "wsgiref",
        # writing anywhere
        "logging", "warnings", "atexit", "faulthandler", "tracemalloc", "traceback", "linecache",
    }
)  # fmt: skip
"""Modules whose purpose is I/O, the environment, clocks, randomness, threads or processes."""

CORE_FORBIDDEN_CALLS = frozenset({"open", "print", "input", "breakpoint", "exec", "eval", "__import__"})

CORE_CLOCK_CALLS = frozenset({"now", "utcnow", "today"})
"""``datetime.now()``, ``date.today()`` and the like: a decision that needs the time is given it."""

ADMISSION_MAY_NOT_IMPORT = ("function.serve", "function.offline", "function.control", "function.func")


def modules_under(folder: str) -> list[Path]:
    return sorted((FUNCTION / folder).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(FUNCTION.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_project_module(name: str) -> bool:
    path = FUNCTION.parent.joinpath(*name.split("."))
    return name.startswith("function.") and (path.is_dir() or path.with_suffix(".py").is_file())


def imports_of(tree: ast.Module, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in a module of ``package``; ``from x import y``
    names ``x.y`` when that is one of this project's modules, else ``x``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            submodules = [f"{module}.{a.name}" for a in node.names if is_project_module(f"{module}.{a.name}")]
            for name in submodules or [module]:
                yield node.lineno, name


def calls_of(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, name) of every call of a plain name (``open()``) or an attribute (``x.now()``: ``now``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            yield node.lineno, node.func.id
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node.lineno, "." + node.func.attr


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def parsed(path: Path) -> tuple[ast.Module, str, str]:
    """The module's syntax tree, its package, and its path as a breach names it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    return (
        ast.parse(path.read_text(encoding="utf-8"), str(path)),
        package,
        str(path.relative_to(FUNCTION.parent)),
    )


def core_breaches(tree: ast.Module, package: str, where: str) -> list[str]:
    """How one core module breaks the core's walls, as ``file:line: what``."""
    found = []
    for line, module in imports_of(tree, package):
        top = module.split(".")[0]
        if top == "function":
            if not under(module, CORE_MAY_IMPORT):
                found.append(f"{where}:{line}: imports {module} (the core imports only {CORE_MAY_IMPORT})")
        elif top in sys.stdlib_module_names:
            if top in CORE_FORBIDDEN_STDLIB:
                found.append(f"{where}:{line}: imports {module} (I/O, environment, clock or threads)")
        elif top not in CORE_PACKAGES and top != "__future__":
            found.append(f"{where}:{line}: imports {module} (not a package the core is built on)")
    for line, name in calls_of(tree):
        if name in CORE_FORBIDDEN_CALLS:
            found.append(f"{where}:{line}: calls {name}()")
        elif name.startswith(".") and name[1:] in CORE_CLOCK_CALLS:
            found.append(f"{where}:{line}: calls {name}() (reads the clock)")
    return found


def admission_breaches(tree: ast.Module, package: str, where: str) -> list[str]:
    return [
        f"{where}:{line}: imports {module} (the adapter must not reach the process edges)"
        for line, module in imports_of(tree, package)
        if under(module, ADMISSION_MAY_NOT_IMPORT)
    ]


def test_the_core_does_no_io_and_imports_no_edge() -> None:
    paths = modules_under("core")
    assert len(paths) > 20  # the walk found the core
    assert [breach for path in paths for breach in core_breaches(*parsed(path))] == []


def test_the_adapter_imports_no_serving_offline_or_control_module() -> None:
    paths = modules_under("admission")
    assert paths
    assert [breach for path in paths for breach in admission_breaches(*parsed(path))] == []


# -- the walls hold: each rule catches what it is for ------------------------------------------
@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import time\n", "imports time"),
        ("import os.path\n", "imports os.path"),
        ("from threading import Thread\n", "imports threading"),
        ("def f():\n    import socket\n", "imports socket"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio\n", "imports asyncio"),
        ("from function.serve.app import build_webhook\n", "imports function.serve.app"),
        ("from function.admission import review\n", "imports function.admission"),
        ("from function import offline\n", "imports function.offline"),
        ("from function.audit.delivery import AuditSender\n", "imports function.audit.delivery"),
        ("import function.control\n", "imports function.control"),
        ("from ..serve import app\n", "imports function.serve"),
        ("import kubernetes\n", "imports kubernetes"),
        ("def f():\n    print('x')\n", "calls print()"),
        ("def f(p):\n    return open(p).read()\n", "calls open()"),
        ("from datetime import datetime\nNOW = datetime.now()\n", "calls .now() (reads the clock)"),
        ("import datetime\ndef f():\n    return datetime.date.today()\n", "calls .today() (reads the clock)"),
    ],
)
def test_a_core_module_breaking_a_wall_is_named(source: str, caught: str) -> None:
    [breach] = core_breaches(ast.parse(source), "function.core", "function/core/probe.py")
    assert breach.startswith("function/core/probe.py:") and caught in breach


@pytest.mark.parametrize(
    "source",
    [
        "from function.core.engine import Engine\n",
        "from function.contract import OPT_OUT_LABEL\n",
        "from . import pod\n",
        "import orjson\nfrom collections.abc import Mapping\n",
        "from datetime import UTC, datetime\ndef f(text):\n    return datetime.fromisoformat(text)\n",
    ],
)
def test_what_the_core_may_import_passes(source: str) -> None:
    assert core_breaches(ast.parse(source), "function.core", "function/core/probe.py") == []


def test_an_adapter_module_importing_the_serving_edge_is_named() -> None:
    source = "from function.serve.http_api import WebhookHttp\n"
    [breach] = admission_breaches(ast.parse(source), "function.admission", "function/admission/probe.py")
    assert breach.startswith("function/admission/probe.py:1: imports function.serve.http_api")
