"""A real one-node cluster on this machine, for the real-node suite (tests/cluster): the control
plane of ``.ci/provision-k8s`` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
plus Debian's containerd, runc and CNI bridge, and kubelet and kube-proxy of the same Kubernetes
build (``.ci/provision-cluster``). Real Pods run in real containers; Services are real ClusterIPs
(kube-proxy's iptables rules); CoreDNS answers cluster names.

Everything the node changes on the host is recorded first and put back by ``down()``, in this
order: the cluster's Pods deleted while the kubelet still runs; the kubelet, kube-proxy's rules
(``kube-proxy --cleanup``), containerd and the control plane stopped; mounts under the work dir
undone; the CNI bridge deleted; the ``kubepods`` cgroups removed; the sysctls the kubelet, CNI
and kube-proxy write restored; the paths the kubelet creates outside its root dir (they are fixed
in 1.37) removed when they did not exist before. ``HostState`` records what the host looked like
(sysctls, iptables rules, mounts, those paths, network links) so the suite can check that the
teardown left it as found.

The apiserver must resolve a Knative route's host to the ingress (it never uses cluster DNS): it
runs in a mount namespace of its own with a hosts file of the cluster's bind-mounted over
/etc/hosts (``map_host``), so the machine's /etc/hosts is never touched.

One real node per machine at a time (the kube-proxy chains, the bridge and /kubepods are global):
a lock file serialises runs. Other control planes on the machine (kwok ones) are left alone:
ports are free ports, data lives under the work dir, only processes started here are stopped.

    python -m tests.cluster.realnode          # start, print the kubeconfig; Ctrl-C stops it
    python -m tests.cluster.realnode recover  # put the host back after a run killed mid-way
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from tests.e2e.controlplane import ControlPlane, ControlPlaneError, find_binaries
from tests.support.kubeconfig import write_kubeconfig
from tests.support.pki import CertFactory
from tests.support.processes import Process, free_port

ASSETS_ENV = "CASTSLICE_CLUSTER_ASSETS"
REQUIRED_ENV = "CASTSLICE_CLUSTER_REQUIRED"
KEEP_ENV = "CASTSLICE_CLUSTER_KEEP"
LOCK_PATH = Path("/run/lock/castslice-realnode.lock")

NODE_NAME = "castslice-node"
NODE_KIND_LABEL = "castslice.test/node-kind"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_CIDR = "10.244.0.0/16"
POD_SUBNET = "10.244.0.0/24"
BRIDGE = "cslnode0"
CLUSTER_DOMAIN = "cluster.local"

SYSCTLS = (
    # the kubelet with protectKernelDefaults: false
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.panic_on_oom",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    # the CNI bridge plugin (isGateway) turns forwarding on
    "net.ipv4.ip_forward",
    "net.bridge.bridge-nf-call-iptables",
    # kube-proxy: localhost NodePorts and conntrack (both configured off; checked anyway)
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
BUILTIN_CHAINS = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
KUBELET_OUTSIDE_PATHS = (Path("/var/lib/kubelet"), Path("/var/log/containers"), Path("/var/log/pods"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
START_TIMEOUT = 180.0


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def _write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", name.replace(".", "/")).write_text(value)


def _run(*args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    if check and done.returncode != 0:
        raise ControlPlaneError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


OTHER_ENGINES_MOUNTS = ("/var/lib/containers/", "/run/containers/", "/var/lib/docker/")


@dataclass(frozen=True)
class HostState:
    """What the node may change on the host, as found: compared before and after a run."""

    sysctls: dict[str, str | None]
    iptables: str
    ip6tables: str
    mounts: tuple[str, ...]
    paths: dict[str, bool]
    links: tuple[str, ...]
    cgroups: tuple[str, ...]

    @classmethod
    def read(cls, tools: dict[str, str]) -> HostState:
        def rules(save: str) -> str:
            """The rules and chains that do something: counters change by themselves, and a
            table iptables-nft made that holds only empty built-in chains with policy ACCEPT
            filters nothing (iptables cannot delete a table; nft is not at hand)."""
            text = _run(save, env=tools, check=False)
            kept: list[str] = []
            for line in text.splitlines():
                if line.startswith("#") or line == "COMMIT" or line.startswith("*"):
                    continue
                if line.startswith(":"):
                    chain, policy = line[1:].split(" ", 2)[:2]
                    if policy in ("ACCEPT", "-") and chain in BUILTIN_CHAINS:
                        continue
                    line = f":{chain} {policy}"
                kept.append(line)
            return "\n".join(kept)

        return cls(
            sysctls={name: _read_sysctl(name) for name in SYSCTLS},
            iptables=rules("iptables-save"),
            ip6tables=rules("ip6tables-save"),
            # Not other container engines' (a podman build mounts and unmounts its layers at any time).
            mounts=tuple(
                sorted(
                    mount
                    for mount in (line.split()[1] for line in Path("/proc/mounts").read_text().splitlines())
                    if not mount.startswith(OTHER_ENGINES_MOUNTS)
                )
            ),
            paths={str(p): p.exists() for p in KUBELET_OUTSIDE_PATHS},
            # Only the node's own: other jobs (podman builds) add and remove veths at any time.
            links=tuple(sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name == BRIDGE)),
            cgroups=tuple(sorted(str(p) for p in CGROUP_ROOT.glob("*/kubepods") if p.is_dir())),
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HostState:
        data = json.loads(text)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def differences(self, other: HostState) -> list[str]:
        """What ``other`` has that differs from this state, one line each."""
        out = [
            f"sysctl {name}: {value!r} -> {other.sysctls.get(name)!r}"
            for name, value in self.sysctls.items()
            if other.sysctls.get(name) != value
        ]
        for what in ("iptables", "ip6tables", "mounts", "paths", "links", "cgroups"):
            if getattr(self, what) != getattr(other, what):
                out.append(f"{what}: {getattr(self, what)!r} -> {getattr(other, what)!r}")
        return out


def host_ip() -> str:
    """The address of the default route's interface (pods reach the apiserver there)."""
    routes = json.loads(_run("ip", "-4", "-j", "route", "show", "default"))
    device = routes[0]["dev"]
    addresses = json.loads(_run("ip", "-4", "-j", "addr", "show", "dev", device))
    return str(addresses[0]["addr_info"][0]["local"])


