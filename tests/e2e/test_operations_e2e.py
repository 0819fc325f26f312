"""Running it for a year, on the real control plane: Pods that skipped the webhook are found, a
rolling restart under load lets no Pod through, an apiserver restart keeps readiness and placements.

Two single-worker ``castslice serve`` processes (GPU slicing and spot at 40 %, their watches on the
rendered RBAC) sit behind one address, a ``ServiceProxy`` that behaves like a Service in front of
two Pods: each new connection goes to the next ready endpoint; a replica joins once its /readyz
answers 200 and leaves ``ENDPOINT_LAG`` seconds after it is told to terminate, the time an endpoint
change takes to reach kube-proxy. A connection that finds nobody listening is closed, which the
apiserver counts as a failed call and, under ``failurePolicy: Ignore``, a Pod admitted unchanged.

Figures (counts, rates, durations) are printed (``-s``) and kept as test properties.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from function.contract import SHUTDOWN_DRAIN_SECONDS
from tests.support.manifests import KNATIVE_DIR, one, render
from tests.support.processes import kill_group

from .controlplane import ControlPlane
from .identity import delete_created, service_account_kubeconfig
from .launch import EventLog, ServedController, ServedWebhook, ServiceProxy, pointed_at, start_event_sink
from .support import restart_apiserver
from .workloads import PLACEMENT, deployment, eventually

pytestmark = pytest.mark.e2e

ROUTE = "castslice-e2e-spot"
"""Namespace label naming the server that handles the namespace (the spot module's key; this
module's namespaces carry the value NAME)."""

CASTSLICE = str(Path(sys.executable).parent / "castslice")
NAME = "ops"
"""The route label value and the webhook configuration's name part (e2e-spot-ops)."""
WEBHOOK = f"e2e-spot-{NAME}.castslice.castops.io"
CONFIG: dict[str, Any] = {"spot": {"enabled": True, "spotPercentageOfReplicaSet": 40}}
CONTROL_NAMESPACE = "ops-control"
"""Where the controllers' Lease lives (no webhook route: nothing there is admitted by ours)."""
DRIFT_INTERVAL = 10
GRACE_SECONDS = 135
"""terminationGracePeriodSeconds of knative/overlays/deployment (tests/deploy/test_termination_grace.py)."""
ENDPOINT_LAG = 2.0
"""Seconds a terminating replica still receives new connections (endpoints -> kube-proxy)."""
UNSCHEDULED = "castslice-e2e-nobody"
"""A scheduler nobody runs: the load's Pods stay Pending, unbound, so the scheduler and kwok do
not spend the machine's two cores on them (admission is what is tested; placement on the fleet is
test_spot_e2e's)."""
GPU_SHARED, GPU = "nvidia.com/gpu-shared", "nvidia.com/gpu"
ADMISSION_TYPES = "io.castops.castslice.admission."

LOAD_SECONDS = 300
"""At most; the rolling restart stops the load once its restarts are done."""
RESTART_ROUNDS = 5
"""Each of the two serving processes is restarted this many times under the load."""
GPU_PODS_PER_SECOND = 15
CLIENTS = 8
DEPLOYMENTS, SCALE_EVERY = 10, 2.0
"""Each Deployment gains one replica every SCALE_EVERY seconds: 5 ReplicaSet Pods a second, which
with the GPU Pods makes 20 Pod creations a second."""


class Replicas:
    """The webhook's replicas behind the proxy: started, ready, terminated one by one."""

    def __init__(self, plane: ControlPlane, kubeconfig: Path, sink: str, proxy: ServiceProxy) -> None:
        self.plane, self.kubeconfig, self.sink, self.proxy = plane, kubeconfig, sink, proxy
        self.running: list[ServedWebhook] = []
        self.started = 0
        self.stopped: list[ServedWebhook] = []

    def start(self) -> ServedWebhook:
        """A new replica; it joins the endpoints once ready (ServedWebhook waits for /readyz)."""
        self.started += 1
        server = ServedWebhook(
            self.plane, f"ops-{self.started}", CONFIG, self.sink, kubeconfig=self.kubeconfig
        )
        self.proxy.add(server.port)
        self.running.append(server)
        return server

    def terminate(self, server: ServedWebhook, timeout: float = GRACE_SECONDS) -> float:
        """SIGTERM to the process the container runtime would signal (gunicorn's arbiter), the
        endpoint leaving ENDPOINT_LAG seconds later; returns how long the process took to exit
        (up to the apiserver's idle limit after the drain: the process closes no connection the
        apiserver may still send a review on)."""
        self.running.remove(server)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        self.proxy.remove_later(server.port, ENDPOINT_LAG)
        server.process.wait(timeout)
        kill_group(server.process)
        self.stopped.append(server)
        return time.monotonic() - started

    def stop_all(self) -> None:
        """Every replica gone: SIGTERM, the drain, then killed instead of waiting for the
        apiserver to close its idle connections (the webhook is down from then on)."""
        for server in list(self.running):
            self.running.remove(server)
            server.process.send_signal(signal.SIGTERM)
            self.proxy.remove_later(server.port, ENDPOINT_LAG)
            self.stopped.append(server)
        time.sleep(SHUTDOWN_DRAIN_SECONDS + 1)
        for server in self.stopped:
            kill_group(server.process)


class Controllers:
    """Two ``castslice control`` replicas (drift reconciler every DRIFT_INTERVAL s, the shipped
    election timings) and a poller reading both ``castslice_control_is_leader`` every 50 ms."""

    def __init__(self, plane: ControlPlane, sink: str) -> None:
        self.plane, self.sink = plane, sink
        self.config = plane.workdir / "castslice-ops-control.yaml"
        self.config.write_text(yaml.safe_dump({**CONFIG, "drift": {"intervalSeconds": DRIFT_INTERVAL}}))
        self.started = 0
        self.running: list[ServedController] = []
        self.rounds: list[tuple[float, dict[str, bool]]] = []
        """(monotonic time, name -> is_leader) per polling round, while polling."""
        self._polling = threading.Event()

    def start(self) -> ServedController:
        self.started += 1
        process = ServedController(
            self.plane, f"ops-control-{self.started}", self.config, self.sink, CONTROL_NAMESPACE
        )
        eventually(lambda: process.answers("/readyz"), 60, f"{process.name} ready")
        self.running.append(process)
        return process

    def leader(self) -> ServedController | None:
        leading = [process for process in self.running if process.leading()]
        return leading[0] if len(leading) == 1 else None

    def poll(self) -> threading.Thread:
        self._polling.set()

        def run() -> None:
            while self._polling.is_set():
                self.rounds.append((time.monotonic(), {p.name: p.leading() for p in list(self.running)}))
                time.sleep(0.05)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def stop_polling(self, thread: threading.Thread) -> None:
        self._polling.clear()
        thread.join(5)

    def stop_all(self) -> None:
        for process in list(self.running):
            process.stop()
        self.running.clear()


@pytest.fixture(scope="module")
def ops(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    created: list[dict[str, Any]] = []
    kubeconfig = service_account_kubeconfig(control_plane, tmp_path_factory.mktemp("ops-rbac"), created)
    events = EventLog()
    sink_url, sink = start_event_sink(events)
    proxy = ServiceProxy()
    replicas = Replicas(control_plane, kubeconfig, sink_url, proxy)
    api = control_plane.api_client()
    registration = client.AdmissionregistrationV1Api(api)
    rendered = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
    route = {"key": ROUTE, "operator": "In", "values": [NAME]}
    registration.create_mutating_webhook_configuration(
        pointed_at(rendered, f"e2e-spot-{NAME}", proxy.url, control_plane.ca_cert.read_bytes(), route)
    )
    client.CoreV1Api(api).create_namespace({"metadata": {"name": CONTROL_NAMESPACE}})
    controllers = Controllers(control_plane, sink_url)
    controllers.start()
    controllers.start()
    eventually(lambda: controllers.leader() is not None, 60, "one controller leading")
    namespaces: list[str] = []

    def namespace(name: str) -> str:
        control_plane.create_namespace(name, labels={ROUTE: NAME})
        namespaces.append(name)
        return name

    try:
        yield {
            "plane": control_plane,
            "api": api,
            "core": client.CoreV1Api(api),
            "apps": client.AppsV1Api(api),
            "events": events,
            "proxy": proxy,
            "replicas": replicas,
            "kubeconfig": kubeconfig,
            "namespace": namespace,
            "controllers": controllers,
        }
    finally:
        registration.delete_mutating_webhook_configuration(f"e2e-spot-{NAME}")
        core = client.CoreV1Api(api)
        for name in namespaces:
            # One request for the Pods (the namespace controller deletes them one by one, at the
            # controller manager's 20 requests a second), then the namespace.
            try:
                core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            except ApiException as error:
                # 1,200 Pods in one request can outlast the apiserver's 60 s request timeout on a
                # busy machine (504); the namespace's deletion below removes what is left, and the
                # rest of this cleanup must still run (a ServiceAccount left behind breaks the
                # modules after this one).
                if error.status != 504:
                    raise
            core.delete_namespace(name)
        replicas.stop_all()
        controllers.stop_all()
        core.delete_namespace(CONTROL_NAMESPACE)
        proxy.stop()
        sink.shutdown()
        for name in namespaces:
            eventually(
                lambda name=name: control_plane.get(f"/api/v1/namespaces/{name}")[0] == 404,
                180,
                f"{name} gone",
            )
        api.close()
        delete_created(control_plane, created)


def wait_called(ops: dict[str, Any], namespace: str) -> None:
    """The apiserver picks up webhook configurations asynchronously: probe with dry runs."""

    def called() -> bool:
        created = ops["core"].create_namespaced_pod(namespace, gpu_pod("probe"), dry_run="All")
        return bool(created.spec.containers[0].resources.limits.get(GPU_SHARED))

    eventually(called, 30, "the webhook to be called")


# -- the Pods -----------------------------------------------------------------------------------
def gpu_pod(name: str) -> dict[str, Any]:
    """An opted-in inference Pod asking for one GPU: sliced, it asks for 2 nvidia.com/gpu-shared."""
    return {
        "metadata": {
            "name": name,
            "annotations": {"castops.io/optimize": "true", "castops.io/workload-type": "inference"},
        },
        "spec": {
            "schedulerName": UNSCHEDULED,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {GPU: "1"}}}],
        },
    }


