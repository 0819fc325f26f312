"""The walls between the folders of function/, read from the source (every import, at any depth,
including the ones inside functions and under TYPE_CHECKING):

- every module keeps to its row of the import table in function/README.md (read from the README,
  so the table and the rule are one);
- every module imports alone, each in an interpreter that has loaded no other module of
  function/ (a child forked per module, tests/support/imports.py);
- no circle: among the imports that run when a module is imported (recorded in one interpreter),
  and among all imports, the ones inside functions included (TYPE_CHECKING aside: the type checker
  alone runs those), between modules and between folders;

- ``core/`` decides purely: of this project it imports only itself and ``contract``, so not the
  serving edge, the adapter, ``offline/``, ``audit/`` or ``control/``; of the standard library,
  nothing that does I/O, reads the environment or a clock, or starts a thread or a process; of
  other packages, only the data libraries it is built on. It calls no ``open``, ``print`` or
  ``input`` either, nor a clock (``datetime.now()``): dates are data, the time is given.
- ``admission/`` (AdmissionReview <-> engine) imports no serving, offline or control module.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.imports import circles, edges_to, imported_from, module_name, package_of

FUNCTION = Path(__file__).resolve().parent.parent / "function"
ROOT = FUNCTION.parent

CORE_MAY_IMPORT = ("function.core", "function.contract")
"""Of this project: the core itself and the names shared with manifests and tests."""

README = (FUNCTION / "README.md").read_text("utf-8")

IMPORT_NAMES = {"PyYAML": "yaml"}
"""The distributions function/README.md names whose modules are imported under another name."""


def core_packages(readme: str) -> frozenset[str]:
    """The packages beyond the standard library the import table's core row names: "the data
    libraries it is built on (pydantic, orjson, ..., jsonpatch and jsonpointer, re2)"."""
    row = next(line for line in readme.splitlines() if line.startswith("| `core/` |"))
    listed = re.search(r"built on \(([^)]*)\)", row)
    assert listed, row
    return frozenset(IMPORT_NAMES.get(name, name) for name in re.split(r",\s*|\s+and\s+", listed[1]))