@dataclass
class Assets:
    """What .ci/provision-cluster left in its key directory."""

    root: Path

    @classmethod
    def find(cls) -> tuple[Assets | None, str]:
        where = os.environ.get(ASSETS_ENV, "")
        if not where:
            return (
                None,
                f'${ASSETS_ENV} is unset: provision with `export {ASSETS_ENV}="$(.ci/provision-cluster)"`',
            )
        root = Path(where)
        if not (root / ".provisioned").is_file():
            return None, f"${ASSETS_ENV}={where} holds no provisioned assets (.ci/provision-cluster)"
        return cls(root), ""

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    @property
    def debian(self) -> Path:
        return self.root / "root"

    def image(self, name: str) -> Path:
        return self.root / "images" / f"{name}.tar"

    @property
    def yaml(self) -> Path:
        return self.root / "yaml"


@dataclass
class RealCluster:
    """A running one-node cluster. ``plane`` offers the e2e suite's ControlPlane helpers (get,
    get_json, api_client, kubeconfig, the CA) for it."""

    plane: ControlPlane
    assets: Assets
    workdir: Path
    before: HostState
    tools_env: dict[str, str]
    hosts_file: Path
    containerd_socket: Path
    _stoppers: list[Callable[[], None]] = field(default_factory=list)
    _lock: Any = None

    # -- names the apiserver resolves
    def map_host(self, name: str, address: str) -> None:
        """Make the apiserver resolve ``name`` to ``address`` (its private /etc/hosts; Go's resolver
        re-reads a changed hosts file within 5 s)."""
        lines = [line for line in self.hosts_file.read_text().splitlines() if not line.endswith(f" {name}")]
        lines.append(f"{address} {name}")
        # In place: the bind mount holds this inode.
        with self.hosts_file.open("r+") as handle:
            handle.seek(0)
            handle.write("\n".join(lines) + "\n")
            handle.truncate()

    # -- images
    def load_image(self, archive: Path) -> None:
        """Import an image archive into containerd's k8s.io namespace (no registry)."""
        _run(
            str(self.assets.debian / "usr/bin/ctr"),
            "--address",
            str(self.containerd_socket),
            "-n",
            "k8s.io",
            "images",
            "import",
            str(archive),
        )

    def load_project_image(self, image: str, name: str = "dev.local/castslice:ci") -> None:
        """The image .ci/build-image made (podman's store) into containerd as ``name``."""
        archive = self.workdir / "project-image.tar"
        _run("podman", "save", "--format", "docker-archive", "-o", str(archive), image)
        self.load_image(archive)
        archive.unlink()
        ctr = [
            str(self.assets.debian / "usr/bin/ctr"),
            "--address",
            str(self.containerd_socket),
            "-n",
            "k8s.io",
        ]
        reference = image if "/" in image.split(":")[0] else f"localhost/{image}"
        _run(*ctr, "images", "tag", "--force", reference, name)

    def images(self) -> list[str]:
        out = _run(
            str(self.assets.debian / "usr/bin/ctr"),
            "--address",
            str(self.containerd_socket),
            "-n",
            "k8s.io",
            "images",
            "ls",
            "-q",
        )
        return out.split()

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 300) -> str:
        from tests.support.manifests import kubectl_path

        done = subprocess.run(
            [kubectl_path(), f"--kubeconfig={self.plane.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr[-3000:]}")
        return done.stdout

    def apply(self, objects: list[dict[str, Any]] | str, *args: str) -> str:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(objects)
        return self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", *args, stdin=text)

    def wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (OSError, ValueError, ControlPlaneError, AssertionError) as error:
                last = f" (last: {error})"
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{last}")

    def wait_rollout(self, namespace: str, kind_name: str, timeout: float = 240.0) -> None:
        # kubectl's own --timeout names what did not roll out; the process gets a margin over it.
        args = ("-n", namespace, "rollout", "status", kind_name, f"--timeout={int(timeout)}s")
        self.kubectl(*args, timeout=timeout + 30)

    # -- teardown
    def down(self) -> list[str]:
        """Stop everything and put the host back; return what still differs from before."""
        for stop in reversed(self._stoppers):
            with contextlib.suppress(Exception):
                stop()
        self._stoppers.clear()
        after = HostState.read(self.tools_env)
        if os.environ.get(KEEP_ENV) != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            (self.workdir / BEFORE_FILE).unlink(missing_ok=True)  # not a dead run's to recover
            print(f"[realnode] kept {self.workdir}")
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return self.before.differences(after)


def _tools_env(assets: Assets, workdir: Path) -> dict[str, str]:
    """PATH and library paths for Debian's unpacked binaries (iptables is found by name by
    kube-proxy and the CNI plugins; its Debian links are made by update-alternatives, so here)."""
    sbin = workdir / "sbin"
    sbin.mkdir(exist_ok=True)
    multi = assets.debian / "usr/sbin/xtables-nft-multi"
    for name in (
        "iptables",
        "iptables-save",
        "iptables-restore",
        "ip6tables",
        "ip6tables-save",
        "ip6tables-restore",
    ):
        link = sbin / name
        if not link.exists():
            link.symlink_to(multi)
    libdir = assets.debian / "usr/lib/x86_64-linux-gnu"
    return {
        **os.environ,
        "PATH": ":".join(
            (
                str(sbin),
                str(assets.debian / "usr/bin"),
                str(assets.debian / "usr/sbin"),
                os.environ.get("PATH", ""),
            )
        ),
        "LD_LIBRARY_PATH": str(libdir),
        "XTABLES_LIBDIR": str(libdir / "xtables"),
    }


def _containerd_config(assets: Assets, work: Path) -> str:
    return f"""version = 2
root = "{work}/containerd/root"
state = "{work}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{work}/containerd.sock"
[ttrpc]
  address = "{work}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{work}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "dev.local/pause:ci"
  # CAP_SYS_RESOURCE is missing here: negative oom_score_adj values are clamped, not refused.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{assets.debian}/usr/lib/cni"
    conf_dir = "{work}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{assets.debian}/usr/sbin/runc"
        Root = "{work}/runc"
        SystemdCgroup = false
"""


def _cni_config(work: Path) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "castslice-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(work / "ipam"),
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _kubelet_config(work: Path, port: int, healthz: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 (hybrid) hosts; containerd 1.6 has no RuntimeConfig, so the driver is ours.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{work}/containerd.sock",
        # Loopback only: the apiserver reaches the node by its Hostname address, which the
        # cluster's hosts file maps to 127.0.0.1; the anonymous port is never on eth0.
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "protectKernelDefaults": False,
        # Its canary and firewall chains would be global iptables rules that nothing removes.
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(work / "podlogs"),
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(work / "resolv.conf"),
        "staticPodPath": "",
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "maxPods": 110,
        "failSwapOn": False,
        "containerLogMaxSize": "5Mi",
        "shutdownGracePeriod": "0s",
    }


def _kube_proxy_config(kubeconfig: Path, metrics: int, healthz: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": CLUSTER_CIDR,
        "bindAddress": "127.0.0.1",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        # No sysctl writes: conntrack limits and timeouts left as the host has them, and no
        # route_localnet (localhost NodePorts off).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "1s"},
    }


def _acquire_lock() -> Any:
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    handle = LOCK_PATH.open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"[realnode] another real node runs on this machine ({LOCK_PATH}); waiting")
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def start(assets: Assets, timeout: float = START_TIMEOUT, dns: bool = True) -> RealCluster:
    """Start the cluster; on failure everything started is stopped and the host restored."""
    binaries, missing = find_binaries()
    if missing:
        raise ControlPlaneError(f"control-plane binaries missing: {missing} (.ci/provision-k8s)")
    lock = _acquire_lock()
    for work in recover_stale(assets):
        print(f"[realnode] put the host back after a run that died without its teardown ({work})")
    # Not under /tmp: containerd's overlay snapshots need a real filesystem, and the work dir
    # must survive as long as the node.
    work = Path(tempfile.mkdtemp(prefix="castslice-node-", dir="/var/tmp"))
    tools = _tools_env(assets, work)
    before = HostState.read(tools)
    (work / BEFORE_FILE).write_text(before.to_json())
    cluster = RealCluster(
        plane=cast(ControlPlane, None),  # set by _start, once its certificates exist
        assets=assets,
        workdir=work,
        before=before,
        tools_env=tools,
        hosts_file=work / "hosts",
        containerd_socket=work / "containerd.sock",
        _lock=lock,
    )
    # From the first change on, down() undoes whatever was started.
    cluster._stoppers.append(lambda: _restore_host(cluster))
    try:
        _start(cluster, binaries, timeout, dns)
    except BaseException:
        problems = cluster.down()
        if problems:
            print("[realnode] the host differs after a failed start:\n  " + "\n  ".join(problems))
        raise
    return cluster


