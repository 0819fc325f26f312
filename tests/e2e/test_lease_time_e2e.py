"""GpuLeases that know time, end to end on the project's control plane: the CRD (rendered from
knative/components/gpu-leases, CEL included), one serving process (`castslice serve`), one
controller (`castslice control`), the apiserver's own stamp policies, and kwok Nodes labelled with
GPU models, tainted so that no other module's Pod lands on them.

The periods are fake-fast so the module takes a few minutes: a budget period of 75 s (``Fixed``),
a recurring window open the first 20 s of every minute (``* * * * *`` for 20s). The figures (the
budget's GPU-hours against the integral of scheduled GPUs the test watched, how early the notice
came) are printed at the end of the run (tests/e2e/conftest.py).

kwok runs no containers: what the downward API would hand a container is shown as the apiserver
stores the Pod (the env's fieldRef and the annotation it reads); a real node runs them in
tests/cluster.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import yaml

from tests.support.manifests import KNATIVE_DIR, one, render

from .controlplane import ControlPlane, FakeNode, node_manifest
from .launch import EventLog, ServedController, ServedWebhook, pointed_at, start_event_sink
from .support import delete_crd, kubectl
from .workloads import eventually, stamp

pytestmark = pytest.mark.e2e

COMPONENT = KNATIVE_DIR / "components" / "gpu-leases"
MODEL_LABEL = "nvidia.com/gpu.product"
H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200-141GB-HBM3e"
TAINT = "castslice.test/lease-time"
ROUTE = "castslice-e2e-lease-time"
SYSTEM = "lease-time-system"
BUDGET, WINDOW, QUEUE, INVENTORY = "time-budget", "time-window", "time-queue", "time-inventory"
FAMILY = "time-family"
NAMESPACES = (BUDGET, WINDOW, QUEUE, INVENTORY, FAMILY)
GROUP, VERSION, PLURAL = "castops.io", "v1alpha1", "gpuleases"
ENDS = "castops.io/gpu-lease-ends"
QUEUED_CONDITION = "castops.io/GpuLeaseQueued"

NODES = (
    FakeNode(
        "time-h100-1",
        "gpu-h100",
        {MODEL_LABEL: H100},
        ({"key": TAINT, "effect": "NoSchedule"},),
        {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
    ),
    FakeNode(
        "time-h200-1",
        "gpu-h200",
        {MODEL_LABEL: H200},
        ({"key": TAINT, "effect": "NoSchedule"},),
        {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
    ),
)
CONFIG: dict[str, Any] = {
    "gpuSlicing": {"enabled": False},
    "gpuLeases": {"enabled": True, "modelFamilies": {"hopper": [H100, H200]}},
}
FAST_ELECTION = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1"]


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    plane = control_plane
    api = plane.api_client()
    core, extensions = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    registration = client.AdmissionregistrationV1Api(api)
    custom = client.CustomObjectsApi(api)
    for node in NODES:
        core.create_node(node_manifest(node))
    crd = one(render(COMPONENT), "CustomResourceDefinition")
    extensions.create_custom_resource_definition(crd)
    eventually(
        lambda: plane.get(f"/apis/{GROUP}/{VERSION}/{PLURAL}")[0] == 200, what="the GpuLease CRD served"
    )
    events = EventLog()
    sink_url, sink = start_event_sink(events)
    server = ServedWebhook(plane, "lease-time", CONFIG, sink_url, kubeconfig=plane.kubeconfig)
    ca = plane.ca_cert.read_bytes()
    base = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")
    registration.create_mutating_webhook_configuration(
        pointed_at(
            base, "e2e-lease-time", server.url, ca, {"key": ROUTE, "operator": "In", "values": ["yes"]}
        )
    )
    validating = pointed_at(
        one(render(COMPONENT), "ValidatingWebhookConfiguration"), "e2e-lease-time-validate", server.url, ca
    )
    registration.create_validating_webhook_configuration(validating)
    core.create_namespace({"metadata": {"name": SYSTEM}})
    for namespace in NAMESPACES:
        plane.create_namespace(namespace, labels={ROUTE: "yes"})
    config_path = plane.workdir / "castslice-control-lease-time.yaml"
    config_path.write_text(yaml.safe_dump(CONFIG))
    controller = ServedController(
        plane, "lease-time", config_path, sink_url, SYSTEM, extra=tuple(FAST_ELECTION)
    )
    eventually(controller.leading, 60, "the controller leading")
    state = {
        "plane": plane,
        "core": core,
        "custom": custom,
        "events": events,
        "server": server,
        "controller": controller,
    }
    _wait_active(state)
    try:
        yield state
    finally:
        controller.stop(signal.SIGKILL)
        registration.delete_mutating_webhook_configuration("e2e-lease-time")
        registration.delete_validating_webhook_configuration("e2e-lease-time-validate")
        server.stop()
        sink.shutdown()
        for namespace in NAMESPACES:  # our finalizer is gone with the controller
            for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
                custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    item["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )
        for namespace in (*NAMESPACES, SYSTEM):
            core.delete_namespace(namespace)
        for node in NODES:
            core.delete_node(node.name)
        delete_crd(api, crd["metadata"]["name"])
        api.close()


def _wait_active(state: dict[str, Any]) -> None:
    """The apiserver picks webhook configurations up asynchronously: until a dry run of a GPU Pod
    comes back charged."""
    create_lease(state, BUDGET, "probe", count=1, podSelector={"matchLabels": {"probe": "yes"}})

    def charged() -> bool:
        probe = gpu_pod("probe", labels={"probe": "yes"}, annotations={"castops.io/gpu-lease": "probe"})
        created = state["core"].create_namespaced_pod(BUDGET, probe, dry_run="All")
        return "castops.io/gpu-lease" in (created.metadata.labels or {})

    eventually(charged, 60, "the lease webhook active")
    state["custom"].delete_namespaced_custom_object(GROUP, VERSION, BUDGET, PLURAL, "probe")


def create_lease(
    state: dict[str, Any], namespace: str, name: str, model: str = H100, count: Any = 8, **spec: Any
) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuLease",
        "metadata": {"name": name},
        "spec": {"gpuModel": model, "count": count, **spec},
    }
    created: dict[str, Any] = state["custom"].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    time.sleep(0.5)  # the webhook decides from its view: until it holds the lease
    return created


def apply_lease(state: dict[str, Any], namespace: str, name: str, model: str, count: Any, **spec: Any) -> Any:
    """``kubectl apply`` of a lease, as an admin does: what kubectl printed (its stderr carries
    the admission warnings), checked to have succeeded."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuLease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gpuModel": model, "count": count, **spec},
    }
    result = kubectl(state["plane"], "apply", "-f", "-", stdin=yaml.safe_dump(body))
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)  # the webhook decides from its view: until it holds the lease
    return result


