"""A structured fuzz campaign against the webhook's HTTP handler: recorded AdmissionReviews with
wrong types in any field, odd quantities and annotations, NaN, huge strings and deep documents,
under five configurations; two of them are the shipped one (PodMutations on, with spot or vGPU
beside it) over a cluster view holding twelve PodMutations (affinity, consolidation, patches,
copies, distribution groups and shares, CAST AI's form, a catastrophic regex), siblings and
recent decisions, fed Pods hostile to what they read (tests/support/hostile.py).

The bar every request must meet (``check``): no 500; no ``error`` outcome (an internal error
means the policy was escaped); a 400 quotes a bounded amount of input; an allowed patch applies to
the Pod, breaks no extended-resource or placement rule the Pod did not already break, and a second
pass over the patched Pod (reinvocation) produces no operation; no env value reaches the answer.

tests/serve/test_hostile_input.py runs a bounded campaign with a fixed seed; a larger one runs by hand:

    python -m tests.support.fuzz --requests 50000 --seed 7
"""

from __future__ import annotations

import argparse
import base64
import copy
import importlib.util
import json
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch

from function.admission.review import Admission
from function.core.config import Config, parse_config
from function.core.engine import Engine
from function.core.rules import introduced_violations, scheduling_violations
from function.core.view import EMPTY_VIEW, ClusterView
from function.serve.http_api import WebhookHttp
from tests.support import load_review, review_names
from tests.support.hostile import ROUTE_LABEL, ROUTES, hostile_pod_change, podmutation_view

CONFIGS: dict[str, Config] = {
    "default": Config(),
    "vgpu-warn": parse_config({"invalidAnnotations": "warn", "vgpu": {"enabled": True}}),
    "vgpu-admit": parse_config({"onInternalError": "admit", "vgpu": {"enabled": True, "overwriteEnv": True}}),
    # The shipped configuration (PodMutations on) with spot placement beside it, over a cluster view
    # holding the PodMutations below, siblings and recent decisions (tests/support/hostile.py).
    "podmutations-spot": parse_config(
        {
            "podMutations": {"enabled": True, "castaiObjects": True},
            "spot": {"enabled": True, "preset": "partialSpot"},
        }
    ),
    "podmutations-vgpu": parse_config(
        {"invalidAnnotations": "warn", "podMutations": {"enabled": True}, "vgpu": {"enabled": True}}
    ),
}
VIEWS: dict[str, Callable[[], ClusterView]] = {
    "podmutations-spot": lambda: podmutation_view(castai=True),
    "podmutations-vgpu": podmutation_view,
}
"""How to build the cluster each configuration's reviews see (built once; none: the empty view)."""

ANNOTATIONS = ("castops.io/optimize", "castops.io/slice-ratio", "castops.io/workload-type")


RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpu-shared",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/priority",
    "example.com/foo",
    "cpu",
    "memory",
)
MAX_BODY_QUOTE = 2_000
"""A 400's body may quote the client's input, but never more than this many bytes of it."""


def odd_scalars(rng: random.Random) -> list[Any]:
    digits = rng.choice([4_299, 4_300, 4_301, 5_000, 20_000])
    return [
        None,
        True,
        False,
        0,
        -1,
        1,
        2**70,
        1.0,
        1.5,
        -0.0,
        1e308,
        "",
        " ",
        "x" * rng.choice([1, 300, 70_000]),
        "1" * digits,
        "0" * digits + "1",
        "9" * digits + "e3",
        "08",
        "+8",
        "1e3",
        "1E-1",
        "0x10",
        "1.",
        ".5",
        "3k",
        "2Ki",
        "-3",
        "１",
        "\u0000",
        "true",
        [],
        {},
        [1, "a"],
        {"a": None},
    ]


