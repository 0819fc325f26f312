"""Golden cases for `castslice mutate`, in the manner of Kyverno's CLI tests.

Each folder under tests/golden/ is one case: ``input.yaml`` (manifests; or an ``input/`` directory,
read with ``-f DIR``), optional ``config.yaml``,
``case.yaml`` (description, extra args, expected exit code, optional ``stdin: true``), and the
expected ``expected.out`` (stdout) and ``expected.err`` (the decision report on stderr), where
the case's own path is written as a relative one.
Run with CASTSLICE_REGENERATE=1 to rewrite the expected files, then read the diff.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from function import cli
from tests.support import REGENERATE, ROOT

GOLDEN = ROOT / "tests" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "case.yaml").exists())


def _input(case_dir: Path) -> Path:
    """input.yaml, or a directory input/ (for -f DIR cases)."""
    single = case_dir / "input.yaml"
    return single if single.exists() else case_dir / "input"


def _args(case_dir: Path, spec: dict[str, object]) -> list[str]:
    args = ["mutate", "-f", "-" if spec.get("stdin") else str(_input(case_dir))]
    if (case_dir / "config.yaml").exists():
        args += ["--config", str(case_dir / "config.yaml")]
    if (case_dir / "cluster.yaml").exists():  # cluster state, as `kubectl get ... -o yaml` prints it
        args += ["--cluster", str(case_dir / "cluster.yaml")]
    extra = spec.get("args") or []
    assert isinstance(extra, list)
    return args + [str(a) for a in extra]


@pytest.mark.parametrize("case", CASES)
def test_golden_case(case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    case_dir = GOLDEN / case
    spec = yaml.safe_load((case_dir / "case.yaml").read_text())
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    if spec.get("stdin"):
        monkeypatch.setattr(sys, "stdin", io.StringIO((case_dir / "input.yaml").read_text()))
    code = cli.main(_args(case_dir, spec))
    out, err = capsys.readouterr()
    # Paths in reports and patch entries are relative to the case, whatever the checkout.
    out = out.replace(str(case_dir) + "/", "")
    err = err.replace(str(case_dir) + "/", "")
    if REGENERATE:
        (case_dir / "expected.out").write_text(out)
        (case_dir / "expected.err").write_text(err)
        spec["exit"] = code
        (case_dir / "case.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        return
    assert code == spec["exit"], err
    assert out == (case_dir / "expected.out").read_text()
    assert err == (case_dir / "expected.err").read_text()


def test_golden_output_is_a_fixed_point() -> None:
    """Feeding a case's mutated YAML back through the engine changes nothing (reinvocation)."""
    checked = 0
    for case in CASES:
        case_dir = GOLDEN / case
        spec = yaml.safe_load((case_dir / "case.yaml").read_text())
        if spec.get("args") or not (case_dir / "expected.out").read_text().strip():
            continue
        args = ["mutate", "-f", str(case_dir / "expected.out"), "-o", "patch"]
        if (case_dir / "config.yaml").exists():
            args += ["--config", str(case_dir / "config.yaml")]
        if (case_dir / "cluster.yaml").exists():
            args += ["--cluster", str(case_dir / "cluster.yaml")]
        out = io.StringIO()
        err = io.StringIO()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "stdout", out)
            mp.setattr(sys, "stderr", err)
            cli.main(args)
        for entry in yaml.safe_load(out.getvalue()):
            assert entry["patch"] == [], (case, entry)
        checked += 1
    assert checked >= 5


def test_console_script_runs_installed() -> None:
    """The `castslice` entry point of the installed package, as a user runs it."""
    case_dir = GOLDEN / "workloads"
    done = subprocess.run(
        ["castslice", "mutate", "-f", str(case_dir / "input.yaml")],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (case_dir / "expected.out").read_text()
