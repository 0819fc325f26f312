"""Property tests: for any Pod the apiserver could send, under each configuration, the reply is a
valid AdmissionReview, its patch applies, the result obeys the extended-resource rules, and a
second pass (reinvocation) produces no operations."""

from __future__ import annotations

import base64
import copy
import json
import os
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from function.admission.review import Admission
from function.core.config import Config, parse_config
from function.core.engine import Engine
from function.core.json_patch import canonical
from function.core.mutators.base import Action, RequestContext
from function.core.rules import pod_violations
from function.serve.http_api import WebhookHttp

CONFIGS = {
    "default": Config(),
    "warn": parse_config({"invalidAnnotations": "warn"}),
    "gpu.shared": parse_config(
        {
            "gpuSlicing": {"targetResource": "nvidia.com/gpu.shared", "presets": {"a": 3}},
            "excludedNamespaces": [],
        }
    ),
    # vGPU beside slicing (they must compose and converge), HAMi's legacy mode with the env
    # overwrite under warn, and vGPU alone taking Pods from any scheduler.
    "vgpu": parse_config({"vgpu": {"enabled": True}}),
    "vgpu-legacy-warn": parse_config(
        {
            "invalidAnnotations": "warn",
            "vgpu": {"enabled": True, "denyPrivileged": False, "overwriteEnv": True},
        }
    ),
    # Spot placement beside slicing, every namespace placed (kube-system on-demand); no cluster view
    # here, so partial spot would be the hash split: spot's own property test covers the split.
    "spot": parse_config(
        {"excludedNamespaces": [], "spot": {"enabled": True, "preset": "allSpotExceptKubeSystem"}}
    ),
    "vgpu-only": parse_config(
        {"gpuSlicing": {"enabled": False}, "vgpu": {"enabled": True, "forceSchedulerName": True}}
    ),
    # The dra backend: a Pod-level claim and container references, beside the Pod's own claims.
    "dra": parse_config({"excludedNamespaces": [], "gpuSlicing": {"backend": "dra"}}),
    "dra-vgpu-warn": parse_config(
        {
            "invalidAnnotations": "warn",
            "gpuSlicing": {"backend": "dra", "dra": {"missingTemplate": "warn"}},
            "vgpu": {"enabled": True, "overwriteEnv": True},
        }
    ),
}
OWN_CLAIMS = st.sampled_from(
    [
        None,
        [{"name": "own", "resourceClaimTemplateName": "fast-disk"}],
        [{"name": "castslice-gpu", "resourceClaimName": "taken"}],
        [{"name": "own", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}],  # already invalid
        "not-a-list",
    ]
)

EXTENDED = ["nvidia.com/gpu", "nvidia.com/gpu-shared", "nvidia.com/gpu.shared", "example.com/fpga"]
VGPU = ["nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority"]
NATIVE = ["cpu", "memory", "ephemeral-storage"]

# JSON numbers as well as strings (manifests and some clients send them), and a few values the
# apiserver itself would reject, which the webhook must neither crash on nor "fix" into validity.
integer_quantity = st.sampled_from(["0", "1", "2", "4", "8", "3k", "100", "101", 1, 2, 0, "1.5", "abc"])
native_quantity = st.sampled_from(["100m", "1", "2", "512Mi", "1Gi"])


@st.composite
def resources(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(EXTENDED + VGPU), max_size=4, unique=True))
    limits = {name: draw(integer_quantity) for name in names}
    for name in draw(st.lists(st.sampled_from(NATIVE), max_size=2, unique=True)):
        limits[name] = draw(native_quantity)
    shape = draw(st.sampled_from(["defaulted", "limits-only", "none", "empty-maps", "nulls"]))
    if shape == "nulls":
        return {"limits": None, "requests": None}
    if shape == "none" or (not limits and shape != "empty-maps"):
        return {}
    if shape == "empty-maps":
        return {"limits": {}, "requests": {}}
    if shape == "limits-only":
        return {"limits": limits}
    # As the apiserver defaults it: requests copied from limits for whatever the user left out.
    requests = dict(limits)
    return {"limits": limits, "requests": requests}


@st.composite
def containers(draw: Any, prefix: str) -> list[dict[str, Any]]:
    result = []
    for index in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([f"{prefix}{index}", f"{prefix}~{index}", f"{prefix}/{index}"]))
        container: dict[str, Any] = {"name": name, "image": "busybox"}
        res = draw(resources())
        if res or draw(st.booleans()):
            container["resources"] = res
        if draw(st.booleans()):
            container["env"] = [
                {
                    "name": draw(st.sampled_from(["TOKEN", "CUDA_TASK_PRIORITY", "NVIDIA_VISIBLE_DEVICES"])),
                    "value": draw(st.sampled_from(["secret", "0", "all"])),
                }
            ]
        if draw(st.integers(0, 5)) == 0:
            container["securityContext"] = {"privileged": True}
        result.append(container)
    return result


