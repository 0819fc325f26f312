"""CastSlice installed on the real node the way its users install it, from a copy of the project's
``knative/`` tree edited as its comments tell users to (the image set in components/settings,
GPU leases and the controller uncommented in overlays/knative-route), then ``kubectl apply -k``.

``Installs`` makes each part on first use and keeps it for the session:
  - ``platform()``: Knative Serving and Traefik (platform.py);
  - ``knative_route()``: overlays/knative-route-host (the Knative Service at min-scale 2, the
    webhooks on its cluster-local route host, certgen for TLS, the controller's two replicas).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.manifests import KNATIVE_DIR, render

from . import platform
from .realnode import RealCluster

NAMESPACE = "castslice-system"
IMAGE = ("dev.local/castslice", "ci")
ROUTE_HOST = f"castslice.{NAMESPACE}.svc.cluster.local"
INSTALL_SECONDS = 420.0
CASTSLICE = str(Path(sys.executable).parent / "castslice")


def user_copy(into: Path, image: tuple[str, str] = IMAGE) -> Path:
    """A copy of knative/ under ``into`` (the cluster's work dir: it goes with the cluster) with
    the edits a user makes: the image, in overlays/knative-route the GPU-leases and controller
    components uncommented (in overlays/deployment GPU leases only: install_plain takes its
    webhook), and the GPU-leases mutator enabled in base/config.yaml."""
    root = Path(tempfile.mkdtemp(prefix="user-", dir=into)) / "knative"
    shutil.copytree(KNATIVE_DIR, root)
    settings = root / "components/settings/kustomization.yaml"
    text = settings.read_text()
    text = re.sub(r"newName: \S+", f"newName: {image[0]}", text)
    text = re.sub(r"newTag: \S+", f"newTag: {image[1]}", text)
    settings.write_text(text)
    # components/gpu-leases: "Enable the mutator with gpuLeases.enabled: true in base/config.yaml".
    config = root / "base/config.yaml"
    config.write_text(config.read_text() + "\ngpuLeases:\n  enabled: true\n")
    route = root / "overlays/knative-route/kustomization.yaml"
    text = route.read_text()
    for component in ("gpu-leases", "controller"):
        text = text.replace(f"  # - ../../components/{component}", f"  - ../../components/{component}")
    route.write_text(text)
    # The plain Deployment beside it (install_plain) reads GpuLeases too: the component's RBAC.
    plain = root / "overlays/deployment/kustomization.yaml"
    text = plain.read_text().replace("  # - ../../components/gpu-leases", "  - ../../components/gpu-leases")
    plain.write_text(text)
    return root


@dataclass
class KnativeRoute:
    tree: Path
    route_host: str
    ca: bytes


class Installs:
    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self._platform = False
        self._knative_route: KnativeRoute | None = None
        self._eventing = False

    def platform(self) -> RealCluster:
        if not self._platform:
            platform.install_traefik(self.cluster)
            platform.install_serving(self.cluster)
            self._platform = True
        return self.cluster

    def knative_route(self) -> KnativeRoute:
        if self._knative_route is None:
            self.platform()
            self._knative_route = install_knative_route(self.cluster)
        return self._knative_route

    def remove_castslice(self) -> None:
        """The Knative install (with eventing if added) deleted as a user deletes it, ``kubectl
        delete -k`` of the overlay applied, and waited for: its namespace and cluster-scoped
        objects are free for another install."""
        if self._knative_route is None:
            return
        overlay = EVENTING_OVERLAY if self._eventing else "knative-route-host"
        path = self._knative_route.tree / "overlays" / overlay
        done = subprocess.run(
            [*kubectl(self.cluster), "delete", "-k", str(path), "--ignore-not-found", "--timeout=300s"],
            capture_output=True,
            text=True,
            timeout=360,
            check=False,
        )
        assert done.returncode == 0, f"kubectl delete -k {path}: {done.stderr[-3000:]}"
        self._knative_route = None
        self._eventing = False

    def eventing(self) -> KnativeRoute:
        """The Knative install with components/eventing added, on Knative Eventing."""
        installed = self.knative_route()
        if not self._eventing:
            platform.install_eventing(self.cluster)
            install_eventing_overlay(self.cluster, installed.tree)
            self._eventing = True
        return installed


def install_knative_route(cluster: RealCluster) -> KnativeRoute:
    tree = user_copy(cluster.workdir)
    apply_tree(cluster, tree)
    cluster.kubectl(
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Complete",
        "job/castslice-certgen",
        f"--timeout={int(INSTALL_SECONDS)}s",
    )
    # The platform's part: the ingress serves the certificate certgen wrote, and the apiserver's
    # resolver maps the route host to the ingress's cluster-local address.
    platform.serve_certificate(cluster, NAMESPACE, "castslice-serving-tls")
    cluster.map_host(ROUTE_HOST, platform.TRAEFIK_PRIVATE_IP)
    cluster.kubectl(
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Ready",
        "ksvc/castslice",
        f"--timeout={int(INSTALL_SECONDS)}s",
    )
    cluster.wait_rollout(NAMESPACE, "deployment/castslice-control", INSTALL_SECONDS)
    ca = platform.secret_ca(cluster, NAMESPACE, "castslice-serving-tls")
    return KnativeRoute(tree=tree, route_host=ROUTE_HOST, ca=ca)


EVENTING_OVERLAY = "knative-route-host-eventing"


def install_eventing_overlay(cluster: RealCluster, tree: Path) -> None:
    """An overlay of the user's own, as docs/deploy.md writes it: the route overlay plus
    components/eventing (then components/settings, last), applied over the running install; the
    SinkBinding then gives the Knative Service K_SINK, which rolls a new revision."""
    overlay = tree / "overlays" / EVENTING_OVERLAY
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources:\n  - ../knative-route-host\n"
        "components:\n  - ../../components/eventing\n  - ../../components/settings\n"
    )
    apply_tree(cluster, tree, EVENTING_OVERLAY)
    wait = ["-n", NAMESPACE, "wait", "--for=condition=Ready", f"--timeout={int(INSTALL_SECONDS)}s"]
    cluster.kubectl(*wait, "broker/castslice", "ksvc/castslice-audit")
    cluster.kubectl(*wait, "trigger/castslice-audit", "sinkbinding/castslice")

    def bound() -> bool:
        ksvc = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "ksvc", "castslice", "-o", "json"))
        env = ksvc["spec"]["template"]["spec"]["containers"][0].get("env", [])
        status = ksvc.get("status", {})
        return any(e["name"] == "K_SINK" for e in env) and (
            status.get("latestReadyRevisionName") == status.get("latestCreatedRevisionName")
            and status.get("observedGeneration") == ksvc["metadata"]["generation"]
        )

    cluster.wait(bound, INSTALL_SECONDS, "the Knative Service's revision with K_SINK ready")
    cluster.kubectl(*wait, "ksvc/castslice")


def apply_tree(cluster: RealCluster, tree: Path, overlay: str = "knative-route-host") -> None:
    """``kubectl apply -k`` of an overlay of the user's tree. CRDs and their objects go in one
    apply, so a retry settles objects of a CRD that was just made."""
    path = tree / "overlays" / overlay
    for _attempt in range(3):
        done = subprocess.run(
            [*kubectl(cluster), "apply", "--server-side", "-k", str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode == 0:
            return
        time.sleep(5)
    raise AssertionError(f"kubectl apply -k {path}: {done.stderr[-3000:]}")


def kubectl(cluster: RealCluster) -> list[str]:
    from tests.support.manifests import kubectl_path

    return [kubectl_path(), f"--kubeconfig={cluster.plane.kubeconfig}"]


def ready_pods(cluster: RealCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json"))["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])
        )
    ]


PLAIN_NAMESPACE = "castslice-plain"
PLAIN_WEBHOOK = "castslice-latency-plain"
PLAIN_KINDS = ("ServiceAccount", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget")


def install_plain(cluster: RealCluster, tree: Path) -> None:
    """overlays/deployment's webhook (Deployment, ClusterIP Service, configuration) as real Pods in
    PLAIN_NAMESPACE beside the Knative install, its serving certificate from ``castslice certgen``
    (the command the certgen Job runs) for the MutatingWebhookConfiguration PLAIN_WEBHOOK that the
    caller registers first. Cluster-scoped objects (CRDs, roles) are the Knative install's; the
    bindings name this namespace's ServiceAccount too."""
    docs = render(tree / "overlays/deployment")
    namespace = {"castops.io/webhook": "ignore"}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLAIN_NAMESPACE, "labels": namespace}}
    ]
    for doc in docs:
        if doc["kind"] in PLAIN_KINDS:
            doc["metadata"]["namespace"] = PLAIN_NAMESPACE
            objects.append(doc)
        elif doc["kind"] == "ClusterRoleBinding":
            doc["metadata"]["name"] += "-plain"
            for subject in doc["subjects"]:
                subject["namespace"] = PLAIN_NAMESPACE
            objects.append(doc)
    cluster.apply(objects)
    certgen = [CASTSLICE, "certgen", "-n", PLAIN_NAMESPACE, "--mutating", PLAIN_WEBHOOK]
    certgen += ["--validating", f"{PLAIN_WEBHOOK}-absent"]
    env = {**os.environ, "KUBECONFIG": str(cluster.plane.kubeconfig)}
    done = subprocess.run(certgen, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    cluster.wait_rollout(PLAIN_NAMESPACE, "deployment/castslice", INSTALL_SECONDS)


def uninstall_plain(cluster: RealCluster) -> None:
    """What install_plain made, deleted: its namespace (with the Secret certgen wrote) and the
    bindings it added."""
    bindings = json.loads(cluster.kubectl("get", "clusterrolebindings", "-o", "json"))["items"]
    names = [b["metadata"]["name"] for b in bindings if b["metadata"]["name"].endswith("-plain")]
    if names:
        cluster.kubectl("delete", "clusterrolebinding", *names, "--ignore-not-found")
    cluster.kubectl("delete", "namespace", PLAIN_NAMESPACE, "--ignore-not-found", "--timeout=180s")
