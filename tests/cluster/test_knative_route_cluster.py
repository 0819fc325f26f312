"""CastSlice as the design card runs it: a Knative Service at min-scale 2 on a real node, behind
the MutatingWebhookConfiguration's ``url`` on the Service's route host, which the apiserver
reaches through the Knative ingress (Traefik) with the TLS the certgen Job made; the controller's
two replicas beside it (installs.py: overlays/knative-route-host as a user applies it).

Everything here goes through the real path: kube-apiserver -> ingress (TLS) -> the revision's
Service (kube-proxy) -> queue-proxy -> castslice serve in a container. In file order: the install,
a GPU Pod sliced, a new revision rolled out (a config change: spot placement on) while Pods are
created at 10/s for 60 s, spot Deployments placed, the controller's leader handover, and the
Knative Service's ready Pods over all of it (never fewer than 2).
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from .installs import CASTSLICE, NAMESPACE, Installs, KnativeRoute, apply_tree, ready_pods
from .realnode import NODE_NAME, RealCluster
from .support import (
    CONTROLLER_PODS,
    GPU,
    GPU_SHARED,
    KSVC_PODS,
    ReadyWatch,
    advertise_gpus,
    advertise_whole_gpus,
    audit_events,
    create,
    gpu_pod,
    webhook_metrics,
    workload_namespace,
)

LEASE_MODEL = "NVIDIA-H100-80GB-HBM3"
MODEL_LABEL = "nvidia.com/gpu.product"
LEASE_LABEL = "castops.io/gpu-lease"
ENDS_ANNOTATION = "castops.io/gpu-lease-ends"
RATE = 10.0
SECONDS = 60.0
SPOT_KEY = "scheduling.cast.ai/spot"
NEVER_SCHEDULED = {"castslice.test/never": "true"}
"""Burst Pods stay Pending: what is judged is what the apiserver stored, not 600 containers."""


@pytest.fixture(scope="module")
def route(installs: Installs) -> Iterator[tuple[RealCluster, KnativeRoute, ReadyWatch]]:
    installed = installs.knative_route()
    cluster = installs.cluster
    advertise_gpus(cluster)
    watch = ReadyWatch(cluster)
    try:
        yield cluster, installed, watch
    finally:
        watch.close()


def revisions(cluster: Any) -> list[str]:
    out = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "revisions", "-o", "json"))["items"]
    return sorted(r["metadata"]["name"] for r in out)


def test_the_knative_service_runs_two_ready_pods_behind_its_route_host(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
) -> None:
    cluster, installed, _ = route
    ksvc = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "ksvc", "castslice", "-o", "json"))
    annotations = ksvc["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "2"
    assert {c["type"]: c["status"] for c in ksvc["status"]["conditions"]}["Ready"] == "True"
    assert ksvc["status"]["url"] == f"http://{installed.route_host}"
    assert len(ready_pods(cluster, NAMESPACE, KSVC_PODS)) >= 2
    hook = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", "castslice", "-o", "json"))[
        "webhooks"
    ][0]
    assert hook["clientConfig"]["url"] == f"https://{installed.route_host}/mutate"
    assert installed.ca.strip() in base64.b64decode(hook["clientConfig"]["caBundle"])


def test_a_gpu_pod_is_sliced_through_the_route_and_runs_on_the_node(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
) -> None:
    cluster, _, _ = route
    namespace = workload_namespace(cluster, "gpu")
    before = webhook_metrics(cluster)
    stored = create(cluster, namespace, gpu_pod("inference-1"))
    limits = stored["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get(GPU_SHARED) == "2" and GPU not in limits, limits
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod/inference-1", "--timeout=120s")
    pod = json.loads(cluster.kubectl("-n", namespace, "get", "pod", "inference-1", "-o", "json"))
    assert pod["spec"]["nodeName"] == NODE_NAME
    after = webhook_metrics(cluster)
    called = after.get("apiserver_admission_webhook_request_total:200", 0) - before.get(
        "apiserver_admission_webhook_request_total:200", 0
    )
    assert called >= 1, (before, after)
    assert after.get("apiserver_admission_webhook_fail_open_count", 0) == before.get(
        "apiserver_admission_webhook_fail_open_count", 0
    )
    subject = f"namespaces/{namespace}/pods/inference-1"
    cluster.wait(
        lambda: any(e.get("subject") == subject for e in audit_events(cluster)),
        30,
        "the decision's audit event",
    )


def test_a_gpu_lease_is_enforced_through_the_route_and_its_status_kept_by_the_controller(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    cluster, _, _ = route
    cluster.kubectl("label", "node", NODE_NAME, f"{MODEL_LABEL}={LEASE_MODEL}", "--overwrite")
    namespace = workload_namespace(cluster, "lease")
    # Half a GPU: two inference Pods (2 time slices each, 1/8 of a GPU per slice) fit, a third not.
    lease = {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {"name": "h100", "namespace": namespace},
        "spec": {"gpuModel": LEASE_MODEL, "count": "0.5"},
    }
    cluster.apply([lease])
    api = client.CoreV1Api(cluster.plane.api_client())
    wait_charging(cluster, namespace)
    for name in ("leased-1", "leased-2"):
        stored = create(cluster, namespace, gpu_pod(name))
        assert stored["metadata"]["labels"][LEASE_LABEL] == "h100", stored["metadata"]
        assert stored["spec"]["nodeSelector"][MODEL_LABEL] == LEASE_MODEL
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_pod(namespace, gpu_pod("leased-3"))
    assert refused.value.status == 403 and "LeaseExhausted" in str(refused.value.body), refused.value.body
    for name in ("leased-1", "leased-2"):
        cluster.kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")

    def status() -> dict[str, Any]:
        found = json.loads(cluster.kubectl("-n", namespace, "get", "gpulease", "h100", "-o", "json"))
        return dict(found.get("status", {}))

    cluster.wait(lambda: status().get("used") in ("0.5", "500m"), 60, "the controller's status.used")
    assert status()["phase"] == "Active"
    subject = f"namespaces/{namespace}/pods/leased-3"
    cluster.wait(
        lambda: any(
            e.get("subject") == subject and e.get("data", {}).get("outcome") == "denied"
            for e in audit_events(cluster)
        ),
        30,
        "the denial's audit event",
    )
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def wait_charging(cluster: RealCluster, namespace: str) -> None:
    """Until every webhook Pod's view holds the namespace's lease: dry runs are spread over the
    revision's Pods, so several charged in a row."""
    from kubernetes import client

    api = client.CoreV1Api(cluster.plane.api_client())
    seen: list[bool] = []

    def every_pod_sees_the_lease() -> bool:
        stored = api.create_namespaced_pod(namespace, gpu_pod("probe"), dry_run="All")
        seen.append(LEASE_LABEL in (stored.metadata.labels or {}))
        return len(seen) >= 6 and all(seen[-6:])

    cluster.wait(every_pod_sees_the_lease, 60, "the lease in every webhook Pod's view")


