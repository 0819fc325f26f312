"""A throwaway Kubernetes cluster for end-to-end tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, which plays the kubelets of
a small fleet of fake Nodes, so the real scheduler places Pods and they turn
Running.

Conventions follow controller-runtime's envtest:

* binaries are looked up in ``$KUBEBUILDER_ASSETS``, then on ``PATH``
  (``TEST_ASSET_ETCD``, ``TEST_ASSET_KUBE_APISERVER``,
  ``TEST_ASSET_KUBE_CONTROLLER_MANAGER``, ``TEST_ASSET_KUBE_SCHEDULER`` and
  ``TEST_ASSET_KWOK`` override single binaries); ``.ci/provision-k8s`` builds
  and caches them: ``export KUBEBUILDER_ASSETS="$(.ci/provision-k8s)"``;
* without binaries the ``control_plane`` fixture skips, unless
  ``CASTSLICE_E2E_REQUIRED=1`` (CI), where it fails;
* the fleet (``FLEET``, ``ControlPlane.nodes``): on-demand CPU Nodes, CAST AI
  spot Nodes (label ``scheduling.cast.ai/spot: "true"`` and a NoSchedule taint
  on that key) and GPU Nodes whose GPUs are shared by time-slicing: they
  advertise ``nvidia.com/gpu-shared`` and no whole ``nvidia.com/gpu`` (0), as
  a device plugin that renames its shared replicas does. A Pod asking for
  whole GPUs therefore never schedules; a sliced one does. Two GPUs of each
  GPU Node are also published through DRA (``resource.k8s.io/v1``): a
  hand-written ResourceSlice per Node, as NVIDIA's driver publishes GPUs in
  its consumable-shares mode (``allowMultipleAllocations``, a ``shares``
  capacity of 8), and a DeviceClass ``gpu.nvidia.com`` without
  ``extendedResourceName``, so whole-GPU requests stay off DRA. No driver
  runs: the scheduler allocates and binds, nothing prepares a device.
* kwok's Stages (``kwok-stages.yaml``) make a managed Node Ready and a Pod bound
  to one Running at once; a deleted Pod goes away.

Every child runs in its own process group, gets SIGKILL if pytest dies
(PR_SET_PDEATHSIG), and is stopped by group at the end of the session.

Other knobs: ``CASTSLICE_E2E_START_TIMEOUT`` (seconds, default 120) and
``CASTSLICE_E2E_KEEP=1`` (keep the work dir with certificates and process
logs after the session, its path is printed).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeconfig import write_kubeconfig
from tests.support.pki import CertFactory, CertKey
from tests.support.processes import Process, free_port

ASSETS_ENV = "KUBEBUILDER_ASSETS"
REQUIRED_ENV = "CASTSLICE_E2E_REQUIRED"
TIMEOUT_ENV = "CASTSLICE_E2E_START_TIMEOUT"
KEEP_ENV = "CASTSLICE_E2E_KEEP"

# binary name -> envtest-style per-binary override variable
BINARIES = {
    "etcd": "TEST_ASSET_ETCD",
    "kube-apiserver": "TEST_ASSET_KUBE_APISERVER",
    "kube-controller-manager": "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
    "kube-scheduler": "TEST_ASSET_KUBE_SCHEDULER",
    "kwok": "TEST_ASSET_KWOK",
}

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "castslice-e2e-admin"
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
# Pod and Node addresses kwok writes into status: loopback, so that nothing
# ever tries to reach a made-up address off this machine.
KWOK_NODE_IP = "127.0.0.1"
KWOK_POD_CIDR = "127.64.0.1/16"

# -- the fake fleet ------------------------------------------------------------------------------
SPOT_KEY = "scheduling.cast.ai/spot"
GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu-shared"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
NODE_KIND_LABEL = "castslice.test/node-kind"

ON_DEMAND = "on-demand"
SPOT = "spot"
GPU_NODE = "gpu"


@dataclass(frozen=True)
class FakeNode:
    """One Node of the fleet: ``kind`` is ``on-demand``, ``spot`` or ``gpu``."""

    name: str
    kind: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    capacity: dict[str, str] = field(default_factory=dict)
    dra_gpus: int = 0
    """GPUs published through DRA (a ResourceSlice of this Node's pool), DRA_SHARES each."""


DRA_DRIVER = "gpu.nvidia.com"
DRA_DEVICE_CLASS = "gpu.nvidia.com"
DRA_SHARES = 8


_CPU = {"cpu": "8", "memory": "32Gi", "pods": "110"}
FLEET: tuple[FakeNode, ...] = (
    FakeNode("on-demand-1", ON_DEMAND, capacity=_CPU),
    FakeNode("on-demand-2", ON_DEMAND, capacity=_CPU),
    FakeNode(
        "spot-1",
        SPOT,
        labels={SPOT_KEY: "true"},
        taints=({"key": SPOT_KEY, "value": "true", "effect": "NoSchedule"},),
        capacity=_CPU,
    ),
    FakeNode(
        "spot-2",
        SPOT,
        labels={SPOT_KEY: "true"},
        taints=({"key": SPOT_KEY, "value": "true", "effect": "NoSchedule"},),
        capacity=_CPU,
    ),
    # 8 GPUs each, time-sliced 8 ways: 64 shared replicas, no whole GPU left to hand out.
    FakeNode(
        "gpu-1",
        GPU_NODE,
        labels={"nvidia.com/gpu.present": "true"},
        capacity={"cpu": "32", "memory": "128Gi", "pods": "110", GPU: "0", GPU_SHARED: "64"},
        dra_gpus=2,
    ),
    FakeNode(
        "gpu-2",
        GPU_NODE,
        labels={"nvidia.com/gpu.present": "true"},
        capacity={"cpu": "32", "memory": "128Gi", "pods": "110", GPU: "0", GPU_SHARED: "64"},
        dra_gpus=2,
    ),
)


def node_manifest(node: FakeNode) -> dict[str, Any]:
    """The Node object kwok will manage (it keeps the capacity given here)."""
    key, value = KWOK_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {key: value},
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                NODE_KIND_LABEL: node.kind,
                **node.labels,
            },
        },
        "spec": {"taints": [dict(t) for t in node.taints]},
        "status": {"capacity": dict(node.capacity), "allocatable": dict(node.capacity)},
    }


