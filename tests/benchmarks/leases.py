"""Benchmark: the GPU lease decision, and what the view keeps per charged Pod.

Not a test (pytest does not collect it, nothing here asserts a time): run it by hand.

    python tests/benchmarks/leases.py                  # 10,000 and 100,000 charged Pods, 100 leases
    python tests/benchmarks/leases.py --pods 20000     # one size

Printed, for each size, p50 and p99 of each measure, all taken in the same run, one call of each
per round in an order that rotates every round (so the machine's other work falls on every side
alike), and the difference at p50 with the review each is compared with:

- review without leases: a whole review through the real webhook (parse, engine, patch proof,
  reply) with knative/base/config.yaml as shipped (gpuSlicing and podMutations on, the Pod not
  opted in to slicing: unchanged);
- with gpuLeases, namespace without lease: the same webhook plus ``gpuLeases`` (the snapshot with
  the lease ledger and the turns, one lookup), for the same Pod in a namespace that leases nothing;
- with gpuLeases, Pod charged: the Pod in a leased namespace: the decision, the stamp (labels,
  annotations, the model's nodeSelector) as a patch that is proven and sent, the ledger record;
- sliced, without and with gpuLeases: a Pod gpuSlicing mutates, so both sides send a patch and the
  difference is what charging adds to a review that changes the Pod anyway;
- lease decision alone: the mutator's decide (choose the lease, read its sums, judge);
- held per charged Pod: resident memory growth per charged Pod kept by the view (records, the
  by-lease layout and its sums), put one event at a time as the watch does (target: at most 1 KiB).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from function.core.leases import CHARGED_PODS, LEASES, slim_lease  # noqa: E402
from function.core.view import IndexState, Overlay, View  # noqa: E402

LEASE_COUNT = 100
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle() -> int:
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def lease_object(n: int) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {
            "name": f"lease-{n:03d}",
            "namespace": f"team-{n:03d}",
            "uid": f"lease-uid-{n}",
            "creationTimestamp": "2026-11-25T00:00:00Z",
        },
        "spec": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "count": 1_000_000, "duration": "720h"},
    }


def charged_pod(n: int) -> dict[str, Any]:
    """A charged Pod as the metadata-only watch delivers it (managedFields included)."""
    lease = n % LEASE_COUNT
    return {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {
            "name": f"train-{n:06d}-7d4b9",
            "generateName": f"train-{n:06d}-",
            "namespace": f"team-{lease:03d}",
            "uid": str(uuid.uuid4()),
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {
                "app": f"train-{n // 10}",
                "castops.io/gpu-lease": f"lease-{lease:03d}",
                "castops.io/gpu-lease-state": "charged",
            },
            "annotations": {
                "castops.io/gpu-lease-charge": "1000m",
                "castops.io/gpu-lease-decision": str(uuid.uuid4()),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"train-{n // 10}",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-25T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
                }
            ],
        },
    }


def held_index(pods: int) -> tuple[IndexState, float]:
    """The charged-Pods index filled one event at a time; bytes held per Pod."""
    before = settle()
    state = IndexState(synced=True)
    for n in range(pods):
        obj = json.loads(json.dumps(charged_pod(n)))  # as parsed from the wire, then dropped
        state = state.put(
            CHARGED_PODS.key(obj), CHARGED_PODS.slim(obj), CHARGED_PODS.group_by, CHARGED_PODS.tally
        )
    after = settle()
    return state, (after - before) / pods


def review_body(namespace: str, annotations: dict[str, str] | None = None) -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": namespace,
                "userInfo": {"username": "bench"},
                "object": pod,
            },
        }
    ).encode()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def side_by_side(calls: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Each call once per round, in an order that rotates every round, so that whatever else the
    machine does (other processes, the CPU's clock) falls on every side alike."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            call = calls[name]
            began = clock()
            call()
            samples[name].append((clock() - began) * 1e6)
    return samples


def shipped_configuration(leases: bool) -> Any:
    """knative/base/config.yaml as shipped (gpuSlicing and podMutations on), audit off, with or
    without ``gpuLeases``: the review without leases is what a user runs today."""
    import yaml

    from function.core.config import parse_config

    data = yaml.safe_load((ROOT / "knative" / "base" / "config.yaml").read_text())
    data["audit"] = {"sink": "none"}
    if leases:
        data["gpuLeases"] = {"enabled": True}
    return parse_config(data)


def measure(pods: int, reviews: int) -> dict[str, Any]:
    from function.admission.wire import parse_review
    from function.core.mutators.base import RequestContext
    from function.core.mutators.gpu_leases import GpuLeases, GpuLeasesConfig
    from function.serve.app import build_webhook
    from function.serve.lease_ledger import LeaseLedger
    from function.serve.ledger import DecisionTurns, with_ledgers

    index, per_pod = held_index(pods)
    leases = IndexState.build(
        {f"lease-uid-{n}": slim_lease(lease_object(n)) for n in range(LEASE_COUNT)}, LEASES
    )
    view = View({LEASES.index: leases, CHARGED_PODS.index: index})
    environ = {"CASTSLICE_LOG_LEVEL": "WARNING"}
    with_leases = build_webhook(shipped_configuration(True), environ, watches=(), freeze_gc=False)
    ledger, turns = LeaseLedger(), DecisionTurns()
    with_leases.admission.cluster = with_ledgers(lambda: view, [ledger], turns, lambda: datetime.now(UTC))
    without = build_webhook(shipped_configuration(False), environ, watches=(), freeze_gc=False)
    without.admission.cluster = lambda: view  # the same view (PodMutations read it): only gpuLeases differs
    body, elsewhere = review_body("team-042"), review_body("no-lease-here")
    # Opted in to slicing: gpuSlicing mutates it either way, so both sides send a patch.
    sliced = review_body("team-042", {"castops.io/optimize": "true", "castops.io/workload-type": "inference"})

    def charged() -> None:
        answer = with_leases.admission.review(parse_review(body))
        assert answer.decision is not None and answer.decision.outcome == "mutated", answer.decision
        # The watch keeps up: the Pod just charged reaches the view and its ledger entry goes
        # (LeaseLedger.watched); here it never reaches this fixed view: forget it the same way.
        ledger._entries.clear()

    def plain() -> None:
        answer = without.admission.review(parse_review(body))
        assert answer.decision is not None and answer.decision.outcome != "denied", answer.decision

    def unleased() -> None:  # gpuLeases on, a namespace without a lease: one lookup, no stamp
        answer = with_leases.admission.review(parse_review(elsewhere))
        assert answer.decision is not None and answer.decision.outcome != "denied", answer.decision

    def sliced_plain() -> None:
        answer = without.admission.review(parse_review(sliced))
        assert answer.decision is not None and answer.decision.outcome == "mutated", answer.decision

    def sliced_charged() -> None:
        answer = with_leases.admission.review(parse_review(sliced))
        decision = answer.decision
        assert decision is not None and decision.outcome == "mutated", decision
        assert "gpu-leases" in decision.reason and "gpu-slicing" in decision.reason, decision.reason
        ledger._entries.clear()

    mutator = GpuLeases(GpuLeasesConfig(enabled=True))
    pod = json.loads(body)["request"]["object"]
    lease_view = Overlay(view, now=NOW)
    ctx = RequestContext(uid="bench", namespace="team-042", cluster=lease_view)

    def decision() -> None:  # the lease decision alone: choose the lease, read its sums, judge
        verdict = mutator.decide(pod, ctx)
        assert verdict is not None and verdict.reason == "Charged", verdict

    calls = {
        "plain": plain,
        "charged": charged,
        "unleased": unleased,
        "sliced_plain": sliced_plain,
        "sliced_charged": sliced_charged,
        "decision": decision,
    }
    side_by_side(calls, 200)  # warm up
    gc.collect()
    gc.freeze()
    samples = side_by_side(calls, reviews)
    gc.unfreeze()
    return {
        "pods": pods,
        "p50": {name: percentile(values, 0.5) for name, values in samples.items()},
        "p99": {name: percentile(values, 0.99) for name, values in samples.items()},
        "held_per_pod": per_pod,
    }


ROWS = (
    ("plain", "review without leases (shipped config)", ""),
    ("unleased", "with gpuLeases, namespace without lease", "plain"),
    ("charged", "with gpuLeases, Pod charged", "plain"),
    ("sliced_plain", "sliced by gpuSlicing, without leases", ""),
    ("sliced_charged", "sliced, and charged with gpuLeases", "sliced_plain"),
    ("decision", "lease decision alone", ""),
)
"""What is printed: (sample, label, the sample it is compared with at p50)."""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pods", type=int, action="append", help="charged Pods in view (default 10000, 100000)"
    )
    parser.add_argument("--reviews", type=int, default=3000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.reviews} rounds")
    for pods in args.pods or [10_000, 100_000]:
        r = measure(pods, args.reviews)
        p50, p99 = r["p50"], r["p99"]
        print(f"{pods:>7} charged Pods, {LEASE_COUNT} leases in view (p50 / p99, us):")
        for name, label, against in ROWS:
            extra = f"   {p50[name] - p50[against]:+7.1f} us at p50" if against else ""
            print(f"  {label:<42} {p50[name]:7.1f} / {p99[name]:7.1f}{extra}")
        print(f"  {'held per charged Pod':<42} {r['held_per_pod']:7.0f} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
