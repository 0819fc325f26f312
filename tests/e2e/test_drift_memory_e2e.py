"""The drift reconciler's memory on the project's control plane: a pass over 200 Pods of 1.5 MB
each (about 300 MB of Pods) stays under the memory limit the controller's Deployment ships with
(knative/components/controller: 512Mi), measured as the process's peak resident set (VmHWM).

The Pods are gated (a scheduling gate nobody removes), so no scheduler or kubelet holds them
running; the drift judges them all the same (they have not finished). The controller runs with the
default configuration (GPU slicing on: the Pods, opted in and asking for a GPU, are drift).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import ControlPlane
from .launch import ServedController

pytestmark = pytest.mark.e2e

NAMESPACE, SYSTEM = "drift-memory", "drift-memory-system"
PODS = 200
POD_BYTES = 1_450_000
"""The argument each Pod carries: with the rest of the Pod, about 1.5 MB stored (under etcd's
1.5 MiB request limit)."""


def shipped_limit() -> int:
    """The controller container's memory limit in the shipped manifests, in bytes."""
    deployment = one(render(KNATIVE_DIR / "components" / "controller"), "Deployment", "castslice-control")
    limit = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    units = {"Mi": 2**20, "Gi": 2**30}
    return int(limit[:-2]) * units[limit[-2:]]


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def large_pod(n: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"large-{n}",
            "annotations": {"castops.io/optimize": "true", "castops.io/workload-type": "inference"},
        },
        "spec": {
            "schedulingGates": [{"name": "castslice.test/never"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "args": ["x" * POD_BYTES],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def large_pods(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    from kubernetes import client

    plane = control_plane
    api = plane.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": SYSTEM}})
    plane.create_namespace(NAMESPACE)
    plane.wait_for_service_account(NAMESPACE)
    began = time.monotonic()
    for n in range(PODS):
        core.create_namespaced_pod(NAMESPACE, large_pod(n))
    print(f"\n{PODS} Pods of 1.5 MB created in {time.monotonic() - began:.0f}s")
    try:
        yield plane
    finally:
        # The namespace's deletion takes its Pods (a deletecollection would answer with all
        # 300 MB of them).
        for namespace in (NAMESPACE, SYSTEM):
            core.delete_namespace(namespace)
        api.close()


def test_a_drift_pass_over_200_pods_of_1_5_mb_stays_under_the_shipped_memory_limit(
    large_pods: ControlPlane, record_property: Callable[[str, object], None]
) -> None:
    plane = large_pods
    config = plane.workdir / "castslice-drift-memory.yaml"
    config.write_text(yaml.safe_dump({"drift": {"intervalSeconds": 10}, "audit": {"sink": "none"}}))
    controller = ServedController(plane, "drift-memory", config, "", SYSTEM)
    try:
        deadline = time.monotonic() + 240

        def passed() -> bool:
            complete = controller.metric('castslice_drift_passes_total{result="complete"}') or 0
            return complete >= 1

        while not passed():
            assert controller.process.poll() is None, controller.log_tail()
            assert time.monotonic() < deadline, f"no complete drift pass: {controller.log_tail()}"
            time.sleep(0.5)
        judged = controller.metric("castslice_drift_judged_pods") or 0
        found = controller.metric('castslice_drift_pods{mutator="gpu-slicing",namespace="drift-memory"}') or 0
        peak = peak_rss(controller.process.pid)
    finally:
        controller.stop(signal.SIGKILL)
    limit = shipped_limit()
    record_property("pods", PODS)
    record_property("judged", judged)
    record_property("peak_rss_mib", round(peak / 2**20, 1))
    record_property("limit_mib", limit // 2**20)
    mib = peak / 2**20
    print(f"\ndrift pass over {PODS} Pods of 1.5 MB: peak RSS {mib:.0f} MiB, limit {limit // 2**20} MiB")
    assert judged >= PODS and found == PODS
    assert peak < limit