def odd_values(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.05:
        return deep(rng.choice([50, 499, 500, 700, 950, 980, 2_000]))
    if pick < 0.07:
        return float("nan")
    return rng.choice(odd_scalars(rng))


def deep(depth: int) -> Any:
    value: Any = 0
    for index in range(depth):
        value = [value] if index % 2 else {"a": value}
    return value


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a member of a dict or list below ``value`` (not too deep)."""
    if len(prefix) > 12:
        return
    if isinstance(value, dict):
        for key, member in value.items():
            yield (*prefix, key)
            yield from paths(member, (*prefix, key))
    elif isinstance(value, list):
        for index, member in enumerate(value):
            yield (*prefix, index)
            yield from paths(member, (*prefix, index))


def set_at(root: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        root = root[part]
    root[path[-1]] = value


def containers_of(review: dict[str, Any]) -> list[dict[str, Any]]:
    request = review.get("request")
    pod = request.get("object") if isinstance(request, dict) else None
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return []
    found = []
    for kind in ("containers", "initContainers"):
        listed = pod["spec"].get(kind)
        if isinstance(listed, list):
            found.extend(c for c in listed if isinstance(c, dict))
    return found


def mutate_review(rng: random.Random, review: dict[str, Any]) -> dict[str, Any]:
    """One hostile variation of a recorded review (several changes of one kind or another)."""
    review = copy.deepcopy(review)
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.random()
        request = review.get("request")
        pod = request.get("object") if isinstance(request, dict) else None
        if kind < 0.35:
            # A wrong type (or odd value) anywhere: envelope fields and Pod fields alike.
            every = list(paths(review))
            set_at(review, rng.choice(every), odd_values(rng))
        elif kind < 0.6 and containers_of(review):
            container = rng.choice(containers_of(review))
            resources = container.setdefault("resources", {})
            if not isinstance(resources, dict):
                continue
            name = rng.choice(RESOURCES)
            value = rng.choice(odd_scalars(rng)) if rng.random() < 0.7 else rng.choice(["1", "2", 1, "8"])
            for section in rng.choice([("limits",), ("requests",), ("limits", "requests")]):
                held = resources.setdefault(section, {})
                if isinstance(held, dict):
                    held[name] = value
            if rng.random() < 0.3:
                container.setdefault("env", [])
                if isinstance(container["env"], list):
                    container["env"].append({"name": "CUDA_TASK_PRIORITY", "value": "s3cr3t-env-value"})
        elif kind < 0.85 and isinstance(pod, dict):
            metadata = pod.setdefault("metadata", {})
            if not isinstance(metadata, dict):
                continue
            annotations = metadata.setdefault("annotations", {})
            if not isinstance(annotations, dict):
                continue
            annotations["castops.io/optimize"] = rng.choice(["true", "true", True, None, "false"])
            key = rng.choice(ANNOTATIONS)
            annotations[key] = odd_values(rng) if rng.random() < 0.6 else rng.choice(["inference", "4"])
        elif isinstance(pod, dict):
            # Deep or large documents inside the Pod.
            where = rng.choice(["metadata", "spec"])
            holder = pod.get(where)
            if isinstance(holder, dict):
                holder[rng.choice(["x-deep", "labels", "tolerations"])] = odd_values(rng)
    return review


def podmutation_variation(rng: random.Random, review: dict[str, Any]) -> dict[str, Any]:
    """``review`` routed to one of the PodMutations (tests/support/hostile.py), with what they read in a
    Pod changed once or twice: node affinity terms with null or empty parts, tolerations, owners,
    marks, long names, env values and Secret references, GPU requests."""
    request = review.get("request")
    pod = request.get("object") if isinstance(request, dict) else None
    if not isinstance(pod, dict):
        return review
    metadata = pod.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.setdefault("labels", {}), dict):
        metadata["labels"][ROUTE_LABEL] = rng.choice(ROUTES)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        hostile_pod_change(rng, pod)
    return review


def body_of(review: dict[str, Any]) -> bytes:
    try:
        return json.dumps(review, separators=(",", ":")).encode()
    except (RecursionError, ValueError):
        # Deeper than the encoder goes: write the nesting by hand, the server must cope.
        return (
            b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":'
            + (b"[" * 3000 + b"]" * 3000)
            + b"}"
        )


RATIO_DIGITS_UNFIXED = importlib.util.find_spec("function.core.mutators.slice_ratio") is None
"""castops.io/slice-ratio of 4,301+ digits raises in int() (issue 13) until the slice-ratio parser of
issue 14 (branch issue-hami, function/core/mutators/slice_ratio.py) is merged; then this is False and
the campaign holds that case to the same bar as every other."""


def _huge_slice_ratio(body: bytes) -> bool:
    try:
        annotations = json.loads(body)["request"]["object"]["metadata"]["annotations"]
        ratio = annotations["castops.io/slice-ratio"]
    except (KeyError, TypeError, ValueError):
        return False
    return isinstance(ratio, str) and len(ratio) > 4_300


class Campaign:
    def __init__(self) -> None:
        self.webhooks = {}
        for name, config in CONFIGS.items():
            view = VIEWS[name]() if name in VIEWS else EMPTY_VIEW
            self.webhooks[name] = WebhookHttp(Admission(Engine(config), cluster=lambda view=view: view))
        self.statuses: Counter[str] = Counter()

    def check(self, config_name: str, body: bytes) -> None:
        webhook = self.webhooks[config_name]
        answer = webhook.handle("POST", "/mutate", body)
        self.statuses[str(answer.status)] += 1
        assert answer.status in (200, 400), (answer.status, answer.body[:500])
        if answer.status == 400:
            assert len(answer.body) < MAX_BODY_QUOTE, answer.body[:300]
            return
        reply = json.loads(answer.body)
        response = reply["response"]
        outcome = response.get("auditAnnotations", {}).get("outcome")
        self.statuses[f"outcome:{outcome}"] += 1
        if outcome == "error" and RATIO_DIGITS_UNFIXED and _huge_slice_ratio(body):
            self.statuses["known: slice-ratio over 4,300 digits (issue 14)"] += 1
            return
        assert outcome != "error", (config_name, response, body[:2000])
        assert "s3cr3t-env-value" not in answer.body.decode(), response
        if not response["allowed"] or "patch" not in response:
            return
        request = json.loads(body)["request"]
        pod = request["object"]
        operations = json.loads(base64.b64decode(response["patch"], validate=True))
        mutated = jsonpatch.JsonPatch(operations).apply(pod, in_place=False)
        introduced = introduced_violations(pod, mutated)
        assert not introduced, (introduced, operations)
        placement = scheduling_violations(mutated) - scheduling_violations(pod)
        assert not placement, (placement, operations)
        self._count_podmutation(mutated)
        request["object"] = mutated
        again = json.loads(
            webhook.handle(
                "POST", "/mutate", json.dumps({**json.loads(body), "request": request}).encode()
            ).body
        )
        assert "patch" not in again["response"], (config_name, operations, again["response"])

    def _count_podmutation(self, pod: Any) -> None:
        """Which PodMutation the patch applied, and the group and placement it chose: the campaign
        reaches them all (tests/serve/test_hostile_input.py holds it to that)."""
        metadata = pod.get("metadata") if isinstance(pod, dict) else None
        annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
        labels = metadata.get("labels") if isinstance(metadata, dict) else None
        mark = annotations.get("castops.io/pod-mutation") if isinstance(annotations, dict) else None
        if not isinstance(mark, str):
            return
        self.statuses[f"podmutation:{mark.split('/')[0]}"] += 1
        group = annotations.get("castops.io/pod-mutation-group")
        if group:
            self.statuses[f"podmutation-group:{group}"] += 1
        placed = labels.get("castops.io/placement") if isinstance(labels, dict) else None
        if placed:
            self.statuses[f"placement:{placed}"] += 1


def run(requests: int, seed: int, keep_going: bool = False) -> Counter[str]:
    rng = random.Random(seed)
    bases = [load_review(name) for name in review_names()]
    campaign = Campaign()
    names = sorted(CONFIGS)
    for number in range(requests):
        config_name = names[number % len(names)]
        if config_name in VIEWS and rng.random() < 0.7:
            review = podmutation_variation(rng, copy.deepcopy(rng.choice(bases)))
            if rng.random() < 0.3:
                review = mutate_review(rng, review)
        else:
            review = mutate_review(rng, rng.choice(bases))
        body = body_of(review)
        try:
            campaign.check(config_name, body)
        except AssertionError as failure:
            print(f"request {number} (seed {seed}, config {config_name}) failed", file=sys.stderr)
            if not keep_going:
                raise
            campaign.statuses["FAILED"] += 1
            print(f"  {str(failure)[:400]}", file=sys.stderr)
    return campaign.statuses


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep-going", action="store_true", help="report every failure, not the first")
    args = parser.parse_args()
    logging.getLogger("castslice").setLevel(logging.CRITICAL)  # failures are reported below
    started = time.monotonic()
    statuses = run(args.requests, args.seed, args.keep_going)
    print(f"{args.requests} requests, seed {args.seed}, {time.monotonic() - started:.1f} s: {dict(statuses)}")
    return 1 if statuses["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
