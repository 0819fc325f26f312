"""What the Knative route costs a Pod creation: the same opted-in Pod created through the webhook
behind the Knative route (apiserver -> Traefik, TLS -> revision Service -> queue-proxy -> the
webhook) and behind the plain Deployment's ClusterIP Service (apiserver -> the webhook's own TLS),
in one cluster, in interleaved rounds (route first in odd rounds, plain first in even ones), so
that whatever else the machine does weighs on both alike. The figures are the medians and 90th
percentiles of each and their ratio (printed at the end of the run); the test pins only that every
Pod was mutated on both paths."""

from __future__ import annotations

import base64
import json
import statistics
import time
from typing import Any

from tests.support.manifests import one, render

from .installs import PLAIN_NAMESPACE, PLAIN_WEBHOOK, Installs, KnativeRoute, install_plain, uninstall_plain
from .realnode import RealCluster
from .support import GPU, GPU_SHARED, gpu_pod, workload_namespace

ROUNDS = 8
PODS_PER_ROUND = 15
LATENCY_LABEL = "castslice.test/latency"
ROUTE_WEBHOOK = "castslice-latency-route"


def registration(
    base: dict[str, Any], name: str, client_config: dict[str, Any], route: str
) -> dict[str, Any]:
    """The project's webhook registration, renamed, calling ``client_config``, for the namespaces
    labelled ``LATENCY_LABEL=route``."""
    hook = dict(base["webhooks"][0])
    hook["name"] = f"{name}.castslice.castops.io"
    hook["clientConfig"] = client_config
    hook["namespaceSelector"] = {
        "matchExpressions": [{"key": LATENCY_LABEL, "operator": "In", "values": [route]}]
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook],
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure(
    cluster: RealCluster,
    base: dict[str, Any],
    route_bundle: str,
    installed: KnativeRoute,
    namespaces: dict[str, str],
) -> tuple[dict[str, list[float]], list[str]]:
    """Both registrations and the plain install made, then ROUNDS interleaved rounds timed."""
    from kubernetes import client

    cluster.apply(
        [
            registration(
                base,
                ROUTE_WEBHOOK,
                {"url": f"https://{installed.route_host}/mutate", "caBundle": route_bundle},
                "route",
            ),
            registration(
                base,
                PLAIN_WEBHOOK,
                {
                    "service": {
                        "namespace": PLAIN_NAMESPACE,
                        "name": "castslice",
                        "path": "/mutate",
                        "port": 443,
                    }
                },
                "plain",
            ),
        ]
    )
    install_plain(cluster, installed.tree)
    for variant in ("route", "plain"):
        namespaces[variant] = workload_namespace(cluster, f"latency-{variant}")
        cluster.kubectl("label", "namespace", namespaces[variant], f"{LATENCY_LABEL}={variant}")
    time.sleep(3)  # the apiserver's webhook registrations are read from its informer
    api = client.CoreV1Api(cluster.plane.api_client())
    seconds: dict[str, list[float]] = {"route": [], "plain": []}
    unmutated: list[str] = []
    for round_number in range(ROUNDS + 1):
        order = ("route", "plain") if round_number % 2 else ("plain", "route")
        for variant in order:
            for index in range(PODS_PER_ROUND):
                pod = gpu_pod(f"r{round_number}-{index}")
                pod["spec"]["nodeSelector"] = {"castslice.test/never": "true"}
                start = time.perf_counter()
                stored = api.create_namespaced_pod(namespaces[variant], pod)  # type: ignore[arg-type]
                took = time.perf_counter() - start
                if round_number:  # round 0 warms both paths (connections, caches)
                    seconds[variant].append(took)
                limits = stored.spec.containers[0].resources.limits or {}
                if GPU_SHARED not in limits or GPU in limits:
                    unmutated.append(f"{variant}/{stored.metadata.name}")
    return seconds, unmutated


def remove_measuring_parts(cluster: RealCluster, namespaces: dict[str, str]) -> None:
    """What measure() added, gone, and the Knative install's registration as it was, for the
    modules after this one."""
    for namespace in namespaces.values():
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    cluster.kubectl(
        "delete", "mutatingwebhookconfiguration", ROUTE_WEBHOOK, PLAIN_WEBHOOK, "--ignore-not-found"
    )
    uninstall_plain(cluster)
    hook = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", "castslice", "-o", "json"))
    expressions = hook["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    ours = [i for i, e in enumerate(expressions) if e["key"] == LATENCY_LABEL]
    if ours:
        path = f"/webhooks/0/namespaceSelector/matchExpressions/{ours[0]}"
        undo = [{"op": "test", "path": f"{path}/key", "value": LATENCY_LABEL}, {"op": "remove", "path": path}]
        patch = ("patch", "mutatingwebhookconfiguration", "castslice", "--type=json")
        cluster.kubectl(*patch, "-p", json.dumps(undo))


def test_pod_creation_through_the_knative_route_against_the_plain_service(
    installs: Installs, record_property: Any
) -> None:
    installed = installs.knative_route()
    cluster = installs.cluster
    base = one(render(installed.tree / "overlays/knative-route-host"), "MutatingWebhookConfiguration")
    route_bundle = base64.b64encode(installed.ca).decode()
    # The Knative install's own registration leaves the measured namespaces alone.
    cluster.kubectl(
        "patch",
        "mutatingwebhookconfiguration",
        "castslice",
        "--type=json",
        "-p",
        json.dumps(
            [
                {
                    "op": "add",
                    "path": "/webhooks/0/namespaceSelector/matchExpressions/-",
                    "value": {"key": LATENCY_LABEL, "operator": "DoesNotExist"},
                }
            ]
        ),
    )
    namespaces: dict[str, str] = {}
    try:
        seconds, unmutated = measure(cluster, base, route_bundle, installed, namespaces)
    finally:
        remove_measuring_parts(cluster, namespaces)
    medians = {v: statistics.median(s) for v, s in seconds.items()}
    for variant in ("route", "plain"):
        record_property(f"{variant}: median Pod create (ms)", round(1000 * medians[variant], 1))
        record_property(f"{variant}: p90 Pod create (ms)", round(1000 * percentile(seconds[variant], 0.9), 1))
    record_property("route / plain, median", round(medians["route"] / medians["plain"], 2))
    record_property("Pods per path", len(seconds["route"]))
    assert unmutated == []