def lease_status(state: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    found = state["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return dict(found.get("status") or {})


def gpu_pod(
    name: str,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    **spec.pop("container", {}),
                }
            ],
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def create_pod(state: dict[str, Any], namespace: str, pod: dict[str, Any]) -> Any:
    return state["core"].create_namespaced_pod(namespace, pod)


def denial(state: dict[str, Any], namespace: str, pod: dict[str, Any]) -> str:
    from kubernetes.client import ApiException

    try:
        state["core"].create_namespaced_pod(namespace, pod)
    except ApiException as error:
        assert error.status == 403, error.body
        return str(error.body)
    raise AssertionError(f"{pod['metadata']['name']} was admitted")


def read_pod(state: dict[str, Any], namespace: str, name: str) -> Any:
    from kubernetes.client import ApiException

    try:
        return state["core"].read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def bound(state: dict[str, Any], namespace: str, name: str) -> bool:
    pod = read_pod(state, namespace, name)
    return pod is not None and bool(pod.spec.node_name) and pod.metadata.deletion_timestamp is None


def gone(state: dict[str, Any], namespace: str, name: str) -> bool:
    pod = read_pod(state, namespace, name)
    return pod is None or pod.metadata.deletion_timestamp is not None


def cloudevents(state: dict[str, Any], step: str) -> list[dict[str, Any]]:
    import json

    wanted = f"io.castops.castslice.gpulease.{step.lower()}.v1"
    with state["events"].lock:
        found = [e for e in state["events"].events if e["headers"].get("ce-type") == wanted]
    return [{"headers": e["headers"], "data": json.loads(e["body"])} for e in found]


def pod_events(state: dict[str, Any], namespace: str, reason: str) -> list[Any]:
    return [e for e in state["core"].list_namespaced_event(namespace).items if e.reason == reason]


class BoundGpus:
    """The test's own watch of a namespace's Pods: when each was first seen bound to a node and
    when it was deleted, so the integral of scheduled GPUs over any interval can be taken."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        from kubernetes import client

        self.api = plane.api_client()
        self.core = client.CoreV1Api(self.api)
        self.namespace = namespace
        self.spans: dict[str, list[float]] = {}  # uid -> [gpus, bound at, gone at (or inf)]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client import ApiException

        # Each stream resumes at the last resourceVersion seen: a bind that happened while a new
        # stream was being opened is delivered as it happens, not with the next list (which made
        # every Pod bound during that gap look bound later than it was).
        version: str | None = None
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self.core.list_namespaced_pod, self.namespace, timeout_seconds=5, resource_version=version
                ):
                    version = event["object"].metadata.resource_version
                    self._seen(event)
                    if self._stop.is_set():
                        stream.stop()
            except ApiException as error:
                if error.status != 410:
                    raise
                version = None  # expired: start again from a list

    def _seen(self, event: dict[str, Any]) -> None:
        now = time.time()
        pod = event["object"]
        uid = pod.metadata.uid
        if event["type"] == "DELETED":
            if uid in self.spans and self.spans[uid][2] == float("inf"):
                self.spans[uid][2] = now
        elif pod.spec.node_name and uid not in self.spans:
            gpus = sum(
                int((c.resources.limits or {}).get("nvidia.com/gpu", "0")) for c in pod.spec.containers
            )
            self.spans[uid] = [gpus, now, float("inf")]

    def gpu_hours(self, start: float, end: float) -> float:
        total = 0.0
        for gpus, began, ended in list(self.spans.values()):
            total += gpus * max(0.0, min(ended, end) - max(began, start))
        return total / 3600

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.api.close()


# -- budgets -------------------------------------------------------------------------------------
def test_a_budget_admits_until_spent_refuses_with_the_numbers_and_reopens_with_a_chargeback_record(
    cluster: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    """3 GPU-minutes (0.05 GPU-hours) every 75 s, 8 at once, Evict without grace: four Pods of one
    GPU spend it in about 45 s and are evicted; a fifth is refused with the numbers; at the
    period's end the chargeback record says what ran, within 1 % of what the test watched run."""
    watched = BoundGpus(cluster["plane"], BUDGET)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    create_lease(
        cluster,
        BUDGET,
        "gpu-minutes",
        count=8,
        window={"start": stamp(start)},
        budget={"gpuHours": "0.05", "period": "Fixed", "length": "75s"},
        onExpiry={"action": "Evict", "gracePeriodSeconds": 0, "noticeSeconds": 5},
    )
    try:
        eventually(lambda: datetime.now(UTC) >= start, 10, "the window's start")
        names = [f"spend-{n}" for n in range(4)]
        for name in names:
            created = create_pod(cluster, BUDGET, gpu_pod(name))
            assert created.metadata.labels["castops.io/gpu-lease"] == "gpu-minutes"
        for name in names:
            eventually(lambda name=name: bound(cluster, BUDGET, name), 30, f"{name} bound")
        # Spent at about start + 45 s: the phase, then every Pod evicted.
        eventually(
            lambda: lease_status(cluster, BUDGET, "gpu-minutes").get("phase") == "Exhausted", 70, "Exhausted"
        )
        for name in names:
            eventually(lambda name=name: gone(cluster, BUDGET, name), 20, f"{name} evicted")
        spent_at = datetime.now(UTC)
        message = denial(cluster, BUDGET, gpu_pod("spend-late"))
        assert "BudgetExhausted" in message and "GPU-hours used this period, 0 left" in message
        period_end = start + timedelta(seconds=75)
        assert f"period ends {stamp(period_end)}" in message and "of 0.05 GPU-hours" in message
        notices = pod_events(cluster, BUDGET, "EndingSoon")
        assert {e.involved_object.name for e in notices} >= set(names)
        # The period closes: one chargeback record, and admission reopens.
        records = eventually(lambda: cloudevents(cluster, "PeriodClosed"), 60, "the chargeback record")
        (record,) = records
        period = record["data"]["period"]
        assert (period["start"], period["end"]) == (stamp(start), stamp(period_end))
        assert record["headers"]["ce-id"] == f"{lease_uid(cluster, BUDGET, 'gpu-minutes')}/{stamp(start)}"
        truth = watched.gpu_hours(start.timestamp(), period_end.timestamp())
        charged = float(Decimal(period["gpuHours"]))
        error = abs(charged - truth) / truth
        record_property("budget_gpu_hours_charged", f"{charged:.6f}")
        record_property("budget_gpu_hours_watched", f"{truth:.6f}")
        record_property("budget_error_percent", f"{100 * error:.3f}")
        record_property("budget_denied_after_spent_s", f"{(spent_at - start).total_seconds():.1f}")
        assert error < 0.01, (charged, truth)
        reopened = create_pod(cluster, BUDGET, gpu_pod("spend-next"))
        assert reopened.metadata.labels["castops.io/gpu-lease"] == "gpu-minutes"
        status = lease_status(cluster, BUDGET, "gpu-minutes")
        assert status["budget"]["periodStart"] == stamp(period_end)
    finally:
        watched.stop()


def lease_uid(state: dict[str, Any], namespace: str, name: str) -> str:
    found = state["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return str(found["metadata"]["uid"])


# -- recurring windows -----------------------------------------------------------------------------
def wait_for_second(low: int, high: int) -> datetime:
    """Until the UTC clock is within [low, high) seconds of a minute; that moment."""

    def inside() -> datetime | None:
        now = datetime.now(UTC)
        return now if low <= now.second < high else None

    found: datetime = eventually(inside, 70, f"second {low}..{high} of a minute")
    return found


def test_a_recurring_window_admits_inside_refuses_outside_and_evicts_and_queues_at_each_boundary(
    cluster: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    """Open the first 20 s of every minute; Evict without grace, notice 8 s before each close. A
    Deny lease and a Queue lease, across close, open, close: admitted inside with the end on the
    Pod, the notice before it, evicted at it, refused (or gated) outside, started at the opening."""
    recurring = {"recurrence": {"schedule": "* * * * *", "duration": "20s"}}
    expiry = {"action": "Evict", "gracePeriodSeconds": 0, "noticeSeconds": 8}
    create_lease(cluster, WINDOW, "minutes", count=2, window=recurring, onExpiry=expiry)
    create_lease(cluster, QUEUE, "minutes", count=2, window=recurring, onExpiry=expiry, enforcement="Queue")
    opened = wait_for_second(1, 8)
    closes = opened.replace(second=20, microsecond=0)  # the window's end, to the second
    env = [
        {"name": "LEASE_ENDS", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{ENDS}']"}}}
    ]
    mounts = [{"name": "lease", "mountPath": "/etc/lease"}]
    volume = {
        "name": "lease",
        "downwardAPI": {
            "items": [{"path": "ends", "fieldRef": {"fieldPath": f"metadata.annotations['{ENDS}']"}}]
        },
    }
    inside = create_pod(
        cluster, WINDOW, gpu_pod("inside", container={"env": env, "volumeMounts": mounts}, volumes=[volume])
    )
    assert inside.metadata.annotations[ENDS] == stamp(closes)
    first_queued = create_pod(cluster, QUEUE, gpu_pod("queued-1"))
    assert first_queued.metadata.labels["castops.io/gpu-lease-state"] == "queued"
    eventually(lambda: bound(cluster, WINDOW, "inside"), 20, "inside bound")
    eventually(lambda: bound(cluster, QUEUE, "queued-1"), 20, "queued-1 started inside the window")
    # What the downward API hands the container (kwok runs none): the stored Pod's env and volume
    # read the annotation the webhook wrote.
    stored = cluster["core"].read_namespaced_pod("inside", WINDOW)
    assert (
        stored.spec.containers[0].env[0].value_from.field_ref.field_path == f"metadata.annotations['{ENDS}']"
    )
    assert (
        stored.spec.volumes[0].downward_api.items[0].field_ref.field_path == f"metadata.annotations['{ENDS}']"
    )
    assert stored.metadata.annotations[ENDS] == stamp(closes)
    # The notice comes before the close; the close evicts.
    notice = eventually(lambda: pod_events(cluster, WINDOW, "EndingSoon"), 25, "the notice")
    told_at = datetime.now(UTC)
    assert told_at < closes, (told_at, closes)
    record_property("window_notice_before_close_s", f"{(closes - told_at).total_seconds():.1f}")
    assert stamp(closes) in notice[0].message
    eventually(
        lambda: gone(cluster, WINDOW, "inside") and gone(cluster, QUEUE, "queued-1"),
        20,
        "evicted at the close",
    )
    assert datetime.now(UTC) >= closes
    eventually(lambda: lease_status(cluster, WINDOW, "minutes").get("phase") == "Closed", 15, "Closed")
    reopens = closes.replace(second=0) + timedelta(minutes=1)
    message = denial(cluster, WINDOW, gpu_pod("outside"))
    assert "WindowClosed" in message and f"closed until {stamp(reopens)}" in message
    waiting = create_pod(cluster, QUEUE, gpu_pod("queued-2"))
    assert waiting.spec.scheduling_gates[0].name == "castops.io/gpu-lease"

    def queued_condition() -> Any:
        pod = read_pod(cluster, QUEUE, "queued-2")
        found = [c for c in (pod.status.conditions or []) if c.type == QUEUED_CONDITION]
        return found[0] if found else None

    condition = eventually(queued_condition, 15, "the queued Pod's condition")
    assert condition.status == "True" and condition.reason == "WindowClosed"
    assert "position 1 of 1" in condition.message and stamp(reopens) in condition.message
    # The next opening: the queued Pod starts, carrying the new end; a Pod is admitted again.
    eventually(lambda: bound(cluster, QUEUE, "queued-2"), 75, "queued-2 started at the opening")
    started_at = datetime.now(UTC)
    assert started_at >= reopens
    record_property("window_queued_started_after_opening_s", f"{(started_at - reopens).total_seconds():.1f}")
    second_close = reopens.replace(second=20)
    assert read_pod(cluster, QUEUE, "queued-2").metadata.annotations[ENDS] == stamp(second_close)
    again = create_pod(cluster, WINDOW, gpu_pod("inside-again"))
    assert again.metadata.annotations[ENDS] == stamp(second_close)
    eventually(
        lambda: gone(cluster, WINDOW, "inside-again") and gone(cluster, QUEUE, "queued-2"),
        40,
        "the second close",
    )
    assert datetime.now(UTC) >= second_close
    steps = [
        e["data"]["step"] for e in cloudevents(cluster, "Closed") if e["data"]["lease"]["namespace"] == WINDOW
    ]
    assert len(steps) >= 2


def condition(state: dict[str, Any], namespace: str, name: str, kind: str) -> dict[str, Any]:
    found = lease_status(state, namespace, name).get("conditions") or []
    return next((c for c in found if c.get("type") == kind), {})


def lease_events(state: dict[str, Any], namespace: str, name: str, reason: str) -> list[Any]:
    return [e for e in pod_events(state, namespace, reason) if e.involved_object.name == name]


def test_leases_overbooking_eight_gpus_are_flagged_until_one_is_shortened_and_an_unknown_model_at_apply(
    cluster: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    """Two leases of 5 H200s over the 8 the kwok node offers, overlapping for an hour: Overbooked
    on both, with a Warning Event and the metric; the first shortened to end where the second
    starts: cleared. A lease of a model no node offers: a warning on kubectl's stderr at apply
    (the validating webhook reads its view of the Nodes), the lease created all the same, then
    ModelOffered False and an Event. One of a model a node offers is applied without a warning."""
    state = cluster
    now = datetime.now(UTC)
    began = time.monotonic()
    offered_apply = apply_lease(
        state, INVENTORY, "h200-a", model=H200, count=5, window={"end": stamp(now + timedelta(hours=2))}
    )
    assert "Warning" not in offered_apply.stderr, offered_apply.stderr
    second = {"start": stamp(now + timedelta(hours=1)), "end": stamp(now + timedelta(hours=3))}
    create_lease(state, INVENTORY, "h200-b", model=H200, count=5, window=second)
    for name in ("h200-a", "h200-b"):
        over = eventually(
            lambda name=name: (
                condition(state, INVENTORY, name, "Overbooked").get("status") == "True"
                and condition(state, INVENTORY, name, "Overbooked")
            ),
            30,
            f"{name} Overbooked",
        )
        assert "10 GPU" in over["message"] and "8 GPU on 1 node(s)" in over["message"], over
        assert condition(state, INVENTORY, name, "ModelOffered")["status"] == "True"
        eventually(
            lambda name=name: lease_events(state, INVENTORY, name, "Overbooked"), 30, f"{name}'s Event"
        )
    flagged = time.monotonic() - began
    series = f'castslice_gpulease_overbooked{{lease="h200-a",model="{H200}",namespace="{INVENTORY}"}}'
    assert state["controller"].metric(series) == 1.0

    state["custom"].patch_namespaced_custom_object(
        GROUP, VERSION, INVENTORY, PLURAL, "h200-a", {"spec": {"window": {"end": second["start"]}}}
    )
    for name in ("h200-a", "h200-b"):
        eventually(
            lambda name=name: (
                condition(state, INVENTORY, name, "Overbooked").get("reason") == "WithinInventory"
            ),
            30,
            f"{name} no longer Overbooked",
        )

    began = time.monotonic()
    applied = apply_lease(state, INVENTORY, "b200", model="NVIDIA-B200", count=1)
    warnings = [line for line in applied.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "no node offers NVIDIA-B200" in warnings[0], applied.stderr
    assert MODEL_LABEL in warnings[0] and "b200" in warnings[0]
    assert "created" in applied.stdout, applied.stdout
    assert state["custom"].get_namespaced_custom_object(GROUP, VERSION, INVENTORY, PLURAL, "b200")
    offered = eventually(
        lambda: (
            condition(state, INVENTORY, "b200", "ModelOffered").get("status") == "False"
            and condition(state, INVENTORY, "b200", "ModelOffered")
        ),
        30,
        "b200 flagged",
    )
    assert offered["reason"] == "NotOffered"
    eventually(
        lambda: lease_events(state, INVENTORY, "b200", "ModelNotOffered"), 30, "the ModelNotOffered Event"
    )
    record_property("inventory_overbooked_flagged_s", f"{flagged:.1f}")
    record_property("inventory_unknown_model_flagged_s", f"{time.monotonic() - began:.1f}")
    record_property("inventory_unknown_model_apply_warning", warnings[0])


def test_a_family_lease_of_h100_or_h200_is_charged_by_pods_on_either_within_its_cap(
    cluster: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    """A lease of the family ``hopper`` (H100 or H200, from the configuration), 3 GPUs with at
    most 1 H200: a Pod on each model charged to the one count; a second H200 Pod refused by the
    cap; a Pod naming no model pinned where no cap holds it (H100) and bound there; the fourth
    refused by the count; the status per model; the inventory holds the family against both
    nodes' GPUs together. Both fields at once are refused by the CRD, naming them."""
    from kubernetes.client import ApiException

    state = cluster
    began = time.monotonic()
    with pytest.raises(ApiException) as both:
        create_lease(state, FAMILY, "both", model=H100, count=1, gpuModels=[H100, H200])
    assert both.value.status == 422 and "spec.gpuModels" in str(both.value.body)
    create_lease(state, FAMILY, "hopper", model="hopper", count=3, caps={H200: 1})

    def on(name: str, model: str | None) -> dict[str, Any]:
        return gpu_pod(name, nodeSelector={MODEL_LABEL: model} if model else {})

    for name, model in (("on-h100", H100), ("on-h200", H200)):
        created = create_pod(state, FAMILY, on(name, model))
        assert created.metadata.labels["castops.io/gpu-lease"] == "hopper"
        assert created.metadata.annotations["castops.io/gpu-lease-model"] == model
    capped = denial(state, FAMILY, on("second-h200", H200))
    assert "LeaseExhausted" in capped and f"the cap of {H200} is 1 GPU, 1 in use" in capped
    anywhere = create_pod(state, FAMILY, on("anywhere", None))
    assert anywhere.metadata.annotations["castops.io/gpu-lease-model"] == H100
    required = anywhere.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert required.node_selector_terms[0].match_expressions[0].values == [H100, f"{H100}-SHARED"]
    full = denial(state, FAMILY, on("fourth", H100))
    assert "LeaseExhausted" in full and "3 of 3 GPU in use" in full
    for name, node in (("on-h100", "time-h100-1"), ("on-h200", "time-h200-1"), ("anywhere", "time-h100-1")):
        eventually(lambda name=name: bound(state, FAMILY, name), 60, f"{name} bound")
        assert read_pod(state, FAMILY, name).spec.node_name == node
    shown = eventually(
        lambda: (
            lease_status(state, FAMILY, "hopper").get("models")
            == [{"model": H200, "used": "1", "cap": "1"}, {"model": H100, "used": "2"}]
            and lease_status(state, FAMILY, "hopper")
        ),
        30,
        "the status per model",
    )
    assert shown["used"] == "3" and shown["free"] == "0"
    offered = eventually(
        lambda: (
            condition(state, FAMILY, "hopper", "ModelOffered").get("status") == "True"
            and condition(state, FAMILY, "hopper", "ModelOffered")
        ),
        30,
        "the family offered",
    )
    assert "16 GPU on 2 node(s)" in offered["message"], offered
    record_property("family_lease_s", f"{time.monotonic() - began:.1f}")