annotation_values = {
    "castops.io/optimize": st.sampled_from(["true", "True", "false", ""]),
    "castops.io/slice-ratio": st.sampled_from(
        ["1", "3", "8", "08", "+8", "0", "-3", "1.5", "abc", "", "1001"]
    ),
    "castops.io/workload-type": st.sampled_from(
        ["training", "inference", "batch", "dev", "a", "simulation", ""]
    ),
    "scheduling.cast.ai/lifecycle": st.sampled_from(["spot", "on-demand", "x"]),
}


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    annotations = {
        key: draw(values) for key, values in annotation_values.items() if draw(st.integers(0, 3)) > 0
    }
    labels = draw(
        st.sampled_from([{}, {"app": "x"}, {"castops.io/webhook": "ignore"}, {"hami.io/webhook": "ignore"}])
    )
    spec: dict[str, Any] = {
        "schedulerName": draw(st.sampled_from(["default-scheduler", "other", "hami-scheduler"]))
    }
    spec["containers"] = draw(containers("c"))
    for kind, prefix in (("initContainers", "i"), ("ephemeralContainers", "e")):
        listed = draw(containers(prefix))
        if listed:
            spec[kind] = listed
    if draw(st.integers(0, 6)) == 0:
        spec["nodeName"] = "node-1"
    own = draw(OWN_CLAIMS)
    if own is not None:
        spec["resourceClaims"] = own
        first = spec["containers"][0] if spec["containers"] else None
        if first is not None and isinstance(first.get("resources"), dict) and draw(st.booleans()):
            first["resources"]["claims"] = [{"name": "own"}]
    metadata: dict[str, Any] = {
        "generateName": "p-",
        "namespace": "ns",
        "annotations": annotations,
        "labels": labels,
    }
    owner_kind = draw(st.sampled_from([None, "ReplicaSet", "DaemonSet"]))
    if owner_kind:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner_kind, "name": "o", "uid": "owner-1", "controller": True}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review_for(pod: dict[str, Any], namespace: str, version: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": version,
            "kind": "AdmissionReview",
            "request": {
                "uid": "0000-uid",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": {"username": "tester", "groups": ["system:authenticated"]},
                "object": pod,
                "dryRun": False,
            },
        }
    ).encode()


@settings(
    max_examples=int(os.environ.get("CASTSLICE_PROPERTY_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    pod=pods(),
    config_name=st.sampled_from(sorted(CONFIGS)),
    namespace=st.sampled_from(["default", "ml", "kube-system"]),
    version=st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]),
)
def test_any_pod_gets_a_valid_reply_whose_patch_applies_obeys_the_rules_and_is_idempotent(
    pod: dict[str, Any], config_name: str, namespace: str, version: str
) -> None:
    config = CONFIGS[config_name]
    engine = Engine(config)
    webhook = WebhookHttp(Admission(engine))

    answer = webhook.handle("POST", "/mutate", review_for(pod, namespace, version))
    assert answer.status == 200
    reply = json.loads(answer.body)
    assert reply["apiVersion"] == version and reply["kind"] == "AdmissionReview"
    response = reply["response"]
    assert response["uid"] == "0000-uid"
    assert isinstance(response["allowed"], bool)
    assert all(isinstance(w, str) and len(w) <= 120 for w in response.get("warnings", []))

    # A safety check withholding a patch is a bug somewhere: no generated Pod may trigger one.
    assert response.get("auditAnnotations", {}).get("outcome") != "error", response

    if not response["allowed"]:
        assert response["status"]["code"] == 403 and response["status"]["message"]
        assert "patch" not in response
        return
    if "patch" not in response:
        assert "patchType" not in response
        return

    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"], validate=True))
    assert operations and all(op["op"] in ("add", "remove", "replace") for op in operations)
    mutated = jsonpatch.JsonPatch(operations).apply(pod, in_place=False)

    introduced = pod_violations(mutated) - pod_violations(pod)
    assert not introduced

    # Reinvocation: the webhook sees its own output again and must change nothing.
    again = json.loads(webhook.handle("POST", "/mutate", review_for(mutated, namespace, version)).body)
    assert again["response"]["allowed"] is True
    assert "patch" not in again["response"], base64.b64decode(again["response"]["patch"])


# --- spot placement ---------------------------------------------------------------------------------
# For generated siblings, percentages, annotations and Pod shapes: a spot decision never takes the
# controller above floor(n x p / 100), the patch applies and breaks no scheduling rule, and a second
# pass gives no operations.

