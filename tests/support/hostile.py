"""Hostile and oversized AdmissionReviews, shared by the fuzz tests, the server tests and the
benchmark: built from the recorded reviews so everything else in them stays realistic."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.support import load_review

APISERVER_REQUEST_LIMIT = 3 * 1024 * 1024
"""The apiserver refuses requests larger than 3 MiB, so no legal Pod review is larger."""


def large_review(
    size: int = APISERVER_REQUEST_LIMIT - 64 * 1024, base: str = "default-slice-inference"
) -> bytes:
    """A mutating review of about ``size`` bytes, made of many small env entries and labels: many
    small objects are what costs the engine most (the worst legal case, not one big string)."""
    review = load_review(base)
    pod = review["request"]["object"]
    container = pod["spec"]["containers"][0]
    env = container.setdefault("env", [])
    labels = pod["metadata"].setdefault("labels", {})
    current = len(json.dumps(review))
    index = 0
    while current < size:
        entry = {"name": f"VAR_{index}", "value": f"value-{index}"}
        env.append(entry)
        labels[f"example.com/l{index}"] = f"v{index}"
        current += len(json.dumps(entry)) + len(f"example.com/l{index}") + len(f"v{index}") + 12
        index += 1
    return json.dumps(review, separators=(",", ":")).encode()


def nested(depth: int) -> Any:
    """A JSON value ``depth`` arrays deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def with_pod(name: str, change: Any) -> dict[str, Any]:
    """A recorded review with ``change(pod)`` applied to a deep copy of its Pod."""
    review = copy.deepcopy(load_review(name))
    change(review["request"]["object"])
    return review


# -- PodMutations under fuzzing: twelve of them, what they read in a Pod, and a cluster view --------
ROUTE_LABEL = "fuzz.castops.io/route"
"""A Pod label each PodMutation below filters on (pm01 ... pm10), so the fuzz campaign reaches every
one of them; a Pod without it gets the unfiltered one, or none."""
ROUTES = (*(f"pm{n:02d}" for n in range(1, 12)), "unrouted")
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}


def _routed(route: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"filter": {"pod": {"labelsFilter": [{"key": ROUTE_LABEL, "value": route}]}}, **spec}


PODMUTATION_SPECS: dict[str, dict[str, Any]] = {
    "pm01-affinity": _routed(
        "pm01",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [ZONE]},
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}
                                ]
                            },
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "preference": {"matchExpressions": [ZONE]}}
                    ],
                }
            }
        },
    ),
    "pm02-consolidate": _routed("pm02", {"nodeTemplatesToConsolidate": ["t1", "t2"]}),
    "pm03-patches": _routed(
        "pm03",
        {
            "patches": [
                {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "gpu", "operator": "Exists"}},
                {"op": "replace", "path": "/spec/tolerations/[key=gpu]/effect", "value": "NoSchedule"},
                {"op": "remove", "path": "/spec/containers/*/resources/limits"},
            ]
        },
    ),
    "pm04-copy": _routed(
        "pm04",
        {
            "patches": [
                {
                    "op": "copy",
                    "from": "/spec/containers/0/env/0/value",
                    "path": "/metadata/annotations/example.com~1copied",
                }
            ]
        },
    ),
    "pm05-groups": _routed(
        "pm05",
        {
            "distributionGroups": [
                {
                    "name": "a",
                    "percentage": 40,
                    "configuration": {
                        "spotMode": "only-spot",
                        "patches": [
                            {"op": "add", "path": "/metadata/labels/example.com~1group", "value": "a"}
                        ],
                    },
                },
                {
                    "name": "b",
                    "percentage": 30,
                    "configuration": {
                        "patchesV2": [
                            {
                                "operations": [
                                    {
                                        "op": "add",
                                        "path": "/metadata/annotations/example.com~1group",
                                        "value": "b",
                                    }
                                ]
                            }
                        ]
                    },
                },
            ]
        },
    ),
    "pm06-share": _routed("pm06", {"spotConfig": {"mode": "preferred-spot", "distributionPercentage": 50}}),
    "pm07-fields": _routed(
        "pm07",
        {
            "labels": {"team": "ml"},
            "annotations": {"example.com/by": "fuzz"},
            "nodeSelector": {"add": {"disk": "ssd"}, "remove": ["scheduling.cast.ai/node-template"]},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ],
        },
    ),
    "pm08-v2": {
        "filterV2": {
            "pod": {
                "labels": {
                    "matchers": [
                        {
                            "keyMatcher": {"type": "exact", "value": ROUTE_LABEL},
                            "valueMatcher": {"type": "regex", "value": "pm0[8]"},
                        }
                    ]
                },
                "tolerations": {
                    "operator": "or",
                    "matchers": [{"keyMatcher": {"type": "regex", "value": ".*"}}],
                },
            }
        },
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
                }
            }
        },
        "spotConfig": {"mode": "only-spot", "distributionPercentage": 100},
    },
    "pm09-catastrophic": {
        "filter": {
            "workload": {"names": ["(a+)+b", "a+(a+)+"]},
            "pod": {"labelsFilter": [{"key": ROUTE_LABEL, "value": "pm09"}]},
        },
        "labels": {"regex": "linear"},
    },
    "pm10-failing": {
        "filter": {
            "workload": {"excludeNamespaces": ["kube-.*"]},
            "pod": {"labelsFilter": [{"key": ROUTE_LABEL, "value": "pm10"}]},
        },
        "patchesV2": [
            {"operations": [{"op": "test", "path": "/spec/priority", "value": 7}]},
            {"operations": [{"op": "add", "path": "/metadata/labels/example.com~1v2", "value": "ok"}]},
        ],
    },
    "pm12-everyone": {
        "nodeTemplatesToConsolidate": ["default-template"],
        "labels": {"example.com/seen": "yes"},
    },
}
CASTAI_SPEC = _routed(
    "pm11",
    {
        "spotConfig": {"mode": "optional-spot"},
        "patches": [{"op": "add", "path": "/metadata/annotations/example.com~1castai", "value": "yes"}],
        "futureField": {"ignored": True},
    },
)
"""pm11: one of CAST AI's own objects (an unknown field is dropped with a warning)."""