def test_a_charged_pods_container_reads_when_its_lease_ends_through_the_downward_api(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
    record_property: Any,
) -> None:
    """A lease with an end, and a Pod charged to it asking for a whole GPU (the node advertises
    one through its status, as a device plugin would): the webhook stamps the lease's end on the
    Pod, and its container, started by the kubelet, reads it through a downwardAPI volume and an
    environment variable and prints both: each is the lease's end."""
    cluster, _, _ = route
    cluster.kubectl("label", "node", NODE_NAME, f"{MODEL_LABEL}={LEASE_MODEL}", "--overwrite")
    namespace = workload_namespace(cluster, "notice")
    ends = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    lease = {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {"name": "h100-ending", "namespace": namespace},
        "spec": {"gpuModel": LEASE_MODEL, "count": 1, "window": {"end": ends}},
    }
    advertise_whole_gpus(cluster, "1")
    try:
        cluster.apply([lease])
        wait_charging(cluster, namespace)
        field = {"fieldRef": {"fieldPath": f"metadata.annotations['{ENDS_ANNOTATION}']"}}
        reader = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "reader"},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "reader",
                        "image": "dev.local/castslice:ci",
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            'echo "volume=$(cat /etc/lease/ends)"; echo "env=$LEASE_ENDS"',
                        ],
                        "env": [{"name": "LEASE_ENDS", "valueFrom": field}],
                        "volumeMounts": [{"name": "lease", "mountPath": "/etc/lease", "readOnly": True}],
                        "resources": {"limits": {GPU: "1"}},
                    }
                ],
                "volumes": [{"name": "lease", "downwardAPI": {"items": [{"path": "ends", **field}]}}],
            },
        }
        began = time.monotonic()
        stored = create(cluster, namespace, reader)
        assert stored["metadata"]["labels"][LEASE_LABEL] == "h100-ending", stored["metadata"]
        assert stored["metadata"]["annotations"][ENDS_ANNOTATION] == ends
        cluster.kubectl(
            "-n",
            namespace,
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            "pod/reader",
            "--timeout=180s",
        )
        record_property(
            "downward-API reader Pod created to Succeeded (s)", round(time.monotonic() - began, 1)
        )
        printed = cluster.kubectl("-n", namespace, "logs", "reader").split()
        record_property("what the reader container printed", " ".join(printed))
        assert printed == [f"volume={ends}", f"env={ends}"], printed
        pod = json.loads(cluster.kubectl("-n", namespace, "get", "pod", "reader", "-o", "json"))
        assert pod["spec"]["nodeName"] == NODE_NAME
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        advertise_whole_gpus(cluster, "0")


