"""The gpu-inventory reconciler: ModelOffered and Overbooked on each lease of a model, written only
when they change, a Warning Event when one turns into a problem, and the metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from function.control.reconciler import Context
from function.control.reconcilers.gpu_inventory import FIELD_MANAGER, InventoryReconciler
from function.core.config import Config
from function.core.leases import LEASES, slim_lease
from function.core.view import NODES, IndexState, View
from function.kube.client import APPLY_PATCH, ApiResponse
from tests.support.fake_api import FakeApi

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
LABEL = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"


def lease_obj(name: str, count: int, end: str, model: str = H100) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-25T00:00:00Z",
            "generation": 1,
        },
        "spec": {"gpuModel": model, "count": count, "window": {"start": "2026-11-25T10:00:00Z", "end": end}},
    }


def node_obj(name: str, gpus: int, product: str = H100) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {LABEL: product}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


class Cluster(FakeApi):
    def __init__(self, leases: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        super().__init__()
        self.leases = {obj["metadata"]["name"]: obj for obj in leases}
        self.nodes = nodes
        self.events: list[dict[str, Any]] = []
        for name in self.leases:
            path = f"/apis/castops.io/v1alpha1/namespaces/ml/gpuleases/{name}/status"
            self.handlers[("PATCH", path)] = self._applier(name)
        self.handlers[("POST", "/api/v1/namespaces/ml/events")] = self._event

    def _applier(self, name: str) -> Any:
        def apply(body: Any, query: Any) -> ApiResponse:
            assert query == {"fieldManager": FIELD_MANAGER, "force": "true"}
            status = self.leases[name].setdefault("status", {})
            mine = {c["type"]: c for c in body["status"]["conditions"]}
            kept = [c for c in status.get("conditions", []) if c["type"] not in mine]
            status["conditions"] = kept + list(mine.values())
            return ApiResponse(200, self.leases[name])

        return apply

    def _event(self, body: Any, query: Any) -> ApiResponse:
        self.events.append(body)
        return ApiResponse(201, body)

    def view(self) -> View:
        leases = {obj["metadata"]["uid"]: slim_lease(obj) for obj in self.leases.values()}
        nodes = {obj["metadata"]["name"]: NODES.slim(obj) for obj in self.nodes}
        return View(
            {LEASES.index: IndexState.build(leases, LEASES), NODES.index: IndexState.build(nodes, NODES)}
        )

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next(c for c in self.leases[name]["status"]["conditions"] if c["type"] == kind)

    def writes(self) -> int:
        return sum(1 for method, path, _, kind in self.requests if method == "PATCH" and kind == APPLY_PATCH)


def reconcile_all(reconciler: InventoryReconciler, cluster: Cluster) -> None:
    view = cluster.view()
    for key in reconciler.keys(view):
        reconciler.reconcile(key, Context(view, NOW))


def test_two_leases_beyond_eight_gpus_are_overbooked_until_one_is_shortened() -> None:
    cluster = Cluster(
        [lease_obj("a", 5, "2026-11-25T18:00:00Z"), lease_obj("b", 5, "2026-11-25T20:00:00Z")],
        [node_obj("gpu-1", 8)],
    )
    reconciler = InventoryReconciler(cluster, LABEL)
    registry = CollectorRegistry()
    reconciler.register(registry)
    reconcile_all(reconciler, cluster)
    for name in ("a", "b"):
        over = cluster.condition(name, "Overbooked")
        assert over["status"] == "True" and "10 GPU" in over["message"] and "ml/a, ml/b" in over["message"]
        assert cluster.condition(name, "ModelOffered")["status"] == "True"
    assert sorted(e["reason"] for e in cluster.events) == ["Overbooked", "Overbooked"]
    assert all(e["type"] == "Warning" for e in cluster.events)
    metrics = generate_latest(registry).decode()
    assert f'castslice_gpulease_overbooked{{lease="a",model="{H100}",namespace="ml"}} 1.0' in metrics
    assert f'castslice_gpu_inventory_gpus{{model="{H100}"}} 8.0' in metrics

    writes = cluster.writes()
    reconcile_all(reconciler, cluster)
    assert cluster.writes() == writes, "nothing changed: nothing written"

    cluster.leases["a"]["spec"]["window"]["end"] = "2026-11-25T12:30:00Z"
    cluster.leases["b"]["spec"]["window"]["start"] = "2026-11-25T12:30:00Z"
    reconcile_all(reconciler, cluster)
    assert cluster.condition("a", "Overbooked")["status"] == "False"
    assert cluster.condition("b", "Overbooked")["reason"] == "WithinInventory"
    assert len(cluster.events) == 2, "a problem that clears is no warning"


def test_a_lease_for_a_model_no_node_offers_is_flagged_with_an_event() -> None:
    cluster = Cluster(
        [lease_obj("b200", 1, "2026-11-26T00:00:00Z", model="NVIDIA-B200")], [node_obj("gpu-1", 8)]
    )
    reconciler = InventoryReconciler(cluster, LABEL)
    reconcile_all(reconciler, cluster)
    offered = cluster.condition("b200", "ModelOffered")
    assert (offered["status"], offered["reason"]) == ("False", "NotOffered")
    assert [e["reason"] for e in cluster.events] == ["ModelNotOffered"]
    assert cluster.condition("b200", "Overbooked")["status"] == "False"


def test_the_inventory_reconciler_runs_with_gpu_leases_and_watches_nodes() -> None:
    from function.control.reconciler import control_rbac_rules
    from function.control.reconcilers.gpu_inventory import build

    assert build(Config(), FakeApi(), lambda event: None) is None
    built = build(Config.model_validate({"gpuLeases": {"enabled": True}}), FakeApi(), lambda event: None)
    assert built is not None
    rules = control_rbac_rules([built])
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]} in rules


def test_a_family_lease_is_held_against_its_models_gpus_together_with_their_leases() -> None:
    h200 = "NVIDIA-H200"
    family = lease_obj("hopper", 10, "2026-11-25T18:00:00Z", model="hopper")
    cluster = Cluster(
        [family, lease_obj("h100", 4, "2026-11-25T18:00:00Z")],
        [node_obj("gpu-1", 8), node_obj("gpu-2", 8, f"{h200}-SHARED")],
    )
    reconciler = InventoryReconciler(cluster, LABEL, families={"hopper": (H100, h200)})
    assert sorted(reconciler.keys(cluster.view())) == [H100, f"{H100}+{h200}", h200]
    # A Node of one of the models makes the family due too.
    node = NODES.slim(node_obj("gpu-3", 8, h200))
    assert tuple(reconciler.triggers(NODES.index, node)) == (h200, f"{H100}+{h200}")
    reconcile_all(reconciler, cluster)
    offered = cluster.condition("hopper", "ModelOffered")
    assert offered["status"] == "True" and "on 2 node(s)" in offered["message"], offered
    # 10 of the family and the 4 H100 open together: 14 of the 16 GPUs, then one more lease of 4.
    assert cluster.condition("hopper", "Overbooked")["status"] == "False"
    assert cluster.condition("h100", "Overbooked")["status"] == "False"
    more = lease_obj("h200", 4, "2026-11-25T18:00:00Z", model=h200)
    cluster.leases["h200"] = more
    cluster.handlers[("PATCH", "/apis/castops.io/v1alpha1/namespaces/ml/gpuleases/h200/status")] = (
        cluster._applier("h200")
    )
    reconcile_all(reconciler, cluster)
    over = cluster.condition("hopper", "Overbooked")
    assert over["status"] == "True" and "18 GPU" in over["message"], over
    assert cluster.condition("h200", "Overbooked")["status"] == "False"  # 4 of its own model's 8
