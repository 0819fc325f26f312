"""Running the ``castslice`` command in-process, as a test sees it: the exit code, stdout and stderr."""

from __future__ import annotations

import io
import sys

import pytest

from function import cli


def run(monkeypatch: pytest.MonkeyPatch, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """``castslice ARGS`` reading ``stdin``, without $CASTSLICE_CONFIG: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()