CORE_PACKAGES = core_packages(README)
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
            module = imported_from(node, package)
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
    return (
        ast.parse(path.read_text(encoding="utf-8"), str(path)),
        package_of(path, ROOT),
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


def test_the_packages_the_core_may_import_are_read_from_the_table_by_their_import_names() -> None:
    assert len(CORE_PACKAGES) >= 6 and "yaml" in CORE_PACKAGES
    assert [name for name in sorted(CORE_PACKAGES) if importlib.util.find_spec(name) is None] == []


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


# -- every module keeps to its row of function/README.md's import table ---------------------------
Rules = dict[str, tuple[str, ...] | None]
"""A unit (``function.core``, ``function.config_file``) -> the modules it may import, None: any."""


def unit_name(token: str) -> str:
    """``core/`` -> ``function.core``; ``offline/drift.py`` -> ``function.offline.drift``;
    ``__init__.py`` -> ``function``."""
    parts = token.removesuffix("/").removesuffix(".py").split("/")
    return ".".join(["function", *(parts if parts != ["__init__"] else [])])


def import_rules(readme: str) -> tuple[Rules, dict[str, tuple[str, ...]]]:
    """The import table of function/README.md: what each unit may import, and what it names under
    "never"."""
    rules: Rules = {}
    never: dict[str, tuple[str, ...]] = {}
    section = readme.split("## What each folder may import", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        units = [unit_name(token) for token in re.findall(r"`([^`]+)`", cells[0])]
        if cells[1].startswith("any folder"):
            allowed: tuple[str, ...] | None = None
        elif cells[1].startswith("nothing"):
            allowed = ()
        else:
            allowed = tuple(unit_name(token) for token in re.findall(r"`([^`]+)`", cells[1]))
        named = tuple(unit_name(token) for token in re.findall(r"`([^`]+)`", cells[2]))
        for unit in units:
            rules[unit] = allowed
            never[unit] = named
    return rules, never


def unit_of(module: str, rules: Rules) -> str:
    """The row a module keeps to: its folder's, or its own (the package ``function`` only its own)."""
    rows = (unit for unit in rules if module == unit or (unit != "function" and under(module, (unit,))))
    return max(rows, key=len, default=module)


def rule_breaches(tree: ast.Module, package: str, where: str, unit: str, rules: Rules) -> list[str]:
    allowed = rules[unit]
    if allowed is None:
        return []
    return [
        f"{where}:{line}: imports {module} ({unit} may import only {', '.join(allowed) or 'nothing'})"
        for line, module in imports_of(tree, package)
        if module.split(".")[0] == "function" and not under(module, (unit, *allowed))
    ]


RULES, NEVER = import_rules(README)


def test_every_module_keeps_to_its_row_of_the_import_table() -> None:
    assert len(RULES) >= 13  # the table was read: eight folders, five modules
    paths = sorted(FUNCTION.rglob("*.py"))
    assert [str(path) for path in paths if unit_of(module_name(path, ROOT), RULES) not in RULES] == []
    found = []
    for path in paths:
        tree, package, where = parsed(path)
        found += rule_breaches(tree, package, where, unit_of(module_name(path, ROOT), RULES), RULES)
    assert found == []


def test_what_the_table_says_a_folder_never_imports_it_does_not_allow() -> None:
    contradictions = [
        f"{unit}: {name}"
        for unit, named in NEVER.items()
        for name in named
        if RULES[unit] is None or under(name, (unit, *(RULES[unit] or ())))
    ]
    assert contradictions == []
    assert under("function.control", NEVER["function.serve"]) and under(
        "function.serve", NEVER["function.control"]
    )


@pytest.mark.parametrize(
    ("where", "source", "caught"),
    [
        ("control/probe.py", "from function.serve.app import build_webhook\n", "imports function.serve.app"),
        (
            "serve/probe.py",
            "def f():\n    from function.control import process\n",
            "imports function.control",
        ),
        ("kube/probe.py", "from function.serve.http_api import problem\n", "imports function.serve.http_api"),
        ("admin/probe.py", "from function.audit.recorder import build_recorder\n", "imports function.audit"),
        ("audit/probe.py", "from function.offline.mutate import run\n", "imports function.offline.mutate"),
        (
            "offline/probe.py",
            "from function.kube.client import kube_client\n",
            "imports function.kube.client",
        ),
        ("admission/probe.py", "from function import func\n", "imports function.func"),
        ("contract.py", "from function.core.pod import Owner\n", "imports function.core.pod"),
        ("config_file.py", "from function.logs import configure_logging\n", "imports function.logs"),
        ("serve/probe.py", "from function.cli import main\n", "imports function.cli"),
    ],
)
def test_a_module_importing_what_its_row_does_not_name_is_named(where: str, source: str, caught: str) -> None:
    path = FUNCTION / where
    unit = unit_of(module_name(path, ROOT), RULES)
    package = package_of(path, ROOT)
    [breach] = rule_breaches(ast.parse(source), package, f"function/{where}", unit, RULES)
    assert breach.startswith(f"function/{where}:") and caught in breach


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("control/probe.py", "from function.kube.elector import LeaderElector\n"),
        ("audit/probe.py", "from function.offline.drift import report\n"),
        ("serve/probe.py", "from function.logs import configure_logging\n"),
        ("admin/probe.py", "from function.kube.client import kube_client\n"),
        ("cli.py", "from function.serve.command import run\n"),
        ("core/probe.py", "from . import pod\n"),
    ],
)
def test_what_a_row_names_may_be_imported(where: str, source: str) -> None:
    path = FUNCTION / where
    package = package_of(path, ROOT)
    unit = unit_of(module_name(path, ROOT), RULES)
    assert rule_breaches(ast.parse(source), package, f"function/{where}", unit, RULES) == []


