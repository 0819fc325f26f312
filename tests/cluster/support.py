"""What the real-node tests share: workload Pods and namespaces, the apiserver's webhook
metrics, the audit events the webhook's Pods wrote, the Knative Service's ready Pods watched."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from .installs import NAMESPACE, ready_pods
from .realnode import NODE_NAME, RealCluster

KSVC_PODS = "serving.knative.dev/service=castslice"
CONTROLLER_PODS = "app.kubernetes.io/component=controller"
GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu-shared"
WEBHOOK = "pods.castslice.castops.io"


class ReadyWatch:
    """Samples the Knative Service's ready Pods every second for as long as the module runs: the
    fewest seen is what min-scale promises (never below 2, never 0)."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.samples.append(len(ready_pods(self.cluster, NAMESPACE, KSVC_PODS)))
            except (AssertionError, ValueError, OSError):
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def advertise_gpus(cluster: RealCluster) -> None:
    """The node advertises time-sliced GPUs (no device plugin here): whole GPUs 0, shared 64, as
    the kwok fleet's GPU nodes do, through the node's status (kubelet keeps extended resources)."""
    patch = {"status": {"capacity": {GPU: "0", GPU_SHARED: "64"}}}
    cluster.kubectl(
        "patch", "node", NODE_NAME, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )
    cluster.wait(
        lambda: (
            json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json"))["status"]
            .get("allocatable", {})
            .get(GPU_SHARED)
            == "64"
        ),
        60,
        "the node's allocatable nvidia.com/gpu-shared",
    )


def advertise_whole_gpus(cluster: RealCluster, count: str) -> None:
    """The node advertises ``count`` whole GPUs (``nvidia.com/gpu``) through its status, as
    Kubernetes' "Advertise Extended Resources for a Node" does (no device plugin here); the
    time-sliced ones stay as they are."""
    patch = {"status": {"capacity": {GPU: count}}}
    cluster.kubectl(
        "patch", "node", NODE_NAME, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )
    cluster.wait(
        lambda: (
            json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json"))["status"]
            .get("allocatable", {})
            .get(GPU)
            == count
        ),
        60,
        f"the node's allocatable {GPU} {count}",
    )


def workload_namespace(cluster: RealCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait(
        lambda: bool(cluster.kubectl("-n", name, "get", "serviceaccount", "default", check=False)),
        60,
        f"the default ServiceAccount of {name}",
    )
    return name


def gpu_pod(name: str, gpus: int = 1, workload: str = "inference") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"castops.io/optimize": "true", "castops.io/workload-type": workload},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "server",
                    "image": "dev.local/pause:ci",
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def create(cluster: RealCluster, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = cluster.kubectl("-n", namespace, "create", "-f", "-", "-o", "json", stdin=json.dumps(obj))
    created: dict[str, Any] = json.loads(out)
    return created


def webhook_metrics(cluster: RealCluster) -> dict[str, float]:
    """The apiserver's own counts for the CastSlice webhook: calls by code, fail-open admissions."""
    status, body = cluster.plane.get("/metrics", timeout=30)
    assert status == 200
    counts: dict[str, float] = {}
    for line in body.decode().splitlines():
        if f'name="{WEBHOOK}"' not in line or line.startswith("#"):
            continue
        metric, value = line.rsplit(" ", 1)
        family = metric.split("{", 1)[0]
        if family in (
            "apiserver_admission_webhook_request_total",
            "apiserver_admission_webhook_fail_open_count",
            "apiserver_admission_webhook_rejection_count",
        ):
            key = (
                family
                if family != "apiserver_admission_webhook_request_total"
                else f"{family}:{_label(metric, 'code')}"
            )
            counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def _label(metric: str, name: str) -> str:
    marker = f'{name}="'
    start = metric.find(marker)
    return "" if start < 0 else metric[start + len(marker) :].split('"', 1)[0]


def audit_events(cluster: RealCluster) -> list[dict[str, Any]]:
    """The CloudEvents the webhook's Pods wrote to stdout (the shipped audit sink without a
    broker), from every container of every revision that ran."""
    events: list[dict[str, Any]] = []
    for pod in json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l", KSVC_PODS, "-o", "json"))[
        "items"
    ]:
        logs = cluster.kubectl(
            "-n", NAMESPACE, "logs", pod["metadata"]["name"], "-c", "castslice", check=False
        )
        for line in logs.splitlines():
            if '"event":' not in line:
                continue
            try:
                events.append(json.loads(line)["event"])
            except (ValueError, KeyError):
                continue
    return events
