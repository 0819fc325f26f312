"""function/cli.py: each command imports only what it runs, so ``castslice --version`` and a
preview start fast (the figures: tests/benchmarks/cli.py, beside ``python -c pass``; no test here
times anything). Each command runs in a fresh interpreter, which then lists the modules it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

RUN_AND_LIST = """
import json, sys
from function import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout.flush()
sys.stderr.write("\\n" + json.dumps(sorted(sys.modules)) + "\\n")
"""

SERVING = ("functions_framework", "starlette", "uvicorn", "gunicorn", "flask", "cloudevents")
CLUSTER = ("kubernetes", "function.kube", "prometheus_client")
PROGRAMS_NOT_RUN = ("function.serve", "function.audit", "function.control", "function.admin")
HEAVY_FOR_VERSION = (
    "pydantic",
    "cryptography",
    "re2",
    "sqlite3",
    "yaml",
    "ruamel",
    "function.core",
    "function.offline",
    "function.admission",
    "function.admin.doctor",
    *SERVING,
    *CLUSTER,
    *PROGRAMS_NOT_RUN,
)
ONE_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: chat, annotations: {castops.io/optimize: "true"}}
spec:
  containers:
    - {name: server, image: vllm, resources: {limits: {nvidia.com/gpu: 1}}}
"""


def loaded(*args: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``castslice ARGS``."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
    )
    last = done.stderr.strip().splitlines()[-1]
    modules: set[str] = set(json.loads(last))
    return modules


def found(modules: set[str], families: tuple[str, ...]) -> list[str]:
    """The families of which ``modules`` holds a module (``pydantic`` for ``pydantic.main``)."""
    return sorted(f for f in families if any(m == f or m.startswith(f + ".") for m in modules))


def test_the_version_loads_no_configuration_model_no_crypto_no_database_no_cluster_client() -> None:
    modules = loaded("--version")
    assert "function.cli" in modules
    assert found(modules, HEAVY_FOR_VERSION) == []


def test_a_preview_loads_the_engine_but_no_server_cluster_client_or_other_program(tmp_path: Path) -> None:
    pod = tmp_path / "one-pod.yaml"
    pod.write_text(ONE_POD)
    modules = loaded("mutate", "-f", str(pod))
    assert {"function.core.engine", "function.offline.mutate", "pydantic"} <= modules
    unused = (
        *SERVING,
        *CLUSTER,
        *PROGRAMS_NOT_RUN,
        "cryptography",
        "sqlite3",
        # PodMutations are compiled only when the input or --mutations has one.
        "re2",
        "function.core.podmutation.spec",
        "function.core.podmutation.compiled",
        "function.admission",
    )
    assert found(modules, unused) == []


def test_a_preview_with_a_podmutation_loads_what_applies_it(tmp_path: Path) -> None:
    mutation = {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "PodMutation",
        "metadata": {"name": "labels"},
        "spec": {"labels": {"team": "ml"}},
    }
    manifest = tmp_path / "with-mutation.yaml"
    manifest.write_text(ONE_POD + "---\n" + json.dumps(mutation) + "\n")
    modules = loaded("mutate", "-f", str(manifest))
    assert {"function.core.podmutation.compiled", "function.core.mutators.pod_mutations_mutator"} <= modules


@pytest.mark.parametrize(
    ("args", "program"),
    [
        (("config", "show"), "function.offline.config"),
        (("dra", "templates"), "function.offline.dra"),
        (("audit", "--help"), None),
        (("certgen", "--help"), None),
    ],
)
def test_each_command_loads_its_own_program_only(args: tuple[str, ...], program: str | None) -> None:
    modules = loaded(*args)
    if program is not None:
        assert program in modules
    assert found(modules, ("function.admin", "function.serve", "function.control", "function.audit")) == []