def test_a_new_revision_rolled_out_under_10_pod_creates_per_second_admits_none_unmutated(
    installs: Installs, record_property: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    installed = installs.knative_route()
    cluster = installs.cluster
    namespace = workload_namespace(cluster, "burst")
    before_revisions = revisions(cluster)
    before = webhook_metrics(cluster)
    api = client.CoreV1Api(cluster.plane.api_client())
    created: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()

    def create(index: int) -> None:
        pod = gpu_pod(f"burst-{index:04d}")
        pod["spec"]["nodeSelector"] = dict(NEVER_SCHEDULED)
        try:
            api.create_namespaced_pod(namespace, pod)
        except ApiException as error:
            with lock:
                failed.append(f"{index}: {error.status} {error.reason}")
            return
        with lock:
            created.append(pod["metadata"]["name"])

    # The config change, as a user makes it: config.yaml edited, the overlay applied again.
    config = installed.tree / "base/config.yaml"
    config.write_text(config.read_text() + "\nspot:\n  enabled: true\n  preset: allSpot\n")
    total = int(RATE * SECONDS)
    start = time.monotonic()
    rolled: dict[str, float] = {}

    def roll() -> None:
        time.sleep(5)
        apply_tree(cluster, installed.tree)
        rolled["applied"] = time.monotonic() - start

    roller = threading.Thread(target=roll)
    roller.start()
    with ThreadPoolExecutor(max_workers=32) as pool:
        for index in range(total):
            delay = start + index / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(create, index)
    roller.join()
    elapsed = time.monotonic() - start
    cluster.kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", "ksvc/castslice", "--timeout=300s")
    new_revisions = [r for r in revisions(cluster) if r not in before_revisions]
    after = webhook_metrics(cluster)

    pods = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]
    unmutated = [
        p["metadata"]["name"]
        for p in pods
        if GPU_SHARED not in p["spec"]["containers"][0]["resources"].get("limits", {})
        or GPU in p["spec"]["containers"][0]["resources"]["limits"]
    ]
    fail_open = after.get("apiserver_admission_webhook_fail_open_count", 0) - before.get(
        "apiserver_admission_webhook_fail_open_count", 0
    )
    # By response code; a code earlier tests saw (the lease's 403) stays in the metrics at +0.
    calls = {
        k: after[k] - before.get(k, 0)
        for k in after
        if k.startswith("apiserver_admission_webhook_request_total") and after[k] != before.get(k, 0)
    }
    record_property("Pods created", len(created))
    record_property("creates refused", len(failed))
    record_property("burst seconds", round(elapsed, 1))
    record_property("new revisions", ",".join(new_revisions))
    record_property("Pods stored unmutated", len(unmutated))
    record_property("webhook calls failed open (apiserver metric)", fail_open)
    record_property("webhook calls by code (apiserver metric)", json.dumps(calls))
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    assert new_revisions, "the config change made no new revision"
    assert not failed, failed[:5]
    assert len(pods) == total
    assert unmutated == [], unmutated[:10]
    assert fail_open == 0
    assert set(calls) == {"apiserver_admission_webhook_request_total:200"}, calls


