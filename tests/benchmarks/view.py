"""Benchmark: the cluster view with 10,000 and 100,000 Pods.

Not a test (pytest does not collect it, nothing here asserts a time): run it by hand.

    python tests/benchmarks/view.py                 # 10,000 and 100,000 Pods
    python tests/benchmarks/view.py --pods 20000    # one size
    python tests/benchmarks/view.py --churn 200     # with 200 Pod updates/s streaming meanwhile

A stand-in apiserver (tests/support/view.py, in its own process so its objects do not count)
serves the Pods as PartialObjectMetadata (with managedFields, as a real apiserver sends them),
10 per ReplicaSet, and a ReplicaSet list. The real ClusterWatcher lists and watches them through
the real KubeClient. Printed:

- sync: time to list (paginated, 500 a page) and index everything;
- RSS: the process's resident memory growth from before the watch to after the sync (after a
  garbage collection and malloc_trim), per Pod - the view's real cost, indices included;
- decision: p50/p99 of a whole review through the real webhook (parse, one snapshot, engine,
  reply) whose mutator counts the new Pod's siblings by placement, as the spot split does, and
  of the view part alone (snapshot + group lookup + count);
- API requests while answering reviews: counted by the stand-in apiserver and by the watcher's
  own counter (target 0).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from function.core.mutators.base import MutatorResult, RequestContext  # noqa: E402
from function.core.view import PODS, REPLICASETS, ClusterView  # noqa: E402

PER_REPLICASET = 10


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle() -> int:
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed JSON pages back, so RSS shows what is kept
    return rss_bytes()


# -- the stand-in apiserver, in its own process ---------------------------------------------------
def realistic_pod(index: int, owner_uid: str, namespace: str) -> dict[str, Any]:
    app = f"app-{index // PER_REPLICASET:06d}"
    return {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {
            "name": f"{app}-7d4b9c8f5-{index % 100000:05d}",
            "generateName": f"{app}-7d4b9c8f5-",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": "2026-11-23T20:00:00Z",
            "labels": {
                "app": app,
                "pod-template-hash": "7d4b9c8f5",
                "castops.io/placement": "spot" if index % 3 else "on-demand",
            },
            "annotations": {"castops.io/placement-decision": "partial 60%"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-7d4b9c8f5",
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-23T20:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:generateName": {},
                            "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                        }
                    },
                }
            ],
        },
    }


def serve(pods: int, churn: float) -> None:
    from tests.support.view import FakeApiServer

    server = FakeApiServer()
    owners = [str(uuid.uuid4()) for _ in range(max(1, pods // PER_REPLICASET))]
    objects = [realistic_pod(i, owners[i // PER_REPLICASET], f"team-{i % 100:03d}") for i in range(pods)]
    server.load(PODS.path(), objects)
    server.load(
        REPLICASETS.path(),
        [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"rs-{n}",
                    "namespace": "team-000",
                    "uid": uid,
                    "ownerReferences": [
                        {"kind": "Deployment", "name": f"d-{n}", "uid": str(uuid.uuid4()), "controller": True}
                    ],
                },
                "spec": {"replicas": PER_REPLICASET},
            }
            for n, uid in enumerate(owners)
        ],
    )
    with server:
        print(json.dumps({"url": server.url, "owners": owners[:1000]}), flush=True)
        if churn > 0:

            def churning() -> None:
                n = 0
                while True:
                    obj = json.loads(json.dumps(objects[n % len(objects)]))
                    obj["metadata"]["labels"]["castops.io/placement"] = "spot" if n % 2 else "on-demand"
                    server.put(PODS.path(), obj)
                    n += 1
                    time.sleep(1 / churn)

            threading.Thread(target=churning, daemon=True).start()
        for _ in sys.stdin:  # each line asks how many requests we served; EOF ends us
            with server.lock:
                print(json.dumps({"requests": len(server.seen)}), flush=True)


# -- the measurement ------------------------------------------------------------------------------
class SiblingCounter:
    """What the spot split reads: the new Pod's siblings under its ReplicaSet, by placement."""

    name = "sibling-counter"

    def mutate(self, pod: dict[str, Any], ctx: RequestContext) -> MutatorResult:
        owner = pod["metadata"]["ownerReferences"][0]["uid"]
        spot, other = count(ctx.cluster, owner)
        return MutatorResult.unchanged(f"{spot} spot, {other} other siblings")


