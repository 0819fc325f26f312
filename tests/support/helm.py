"""helm for the tests: the binary .ci/provision-helm builds (CASTSLICE_HELM, else its cache),
and charts/castslice rendered with it. CI sets CASTSLICE_HELM_REQUIRED=1: no helm fails there."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import yaml

from tests.support import ROOT

CHART = ROOT / "charts" / "castslice"
REQUIRED = os.environ.get("CASTSLICE_HELM_REQUIRED") == "1"


def helm_binary() -> str | None:
    if os.environ.get("CASTSLICE_HELM"):
        return os.environ["CASTSLICE_HELM"]
    found = subprocess.run(
        [str(ROOT / ".ci" / "provision-helm"), "--check"], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() or None if found.returncode == 0 else None


HELM = helm_binary()
SKIP_REASON = 'no helm: export CASTSLICE_HELM="$(.ci/provision-helm)"; CI sets CASTSLICE_HELM_REQUIRED=1'


def helm_template(*settings: str) -> list[dict[str, Any]]:
    assert HELM is not None, "helm is required here (CASTSLICE_HELM_REQUIRED=1): .ci/provision-helm"
    args = [HELM, "template", "castslice", str(CHART), "--namespace", "castslice-system", "--include-crds"]
    for setting in settings:
        args += ["--set", setting]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