def podmutation_objects(castai: bool = False) -> list[dict[str, Any]]:
    objects = [
        {
            "apiVersion": "castops.io/v1alpha1",
            "kind": "PodMutation",
            "metadata": {"name": name, "generation": 1, "uid": f"uid-{name}"},
            "spec": spec,
        }
        for name, spec in PODMUTATION_SPECS.items()
    ]
    if castai:
        objects.append(
            {
                "apiVersion": "pod-mutations.cast.ai/v1",
                "kind": "PodMutation",
                "metadata": {"name": "pm11-castai", "generation": 2, "uid": "uid-pm11"},
                "spec": CASTAI_SPEC,
            }
        )
    return objects


def podmutation_view(castai: bool = False) -> Any:
    """The PodMutations above, siblings of every owner in the recorded reviews (placed, grouped,
    terminating, unplaced) and recent decisions not yet in the view, as the served webhook sees them."""
    from function.core.mutators.pod_mutations_mutator import CASTAI_MUTATIONS, JOBS, OUR_MUTATIONS
    from function.core.placement import LEDGER_INDEX, LedgerEntry
    from function.core.pod import Owner
    from function.core.view import PODS, REPLICASETS, Overlay, PodRecord, StaticView
    from tests.support import mutation_records, review_names

    objects = podmutation_objects(castai)
    ours = [o for o in objects if o["apiVersion"].startswith("castops.io")]
    theirs = [o for o in objects if o not in ours]
    owners = set()
    for name in review_names():
        metadata = load_review(name)["request"]["object"].get("metadata", {})
        for ref in metadata.get("ownerReferences", []):
            owners.add((ref["uid"], ref["kind"], ref["name"]))
    pods, ledger = [], {}
    for n, (uid, kind, name) in enumerate(sorted(owners)):
        for i, (placement, group, terminating) in enumerate(
            [("spot", "a", False), ("on-demand", "a", False), ("", "none", False), ("spot", "b", True)][
                : n % 4
            ]
        ):
            pods.append(
                PodRecord(
                    "default",
                    f"{name}-{i}",
                    f"{uid}-{i}",
                    Owner(uid, kind, name),
                    placement,
                    terminating,
                    f"decided-{uid}-{i}",
                    group,
                )
            )
        ledger[uid] = (
            LedgerEntry(f"decided-{uid}-0", "spot", "a"),
            LedgerEntry(f"pending-{uid}", "on-demand", "a"),
        )
    view = StaticView(
        {
            "podmutations": mutation_records(ours),
            "podmutations-castai": mutation_records(theirs),
            "pods": pods,
        },
        specs=(PODS, REPLICASETS, JOBS, OUR_MUTATIONS, CASTAI_MUTATIONS),
    )
    return Overlay(view, {LEDGER_INDEX: ledger})


