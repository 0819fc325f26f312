"""PodMutation cost per admission: ``python tests/benchmarks/podmutation.py``.

Every mutation filters on namespace ``prod`` (each one passes it) and a name regex, so all N are
ranked for every Pod; the last one matches and is applied (a label, a toleration, an extended patch).
Then the catastrophic-backtracking filter ``(a+)+b`` against names of ``a``s, each name new (so no
remembered answer helps): linear time on RE2, where Python's re took 3.2 s at 27 characters.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: tests is a package

from function.core.config import parse_config
from function.core.engine import Engine
from function.core.mutators.base import RequestContext
from function.core.podmutation.compiled import compile_object
from function.core.view import StaticView
from tests.support import mutation_records


def podmutation(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "PodMutation",
        "metadata": {"name": f"m{i:04d}", "generation": 1, "uid": f"u{i}"},
        "spec": {
            "filter": {
                "workload": {"namespaces": [f"ns-{i}", "prod"], "names": [f"^app-{i}-.*$"]},
                "pod": {"labelsFilter": [{"key": "tier", "value": f"t{i % 7}"}]},
            },
            "labels": {"m": str(i)},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "patches": [{"op": "replace", "path": "/spec/tolerations/[key=k]/effect", "value": "NoSchedule"}],
        },
    }


def main() -> None:
    engine = Engine(parse_config({"podMutations": {"enabled": True}}))
    for n in (1, 10, 100, 1000):
        started = time.perf_counter()
        records = {compiled.uid: compiled for compiled in map(compile_object, map(podmutation, range(n)))}
        compile_seconds = time.perf_counter() - started
        view = StaticView({"podmutations": records}, specs=())
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"app-{n - 1}-x",
                "namespace": "prod",
                "labels": {"tier": f"t{(n - 1) % 7}"},
            },
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        ctx = RequestContext(uid="u", namespace="prod", cluster=view)
        assert engine.decide(pod, ctx).outcome == "mutated"
        repeats = 2000 if n < 1000 else 200
        started = time.perf_counter()
        for _ in range(repeats):
            engine.decide(pod, ctx)
        decide_seconds = (time.perf_counter() - started) / repeats
        print(
            f"{n:5d} PodMutations: decide {decide_seconds * 1e6:6.0f} us per Pod; "
            f"compile {compile_seconds / n * 1e6:4.0f} us each"
        )

    catastrophic = mutation_records(
        [{**podmutation(0), "spec": {"filter": {"workload": {"names": ["(a+)+b"]}}, "labels": {"m": "x"}}}]
    )
    view = StaticView({"podmutations": catastrophic}, specs=())
    for length in (30, 253, 100_000):
        pods = [
            {"metadata": {"name": "a" * (length - 1) + chr(ord("c") + i % 20), "namespace": "prod"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}}
            for i in range(20)
        ]  # fmt: skip
        ctx = RequestContext(uid="u", namespace="prod", cluster=view)
        started = time.perf_counter()
        for pod in pods:
            assert engine.decide(pod, ctx).outcome == "unchanged"
        took = (time.perf_counter() - started) / len(pods)
        print(f"filter (a+)+b, a name of {length:7,d} characters: decide {took * 1e6:6.0f} us per Pod")


if __name__ == "__main__":
    main()