def _restore_host(cluster: RealCluster) -> None:
    """The last step of down(): undo what the processes left behind."""
    restore(cluster.workdir, cluster.before, cluster.tools_env, cluster.assets)


BEFORE_FILE = "host-before.json"


def restore(work: Path, before: HostState, tools_env: dict[str, str], assets: Assets) -> None:
    """Put the host back as ``before`` says, whatever state a run left it in (also after a run
    that was killed: ``recover_stale``). Every process still in the node's cgroups or naming its
    work dir (containers, their shims) is killed first."""
    _kill_leftovers(work)
    subprocess.run(
        [str(assets.bin("kube-proxy")), "--cleanup"],
        env=tools_env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    # Mounts under the work dir (the kubelet bind-mounts its root dir; pod volumes, netns).
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in reversed(mounts):
        if mount.startswith(str(work)):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
    # KUBE-FIREWALL (a DROP of non-loopback traffic to 127.0.0.0/8, jumped to from INPUT and
    # OUTPUT): kube-proxy --cleanup empties what it wrote but leaves this chain.
    for family in ("iptables", "ip6tables"):
        if "KUBE-FIREWALL" in getattr(before, family):
            continue
        for args in (
            ("-D", "INPUT", "-j", "KUBE-FIREWALL"),
            ("-D", "OUTPUT", "-j", "KUBE-FIREWALL"),
            ("-F", "KUBE-FIREWALL"),
            ("-X", "KUBE-FIREWALL"),
        ):
            subprocess.run([family, "-t", "filter", *args], env=tools_env, check=False, capture_output=True)
    # The kubepods cgroups, deepest first, in every hierarchy.
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / "kubepods"
        if top.is_dir():
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    for name, value in before.sysctls.items():
        if value is not None and _read_sysctl(name) != value:
            _write_sysctl(name, value)
    for path in KUBELET_OUTSIDE_PATHS:
        if not before.paths[str(path)] and path.exists():
            shutil.rmtree(path, ignore_errors=True)
    for directory in (Path("/var/lib/cni/results"),):
        # go-cni's cache: emptied when sandboxes go; the dirs it made are removed if empty.
        with contextlib.suppress(OSError):
            directory.rmdir()
            directory.parent.rmdir()


def _kill_leftovers(work: Path) -> None:
    pids: set[int] = set()
    for procs in CGROUP_ROOT.glob("pids/kubepods/**/cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(line) for line in procs.read_text().split())
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if str(work).encode() in (proc / "cmdline").read_bytes():
                    pids.add(int(proc.name))
    pids.discard(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(1 if pids else 0)


def recover_stale(assets: Assets) -> list[Path]:
    """Work dirs of runs that died without their teardown (their processes gone, or only what
    they left running): the host put back as each recorded it, the dir removed. Called with the
    lock held, so no live run is touched."""
    recovered = []
    for before_file in Path("/var/tmp").glob(f"castslice-node-*/{BEFORE_FILE}"):
        work = before_file.parent
        before = HostState.from_json(before_file.read_text())
        restore(work, before, _tools_env(assets, work), assets)
        shutil.rmtree(work, ignore_errors=True)
        recovered.append(work)
    return recovered


def _start(cluster: RealCluster, binaries: dict[str, Path], timeout: float, dns: bool) -> None:
    work, assets = cluster.workdir, cluster.assets
    logs = work / "logs"
    logs.mkdir()
    address = host_ip()
    certs = CertFactory(work / "certs")
    ca = certs.make_ca("castslice-node-ca")
    serving = certs.issue(
        "apiserver",
        "kube-apiserver",
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
        ],
        ip_addresses=["127.0.0.1", address, KUBERNETES_SERVICE_IP],
        server=True,
    )
    admin = certs.issue("admin", "castslice-node-admin", organizations=["system:masters"], client=True)
    sa_key, sa_pub = certs.rsa_keypair("service-account")
    etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    host = f"https://{address}:{api_port}"
    kubeconfig = work / "admin.kubeconfig"
    credentials = {"client-certificate": str(admin.cert), "client-key": str(admin.key)}
    write_kubeconfig(kubeconfig, host, "castslice-node-admin", credentials, ca.cert)
    etcd_data = work / "etcd"
    plane = ControlPlane(
        host=host,
        ca_cert=ca.cert,
        ca_key=ca.key,
        client_cert=admin.cert,
        client_key=admin.key,
        kubeconfig=kubeconfig,
        etcd_url=etcd_url,
        workdir=work,
        binaries=dict(binaries),
        certs=certs,
        nodes=(),
    )
    cluster.plane = plane

    def run(process: Process, stop_timeout: float = 10.0) -> Process:
        process.keep_env = KEEP_ENV  # its failure names the variable that keeps this work dir
        plane.run(process)
        cluster._stoppers.append(lambda: process.stop(stop_timeout))
        return process

    # The apiserver's own /etc/hosts: the node's name (it reaches the kubelet by its Hostname
    # address) and, later, the Knative route hosts (map_host).
    cluster.hosts_file.write_text(f"127.0.0.1 localhost\n127.0.0.1 {NODE_NAME}\n")
    (work / "resolv.conf").write_text(
        f"# the node's pods resolve through CoreDNS ({DNS_SERVICE_IP})\nsearch {CLUSTER_DOMAIN}\n"
    )
    run(
        Process(
            "etcd",
            [
                str(binaries["etcd"]),
                "--name=node",
                f"--data-dir={etcd_data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=node=http://127.0.0.1:{etcd_peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
                "--logger=zap",
                "--log-level=warn",
            ],
            logs / "etcd.log",
        )
    )
    plane.wait_until(lambda: _http_ok(f"{etcd_url}/health"), timeout, "etcd", "etcd")
    apiserver_args = [
        str(binaries["kube-apiserver"]),
        f"--advertise-address={address}",
        f"--bind-address={address}",
        f"--secure-port={api_port}",
        f"--cert-dir={work / 'certs'}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={ca.cert}",
        f"--etcd-servers={etcd_url}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
        f"--service-account-key-file={sa_pub}",
        f"--service-account-signing-key-file={sa_key}",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,"
        "ValidatingAdmissionWebhook",
        # Never --enable-aggregator-routing: it refuses ExternalName Services as webhook backends.
        "--v=1",
    ]
    # Its own mount namespace, with the cluster's hosts file over /etc/hosts.
    hosts = cluster.hosts_file
    run(
        Process(
            "kube-apiserver",
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount --bind "{hosts}" /etc/hosts && exec "$@"',
                "apiserver",
                *apiserver_args,
            ],
            logs / "kube-apiserver.log",
        )
    )
    ready = lambda: plane.get("/readyz")[0] == 200  # noqa: E731
    plane.wait_until(ready, timeout, "kube-apiserver /readyz", "kube-apiserver")
    run(
        Process(
            "kube-controller-manager",
            [
                str(binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}",
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
    )
    run(
        Process(
            "kube-scheduler",
            [
                str(binaries["kube-scheduler"]),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
            logs / "kube-scheduler.log",
        )
    )

    # containerd and the images (no registry).
    (work / "cni").mkdir()
    (work / "cni" / "10-castslice-node.conflist").write_text(json.dumps(_cni_config(work), indent=2))
    (work / "containerd.toml").write_text(_containerd_config(assets, work))
    containerd = run(
        Process(
            "containerd",
            [
                str(assets.debian / "usr/bin/containerd"),
                f"--config={work / 'containerd.toml'}",
                "--log-level=warn",
            ],
            logs / "containerd.log",
            env=cluster.tools_env,
        ),
        stop_timeout=20,
    )
    plane.wait_until(lambda: cluster.containerd_socket.exists(), timeout, "containerd", "containerd")
    del containerd
    for archive in sorted((assets.root / "images").glob("*.tar")):
        cluster.load_image(archive)

    # kubelet
    kubelet_port, kubelet_healthz = free_port(), free_port()
    (work / "kubelet.yaml").write_text(yaml.safe_dump(_kubelet_config(work, kubelet_port, kubelet_healthz)))
    run(
        Process(
            "kubelet",
            [
                str(assets.bin("kubelet")),
                f"--config={work / 'kubelet.yaml'}",
                f"--root-dir={work / 'kubelet'}",
                f"--cert-dir={work / 'kubelet-pki'}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--node-labels={NODE_KIND_LABEL}=real",
                "--v=1",
            ],
            logs / "kubelet.log",
            env=cluster.tools_env,
        ),
        stop_timeout=20,
    )
    # Before the kubelet stops: the cluster's Pods go (their sandboxes, netns, mounts, cgroups).
    cluster._stoppers.append(lambda: _delete_all_pods(cluster))
    plane.wait_until(lambda: _node_ready(plane), timeout, f"Node {NODE_NAME} Ready", "kubelet")

    # kube-proxy; its rules are removed by --cleanup after it stops (restore()).
    proxy_config = work / "kube-proxy.yaml"
    proxy_config.write_text(yaml.safe_dump(_kube_proxy_config(kubeconfig, free_port(), free_port())))

    run(
        Process(
            "kube-proxy",
            [str(assets.bin("kube-proxy")), f"--config={proxy_config}", "--v=1"],
            logs / "kube-proxy.log",
            env=cluster.tools_env,
        )
    )
    plane.wait_until(
        lambda: "KUBE-SERVICES" in _run("iptables-save", "-t", "nat", env=cluster.tools_env),
        timeout,
        "kube-proxy's rules",
        "kube-proxy",
    )
    if dns:
        cluster.apply(coredns_manifests())
        cluster.wait_rollout("kube-system", "deployment/coredns", timeout)


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _node_ready(plane: ControlPlane) -> bool:
    status, body = plane.get(f"/api/v1/nodes/{NODE_NAME}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _delete_all_pods(cluster: RealCluster) -> None:
    """Every Pod of the node deleted (controllers stopped first, so none comes back), and their
    sandboxes gone, while the kubelet still runs."""
    plane = cluster.plane
    for name in ("kube-controller-manager", "kube-scheduler"):
        with contextlib.suppress(StopIteration):
            plane.process(name).stop()
    cluster.kubectl(
        "delete", "pods", "--all-namespaces", "--all", "--grace-period=1", "--wait=false", check=False
    )
    crictl_free_deadline = time.monotonic() + 90
    while time.monotonic() < crictl_free_deadline:
        status, body = plane.get("/api/v1/pods")
        if status == 200 and not json.loads(body)["items"]:
            break
        time.sleep(1)
    # The kubelet removes a sandbox shortly after its Pod is gone.
    sandboxes = Path(cluster.workdir, "containerd/state/io.containerd.grpc.v1.cri/sandboxes")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sandboxes.is_dir() and any(sandboxes.iterdir()):
        time.sleep(1)


def coredns_manifests() -> list[dict[str, Any]]:
    """CoreDNS for cluster names only (nothing leaves this machine), on 1053 as a non-root user,
    behind the kube-dns Service at DNS_SERVICE_IP."""
    labels = {"k8s-app": "kube-dns"}
    corefile = f""".:1053 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loadbalance
}}
"""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "castslice-node:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "castslice-node:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "castslice-node:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": corefile},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "containers": [
                            {
                                "name": "coredns",
                                "image": "dev.local/coredns:ci",
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"containerPort": 1053, "protocol": "UDP", "name": "dns"},
                                    {"containerPort": 1053, "protocol": "TCP", "name": "dns-tcp"},
                                ],
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}},
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                                "resources": {
                                    "requests": {"cpu": "10m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"},
                                },
                                "securityContext": {
                                    "runAsNonRoot": True,
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                ],
            },
        },
    ]


@contextlib.contextmanager
def running(assets: Assets) -> Iterator[RealCluster]:
    cluster = start(assets)
    try:
        yield cluster
    finally:
        problems = cluster.down()
        if problems:
            print("[realnode] the host differs after teardown:\n  " + "\n  ".join(problems))


def interrupt_on_sigterm() -> None:
    """SIGTERM (a CI runner's stop, ``timeout``) raises KeyboardInterrupt, so the teardown runs."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def main() -> None:
    assets, why = Assets.find()
    if assets is None:
        raise SystemExit(why)
    interrupt_on_sigterm()
    if sys.argv[1:] == ["recover"]:
        for work in recover_stale(assets):
            print(f"put the host back after {work}")
        return
    with running(assets) as cluster:
        print(f"export KUBECONFIG={cluster.plane.kubeconfig}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
