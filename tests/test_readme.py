"""The README opens with the two commands a new user runs, and CI runs the second one verbatim."""

from __future__ import annotations

import re

from tests.support import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.+?)\n```", text, re.S)[:2]


def test_readme_starts_with_run_and_test_commands() -> None:
    run, test = readme_commands()
    assert "castslice serve" in run and "pip install" in run
    assert "pytest" in test and "pip install" in test
    assert (ROOT / "README.md").read_text().index(run) < 400


def test_ci_runs_the_readme_test_command() -> None:
    _, test = readme_commands()
    assert test in (ROOT / ".ci" / "run").read_text()


def test_procfile_serves_the_function_on_port() -> None:
    assert (ROOT / "Procfile").read_text().strip() == "web: castslice serve --port $PORT"
