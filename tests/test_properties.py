"""Property tests: for any Pod the apiserver could send, under each configuration, the reply is a
valid AdmissionReview, its patch applies, the result obeys the extended-resource rules, and a
second pass (reinvocation) produces no operations."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from function.admission import Admission
from function.config import Config, parse_config
from function.engine import Engine
from function.http_api import WebhookHttp
from function.rules import extended_resource_violations

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
    "vgpu-only": parse_config(
        {"gpuSlicing": {"enabled": False}, "vgpu": {"enabled": True, "forceSchedulerName": True}}
    ),
}

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
    metadata: dict[str, Any] = {
        "generateName": "p-",
        "namespace": "ns",
        "annotations": annotations,
        "labels": labels,
    }
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

    introduced = extended_resource_violations(mutated) - extended_resource_violations(pod)
    assert not introduced

    # Reinvocation: the webhook sees its own output again and must change nothing.
    again = json.loads(webhook.handle("POST", "/mutate", review_for(mutated, namespace, version)).body)
    assert again["response"]["allowed"] is True
    assert "patch" not in again["response"], base64.b64decode(again["response"]["patch"])
