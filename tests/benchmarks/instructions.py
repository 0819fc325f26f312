"""Benchmark: instructions per review, counted by valgrind's callgrind, so the figure does not move
with the machine's load (a busy shared machine makes every timed figure several times slower).

Not a test (pytest does not collect it, nothing here asserts a count): run it by hand.

    python tests/benchmarks/instructions.py                    # this checkout, mutating and non-mutating
    python tests/benchmarks/instructions.py --before DIR       # and another checkout, side by side
    python tests/benchmarks/instructions.py --without rules    # with one engine stage taken out
    python tests/benchmarks/instructions.py --kind lease-plain --kind lease-charged   # a lease's charge

Each figure is one process running ``WebhookHttp.handle`` as ``tests/benchmarks/webhook.py``'s
in-process figure does (built as served, the audit event built and its delivery dropped): after a
warm-up, ``--reviews`` reviews are made through ``map`` and callgrind counts only while CPython's
``map_next`` runs (``--toggle-collect``), so the count is the reviews' own, without the
interpreter's start, the imports and the warm-up.

``lease-plain`` and ``lease-charged`` are ``tests/benchmarks/leases.py``'s review without leases and
its charged review, over its view (100 GpuLeases, 10,000 charged Pods): the shipped configuration
(knative/base/config.yaml, audit events built and dropped) without and with ``gpuLeases``, the same
GPU Pod in namespace team-042, which holds a GpuLease; the difference is what a lease's charge adds
(the decision, the stamp, the patch and its proof, the ledger's record; the ledger is emptied after
each review, as the watch empties it when the Pod arrives). Needs valgrind (Debian package `valgrind`) and a
CPython whose symbols are not stripped; one count takes a minute or two.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REVIEWS = ROOT / "tests" / "data" / "admission-reviews"
BODIES: dict[str, Path | None] = {
    "mutating": REVIEWS / "default-slice-inference.json",
    "non-mutating": REVIEWS / "default-not-opted-in.json",
    "lease-plain": None,
    "lease-charged": None,
}
WARM_UP = 50
WITHOUT = {
    "engine": "the engine's whole decision (each review gets the first review's decision again)",
    "rules": "the apiserver rules' check of the patched Pod (rules.introduced answers: nothing)",
    "proof": "applying the patch and comparing the result (json_patch.prove answers: the intended Pod)",
}
"""Engine stages ``--without`` takes out of the counted reviews: only to see what each costs (the
reviews' answers stay the same for the shipped bodies, whose patches pass both)."""

# Run under valgrind in a process of its own, with the checkout measured first on sys.path.
REVIEWER = """
import sys
from pathlib import Path
checkout, kind, body_path = sys.argv[1], sys.argv[2], sys.argv[3]
warm_up, count, lease_setup = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
without = sys.argv[7:]
sys.path.insert(0, checkout)
from function.serve.app import build_webhook
from function.core import engine
if "rules" in without:
    engine.introduced = lambda original, patched: set()
if "proof" in without:
    engine.prove = lambda original, patch, intended, intended_json=None: intended
if "engine" in without:
    decided = {}
    decide = engine.Engine.decide_or_raise
    engine.Engine.decide_or_raise = lambda self, pod, request: (
        decided.get("first") or decided.setdefault("first", decide(self, pod, request))
    )
if kind.startswith("lease-"):
    exec(lease_setup)
else:
    webhook = build_webhook(environ={})
    body = Path(body_path).read_bytes()
    empty = []
audit = webhook.admission.recorder
getattr(audit, "inner", audit).sender.submit = lambda event: None
def review(_):
    webhook.handle("POST", "/mutate", body)
    for entries in empty:
        entries.clear()
for _ in range(warm_up):
    review(None)
for _ in map(review, range(count)):  # counted: map_next
    pass
"""

LEASE_SETUP = """
from datetime import UTC, datetime
sys.path.insert(0, str(Path(checkout) / "tests" / "benchmarks"))
from leases import LEASE_COUNT, charged_pod, lease_object, review_body
from function.core.config import parse_config
from function.core.leases import CHARGED_PODS, LEASES, slim_lease
from function.core.view import IndexState, View
from function.serve.ledger import with_ledgers
import yaml
data = yaml.safe_load((Path(checkout) / "knative" / "base" / "config.yaml").read_text())
if kind == "lease-charged":
    data["gpuLeases"] = {"enabled": True}
webhook = build_webhook(parse_config(data), {"CASTSLICE_LOG_LEVEL": "WARNING"}, watches=(), freeze_gc=False)
ledgers = getattr(webhook.admission.recorder, "ledgers", ())
empty = [ledger._entries for ledger in ledgers]
leases = IndexState.build({f"lease-uid-{n}": slim_lease(lease_object(n)) for n in range(LEASE_COUNT)}, LEASES)
pods = {}
for n in range(10_000):
    obj = charged_pod(n)
    pods[CHARGED_PODS.key(obj)] = CHARGED_PODS.slim(obj)
view = View({LEASES.index: leases, CHARGED_PODS.index: IndexState.build(pods, CHARGED_PODS)})
turns = getattr(webhook.admission.recorder, "turns", None)
webhook.admission.cluster = with_ledgers(lambda: view, ledgers, turns, lambda: datetime.now(UTC))
body = review_body("team-042")
"""


def per_review(checkout: Path, kind: str, count: int, without: list[str] | None = None) -> int:
    """Instructions per review of ``kind``, over ``count`` reviews, with the engine stages of
    ``without`` taken out (WITHOUT)."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--collect-atstart=no",
            "--toggle-collect=map_next",
            sys.executable,
            "-c",
            REVIEWER,
            str(checkout),
            kind,
            str(BODIES[kind] or ""),
            str(WARM_UP),
            str(count),
            LEASE_SETUP,
            *(without or ()),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=checkout,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1)) // count


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", type=Path, help="another checkout (a git worktree) counted beside this one"
    )
    parser.add_argument("--reviews", type=int, default=200, help="reviews counted (default: 200)")
    parser.add_argument("--kind", choices=sorted(BODIES), action="append", help="one kind only (repeatable)")
    parser.add_argument(
        "--without",
        choices=sorted(WITHOUT),
        action="append",
        help="count with this engine stage taken out (the difference is what it costs; repeatable)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install -y valgrind)")
    checkouts = {"this": ROOT} if args.before is None else {"before": args.before.resolve(), "this": ROOT}
    figures: dict[str, dict[str, int]] = {}
    for kind in args.kind or list(BODIES):
        for name, checkout in checkouts.items():
            count = per_review(checkout, kind, args.reviews, args.without)
            figures.setdefault(name, {})[kind] = count
            print(f"{kind:>12} {name:>6} ({checkout}): {count:,} instructions per review", flush=True)
        if "before" in figures:
            ratio = figures["this"][kind] / figures["before"][kind]
            print(f"{kind:>12} this / before: {ratio:.3f}", flush=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
