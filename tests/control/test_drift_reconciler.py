"""The drift reconciler (function/control/drift.py) against the stand-in apiserver: paged lists,
one CloudEvent per Pod found, the metric per mutator and namespace replaced by each complete pass,
a failed list publishing nothing, a summary in the log."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from function.control.drift import EVENT_TYPE, DriftMetrics, DriftReconciler
from function.core.config import parse_config
from function.core.engine import Engine
from function.core.mutators.spot import NAMESPACES, slim_namespace
from function.core.view import PODS, StaticView, slim_pod
from tests.view_support import FakeApiServer, transport_for

CONFIG = parse_config({})


def pod(name: str, namespace: str, opted_in: bool = True, gpu: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "annotations": {"castops.io/optimize": "true"} if opted_in else {},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {gpu: "1"}, "requests": {gpu: "1"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "uid": name, "labels": labels},
    }


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.load(
            "/api/v1/namespaces",
            [namespace("ml"), namespace("lab"), namespace("quiet", **{"castops.io/webhook": "ignore"})],
        )
        yield server


def reconciler(api: FakeApiServer, events: list[CloudEvent], metrics: DriftMetrics) -> DriftReconciler:
    def view() -> StaticView:
        stored = [r for r in map(slim_pod, api.sorted_items("/api/v1/pods")) if r is not None]
        namespaces = [slim_namespace(n) for n in api.sorted_items("/api/v1/namespaces")]
        return StaticView({"pods": stored, "namespaces": namespaces}, (PODS, NAMESPACES))

    return DriftReconciler(Engine(CONFIG), transport_for(api.url), view, events.append, metrics, page_size=2)


def gauge(metrics: DriftMetrics) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["mutator"], sample.labels["namespace"]): sample.value
        for family in metrics.registry.collect()
        if family.name == "castslice_drift_pods"
        for sample in family.samples
    }


def test_a_pass_pages_through_every_pod_and_reports_each_one_found(
    api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    missed = [pod(f"missed-{n}", "ml") for n in range(3)] + [pod("missed-lab", "lab")]
    fine = [pod("sliced", "ml", gpu="nvidia.com/gpu-shared"), pod("plain", "ml", opted_in=False)]
    api.load("/api/v1/pods", [*missed, *fine, pod("quiet", "quiet")])
    events: list[CloudEvent] = []
    metrics = DriftMetrics()
    with caplog.at_level(logging.INFO, logger="castslice.drift"):
        tally = reconciler(api, events, metrics).run_pass()
    assert tally is not None and (tally.judged, tally.drifted) == (6, 4)
    # Seven Pods in pages of two: four list requests, each with the continue token of the last.
    pages = [seen for seen in api.requests() if seen.path == "/api/v1/pods"]
    assert len(pages) == 4 and all(seen.query["limit"] == "2" for seen in pages)
    assert [bool(seen.query.get("continue")) for seen in pages] == [False, True, True, True]
    assert sorted(e["subject"] for e in events) == sorted(
        f"namespaces/{p['metadata']['namespace']}/pods/{p['metadata']['name']}" for p in missed
    )
    event = events[0]
    assert (event["type"], event["source"], event["mutators"]) == (
        EVENT_TYPE,
        "/castslice/controller/drift",
        "gpu-slicing",
    )
    assert event.data["outcome"] == "mutated" and "patch" not in event.data
    assert event.data["mutators"][0]["mutator"] == "gpu-slicing"
    assert gauge(metrics) == {("gpu-slicing", "ml"): 3.0, ("gpu-slicing", "lab"): 1.0}
    assert (
        "drift: 6 Pod(s) judged, 4 the webhook would change (gpu-slicing in lab: 1, gpu-slicing in ml: 3)"
        in caplog.text
    )


def test_the_next_pass_replaces_the_figures(api: FakeApiServer) -> None:
    lab = pod("missed-lab", "lab")
    api.load("/api/v1/pods", [pod("missed", "ml"), lab])
    events: list[CloudEvent] = []
    metrics = DriftMetrics()
    drift = reconciler(api, events, metrics)
    drift.run_pass()
    assert gauge(metrics) == {("gpu-slicing", "ml"): 1.0, ("gpu-slicing", "lab"): 1.0}
    api.delete("/api/v1/pods", lab["metadata"]["uid"])  # re-created through the webhook, say
    drift.run_pass()
    assert gauge(metrics) == {("gpu-slicing", "ml"): 1.0}
    text = metrics.render().decode()
    assert 'castslice_drift_passes_total{result="complete"} 2.0' in text
    assert "castslice_drift_judged_pods 1.0" in text


def test_a_failed_list_publishes_nothing_and_counts_a_failed_pass(api: FakeApiServer) -> None:
    api.load("/api/v1/pods", [pod(f"missed-{n}", "ml") for n in range(3)])
    events: list[CloudEvent] = []
    metrics = DriftMetrics()
    drift = reconciler(api, events, metrics)
    drift.run_pass()
    api.expire_continue = 1  # the second page's continue token has expired: 410
    assert drift.run_pass() is None
    assert gauge(metrics) == {("gpu-slicing", "ml"): 3.0}  # the previous pass stands
    text = metrics.render().decode()
    assert 'castslice_drift_passes_total{result="failed"} 1.0' in text
    assert 'castslice_drift_passes_total{result="complete"} 1.0' in text
