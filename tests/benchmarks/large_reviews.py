"""Small reviews beside 3 MiB ones, with the shipped configuration: figures for docs/serving.md.

``castslice serve --config knative/base/config.yaml`` (the manifests' configuration: PodMutations
on) over a stand-in apiserver (tests/support/view.py) holding the twelve PodMutations of
tests/support/hostile.py, so every review is decided over a cluster view. Small mutating reviews go one
after another on a kept-alive connection while three 3 MiB reviews are in flight
(tests/benchmarks/webhook.py ``large_reviews``); printed: their p50/p99, the slowest 3 MiB review, and
the same small reviews alone. ``--compare`` runs the same with ``CASTSLICE_LARGE_REVIEWS=event-loop``
(every review on the event loop, as large reviews were decided with PodMutations on before the
large-review process read the view).

    python tests/benchmarks/large_reviews.py [--rounds 3] [--compare]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from function.core.mutators.pod_mutations_mutator import OUR_MUTATIONS  # noqa: E402
from tests.benchmarks.webhook import free_port, large_reviews, stop  # noqa: E402
from tests.support.hostile import podmutation_objects  # noqa: E402
from tests.support.view import FakeApiServer, kubeconfig_for  # noqa: E402

SHIPPED = ROOT / "knative" / "base" / "config.yaml"


def serve(kubeconfig: Path, large: str | None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "CASTSLICE_LOG_LEVEL": "WARNING"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    if large is not None:
        env["CASTSLICE_LARGE_REVIEWS"] = large
    castslice = Path(sys.executable).parent / "castslice"
    server = subprocess.Popen(
        [str(castslice), "serve", "--config", str(SHIPPED), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return server, port
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            stop(server)
            raise SystemExit("castslice serve did not become ready")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=3, help="3 MiB reviews in flight at once")
    parser.add_argument("--compare", action="store_true", help="also every review on the event loop")
    args = parser.parse_args()
    modes = {"large-review process (default)": None}
    if args.compare:
        modes["event loop (CASTSLICE_LARGE_REVIEWS=event-loop)"] = "event-loop"
    with FakeApiServer() as api, tempfile.TemporaryDirectory() as scratch:
        api.load(OUR_MUTATIONS.path(), podmutation_objects())
        kubeconfig = kubeconfig_for(api.url, Path(scratch) / "kubeconfig")
        for label, large in modes.items():
            for number in range(1, args.rounds + 1):
                server, port = serve(kubeconfig, large)
                try:
                    figures = large_reviews(port, args.in_flight)
                finally:
                    stop(server)
                print(
                    f"{label}, round {number}: {args.in_flight} x 3 MiB in flight: "
                    f"{int(figures['small_n'])} small reviews, p50 {figures['small_p50']:.2f} ms, "
                    f"p99 {figures['small_p99']:.2f} ms; slowest 3 MiB review {figures['large_max_s']:.2f} s "
                    f"(small reviews alone: p99 {figures['idle_p99']:.2f} ms)",
                    flush=True,
                )
                print(json.dumps({"mode": label, "round": number, **figures}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