ODD_TERMS: tuple[Any, ...] = (
    [{"matchExpressions": None}],
    [{"matchFields": None, "matchExpressions": [ZONE]}],
    [
        {
            "matchExpressions": None,
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
        }
    ],
    [{}],
    [{}, {"matchExpressions": [ZONE]}],
    [{"matchExpressions": []}, {"matchFields": []}],
    [{"matchExpressions": "x"}],
    [{"matchExpressions": [None, 5, {"key": None}]}],
    [None],
    [],
    None,
    "x",
)


def hostile_pod_change(rng: Any, pod: dict[str, Any]) -> None:
    """One change of what the PodMutations (and spot) read in a Pod: node affinity terms with null
    or empty parts, odd tolerations and selectors, marks and placements nobody wrote, long names
    for the regex filters, env values and Secret references a patch may copy."""
    spec = pod.get("spec")
    metadata = pod.get("metadata")
    if not isinstance(spec, dict) or not isinstance(metadata, dict):
        return
    # Node affinity first: its shapes are many, and two mutations (affinity, consolidation) and
    # spot's on-demand placement all merge into it.
    pick = 0 if rng.random() < 0.35 else rng.randrange(1, 8)
    if pick == 0:
        required = {"nodeSelectorTerms": rng.choice(ODD_TERMS)}
        node = rng.choice(
            [
                {"requiredDuringSchedulingIgnoredDuringExecution": required},
                {"requiredDuringSchedulingIgnoredDuringExecution": required},
                {"requiredDuringSchedulingIgnoredDuringExecution": None},
                {
                    "preferredDuringSchedulingIgnoredDuringExecution": rng.choice(
                        [None, [None], [{"weight": "x"}], "x"]
                    )
                },
                None,
            ]
        )
        spec["affinity"] = rng.choice(
            [
                {"nodeAffinity": node},
                {"nodeAffinity": node},
                None,
                "x",
                {"nodeAffinity": node, "podAffinity": {}},
            ]
        )
    elif pick == 1:
        spec["tolerations"] = rng.choice(
            [
                [None, {"key": None}, {"key": "gpu", "operator": "Exists"}],
                [{"key": "scheduling.cast.ai/spot", "operator": "Exists"}, {"operator": "Exists"}],
                [{"key": "scheduling.cast.ai/node-template", "value": "t1", "effect": "NoSchedule"}],
                None,
                "x",
                [],
            ]
        )
    elif pick == 2:
        spec["nodeSelector"] = rng.choice(
            [
                {"scheduling.cast.ai/node-template": "t0"},
                {"k": None},
                {"scheduling.cast.ai/spot": "true"},
                "x",
                None,
                {},
            ]
        )
    elif pick == 3:
        labels = metadata.setdefault("labels", {})
        annotations = metadata.setdefault("annotations", {})
        if isinstance(labels, dict) and isinstance(annotations, dict):
            labels["castops.io/placement"] = rng.choice(["spot", "on-demand", "", "elsewhere", None])
            annotations["castops.io/pod-mutation"] = rng.choice(["", "pm05-groups/1", "x", "Pm/1", None, 7])
            annotations["castops.io/pod-mutation-group"] = rng.choice(["a", "none", "", None])
            annotations["castops.io/placement-decision"] = rng.choice(["decided-x", "", None])
    elif pick == 4:
        length = rng.choice([27, 30, 253, 5_000])
        metadata.pop("name", None)
        metadata["generateName" if rng.random() < 0.5 else "name"] = "a" * length + rng.choice(["", "b", "-"])
    elif pick == 5:
        for container in spec.get("containers") or []:
            if isinstance(container, dict):
                container["env"] = [
                    {"name": "TOKEN", "value": "s3cr3t-env-value"},
                    {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-creds", "key": "password"}}},
                    {"name": "N", "value": rng.choice(["true", "4", "0.5", ""])},
                ]
                container["args"] = ["--token", "s3cr3t-env-value"]
    elif pick == 6:
        metadata["ownerReferences"] = rng.choice(
            [
                [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "web-58c67d7989",
                        "controller": True,
                        "uid": "1ed9a68d-53c0-4854-90f5-39020caa8112",
                    }
                ],
                [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "x",
                        "uid": "fresh",
                        "controller": True,
                    }
                ],
                [None],
                [{"controller": "yes"}],
                None,
                "x",
            ]
        )
    else:
        for container in spec.get("containers") or []:
            if isinstance(container, dict):
                gpu = rng.choice(["1", "2", 1, "0.5"])
                container["resources"] = {
                    "limits": {"nvidia.com/gpu": gpu},
                    "requests": {"nvidia.com/gpu": gpu},
                }
        annotations = metadata.setdefault("annotations", {})
        if isinstance(annotations, dict):
            annotations["castops.io/optimize"] = "true"