SPOT_ANNOTATIONS = {
    "scheduling.cast.ai/lifecycle": st.sampled_from(["spot", "on-demand", "Spot", ""]),
    "scheduling.cast.ai/spot-percentage": st.sampled_from(["1", "40", "99", "100", "0", "x"]),
    "controller.kubernetes.io/pod-deletion-cost": st.sampled_from(["5"]),
}
SPOT_KEYS = ["scheduling.cast.ai/spot", "karpenter.sh/capacity-type", "zone"]
requirement = st.fixed_dictionaries(
    {
        "key": st.sampled_from(SPOT_KEYS),
        "operator": st.sampled_from(["In", "NotIn"]),
        "values": st.just(["spot"]),
    }
) | st.fixed_dictionaries({"key": st.sampled_from(SPOT_KEYS), "operator": st.just("Exists")})
node_affinity = st.fixed_dictionaries(
    {},
    optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
            {
                "nodeSelectorTerms": st.lists(
                    st.fixed_dictionaries(
                        {}, optional={"matchExpressions": st.lists(requirement, max_size=2)}
                    ),
                    min_size=1,
                    max_size=3,
                )
            }
        ),
        "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
            st.fixed_dictionaries(
                {
                    "weight": st.integers(1, 100),
                    "preference": st.fixed_dictionaries(
                        {"matchExpressions": st.lists(requirement, max_size=2)}
                    ),
                }
            ),
            max_size=2,
        ),
    },
)
toleration = st.sampled_from(
    [
        {"key": "scheduling.cast.ai/spot", "operator": "Exists"},
        {"key": "scheduling.cast.ai/spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "karpenter.sh/capacity-type", "operator": "Exists"},
        {"operator": "Exists"},
        {"key": "other", "operator": "Exists", "effect": "NoExecute"},
    ]
)


@st.composite
def spot_pods(draw: Any) -> dict[str, Any]:
    annotations = {
        key: draw(values) for key, values in SPOT_ANNOTATIONS.items() if draw(st.integers(0, 2)) == 0
    }
    kind = draw(st.sampled_from(["ReplicaSet", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", None]))
    metadata: dict[str, Any] = {"generateName": "p-", "namespace": "ns"}
    if kind:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "owner", "controller": True}
        ]
    if annotations or draw(st.booleans()):
        metadata["annotations"] = annotations
    elif draw(st.integers(0, 9)) == 0:
        metadata["annotations"] = None  # null, as some clients send it
    labels = draw(st.sampled_from([None, {}, {"app": "web"}, {"castops.io/placement": "spot"}, "junk"]))
    if labels is not None:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(toleration, max_size=3))
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(
            st.sampled_from(
                [
                    {},
                    {"zone": "a"},
                    {"scheduling.cast.ai/spot": "true"},
                    {"karpenter.sh/capacity-type": "spot"},
                ]
            )
        )
    if draw(st.booleans()):
        spec["affinity"] = {"nodeAffinity": draw(node_affinity)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@settings(
    max_examples=int(os.environ.get("CASTSLICE_PROPERTY_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    pod=spot_pods(),
    scheme=st.sampled_from(["castai", "karpenter", "gke", "eks", "aks"]),
    percentage=st.integers(0, 100),
    default_to_spot=st.booleans(),
    spot=st.integers(0, 12),
    on_demand=st.integers(0, 12),
    unplaced=st.integers(0, 3),
    terminating=st.integers(0, 3),
    pending=st.lists(st.sampled_from(["spot", "on-demand"]), max_size=4),
    view=st.sampled_from(["synced", "missing", "unsynced"]),
    deny=st.booleans(),
)
def test_spot_stays_at_or_below_the_floor_patches_apply_and_a_second_pass_is_empty(
    pod: dict[str, Any],
    scheme: str,
    percentage: int,
    default_to_spot: bool,
    spot: int,
    on_demand: int,
    unplaced: int,
    terminating: int,
    pending: list[str],
    view: str,
    deny: bool,
) -> None:
    from function.core.json_patch import copy_json, diff, prove
    from function.core.mutators.spot import Spot, SpotConfig
    from function.core.placement import LedgerEntry, placement_of
    from function.core.rules import scheduling_violations
    from tests.support.spot import NO_VIEW, Ctx, siblings, view_with

    config = SpotConfig(
        enabled=True, labelScheme=scheme, spotPercentageOfReplicaSet=percentage, defaultToSpot=default_to_spot
    )
    mutator = Spot(config, deny, "castslice-system")
    ledger = tuple(
        LedgerEntry(f"pending-{i}", "spot" if p == "spot" else "on-demand") for i, p in enumerate(pending)
    )
    synced = view_with(
        siblings(spot, on_demand, unplaced, terminating, owner_uid="owner"), ledger, owner_uid="owner"
    )
    cluster = {
        "synced": synced,
        "missing": NO_VIEW,
        "unsynced": view_with(siblings(spot, on_demand), ledger, owner_uid="owner", pods_synced=False),
    }
    ctx = Ctx(uid="req-0", namespace="ns", cluster=cluster[view])

    working = copy_json(pod)
    result = mutator.mutate(working, ctx)
    changed = working != pod
    assert changed == (result.action.value == "mutated"), result
    if result.action.value == "denied":
        assert not changed
        return

    # The floor: a percentage decision from a synced view never takes spot above floor(n x p / 100).
    placed = placement_of(working)
    annotated = (pod["metadata"].get("annotations") or {}).get("scheduling.cast.ai/spot-percentage")
    if view == "synced" and placed == "spot" and "spotPercentageOfReplicaSet" in result.reason:
        spot_now = spot + pending.count("spot") + 1
        n = spot + on_demand + unplaced + len(pending) + 1
        assert spot_now <= n * percentage // 100
    if view == "synced" and placed == "spot" and annotated and "spot-percentage=" in result.reason:
        n = spot + on_demand + unplaced + len(pending) + 1
        assert spot + pending.count("spot") + 1 <= n * int(annotated) // 100

    if changed:
        operations = diff(pod, working)
        prove(pod, operations, working)
        assert jsonpatch.JsonPatch(operations).apply(pod, in_place=False) == working
        assert not scheduling_violations(working) - scheduling_violations(pod)

    # Reinvocation, with whatever the view shows by then: no operations.
    again = copy_json(working)
    second = mutator.mutate(again, Ctx(uid="req-0", namespace="ns", cluster=NO_VIEW))
    assert again == working and second.action.value != "mutated"


def idempotence_problem(mutators: list[Any], pod: dict[str, Any], request: RequestContext) -> str | None:
    """Each mutator in the engine's order on one copy of ``pod``; after every run of one declaring
    ``idempotent`` that changed the Pod, the same mutator run again on its own result must report
    unchanged and change nothing (what lets the engine skip that run). Why not, or None."""
    working = copy.deepcopy(pod)
    for mutator in mutators:
        first = mutator.mutate(working, request)
        if first.action is Action.denied:
            return None  # the engine stops at a denial
        if first.action is not Action.mutated or getattr(mutator, "idempotent", False) is not True:
            continue
        result = canonical(working)
        again = mutator.mutate(working, request)
        if again.action is not Action.unchanged or canonical(working) != result:
            return f"{mutator.name} run on its own result: {again.action.value} ({again.reason})"
    return None


@settings(
    max_examples=int(os.environ.get("CASTSLICE_PROPERTY_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    pod=pods() | spot_pods(),
    config_name=st.sampled_from(sorted(CONFIGS)),
    namespace=st.sampled_from(["default", "ml", "kube-system"]),
)
def test_a_mutator_declaring_itself_idempotent_changes_nothing_of_its_own_result(
    pod: dict[str, Any], config_name: str, namespace: str
) -> None:
    mutators = Engine(CONFIGS[config_name]).mutators
    assert any(getattr(m, "idempotent", False) for m in mutators)  # the property is exercised
    assert idempotence_problem(mutators, pod, RequestContext(uid="0000-uid", namespace=namespace)) is None


class FullRunEngine(Engine):
    skip_repeated_runs = False


@settings(
    max_examples=int(os.environ.get("CASTSLICE_PROPERTY_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    pod=pods() | spot_pods(),
    config_name=st.sampled_from(sorted(CONFIGS)),
    namespace=st.sampled_from(["default", "ml", "kube-system"]),
    reverse=st.booleans(),
)
def test_skipping_runs_that_can_only_repeat_the_last_gives_the_full_runs_decision(
    pod: dict[str, Any], config_name: str, namespace: str, reverse: bool
) -> None:
    # In reverse order too: a later mutator then changes what an earlier one read, so runs after
    # another mutator's change must not be skipped.
    config = CONFIGS[config_name]
    mutators = Engine(config).mutators[:: -1 if reverse else 1]
    request = RequestContext(uid="0000-uid", namespace=namespace)
    skipping = Engine(config, mutators, []).decide(copy.deepcopy(pod), request)
    full = FullRunEngine(config, mutators, []).decide(copy.deepcopy(pod), request)
    assert skipping == full and skipping.mutated_pod == full.mutated_pod
