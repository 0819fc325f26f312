"""The GPUs per model from the Nodes, and leases of one model overbooking them (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from function.core.inventory import (
    base_model,
    gpu_node,
    offered_any,
    overbooked,
    stock_of,
    stocks,
)
from function.core.leases import slim_lease
from function.core.view import EMPTY_VIEW, NODES, PODS, IndexState, StaticView, View, slim_node
from function.zones import ZONES

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
LABEL = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, product: str, allocatable: dict[str, str], **labels: str) -> Any:
    """The Node as the view keeps it."""
    return slim_node(
        {
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {LABEL: product, **labels}},
            "status": {"allocatable": {"cpu": "8", **allocatable}},
        }
    )


def lease(name: str, count: int, start: datetime, end: datetime, **window: Any) -> Any:
    obj = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-01T00:00:00Z",
        },
        "spec": {
            "gpuModel": H100,
            "count": count,
            "window": {
                "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "end": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
                **window,
            },
        },
    }
    record = slim_lease(obj)
    assert record is not None and not record.problems, record
    return record


def test_gfd_shared_and_mig_product_names_count_as_the_gpu_they_come_from() -> None:
    assert base_model(H100 + "-SHARED") == H100
    assert base_model("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == "NVIDIA-A100-SXM4-40GB"
    assert base_model(H100) == H100


def test_a_node_counts_physical_gpus_and_apart_its_slices_and_mig_devices() -> None:
    whole = gpu_node(node("a", H100, {"nvidia.com/gpu": "8"}), LABEL)
    sliced = gpu_node(
        node("b", H100 + "-SHARED", {"nvidia.com/gpu": "16"}, **{"nvidia.com/gpu.replicas": "4"}), LABEL
    )
    counted = gpu_node(
        node("c", H100, {"nvidia.com/gpu.shared": "8"}, **{"nvidia.com/gpu.count": "2"}), LABEL
    )
    mig = gpu_node(
        node(
            "d",
            "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            {"nvidia.com/mig-1g.5gb": "14"},
            **{"nvidia.com/gpu.count": "2"},
        ),
        LABEL,
    )
    assert whole is not None and (whole.model, whole.whole, whole.slices) == (H100, 8000, 0)
    assert sliced is not None and (sliced.model, sliced.whole, sliced.slices) == (H100, 4000, 16)
    assert counted is not None and (counted.whole, counted.slices) == (2000, 8)
    assert mig is not None and (mig.model, mig.whole, mig.mig) == ("NVIDIA-A100-SXM4-40GB", 2000, 14)
    assert gpu_node(slim_node({"metadata": {"name": "cpu-only", "labels": {}}}), LABEL) is None
    found = stocks([whole, sliced, counted, mig])
    assert found[H100].whole == 14000 and found[H100].nodes == 3 and found[H100].slices == 24


def test_leases_overlapping_beyond_the_stock_are_overbooked_and_back_to_back_ones_are_not() -> None:
    stock = stock_of(H100, [gpu_node(node("a", H100, {"nvidia.com/gpu": "8"}), LABEL)])
    hour = timedelta(hours=1)
    a = lease("a", 5, NOW, NOW + 2 * hour)
    b = lease("b", 5, NOW + hour, NOW + 3 * hour)
    c = lease("c", 3, NOW + 2 * hour, NOW + 4 * hour)
    overlap = overbooked([a, b, c], stock, NOW, ZONES)
    assert overlap is not None
    assert overlap.total == 10000 and overlap.at == NOW + hour and overlap.leases == ("ml/a", "ml/b")
    assert overlap.involved == {"ml/a", "ml/b"}  # c starts as a ends: 8 of 8
    shortened = lease("b", 5, NOW + 2 * hour, NOW + 3 * hour)
    assert overbooked([a, shortened, c], stock, NOW, ZONES) is None
    assert overbooked([a, b], stock_of(H100, []), NOW, ZONES) is None  # not offered: said apart


def test_recurring_windows_overlap_only_where_their_occurrences_do() -> None:
    stock = stock_of(H100, [gpu_node(node("a", H100, {"nvidia.com/gpu": "8"}), LABEL)])
    far = NOW + timedelta(days=60)
    day = lease("day", 6, NOW, far, recurrence={"schedule": "0 8 * * *", "duration": "8h"})
    night = lease("night", 6, NOW, far, recurrence={"schedule": "0 20 * * *", "duration": "8h"})
    assert overbooked([day, night], stock, NOW, ZONES) is None
    evening = lease("evening", 6, NOW, far, recurrence={"schedule": "0 14 * * *", "duration": "8h"})
    overlap = overbooked([day, night, evening], stock, NOW, ZONES)
    assert overlap is not None and overlap.involved == {"ml/day", "ml/night", "ml/evening"}


def nodes_view(*records: Any) -> StaticView:
    return StaticView({NODES.index: {r.name: r for r in records}}, specs=(NODES,))


def test_whether_a_node_offers_any_of_the_models_and_a_view_that_cannot_tell_says_none() -> None:
    fleet = nodes_view(
        node("a", H100 + "-SHARED", {"nvidia.com/gpu": "16"}, **{"nvidia.com/gpu.replicas": "4"}),
        node("b", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", {"nvidia.com/mig-1g.5gb": "7"}),
        node("c", "NVIDIA-L4", {"nvidia.com/gpu": "0"}),  # labelled, but offering none
    )
    # Sliced and MIG nodes offer their GPU; a label without GPUs offers nothing.
    assert offered_any([H100], fleet, LABEL) is True
    assert offered_any(["NVIDIA-A100-SXM4-40GB"], fleet, LABEL) is True
    assert offered_any(["NVIDIA-L4"], fleet, LABEL) is False
    assert offered_any(["NVIDIA-B200", "NVIDIA-B200-SHARED"], fleet, LABEL) is False
    # Several models (a family): offered when one of them is.
    assert offered_any(["NVIDIA-B200", H100], fleet, LABEL) is True
    assert offered_any([H100], fleet, "example.com/other-label") is False
    # A synced Node index without a Node: no node offers anything.
    assert offered_any([H100], nodes_view(), LABEL) is False
    # No model, no Nodes watched, not listed yet, or no cluster at all: no guess.
    assert offered_any([], fleet, LABEL) is None
    assert offered_any([H100], StaticView({PODS.index: {}}), LABEL) is None
    assert offered_any([H100], View({NODES.index: IndexState()}), LABEL) is None
    assert offered_any([H100], EMPTY_VIEW, LABEL) is None
