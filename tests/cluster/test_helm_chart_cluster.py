"""charts/castslice installed with ``helm install --wait --wait-for-jobs`` as real Pods on the real
node, the way a user without cert-manager installs it: certgen (as a Job of the release, the
default, and as Helm hooks), GPU leases and the controller on, the project's image. The certgen Job
runs for real and writes the Secret the webhook's Pods mount; the webhook's two replicas and the
controller's two run; an opted-in GPU Pod is sliced through the chart's webhook (the apiserver ->
its ClusterIP Service -> the Pods' own TLS); ``castslice doctor`` is green against the release;
``helm uninstall`` then leaves none of the objects the chart renders (hooks included), and the
garbage collector removes the Secret certgen wrote (owned by the webhook's ServiceAccount).

The chart takes the cluster-scoped names the Knative install holds (the CRDs, the webhook
configurations, the roles), so this module removes that install first (conftest's MODULE_ORDER
runs it last)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.helm import CHART, HELM, REQUIRED, SKIP_REASON

from .installs import CASTSLICE, IMAGE, Installs, ready_pods
from .realnode import RealCluster
from .support import GPU, GPU_SHARED, advertise_gpus, create, gpu_pod, workload_namespace

pytestmark = pytest.mark.skipif(HELM is None and not REQUIRED, reason=SKIP_REASON)

NAMESPACE = "castslice-helm"
SETTINGS = (
    f"image.repository={IMAGE[0]}",
    f"image.tag={IMAGE[1]}",
    "certManager.enabled=false",
    "certgen.enabled=true",
    "gpuLeases.enabled=true",
    "controller.enabled=true",
)
INSTALL_SECONDS = 420
SECRET = "castslice-serving-tls"


@pytest.fixture(scope="module")
def chart_cluster(installs: Installs) -> Iterator[RealCluster]:
    installs.remove_castslice()
    advertise_gpus(installs.cluster)
    yield installs.cluster


def helm(cluster: RealCluster, *args: str, timeout: float = INSTALL_SECONDS + 60) -> str:
    assert HELM is not None, SKIP_REASON
    done = subprocess.run(
        [HELM, "--kubeconfig", str(cluster.plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def rendered(cluster: RealCluster, settings: list[str]) -> list[dict[str, Any]]:
    """Every object the chart makes for these settings, hooks included (helm template renders them)."""
    flags = [flag for setting in settings for flag in ("--set", setting)]
    out = helm(cluster, "template", "castslice", str(CHART), "--namespace", NAMESPACE, *flags)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def present(cluster: RealCluster, obj: dict[str, Any]) -> bool:
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    kind = f"{obj['kind']}.{obj['apiVersion'].split('/')[-1]}" + (f".{group}" if group else "")
    namespace = obj["metadata"].get("namespace")
    args = ["get", kind, obj["metadata"]["name"], "--ignore-not-found", "-o", "name"]
    done = subprocess.run(
        [*_kubectl(cluster), *args, *(["-n", namespace] if namespace else [])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and "doesn't have a resource type" in done.stderr:
        return False  # its CRD went with the release
    assert done.returncode == 0, done.stderr
    return bool(done.stdout.strip())


def _kubectl(cluster: RealCluster) -> list[str]:
    from tests.support.manifests import kubectl_path

    return [kubectl_path(), f"--kubeconfig={cluster.plane.kubeconfig}"]


@pytest.mark.parametrize("hooks", [False, True], ids=["certgen-job", "certgen-hooks"])
def test_the_helm_chart_runs_as_real_pods_and_uninstalls_without_a_trace(
    chart_cluster: RealCluster, hooks: bool, record_property: Any
) -> None:
    cluster = chart_cluster
    settings = [*SETTINGS, f"certgen.hooks={str(hooks).lower()}"]
    # The release's namespace is the user's (Helm never deletes a namespace it did not make).
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "labels": {"castops.io/webhook": "ignore"}},
            }
        ]
    )
    objects = rendered(cluster, settings)
    started = time.monotonic()
    helm(
        cluster,
        "install", "castslice", str(CHART), "--namespace", NAMESPACE,
        *[flag for setting in settings for flag in ("--set", setting)],
        "--wait", "--wait-for-jobs", "--timeout", f"{INSTALL_SECONDS}s",
    )  # fmt: skip
    record_property("helm install --wait (s)", round(time.monotonic() - started, 1))

    assert len(ready_pods(cluster, NAMESPACE, "app.kubernetes.io/name=castslice")) >= 2
    assert len(ready_pods(cluster, NAMESPACE, "app.kubernetes.io/component=controller")) == 2
    secret = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "secret", SECRET, "-o", "json"))
    assert secret["data"].get("tls.crt") and secret["data"].get("ca.crt")
    hook = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", "castslice", "-o", "json"))
    assert hook["webhooks"][0]["clientConfig"].get("caBundle") == secret["data"]["ca.crt"]

    namespace = workload_namespace(cluster, "helm")
    stored = create(cluster, namespace, gpu_pod("inference-helm"))
    limits = stored["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get(GPU_SHARED) == "2" and GPU not in limits, limits
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod/inference-helm", "--timeout=120s")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")

    doctor = subprocess.run(
        [CASTSLICE, "doctor", "-n", NAMESPACE, f"--kubeconfig={cluster.plane.kubeconfig}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    helm(cluster, "uninstall", "castslice", "--namespace", NAMESPACE, "--wait", "--timeout", "300s")
    cluster.wait(
        lambda: not any(present(cluster, obj) for obj in objects),
        120,
        "every object the chart rendered gone after helm uninstall",
    )
    metadata = {"name": SECRET, "namespace": NAMESPACE}
    certgen_secret = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata}
    cluster.wait(lambda: not present(cluster, certgen_secret), 120, "certgen's Secret collected")
    cluster.kubectl("delete", "namespace", NAMESPACE, "--timeout=180s")