# -- every module imports alone; no circle --------------------------------------------------------
def recorded_imports(root: Path, package: str) -> dict[str, Any]:
    """tests/support/imports.py in a fresh interpreter: each module of ``package`` imported alone,
    and all of them in one interpreter, with the edges the imports that ran drew."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.imports", str(root), package],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    recorded: dict[str, Any] = json.loads(done.stdout)
    return recorded


@functools.cache
def function_imports() -> dict[str, Any]:
    return recorded_imports(ROOT, "function")


def test_every_module_of_function_imports_alone_in_a_fresh_interpreter() -> None:
    recorded = function_imports()
    assert len(recorded["modules"]) > 90
    assert recorded["alone"] == {}


def test_no_circle_among_the_imports_that_run_when_the_modules_are_imported() -> None:
    recorded = function_imports()
    assert len(recorded["edges"]) > 300  # the imports were recorded
    assert recorded["failed"] == {}
    assert circles(map(tuple, recorded["edges"]), "function") == []


RING = {
    # The shape of a circle that once was in the core: a module imports a plug-in's base, whose
    # package's __init__ imports every plug-in, one of which imports the first module. Imported
    # in order, every module loads; ring.templates imported first fails.
    "ring/__init__.py": "",
    "ring/plugins/__init__.py": "from ring.plugins import slicing\n",
    "ring/plugins/base.py": "class Base:\n    pass\n",
    "ring/plugins/slicing.py": "from ring.templates import TEMPLATES\n",
    "ring/templates.py": "from ring.plugins.base import Base\n\nTEMPLATES = (Base,)\n",
}


def test_a_module_failing_alone_is_named_and_its_circle_found_though_every_module_imports_in_order(
    tmp_path: Path,
) -> None:
    for name, text in RING.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    recorded = recorded_imports(tmp_path, "ring")
    assert recorded["failed"] == {}
    assert list(recorded["alone"]) == ["ring.templates"]
    assert "partially initialized module 'ring.templates'" in recorded["alone"]["ring.templates"]
    edges = list(map(tuple, recorded["edges"]))
    assert circles(edges, "ring") == [["ring.plugins", "ring.plugins.slicing", "ring.templates"]]
    alone = subprocess.run(
        [sys.executable, "-c", "import ring.templates"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert alone.returncode != 0 and "partially initialized module 'ring.templates'" in alone.stderr


def under_type_checking(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (run by the type checker only)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def static_edges(sources: Iterable[tuple[str, ast.Module, str]]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of this project's modules in ``sources`` ((module,
    tree, package)), the ones inside functions included, TYPE_CHECKING aside."""
    edges: set[tuple[str, str]] = set()
    for module, tree, package in sources:
        skipped = under_type_checking(tree)
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for _, imported in imports_of(ast.Module(body=[node], type_ignores=[]), package):
                if imported.split(".")[0] == "function":
                    edges.update(edges_to(module, imported))
    return edges


def function_sources() -> list[tuple[str, ast.Module, str]]:
    return [(module_name(path, ROOT), *parsed(path)[:2]) for path in sorted(FUNCTION.rglob("*.py"))]


def test_no_circle_among_the_modules_with_the_imports_inside_functions() -> None:
    edges = static_edges(function_sources())
    assert len(edges) > 300  # the walk found the imports
    assert circles(edges, "function") == []


def test_no_circle_among_the_folders() -> None:
    edges = static_edges(function_sources())
    units = {(unit_of(a, RULES), unit_of(b, RULES)) for a, b in edges}
    assert circles({(a, b) for a, b in units if a != b}, "function") == []


CORE_WALLS = {
    "function.core.configtypes": ("function.core.config",),
    "function.core.view": ("function.core.config", "function.core.mutators"),
}
"""The walls inside the core function/README.md names: a module -> what it never reaches, through
any chain of imports (the configuration imports the mutators, which import its building blocks;
the view is told what to keep, it does not ask the configuration or the mutators)."""


def reached(edges: Iterable[tuple[str, str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    imported: dict[str, set[str]] = {}
    for importer, module in edges:
        imported.setdefault(importer, set()).add(module)
    seen: set[str] = set()
    todo = [start]
    while todo:
        for module in imported.get(todo.pop(), ()):
            if module not in seen:
                seen.add(module)
                todo.append(module)
    return seen


def wall_breaches(edges: Iterable[tuple[str, str]]) -> list[str]:
    edges = list(edges)
    return [
        f"{module} reaches {target}"
        for module, walled in CORE_WALLS.items()
        for target in sorted(reached(edges, module))
        if under(target, walled)
    ]


def test_the_walls_inside_the_core_hold() -> None:
    named = [name for module, walled in CORE_WALLS.items() for name in (module, *walled)]
    assert [name for name in named if not is_project_module(name)] == []
    assert wall_breaches(static_edges(function_sources())) == []


def test_a_chain_of_imports_through_a_wall_inside_the_core_is_named() -> None:
    edges = [
        ("function.core.view", "function.core.pod"),
        ("function.core.pod", "function.core.mutators.spot"),
        ("function.core.configtypes", "function.core.quantity"),
    ]
    assert wall_breaches(edges) == ["function.core.view reaches function.core.mutators.spot"]


def test_a_circle_through_an_import_inside_a_function_is_found_and_one_for_the_type_checker_is_not() -> None:
    sources = {
        "function.serve.app": "from function.serve.offload import LargeReviews\n",
        "function.serve.offload": "def child():\n    from function.serve.app import configure_logging\n",
        "function.serve.http_api": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from function.serve.offload import X\n"
        ),
        "function.serve.other": "from function.serve.http_api import problem\n",
    }
    sources["function.serve.offload"] += "from function.serve.other import thing\n"
    trees = [(name, ast.parse(text), "function.serve") for name, text in sources.items()]
    assert circles(static_edges(trees), "function") == [["function.serve.app", "function.serve.offload"]]