def count(view: ClusterView, owner: str) -> tuple[int, int]:
    spot = other = 0
    for record in view.group("pods", owner).values():
        if record.terminating:
            continue
        if record.placement == "spot":
            spot += 1
        else:
            other += 1
    return spot, other


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    pods: int, churn: float, reviews: int, freeze: bool = True, decision: str = "spot"
) -> dict[str, Any]:
    from function.core.config import parse_config
    from function.core.engine import Engine
    from function.serve.app import build_webhook
    from tests.support.view import transport_for

    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(pods), "--churn", str(churn)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        hello = json.loads(child.stdout.readline())  # type: ignore[union-attr]
        # Audit events off (decisions are not what is measured); the webhook and the transport are
        # built - every module imported - before the baseline, so RSS growth is the view's own.
        settings: dict[str, Any] = {"audit": {"sink": "none"}}
        if decision == "spot":
            # The real spot mutator, partial split (CAST AI's partialSpot preset: 40 % of each
            # ReplicaSet on spot), counting the siblings in the view; GPU slicing off.
            settings |= {"gpuSlicing": {"enabled": False}, "spot": {"enabled": True, "preset": "partialSpot"}}
        config = parse_config(settings)
        transport = transport_for(hello["url"])
        warm = build_webhook(config, {}, transport=transport, watches=())
        del warm
        before = settle()
        started = time.perf_counter()
        webhook = build_webhook(
            config, {}, transport=transport, watches=(PODS, REPLICASETS), freeze_gc=freeze
        )
        watcher = webhook.watcher
        assert watcher.wait_synced(600)
        synced_in = time.perf_counter() - started
        after = settle()
        held = len(watcher.snapshot().index("pods"))
        t0 = time.perf_counter()
        gc.collect()
        full_gc_ms = (time.perf_counter() - t0) * 1e3

        if decision != "spot":
            webhook.admission.engine = Engine(config, mutators=[SiblingCounter()], shadow=[])
        review = json.loads(
            (
                ROOT / "tests" / "data" / "admission-reviews" / "default-inference-fleet-64d4bcc9b8.json"
            ).read_text()
        )
        bodies = []
        for owner in hello["owners"][:200]:
            review["request"]["uid"] = str(uuid.uuid4())
            review["request"]["object"]["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "rs",
                    "uid": owner,
                    "controller": True,
                }
            ]
            bodies.append(json.dumps(review).encode())
        time.sleep(0.5)  # the watches are open: from now on nothing should ask the apiserver

        def served() -> int:
            child.stdin.write("count\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            return int(json.loads(child.stdout.readline())["requests"])  # type: ignore[union-attr]

        served_before, counted_before = served(), watcher.api_requests()

        def timed_reviews(target: Any) -> list[float]:
            samples = []
            for n in range(reviews):
                t0 = time.perf_counter()
                reply = target.handle("POST", "/mutate", bodies[n % len(bodies)])
                samples.append(time.perf_counter() - t0)
                assert reply.status == 200
            return samples

        pauses: list[tuple[int, float]] = []
        began: list[float] = [0.0]

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
            else:
                pauses.append((info["generation"], time.perf_counter() - began[0]))

        gc.callbacks.append(on_gc)
        whole = timed_reviews(webhook)
        gc.callbacks.remove(on_gc)
        full = [seconds for generation, seconds in pauses if generation == 2]
        # The same reviews on a webhook without a view, in the same process and moment: what the
        # view adds to a review, apart from this machine's noise.
        bare = build_webhook(config, {}, watches=())
        if decision != "spot":  # (spot without a view decides by a hash split instead)
            bare.admission.engine = Engine(config, mutators=[SiblingCounter()], shadow=[])
        baseline = timed_reviews(bare)
        view_only: list[float] = []
        for n in range(reviews):
            owner = hello["owners"][n % len(hello["owners"])]
            t0 = time.perf_counter()
            count(watcher.snapshot(), owner)
            view_only.append(time.perf_counter() - t0)

        from function.admission.wire import parse_review

        decided = webhook.admission.review(parse_review(bodies[0])).decision
        sample = "; ".join(m.reason for m in decided.decisions) if decided is not None else "(no decision)"
        served_after, counted_after = served(), watcher.api_requests()
        watcher.stop()
        child.stdin.close()  # type: ignore[union-attr]
        return {
            "pods": pods,
            "held": held,
            "sample": sample,
            "sync_s": synced_in,
            "rss_mib": (after - before) / 2**20,
            "rss_per_pod": (after - before) / pods,
            "review_p50_ms": percentile(whole, 0.5) * 1e3,
            "review_p99_ms": percentile(whole, 0.99) * 1e3,
            "full_gc_ms": full_gc_ms,
            "gc_full": len(full),
            "gc_full_max_ms": max(full, default=0.0) * 1e3,
            "bare_p50_ms": percentile(baseline, 0.5) * 1e3,
            "bare_p99_ms": percentile(baseline, 0.99) * 1e3,
            "view_p50_us": percentile(view_only, 0.5) * 1e6,
            "view_p99_us": percentile(view_only, 0.99) * 1e6,
            "view_mean_us": statistics.fmean(view_only) * 1e6,
            "requests_during_reviews": counted_after - counted_before,
            "apiserver_saw_during_reviews": served_after - served_before,
            "apiserver_requests_total": served_after,
        }
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, action="append", help="view size (repeatable)")
    parser.add_argument("--churn", type=float, default=0.0, help="Pod updates per second during the run")
    parser.add_argument("--reviews", type=int, default=5000)
    parser.add_argument("--no-gc-freeze", action="store_true", help="leave the view to the garbage collector")
    parser.add_argument(
        "--decision",
        choices=("spot", "siblings"),
        default="spot",
        help="spot: the real spot mutator (partialSpot); siblings: only count siblings by placement",
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.churn)
        return 0
    print("pods    held    sync   RSS     RSS/Pod review p50/p99 (no view)  view p50/p99  API req. answering")
    for pods in args.pods or [10_000, 100_000]:
        r = measure(pods, args.churn, args.reviews, not args.no_gc_freeze, args.decision)
        print(
            f"{r['pods']:<8} {r['held']:<7} {r['sync_s']:5.1f}s  {r['rss_mib']:6.1f}Mi  "
            f"{r['rss_per_pod']:5.0f} B  {r['review_p50_ms']:.3f}/{r['review_p99_ms']:.3f} ms "
            f"({r['bare_p50_ms']:.3f}/{r['bare_p99_ms']:.3f})  "
            f"{r['view_p50_us']:.1f}/{r['view_p99_us']:.1f} us"
            f"     {r['requests_during_reviews']} (apiserver saw {r['apiserver_saw_during_reviews']}; "
            f"{r['apiserver_requests_total']} in all, the sync); "
            f"a full GC after the sync {r['full_gc_ms']:.1f} ms; during the reviews {r['gc_full']}, "
            f"longest {r['gc_full_max_ms']:.1f} ms",
            flush=True,
        )
        print(f"         a decision: {r['sample'][:220]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