def device_class() -> dict[str, Any]:
    """Every device of the driver; no ``extendedResourceName`` (see the module)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]},
    }


def resource_slice(node: FakeNode) -> dict[str, Any]:
    """The Node's pool as NVIDIA's driver publishes it with consumable shares: each GPU may be
    allocated to several claims, each consuming 1-8 of its 8 shares."""
    shares = str(DRA_SHARES)
    policy = {"default": "1", "validRange": {"min": "1", "max": shares, "step": "1"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node.name}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{index}",
                    "allowMultipleAllocations": True,
                    "capacity": {"shares": {"value": shares, "requestPolicy": policy}},
                }
                for index in range(node.dra_gpus)
            ],
        },
    }


class ControlPlaneError(RuntimeError):
    """The control plane could not be started."""


# ---------------------------------------------------------------------------
# binaries


def find_binaries() -> tuple[dict[str, Path], list[str]]:
    """Return (found binaries, descriptions of the missing ones)."""
    assets = os.environ.get(ASSETS_ENV)
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name, override in BINARIES.items():
        candidates: list[Path] = []
        if os.environ.get(override):
            candidates.append(Path(os.environ[override]))
        if assets:
            candidates.append(Path(assets) / name)
        on_path = shutil.which(name)
        if on_path:
            candidates.append(Path(on_path))
        for cand in candidates:
            if cand.is_file() and os.access(cand, os.X_OK):
                found[name] = cand
                break
        else:
            missing.append(name)
    return found, missing


def _missing_message(missing: Sequence[str]) -> str:
    assets = os.environ.get(ASSETS_ENV)
    where = f"${ASSETS_ENV}={assets}" if assets else f"${ASSETS_ENV} (unset)"
    return (
        f"e2e control plane binaries not found: {', '.join(missing)} "
        f"(looked in {where} and on PATH); provision them with "
        f'`export {ASSETS_ENV}="$(.ci/provision-k8s)"`'
    )


# ---------------------------------------------------------------------------
# the control plane


@dataclass
class ControlPlane:
    """A running control plane. Attributes:

    host            https://127.0.0.1:<port> of the kube-apiserver
    ca_cert         CA certificate (PEM) that signed every cert here; trust it
                    to talk to the apiserver
    ca_key          its private key (e.g. to sign a webhook's serving cert;
                    see ``issue_cert``)
    client_cert     admin client certificate (O=system:masters)
    client_key      its key
    kubeconfig      kubeconfig file for the admin user (absolute paths)
    etcd_url        http://127.0.0.1:<port> of etcd
    workdir         temp dir with certificates, kubeconfigs and logs/*.log
    binaries        paths of the binaries used
    nodes           the fake fleet (``FLEET``), Ready when the fixture yields
    """

    host: str
    ca_cert: Path
    ca_key: Path
    client_cert: Path
    client_key: Path
    kubeconfig: Path
    etcd_url: str
    workdir: Path
    binaries: dict[str, Path]
    certs: CertFactory = field(repr=False)
    nodes: tuple[FakeNode, ...] = FLEET
    _processes: list[Process] = field(repr=False, default_factory=list)
    _dirs: list[Path] = field(repr=False, default_factory=list)

    @property
    def logs(self) -> dict[str, Path]:
        return {p.name: p.log for p in self._processes}

    # -- the fleet
    def node_names(self, kind: str) -> list[str]:
        """Names of the fleet's Nodes of one kind (``on-demand``, ``spot``, ``gpu``)."""
        names = [n.name for n in self.nodes if n.kind == kind]
        if not names:
            raise ValueError(f"no {kind!r} nodes in the fleet")
        return names

    def node_kind(self, name: str | None) -> str | None:
        """The kind of the fleet Node called ``name`` (None for no or an unknown Node)."""
        return next((n.kind for n in self.nodes if n.name == name), None)

    # -- clients
    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` authenticated as admin."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.host
        cfg.ssl_ca_cert = str(self.ca_cert)
        cfg.cert_file = str(self.client_cert)
        cfg.key_file = str(self.client_key)
        cfg.verify_ssl = True
        return client.ApiClient(cfg)

    def issue_cert(
        self,
        name: str,
        common_name: str,
        *,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        organizations: Sequence[str] = (),
        server: bool = True,
        client: bool = False,
    ) -> CertKey:
        """Issue a certificate signed by ``ca_cert`` into ``workdir/certs``
        (e.g. a webhook serving cert for 127.0.0.1; its caBundle is
        ``ca_cert``'s content). ``name`` must be new in that directory."""
        if (self.certs.dir / f"{name}.crt").exists() or (self.certs.dir / f"{name}.key").exists():
            raise ValueError(f"a certificate named {name!r} already exists in {self.certs.dir}")
        return self.certs.issue(
            name,
            common_name,
            organizations=organizations,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
            server=server,
            client=client,
        )

    def audited_kubeconfig(self, name: str, server: str | None = None) -> Path:
        """A kubeconfig for AUDITED_USER (in system:masters), reaching the apiserver at ``server``
        (default: its own address; a proxy in front of it, say): its writes are in the audit log."""
        path = self.workdir / f"{name}.kubeconfig"
        if not (self.certs.dir / f"{name}.crt").exists():
            self.certs.issue(name, AUDITED_USER, organizations=["system:masters"], server=False, client=True)
        cert = CertKey(self.certs.dir / f"{name}.crt", self.certs.dir / f"{name}.key")
        _write_kubeconfig(path, server or self.host, self.ca_cert, cert, AUDITED_USER)
        return path

    def audited_writes(self) -> list[dict[str, Any]]:
        """The audit log's events (AUDITED_USER's writes), in the order the apiserver logged them."""
        path = self.workdir / "audit.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def get(self, path: str, timeout: float = 5.0, accept: str | None = None) -> tuple[int, bytes]:
        """GET ``path`` on the apiserver as admin (raw HTTP): (status, body)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        request = urllib.request.Request(self.host + path, headers={"Accept": accept} if accept else {})
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get_json(self, path: str) -> dict[str, Any]:
        """GET ``path`` as JSON; raises on anything but 200."""
        status, body = self.get(path)
        if status != 200:
            raise ControlPlaneError(f"GET {path}: HTTP {status}: {body[:500]!r}")
        data: dict[str, Any] = json.loads(body)
        return data

    # -- waiting
    def wait_for_service_account(self, namespace: str, name: str = "default", timeout: float = 60.0) -> None:
        """Wait until the ServiceAccount exists (the controller manager makes
        ``default`` in every namespace; ServiceAccount admission rejects Pods
        before). Since 1.24 there is no token Secret to wait for."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        self.wait_until(
            lambda: self.get(path)[0] == 200,
            timeout,
            f"ServiceAccount {namespace}/{name}",
            "kube-controller-manager",
        )

    def create_namespace(
        self, name: str, labels: dict[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        """Create a namespace and wait for its default ServiceAccount, so that
        Pods can be created in it right away."""
        from kubernetes import client

        with self.api_client() as api:
            client.CoreV1Api(api).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
            )
        self.wait_for_service_account(name, timeout=timeout)

    def wait_for_pod(
        self, namespace: str, name: str, phase: str = "Running", timeout: float = 60.0
    ) -> dict[str, Any]:
        """Wait until the Pod is bound to a Node (by kube-scheduler) and in
        ``phase`` (kwok runs it); return the Pod as stored (JSON)."""
        return self._wait_pod(
            namespace,
            name,
            lambda p: bool(p["spec"].get("nodeName")) and p.get("status", {}).get("phase") == phase,
            timeout,
            f"scheduled and {phase}",
        )

    def wait_for_unschedulable(self, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until kube-scheduler has tried the Pod and found no Node for it
        (condition PodScheduled=False, reason Unschedulable); return that
        condition (its ``message`` says why, per Node)."""
        pod = self._wait_pod(
            namespace,
            name,
            lambda p: _pod_scheduled_condition(p).get("reason") == "Unschedulable",
            timeout,
            "marked Unschedulable",
        )
        return _pod_scheduled_condition(pod)

    def _wait_pod(
        self,
        namespace: str,
        name: str,
        done: Callable[[dict[str, Any]], bool],
        timeout: float,
        what: str,
    ) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        deadline = time.monotonic() + timeout
        pod: dict[str, Any] = {}
        while True:
            pod = self.get_json(path)
            if done(pod):
                return pod
            for p in self._processes:
                if p.exited() is not None:
                    raise ControlPlaneError(p.describe_failure(f"{p.name} died while waiting for a Pod"))
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Pod {namespace}/{name} not {what} after {timeout:.0f}s: "
                    f"nodeName={pod['spec'].get('nodeName')!r} status={json.dumps(pod.get('status'))}"
                )
            time.sleep(0.2)

    def run(self, process: Process) -> Process:
        """Start ``process`` as one of this cluster's: its health is checked while waiting
        (``wait_until``), and ``stop`` stops it."""
        process.start()
        self._processes.append(process)
        return process

    def process(self, name: str) -> Process:
        return next(p for p in self._processes if p.name == name)

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str, blame: str) -> None:
        deadline = time.monotonic() + timeout
        last_error = ""
        while True:
            for p in self._processes:
                if p.exited() is not None:
                    raise ControlPlaneError(p.describe_failure(f"{p.name} died while waiting for {what}"))
            try:
                if check():
                    return
            except (OSError, ValueError, ControlPlaneError) as e:
                last_error = f" (last error: {e})"
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    self.process(blame).describe_failure(
                        f"timed out after {timeout:.0f}s waiting for {what}{last_error}"
                    )
                )
            time.sleep(0.25)

    def _fleet_ready(self) -> bool:
        """Every fleet Node Ready, with no taint but its own (the node
        lifecycle controller taints a Node not-ready until kwok reports it)."""
        items = {n["metadata"]["name"]: n for n in self.get_json("/api/v1/nodes")["items"]}
        for node in self.nodes:
            stored = items.get(node.name)
            if stored is None:
                return False
            conditions = {c["type"]: c["status"] for c in stored.get("status", {}).get("conditions", [])}
            taints = {t["key"] for t in stored["spec"].get("taints", [])}
            if conditions.get("Ready") != "True" or taints != {t["key"] for t in node.taints}:
                return False
        return True

    def stop(self) -> None:
        for p in reversed(self._processes):
            p.stop()
        if os.environ.get(KEEP_ENV) == "1":
            print(f"\n[control_plane] kept work dir {self.workdir}")
            return
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


def _pod_scheduled_condition(pod: dict[str, Any]) -> dict[str, Any]:
    conditions = pod.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


AUDITED_USER = "castslice-audited"
"""Requests of this user (a client certificate, ``ControlPlane.audited_kubeconfig``) that change
something are written to the apiserver's audit log; nothing else is."""


def _write_audit_policy(workdir: Path) -> Path:
    path = workdir / "audit-policy.json"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived", "ResponseStarted"],
                "rules": [
                    {
                        "level": "Metadata",
                        "users": [AUDITED_USER],
                        "verbs": ["create", "update", "patch", "delete", "deletecollection"],
                    },
                    {"level": "None"},
                ],
            }
        )
    )
    return path


def _write_kubeconfig(path: Path, host: str, ca: Path, cert: CertKey, user: str) -> None:
    credentials = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
    write_kubeconfig(path, host, user, credentials, ca)


def start_control_plane(binaries: dict[str, Path], timeout: float | None = None) -> ControlPlane:
    """Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler
    and kwok, register the fleet; return once the apiserver is ready, the
    ``default/default`` ServiceAccount exists and every Node is Ready.
    Raises ControlPlaneError (with log tails) on failure."""
    if timeout is None:
        timeout = float(os.environ.get(TIMEOUT_ENV, "120"))
    workdir = Path(tempfile.mkdtemp(prefix="castslice-e2e-"))
    # etcd fsyncs a lot: keep its data on tmpfs when there is one.
    shm = Path("/dev/shm")
    etcd_parent = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    etcd_data = Path(tempfile.mkdtemp(prefix="castslice-e2e-etcd-", dir=etcd_parent))
    try:
        return _start(binaries, timeout, workdir, etcd_data)
    except BaseException:
        if os.environ.get(KEEP_ENV) != "1":
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(etcd_data, ignore_errors=True)
        raise


def _start(binaries: dict[str, Path], timeout: float, workdir: Path, etcd_data: Path) -> ControlPlane:
    logs = workdir / "logs"
    logs.mkdir()

    certs = CertFactory(workdir / "certs")
    ca = certs.make_ca()
    serving = certs.issue(
        "apiserver",
        "kube-apiserver",
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ip_addresses=["127.0.0.1", "10.0.0.1"],
        server=True,
    )
    admin = certs.issue("admin", ADMIN_USER, organizations=["system:masters"], client=True)
    # The components authenticate with client certificates; system:masters keeps RBAC out of the way.
    component_kubeconfigs: dict[str, Path] = {}
    sa_key, sa_pub = certs.rsa_keypair("service-account")

    etcd_port, etcd_peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    host = f"https://127.0.0.1:{api_port}"
    admin_kubeconfig = workdir / "admin.kubeconfig"
    _write_kubeconfig(admin_kubeconfig, host, ca.cert, admin, ADMIN_USER)
    for component, user in (
        ("kube-controller-manager", "system:kube-controller-manager"),
        ("kube-scheduler", "system:kube-scheduler"),
        ("kwok", "kwok-controller"),
    ):
        cert = certs.issue(component, user, organizations=["system:masters"], client=True)
        component_kubeconfigs[component] = workdir / f"{component}.kubeconfig"
        _write_kubeconfig(component_kubeconfigs[component], host, ca.cert, cert, user)
    kwok_home = workdir / "kwok-home"  # kwok also reads ~/.kwok/kwok.yaml: not the user's
    kwok_home.mkdir()

    cp = ControlPlane(
        host=host,
        ca_cert=ca.cert,
        ca_key=ca.key,
        client_cert=admin.cert,
        client_key=admin.key,
        kubeconfig=admin_kubeconfig,
        etcd_url=etcd_url,
        workdir=workdir,
        binaries=dict(binaries),
        certs=certs,
        _dirs=[workdir, etcd_data],
    )
    etcd_peer = f"http://127.0.0.1:{etcd_peer_port}"
    kwok_selector = "=".join(KWOK_NODE_ANNOTATION)
    etcd = Process(
        "etcd",
        [
            str(binaries["etcd"]),
            "--name=e2e",
            f"--data-dir={etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={etcd_peer}",
            f"--initial-advertise-peer-urls={etcd_peer}",
            f"--initial-cluster=e2e={etcd_peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # a throwaway store on tmpfs
            "--logger=zap",
            "--log-level=warn",
        ],
        logs / "etcd.log",
    )
    apiserver = Process(
        "kube-apiserver",
        [
            str(binaries["kube-apiserver"]),
            "--advertise-address=127.0.0.1",
            "--bind-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={workdir / 'certs'}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca.cert}",
            f"--etcd-servers={etcd_url}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--authorization-mode=Node,RBAC",
            # Added to the defaults (NamespaceLifecycle, ServiceAccount, the webhooks, PodSecurity, ...).
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,"
            "MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
            "--allow-privileged=true",
            # The writes of AUDITED_USER only (tests that check who wrote what, in the
            # apiserver's own order: see ControlPlane.audited_writes).
            f"--audit-policy-file={_write_audit_policy(workdir)}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-format=json",
            # An Endpoints object for `kubernetes` pointing at 127.0.0.1 is
            # rejected (loopback) and nothing could reach it anyway.
            "--endpoint-reconciler-type=none",
            "--v=1",
        ],
        logs / "kube-apiserver.log",
    )
    controller_manager = Process(
        "kube-controller-manager",
        [
            str(binaries["kube-controller-manager"]),
            f"--kubeconfig={component_kubeconfigs['kube-controller-manager']}",
            "--controllers=*",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={ca.cert}",
            f"--cluster-signing-cert-file={ca.cert}",
            f"--cluster-signing-key-file={ca.key}",
            "--secure-port=0",
            "--v=1",
        ],
        logs / "kube-controller-manager.log",
    )
    scheduler = Process(
        "kube-scheduler",
        [
            str(binaries["kube-scheduler"]),
            f"--kubeconfig={component_kubeconfigs['kube-scheduler']}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ],
        logs / "kube-scheduler.log",
    )
    kwok = Process(
        "kwok",
        [
            str(binaries["kwok"]),
            f"--kubeconfig={component_kubeconfigs['kwok']}",
            f"--config={KWOK_STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={kwok_selector}",
            "--manage-nodes-with-label-selector=",
            f"--node-ip={KWOK_NODE_IP}",
            f"--cidr={KWOK_POD_CIDR}",
            "--node-lease-duration-seconds=40",
        ],
        logs / "kwok.log",
        env={**os.environ, "HOME": str(kwok_home)},
    )

    try:
        cp.run(etcd)
        cp.wait_until(lambda: _http_ok(f"{etcd_url}/health"), timeout, "etcd /health", "etcd")
        cp.run(apiserver)
        ready = lambda: cp.get("/readyz")[0] == 200  # noqa: E731
        cp.wait_until(ready, timeout, "kube-apiserver /readyz", "kube-apiserver")
        for p in (controller_manager, scheduler, kwok):
            cp.run(p)
        _create_fleet(cp)
        cp.wait_for_service_account("default", timeout=timeout)
        cp.wait_until(cp._fleet_ready, timeout, "the fake Nodes to be Ready (kwok)", "kwok")
    except BaseException:
        cp.stop()
        raise
    return cp


def _create_fleet(cp: ControlPlane) -> None:
    from kubernetes import client

    with cp.api_client() as api:
        core: Any = client.CoreV1Api(api)
        for node in cp.nodes:
            core.create_node(node_manifest(node))
        resource = client.CustomObjectsApi(api)
        resource.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", device_class())
        for node in cp.nodes:
            if node.dra_gpus:
                resource.create_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceslices", resource_slice(node)
                )


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def control_plane_fixture() -> Iterator[ControlPlane]:
    """Generator behind the ``control_plane`` fixture (see conftest.py)."""
    binaries, missing = find_binaries()
    msg = _missing_message(missing) if missing else ""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        msg = "the `cryptography` package (a test dependency) is not installed; " + msg
    if msg:
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(f"{msg} [{REQUIRED_ENV}=1]", pytrace=False)
        pytest.skip(msg)
    try:
        cp = start_control_plane(binaries)
    except ControlPlaneError as e:
        error = str(e)
    else:
        error = ""
    if error:  # (outside the except: no chained traceback in the report)
        pytest.fail(f"could not start the e2e control plane: {error}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """Session-wide etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok."""
    yield from control_plane_fixture()