def test_a_spot_deployment_is_placed_on_spot_nodes(installs: Installs) -> None:
    cluster = installs.cluster
    installs.knative_route()
    # The real node is the spot node here (labelled, not tainted: the platform's Pods live on it).
    cluster.kubectl("label", "node", NODE_NAME, f"{SPOT_KEY}=true", "--overwrite")
    namespace = workload_namespace(cluster, "spot")
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "web",
                            "image": "dev.local/pause:ci",
                            "imagePullPolicy": "Never",
                            "resources": {"requests": {"cpu": "1m"}},
                        }
                    ],
                },
            },
        },
    }
    cluster.apply([deployment])
    cluster.wait_rollout(namespace, "deployment/web", 180)
    pods = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]
    assert len(pods) == 2
    for pod in pods:
        tolerations = pod["spec"].get("tolerations", [])
        assert any(t.get("key") == SPOT_KEY for t in tolerations), tolerations
        assert SPOT_KEY in json.dumps(pod["spec"].get("affinity", {})) or pod["spec"].get(
            "nodeSelector", {}
        ).get(SPOT_KEY)
        assert pod["spec"]["nodeName"] == NODE_NAME
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_castslice_doctor_is_green_against_the_install(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
) -> None:
    """From where the apiserver calls the webhook: doctor runs in the apiserver's mount namespace,
    so it resolves the route host through the same hosts file."""
    cluster, _, _ = route
    apiserver = cluster.plane.process("kube-apiserver").popen
    assert apiserver is not None
    done = subprocess.run(
        ["nsenter", "--mount", f"--target={apiserver.pid}", CASTSLICE, "doctor",
         f"--kubeconfig={cluster.plane.kubeconfig}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # The configuration read from the Knative Service's ConfigMap, not the defaults assumed.
    assert f"ConfigMap {NAMESPACE}/castslice-config-" in done.stdout, done.stdout


def test_the_controllers_two_replicas_elect_one_leader_and_hand_over_when_it_is_deleted(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
    record_property: Any,
) -> None:
    cluster, _, _ = route
    cluster.wait(
        lambda: len(ready_pods(cluster, NAMESPACE, CONTROLLER_PODS)) == 2, 120, "two controller Pods"
    )

    def holder() -> str:
        lease = json.loads(
            cluster.kubectl("-n", NAMESPACE, "get", "lease", "castslice-control", "-o", "json")
        )
        return str(lease["spec"].get("holderIdentity") or "")

    cluster.wait(lambda: bool(holder()), 120, "a leader")
    leader = holder()
    pods = {p["metadata"]["name"] for p in ready_pods(cluster, NAMESPACE, CONTROLLER_PODS)}
    assert any(leader.startswith(name) for name in pods), (leader, pods)
    deleted_at = time.monotonic()
    leader_pod = next(name for name in pods if leader.startswith(name))
    cluster.kubectl("-n", NAMESPACE, "delete", "pod", leader_pod, "--wait=false")
    cluster.wait(lambda: holder() not in ("", leader), 120, "another replica leading")
    handover = time.monotonic() - deleted_at
    record_property("leader handover after deleting the leader Pod (s)", round(handover, 1))
    assert not holder().startswith(leader_pod)


def test_the_knative_service_never_had_fewer_than_two_ready_pods(
    route: tuple[RealCluster, KnativeRoute, ReadyWatch],
    record_property: Any,
) -> None:
    _, _, watch = route
    assert watch.samples, "no sample of the Knative Service's ready Pods"
    record_property("ready Pods of the Knative Service, fewest seen", min(watch.samples))
    record_property("ready-Pod samples", len(watch.samples))
    assert min(watch.samples) >= 2
