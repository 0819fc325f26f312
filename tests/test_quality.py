"""Lint and type checks run with the tests, so the README's one test command covers them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_is_clean() -> None:
    done = run(str(BIN / "ruff"), "check", "function", "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean() -> None:
    done = run(str(BIN / "ruff"), "format", "--check", "function", "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean_and_strict_on_the_pure_core() -> None:
    # pyproject.toml makes mypy strict on the pure core (engine, mutators, review, config...).
    done = run(sys.executable, "-m", "mypy", "function")
    assert done.returncode == 0, done.stdout + done.stderr
