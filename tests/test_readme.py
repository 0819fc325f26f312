"""The README is a short start for users that works as written: its two first commands (CI runs the
second verbatim), a table of contents that reaches every section, links and paths that exist, the
quick start's request and preview answering what it shows, and no figure that can go stale there.
The reference material in docs/ is held to the same links and paths."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, asgi_client

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CASTSLICE = str(Path(sys.executable).parent / "castslice")
README_LIMIT_BYTES = 40_000
"""Past this the README stops being a short start (the session's stop hook says the same)."""


def readme_commands() -> list[str]:
    text = README.read_text()
    return re.findall(r"```sh\n(.+?)\n```", text, re.S)[:2]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.S)


def block_after(text: str, command: str) -> str:
    """The code block that follows the one holding ``command`` (what the README shows it prints)."""
    blocks = code_blocks(text)
    for i, block in enumerate(blocks):
        if command in block:
            return blocks[i + 1]
    raise AssertionError(f"the README shows no block with {command!r}")


def prose(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))


# -- the first two commands ---------------------------------------------------------------------
def test_readme_starts_with_run_and_test_commands() -> None:
    run, test = readme_commands()
    assert "castslice serve" in run and "pip install" in run
    assert "pytest" in test and "pip install" in test
    assert README.read_text().index(run) < 400


def test_ci_runs_the_readme_test_command() -> None:
    _, test = readme_commands()
    assert test in (ROOT / ".ci" / "run").read_text()


def test_procfile_serves_the_function_on_port() -> None:
    assert (ROOT / "Procfile").read_text().strip() == "web: castslice serve --host 0.0.0.0 --port $PORT"


def test_how_to_get_the_end_to_end_binaries_is_next_to_the_test_command() -> None:
    text = README.read_text()
    _, test = readme_commands()
    after_test = text[text.index(test) : text.index(test) + 900]
    assert ".ci/provision-k8s" in after_test and "KUBEBUILDER_ASSETS" in after_test


# -- a short start with a table of contents -------------------------------------------------------
def test_readme_stays_a_short_start() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes: move reference material to docs/"


def test_contents_reach_every_section() -> None:
    text = README.read_text()
    contents = text[text.index("## Contents") :].split("\n## ", 1)[0]
    listed = set(re.findall(r"\]\(#([^)]+)\)", contents))
    sections = {slug(h) for h in re.findall(r"^## (.+)$", prose(text), re.M)} - {"contents"}
    assert sections <= listed, f"sections missing from the table of contents: {sorted(sections - listed)}"


def test_every_doc_is_listed_in_the_readme() -> None:
    linked = {link.split("#")[0] for link in links(README)}
    missing = [doc.name for doc in DOCS if f"docs/{doc.name}" not in linked]
    assert not missing, f"docs/ files the README does not link to: {missing}"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_reach_a_file_and_a_heading(path: Path) -> None:
    broken = []
    for link in links(path):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(link)
    assert not broken, f"{path.name}: links to nothing: {broken}"


PROJECT_PATH = re.compile(r"`((?:tests|function|knative|docs|examples|\.ci)/[\w./-]*)`")


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_named_exist(path: Path) -> None:
    named = set(PROJECT_PATH.findall(path.read_text()))
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"{path.name} names paths that do not exist: {missing}"


STALE_FIGURE = re.compile(
    r"\b\d[\d,.]*\s*(?:tests?|passed|skipped|ms|s|sec|seconds|min|minutes|req/s|MB|MiB)\b(?![-/])"
)


def test_readme_holds_no_figure_that_can_go_stale() -> None:
    """Test counts, timings and sizes go to docs/, next to the command that measured them."""
    figures = [m.group(0) for m in STALE_FIGURE.finditer(prose(README.read_text()))]
    assert not figures, f"figures in the README: {figures}"


# -- the quick start works as written ------------------------------------------------------------
def test_quick_start_request_answers_what_the_readme_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    command = next(b for b in code_blocks(text) if b.startswith("curl "))
    curl, _, decode = command.replace("\\\n", " ").partition("|")
    words = shlex.split(curl)
    body = (ROOT / next(w for w in words if w.startswith("@"))[1:]).read_bytes()
    url = next(w for w in words if w.startswith("http://localhost:8080/"))
    reply = asgi_client(monkeypatch).post(url.removeprefix("http://localhost:8080"), content=body)
    assert reply.status_code == 200
    printed = subprocess.run(
        shlex.split(decode.strip().replace("python3", sys.executable, 1)),
        input=reply.content,
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert printed == block_after(text, command)
    assert json.loads(printed.splitlines()[1])  # the patch, as JSON


def test_quick_start_preview_prints_what_the_readme_shows() -> None:
    text = README.read_text()
    command = "castslice mutate -f examples/inference.yaml > /dev/null"
    args = shlex.split(command.removesuffix(" > /dev/null"))[1:]
    done = subprocess.run([CASTSLICE, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == block_after(text, command)
    assert "nvidia.com/gpu-shared" in done.stdout