def spot_deployment(name: str, replicas: int) -> dict[str, Any]:
    manifest = deployment(name, replicas)
    manifest["spec"]["template"]["spec"]["schedulerName"] = UNSCHEDULED
    return manifest


def stored_pods(ops: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    raw = ops["core"].list_namespaced_pod(namespace, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def sliced(pod: dict[str, Any]) -> bool:
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    return GPU_SHARED in limits and GPU not in limits


def is_gpu(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("ownerReferences")


def replicaset_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["ownerReferences"][0]["name"])


def wait_for_pods(
    ops: dict[str, Any], namespace: str, count: int, timeout: float = 120
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def all_there() -> bool:
        nonlocal found
        found = stored_pods(ops, namespace)
        return len(found) >= count

    eventually(all_there, timeout, f"{count} Pods in {namespace}")
    return found


def audit_events(ops: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    events: EventLog = ops["events"]
    with events.lock:
        return [
            {"headers": e["headers"], "data": json.loads(e["body"])}
            for e in events.events
            if e["headers"].get("ce-podnamespace") == namespace
            and e["headers"].get("ce-type", "").startswith(ADMISSION_TYPES)
        ]


def failed_calls(plane: ControlPlane) -> list[str]:
    """The apiserver's log lines for calls to this module's webhook that failed (why they did)."""
    log = plane.logs["kube-apiserver"].read_text(errors="replace")
    return [line[:400] for line in log.splitlines() if "failing open" in line and WEBHOOK in line]


def fail_open_count(plane: ControlPlane) -> float:
    """The apiserver's own count of calls to this module's webhook that failed and were ignored."""
    status, body = plane.get("/metrics", timeout=30)
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("apiserver_admission_webhook_fail_open_count{") and f'name="{WEBHOOK}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- the tests ----------------------------------------------------------------------------------
def test_drift_names_exactly_the_pods_created_while_the_webhook_was_down(
    ops: dict[str, Any], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    replicas: Replicas = ops["replicas"]
    namespace = ops["namespace"]("ops-drift")
    replicas.start()
    replicas.start()
    wait_called(ops, namespace)
    # Through the webhook: three sliced GPU Pods and a Deployment's three placed Pods.
    for n in range(3):
        ops["core"].create_namespaced_pod(namespace, gpu_pod(f"seen-{n}"))
    ops["apps"].create_namespaced_deployment(namespace, spot_deployment("seen", 3))
    seen = wait_for_pods(ops, namespace, 6)
    assert all(sliced(p) for p in seen if is_gpu(p))
    assert all(p["metadata"]["labels"].get(PLACEMENT) for p in seen if not is_gpu(p))
    eventually(lambda: all(r.view_objects("pods") >= 3 for r in replicas.running), 30, "the views")

    # The webhook stopped: failurePolicy Ignore admits everything unchanged.
    replicas.stop_all()
    for n in range(2):
        ops["core"].create_namespaced_pod(namespace, gpu_pod(f"missed-{n}"))
    ops["apps"].create_namespaced_deployment(namespace, spot_deployment("missed", 3))
    ops["apps"].patch_namespaced_deployment_scale("seen", namespace, {"spec": {"replicas": 5}})
    everything = wait_for_pods(ops, namespace, 13)
    seen_uids = {p["metadata"]["uid"] for p in seen}
    missed = {p["metadata"]["uid"]: p for p in everything if p["metadata"]["uid"] not in seen_uids}
    assert len(missed) == 7
    assert not any(sliced(p) for p in missed.values() if is_gpu(p))
    assert not any(p["metadata"].get("labels", {}).get(PLACEMENT) for p in missed.values() if not is_gpu(p))

    # Started again; the state as `kubectl get pods,replicasets,namespaces -A -o yaml` prints it.
    replicas.start()
    replicas.start()
    wait_called(ops, namespace)
    state = {"apiVersion": "v1", "kind": "List", "items": []}
    for path, kind, api_version in (
        ("/api/v1/pods", "Pod", "v1"),
        ("/apis/apps/v1/replicasets", "ReplicaSet", "apps/v1"),
        ("/api/v1/namespaces", "Namespace", "v1"),
    ):
        for item in ops["plane"].get_json(path)["items"]:
            state["items"].append({"apiVersion": api_version, "kind": kind, **item})
    (tmp_path / "state.yaml").write_text(yaml.safe_dump(state))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    reported = subprocess.run(
        [CASTSLICE, "audit", "drift", "--cluster", str(tmp_path / "state.yaml"), "--config",
         str(tmp_path / "config.yaml"), "-n", namespace, "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert reported.returncode == 1, reported.stderr
    report = json.loads(reported.stdout)
    assert {p["uid"] for p in report["pods"]} == set(missed)
    by_uid = {p["uid"]: p for p in report["pods"]}
    for uid, pod in missed.items():
        wanted = ["gpu-slicing"] if is_gpu(pod) else ["spot"]
        assert [m["mutator"] for m in by_uid[uid]["mutators"]] == wanted, by_uid[uid]
    record_property(
        "drift_offline",
        f"{len(report['pods'])} Pods named of {report['judged']} judged, exactly the {len(missed)} "
        f"created while the webhook was down ({len(everything)} Pods in the namespace)",
    )
    print(
        f"\n[ops e2e] drift offline: {len(report['pods'])} Pods named of {report['judged']} judged: "
        f"exactly the {len(missed)} created while the webhook was down; {reported.stderr.strip()}"
    )

    # The controller's drift reconciler (castslice control, a pass every DRIFT_INTERVAL s) finds the
    # same Pods: one CloudEvent per Pod found, and the figures on the leader's /metrics.
    controllers: Controllers = ops["controllers"]
    wanted = {f"namespaces/{namespace}/pods/{p['metadata']['name']}" for p in missed.values()}

    def found() -> set[str]:
        events: EventLog = ops["events"]
        with events.lock:
            return {
                e["headers"].get("ce-subject", "")
                for e in events.events
                if e["headers"].get("ce-type") == "io.castops.castslice.drift.found.v1"
                and e["headers"].get("ce-podnamespace") == namespace
            }

    eventually(lambda: found() >= wanted, 3 * DRIFT_INTERVAL + 30, "the controller's drift events")
    assert found() == wanted

    def figures() -> dict[str, float]:
        leader = controllers.leader()
        if leader is None:
            return {}
        text = urllib.request.urlopen(f"http://127.0.0.1:{leader.port}/metrics", timeout=5).read().decode()
        return {
            match[0]: float(match[1])
            for match in re.findall(
                rf'^castslice_drift_pods{{mutator="([^"]+)",namespace="{namespace}"}} (\S+)$',
                text,
                re.MULTILINE,
            )
        }

    eventually(lambda: figures() == {"gpu-slicing": 2.0, "spot": 5.0}, 3 * DRIFT_INTERVAL + 30, "the figures")
    record_property(
        "drift_controller", f"{len(found())} Pods, one event each; castslice_drift_pods {figures()}"
    )
    print(
        f"[ops e2e] drift in castslice control: {len(wanted)} Pods, one event each; "
        f"castslice_drift_pods {figures()}"
    )


def test_the_rules_and_the_dashboard_read_only_series_the_running_processes_serve(
    ops: dict[str, Any], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """Every metric name knative/components/monitoring queries is on the /metrics of a running
    process: a webhook replica, the leading controller, or the apiserver (whose webhook series
    exist once it called a webhook and failed open: the drift test above stopped ours). Runs after
    the drift test, before the apiserver restart resets the apiserver's counters."""
    from tests.deploy.monitoring_support import queried_names, served_names

    replicas: Replicas = ops["replicas"]
    controllers: Controllers = ops["controllers"]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    up = os.path.relpath(KNATIVE_DIR, overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{up}/overlays/deployment"],
                "components": [f"{up}/components/controller", f"{up}/components/monitoring"],
            }
        )
    )
    rendered = render(overlay)
    rules = one(rendered, "PrometheusRule", "castslice")["spec"]
    dashboard = json.loads(one(rendered, "ConfigMap", "castslice-dashboard")["data"]["castslice.json"])
    queried = queried_names(rules, dashboard)

    while len(replicas.running) < 2:
        replicas.start()
    eventually(lambda: controllers.leader() is not None, 60, "one controller leading")
    leader = controllers.leader()
    assert leader is not None
    status, apiserver = ops["plane"].get("/metrics", timeout=30)
    assert status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{leader.port}/metrics", timeout=5) as reply:
        controller = reply.read().decode()
    served = {
        "webhook": served_names(replicas.running[0].metrics()),
        "controller": served_names(controller),
        "apiserver": served_names(apiserver.decode()),
    }
    missing = queried - set().union(*served.values())
    # The lease reconciler does not run in this module (gpuLeases off); test_monitoring holds its
    # series to what it registers.
    not_running = {name for name in missing if name.startswith("castslice_gpulease_")}
    found = {part: sorted(queried & names) for part, names in served.items()}
    record_property(
        "metric_names",
        f"{len(queried)} names queried: {len(queried - missing)} served by the running processes "
        f"({ {part: len(names) for part, names in found.items()} }), {len(not_running)} by the "
        f"lease reconciler (not run here), {len(missing - not_running)} missing",
    )
    assert missing - not_running == set(), found
    assert {n for n in queried if n.startswith("apiserver_")} <= served["apiserver"]
    # The apiserver's series carry the webhook's name, which the rules select on.
    assert "apiserver_admission_webhook_fail_open_count{" in apiserver.decode()
    assert f'name="{WEBHOOK}"' in apiserver.decode()


class Load:
    """Pods created at a steady rate: opted-in GPU Pods by this client, and Deployments scaled up
    one replica at a time (their ReplicaSets create the Pods). Every client-side failure is kept."""

    def __init__(self, ops: dict[str, Any], namespace: str) -> None:
        self.ops, self.namespace = ops, namespace
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.gpu_created = 0
        self.scaled = dict.fromkeys((f"web-{n}" for n in range(DEPLOYMENTS)), 0)
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.started = 0.0

    def run(self, seconds: float) -> None:
        for name in self.scaled:
            self.ops["apps"].create_namespaced_deployment(self.namespace, spot_deployment(name, 0))
        self.started = time.monotonic()
        deadline = self.started + seconds
        # Enough clients that a slow create (the machine's two cores are shared with the whole
        # control plane) does not hold the next ones back.
        for worker in range(CLIENTS):
            self.threads.append(
                threading.Thread(target=self._gpu, args=(worker, CLIENTS, deadline), daemon=True)
            )
        self.threads.append(threading.Thread(target=self._scale, args=(deadline,), daemon=True))
        for thread in self.threads:
            thread.start()

    def join(self) -> float:
        for thread in self.threads:
            thread.join(LOAD_SECONDS + 60)
        return time.monotonic() - self.started

    def _gpu(self, worker: int, workers: int, deadline: float) -> None:
        from kubernetes import client

        with self.ops["plane"].api_client() as api:
            core = client.CoreV1Api(api)
            number = worker
            while True:
                due = self.started + number / GPU_PODS_PER_SECOND
                if due >= deadline or self.stop.is_set():
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    core.create_namespaced_pod(self.namespace, gpu_pod(f"gpu-{number:05d}"))
                    with self.lock:
                        self.gpu_created += 1
                except Exception as error:  # noqa: BLE001 - every failure is the finding
                    with self.lock:
                        self.errors.append(f"gpu-{number:05d}: {error}")
                number += workers

    def _scale(self, deadline: float) -> None:
        names = list(self.scaled)
        step = 0
        while True:
            due = self.started + step * SCALE_EVERY / len(names)
            if due >= deadline or self.stop.is_set():
                return
            time.sleep(max(0.0, due - time.monotonic()))
            name = names[step % len(names)]
            try:
                self.ops["apps"].patch_namespaced_deployment_scale(
                    name, self.namespace, {"spec": {"replicas": self.scaled[name] + 1}}
                )
                self.scaled[name] += 1
            except Exception as error:  # noqa: BLE001 - every failure is the finding
                self.errors.append(f"scale {name}: {error}")
            step += 1


def roll(controllers: Controllers, handovers: list[float]) -> None:
    """SIGTERM the leader, start its replacement and wait for it to be ready; then the same with
    the other (which leads by then). Each handover: from SIGTERM to another replica leading."""
    for _ in range(2):
        leader = controllers.leader()
        assert leader is not None, "no single leader before the restart"
        began = time.monotonic()
        os.killpg(leader.process.pid, signal.SIGTERM)
        eventually(
            lambda leader=leader: any(p is not leader and p.leading() for p in controllers.running),
            60,
            "another controller leading",
        )
        handovers.append(time.monotonic() - began)
        assert leader.process.wait(30) == 0, leader.log_path.read_text()[-2000:]
        controllers.running.remove(leader)
        controllers.start()


def gaps(rounds: list[tuple[float, dict[str, bool]]]) -> list[float]:
    """How long each stretch of polling rounds without a leader lasted (a handover's gap)."""
    found, began = [], None
    for moment, leading in rounds:
        if not any(leading.values()):
            began = moment if began is None else began
        elif began is not None:
            found.append(moment - began)
            began = None
    return found


def test_a_rolling_restart_under_load_lets_no_pod_through_and_keeps_one_leader(
    ops: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    replicas: Replicas = ops["replicas"]
    proxy: ServiceProxy = ops["proxy"]
    namespace = ops["namespace"]("ops-rolling")
    while len(replicas.running) < 2:
        replicas.start()
    wait_called(ops, namespace)
    fail_open_before = fail_open_count(ops["plane"])
    refused_before, no_endpoint_before = proxy.refused, proxy.no_endpoint
    load = Load(ops, namespace)
    load.run(LOAD_SECONDS)
    # Rolling restarts meanwhile, RESTART_ROUNDS of them: SIGTERM one, start its replacement, wait
    # for it to be ready, then the other; the controllers' Deployment rolls once at the same time
    # (the leader first). The load runs from 10 s before the first SIGTERM to 5 s after the last.
    time.sleep(10)
    controllers: Controllers = ops["controllers"]
    poller = controllers.poll()
    handovers: list[float] = []
    rolling_controllers = threading.Thread(target=roll, args=(controllers, handovers), daemon=True)
    rolling_controllers.start()
    started: list[tuple[str, str, float, list[float]]] = []
    stopping: list[threading.Thread] = []
    for _ in range(RESTART_ROUNDS):
        for old in list(replicas.running):
            began = time.monotonic()
            exit_seconds: list[float] = []
            stopping.append(
                threading.Thread(target=lambda old=old, out=exit_seconds: out.append(replicas.terminate(old)))
            )
            stopping[-1].start()
            replacement = replicas.start()
            started.append((old.name, replacement.name, round(time.monotonic() - began, 1), exit_seconds))
            time.sleep(5)
    restarted_under_load = time.monotonic() - load.started < LOAD_SECONDS  # not past the load's end
    load.stop.set()
    elapsed = load.join()
    for thread in stopping:  # an old replica may outlive the load, holding idle connections
        thread.join(GRACE_SECONDS + 10)
    restarts = [(old, new, round(out[0], 1) if out else None, ready) for old, new, ready, out in started]
    rolling_controllers.join(180)
    controllers.stop_polling(poller)
    assert not load.errors, load.errors[:5]
    # The poller read both replicas every 50 ms from before the first SIGTERM to after the last
    # handover (a poller that died early would hide two leaders).
    polled = controllers.rounds[-1][0] - controllers.rounds[0][0] if controllers.rounds else 0.0
    assert polled >= sum(handovers) and len(controllers.rounds) >= 100, (polled, len(controllers.rounds))
    leaders_at_once = max(sum(leading.values()) for _, leading in controllers.rounds)
    without_leader = gaps(controllers.rounds)

    wanted = load.gpu_created + sum(load.scaled.values())
    pods = wait_for_pods(ops, namespace, wanted)
    gpu = [p for p in pods if is_gpu(p)]
    placed = [p for p in pods if not is_gpu(p)]
    assert len(gpu) == load.gpu_created and len(placed) == sum(load.scaled.values())
    unsliced = [p["metadata"]["name"] for p in gpu if not sliced(p)]
    unplaced = [p["metadata"]["name"] for p in placed if not p["metadata"].get("labels", {}).get(PLACEMENT)]
    # Each ReplicaSet's split: floor(n x 40 / 100) spot. One replica is added every 2 s, but under
    # load the ReplicaSet controller may create two Pods back to back, and each serving process
    # knows the other's decisions only once its watch shows the Pod: with two processes a split
    # may end one off (docs/spot.md), never more, restart or not.
    splits: dict[str, list[str]] = {}
    for pod in placed:
        side = pod["metadata"]["labels"].get(PLACEMENT, "")
        splits.setdefault(replicaset_of(pod), []).append(side)
    deviations = {rs: sides.count("spot") - len(sides) * 40 // 100 for rs, sides in splits.items()}

    # The audit trail says the same: one mutated event per stored Pod, matched by name (GPU Pods)
    # or by the admission uid the spot mutator writes on the Pod.
    events = audit_events(ops, namespace)
    outcomes = sorted({e["data"]["outcome"] for e in events})
    mutated = [e for e in events if e["data"]["outcome"] == "mutated"]
    event_names = {e["data"]["pod"]["name"] for e in mutated if e["data"]["pod"]["name"]}
    event_uids = {e["data"]["request"]["uid"] for e in mutated if not e["data"]["pod"]["name"]}
    stored_names = {p["metadata"]["name"] for p in gpu if sliced(p)}
    stored_uids = {
        p["metadata"]["annotations"].get("castops.io/placement-decision")
        for p in placed
        if p["metadata"].get("labels", {}).get(PLACEMENT)
    }
    failed_open = fail_open_count(ops["plane"]) - fail_open_before
    refused, no_endpoint = proxy.refused - refused_before, proxy.no_endpoint - no_endpoint_before

    # Lost: a Pod stored without its mutation, a create that failed, a call the apiserver failed open.
    lost = len(unsliced) + len(unplaced) + len(load.errors) + int(failed_open)
    summary = (
        f"lost {lost}; {len(pods)} Pods created in {elapsed:.0f} s ({len(pods) / elapsed:.1f}/s): "
        f"{len(gpu)} GPU Pods, "
        f"{len(gpu) - len(unsliced)} sliced; {len(placed)} ReplicaSet Pods in {len(splits)} ReplicaSets, "
        f"{len(placed) - len(unplaced)} placed, {list(deviations.values()).count(0)} splits exact "
        f"(spot - floor(n x 40 %): {sorted(deviations.values())}); "
        f"{len(mutated)} mutated audit events ({len(event_names & stored_names)} GPU by name, "
        f"{len(event_uids & stored_uids)} placed by decision uid); apiserver fail-open {failed_open:.0f}; "
        f"client errors {len(load.errors)}; proxy refused {refused}, no endpoint {no_endpoint}; "
        f"restarts (old, new, old exited s, new ready s): {restarts}; controllers: "
        f"{len(controllers.rounds)} is_leader rounds, at most {leaders_at_once} leader(s) at once, "
        f"handovers (SIGTERM to the other leading) {[round(h, 1) for h in handovers]} s, "
        f"no leader for {[round(g, 2) for g in without_leader]} s"
    )
    record_property("rolling_restart", summary)
    print(f"\n[ops e2e] rolling restart: {summary}")
    summary += "".join(f"\n  apiserver: {line}" for line in failed_calls(ops["plane"])[-5:])
    assert unsliced == [] and unplaced == [], summary
    assert all(abs(deviation) <= 1 for deviation in deviations.values()), deviations
    assert outcomes == ["mutated"], outcomes
    assert event_names == stored_names and event_uids == stored_uids, summary
    assert len(mutated) == len(pods)
    assert failed_open == 0 and refused == 0 and no_endpoint == 0, summary
    assert leaders_at_once == 1 and len(handovers) == 2, summary
    assert len(restarts) == 2 * RESTART_ROUNDS and restarted_under_load, summary


def ready(server: ServedWebhook) -> bool:
    try:
        with urllib.request.urlopen(server.url + "/readyz", context=server.context, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def metric(server: ServedWebhook, name: str, index: str) -> float:
    text = server.metrics()
    match = re.search(rf'^{name}{{index="{index}"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else -1.0


def test_an_apiserver_restart_keeps_readiness_and_placements_right(
    ops: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    replicas: Replicas = ops["replicas"]
    plane: ControlPlane = ops["plane"]
    namespace = ops["namespace"]("ops-apiserver")
    while len(replicas.running) < 2:
        replicas.start()
    wait_called(ops, namespace)
    servers = list(replicas.running)
    relists_before = {s.name: metric(s, "castslice_view_relists_total", "pods") for s in servers}
    # /readyz of both replicas, every 0.1 s, through the restart (the README: ready through relists,
    # the previous state served meanwhile).
    answers: dict[str, list[bool]] = {s.name: [] for s in servers}
    stop = threading.Event()

    def probe(server: ServedWebhook) -> None:
        while not stop.is_set():
            answers[server.name].append(ready(server))
            time.sleep(0.1)

    probes = [threading.Thread(target=probe, args=(s,), daemon=True) for s in servers]
    for thread in probes:
        thread.start()
    began = time.monotonic()
    restart_apiserver(plane)
    restarted = time.monotonic() - began

    # The views come back: each replica's Pod index equals the apiserver's live Pods again.
    def live_pods() -> float:
        items = plane.get_json("/api/v1/pods")["items"]
        return float(sum(1 for p in items if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")))

    ops["core"].create_namespaced_pod(namespace, gpu_pod("after-restart"))
    for server in servers:
        eventually(lambda server=server: metric(server, "castslice_view_objects", "pods") == live_pods(), 90,
                   f"{server.name}'s view equal to the apiserver's Pods")  # fmt: skip
        assert metric(server, "castslice_view_synced", "pods") == 1
    stop.set()
    for thread in probes:
        thread.join(5)
    relists = {
        s.name: metric(s, "castslice_view_relists_total", "pods") - relists_before[s.name] for s in servers
    }

    # Placements made after the restart: a Deployment scaled one replica at a time to 10 ends at
    # exactly 4 spot, 6 on-demand; the GPU Pod is sliced.
    ops["apps"].create_namespaced_deployment(namespace, spot_deployment("after", 0))
    for replicas_wanted in range(1, 11):
        ops["apps"].patch_namespaced_deployment_scale(
            "after", namespace, {"spec": {"replicas": replicas_wanted}}
        )
        wait_for_pods(ops, namespace, replicas_wanted + 1)
    pods = wait_for_pods(ops, namespace, 11)
    sides = [p["metadata"].get("labels", {}).get(PLACEMENT, "") for p in pods if not is_gpu(p)]
    (gpu,) = [p for p in pods if is_gpu(p)]
    not_ready = {name: seen.count(False) for name, seen in answers.items()}
    summary = (
        f"apiserver back in {restarted:.1f} s; /readyz probes not 200: {not_ready} of "
        f"{ {name: len(seen) for name, seen in answers.items()} }; relists {relists}; "
        f"after it: {sides.count('spot')} spot, {sides.count('on-demand')} on-demand of 10, "
        f"GPU Pod sliced: {sliced(gpu)}"
    )
    record_property("apiserver_restart", summary)
    print(f"\n[ops e2e] apiserver restart: {summary}")
    assert all(count == 0 for count in not_ready.values()), summary
    assert sorted(sides) == ["on-demand"] * 6 + ["spot"] * 4 and sliced(gpu), summary
