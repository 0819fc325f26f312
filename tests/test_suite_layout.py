"""How the test suite itself is laid out, read from its source:

- no module under ``tests/`` imports a test module (``test_*.py``): a helper several test modules
  share lives in a support module (under ``tests/support/``, or a folder's own ``support.py``,
  ``tests/e2e/launch.py``...), so that running, moving or deleting one test module never changes
  another, and pytest never collects a test twice under two names;
- nothing but test modules at the root of tests/: support code and benchmarks in their folders;
- test modules are named for what they pin, never for how their tests were found (no
  ``*_answers.py`` beside a module's tests, no ``*_mutants.py``);
- no module under ``tests/`` imports another module's private name (``_name``) from ``tests``:
  what another part of the suite needs is that module's public API, or moves to a support module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.imports import imported_from, package_of

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

NAMED_FOR_HOW_FOUND = ("_answers", "_mutants")
"""Endings of a test module's name that say how its tests were found, not what they guard."""


def imported_modules(tree: ast.Module, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import, at any depth; ``from x import y`` names both
    ``x`` and ``x.y`` (``y`` may be a module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            module = imported_from(node, package)
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "tests" or not parts[-1].startswith("test_"):
        return False
    return ROOT.joinpath(*parts).with_suffix(".py").is_file()


def imports_of_test_modules(source: str, path: Path) -> list[str]:
    """How one module under tests/ imports a test module, as ``file:line: what``."""
    package = package_of(path, ROOT)
    where = str(path.relative_to(ROOT))
    return [
        f"{where}:{line}: imports the test module {module} (share it from a support module)"
        for line, module in imported_modules(ast.parse(source, where), package)
        if is_test_module(module)
    ]


def suite_modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def test_no_module_of_the_suite_imports_a_test_module() -> None:
    paths = suite_modules()
    assert len(paths) > 100  # the walk found the suite
    found = [breach for path in paths for breach in imports_of_test_modules(path.read_text("utf-8"), path)]
    assert found == []


def private_imports_from_the_suite(source: str, path: Path) -> list[str]:
    """How one module under tests/ imports a private name of another module of the suite."""
    package = package_of(path, ROOT)
    where = str(path.relative_to(ROOT))
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = imported_from(node, package)
        if module.split(".")[0] != "tests":
            continue
        found += [
            f"{where}:{node.lineno}: imports the private {alias.name} of {module}"
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")
        ]
    return found


def test_no_module_of_the_suite_imports_a_private_name_of_another() -> None:
    found = [
        breach
        for path in suite_modules()
        for breach in private_imports_from_the_suite(path.read_text("utf-8"), path)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("from tests.e2e.controlplane import _Process\n", "_Process"),
        ("from ..e2e.controlplane import ControlPlane, _CertFactory\n", "_CertFactory"),
    ],
)
def test_a_private_name_imported_from_the_suite_is_named(source: str, caught: str) -> None:
    [breach] = private_imports_from_the_suite(source, TESTS / "cluster" / "probe.py")
    assert breach.startswith("tests/cluster/probe.py:") and f"imports the private {caught} " in breach


def test_public_names_and_privates_of_the_code_under_test_may_be_imported() -> None:
    source = "from tests.support.pki import CertFactory\nfrom function.core.engine import _internal\n"
    assert private_imports_from_the_suite(source, TESTS / "cluster" / "probe.py") == []


def test_the_root_of_the_suite_holds_test_modules_only() -> None:
    """Support code lives in tests/support/ (or beside the folder's tests), benchmarks in
    tests/benchmarks/: none of them loose beside the test modules."""
    loose = [
        path.name
        for path in TESTS.glob("*.py")
        if path.name != "__init__.py" and not path.name.startswith("test_")
    ]
    assert loose == []


def test_no_test_module_is_named_for_how_its_tests_were_found() -> None:
    misnamed = [
        str(path.relative_to(ROOT))
        for path in suite_modules()
        if path.name.startswith("test_") and path.stem.endswith(NAMED_FOR_HOW_FOUND)
    ]
    assert misnamed == []


# -- the rule catches what it is for ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("from tests.core.test_engine import pod\n", "tests.core.test_engine"),
        ("from tests.core import test_engine\n", "tests.core.test_engine"),
        ("import tests.core.test_engine as t\n", "tests.core.test_engine"),
        ("from .test_engine import pod\n", "tests.core.test_engine"),
        ("from . import test_engine\n", "tests.core.test_engine"),
        ("def f():\n    from tests.test_layout import core_breaches\n", "tests.test_layout"),
    ],
)
def test_a_test_module_imported_by_another_is_named(source: str, caught: str) -> None:
    [breach] = imports_of_test_modules(source, TESTS / "core" / "probe.py")
    assert breach.startswith("tests/core/probe.py:") and f"imports the test module {caught} " in breach


@pytest.mark.parametrize(
    "source",
    [
        "from tests.support import load_review\n",
        "from tests.support.spot import Ctx\n",
        "from .support import kubectl\n",
        "from tests.core import test_does_not_exist\n",
        "from function.core.engine import Engine\n",
    ],
)
def test_support_modules_and_the_code_under_test_may_be_imported(source: str) -> None:
    assert imports_of_test_modules(source, TESTS / "core" / "probe.py") == []
