"""The drift reconciler (function/control/drift.py) against the stand-in apiserver: paged lists,
one event per Pod found (the CloudEvent the audit stream carries, its time in the one format), the
metric per mutator and namespace replaced by each complete pass and shown only while fresh, a
failed list publishing nothing, a summary in the log; and as a plug-in of castslice control (one
page per reconcile, the configuration's interval)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from prometheus_client import CollectorRegistry

from function.audit.events import Event, wire_event
from function.audit.recorder import random_event_id
from function.control.drift import EVENT_TYPE, PASS_KEY, DriftMetrics, DriftReconciler
from function.control.reconciler import Context, Requeue
from function.control.reconcilers import PLUGINS
from function.control.reconcilers.drift import build
from function.core.config import ConfigError, parse_config
from function.core.drift import Tally
from function.core.engine import Engine
from function.core.mutators.spot import NAMESPACES, slim_namespace
from function.core.view import PODS, StaticView, slim_pod
from tests.support.view import FakeApiServer, transport_for

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
        quiet = namespace("quiet", **{"castops.io/webhook": "ignore"})
        server.load("/api/v1/namespaces", [namespace("ml"), namespace("lab"), quiet])
        yield server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def view_of(api: FakeApiServer) -> StaticView:
    stored = [r for r in map(slim_pod, api.sorted_items("/api/v1/pods")) if r is not None]
    namespaces = [slim_namespace(n) for n in api.sorted_items("/api/v1/namespaces")]
    return StaticView({"pods": stored, "namespaces": namespaces}, (PODS, NAMESPACES))


def reconciler(
    api: FakeApiServer, events: list[CloudEvent], clock: Clock | None = None, interval: float = 300.0
) -> DriftReconciler:
    kube = transport_for(api.url)
    clock = clock or Clock()

    def emit(event: Event) -> None:  # as the recorder sends it
        emitted = wire_event(event, event_id=random_event_id(), time=datetime.now(UTC))
        events.append(emitted.cloud_event())

    return DriftReconciler(
        Engine(CONFIG), kube, emit, interval=interval, page_size=2, clock=clock, wall=clock
    )


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
    drift = reconciler(api, events)
    with caplog.at_level(logging.INFO, logger="castslice.drift"):
        tally = drift.run_pass(lambda: view_of(api))
    assert tally is not None and (tally.judged, tally.drifted) == (6, 4)
    # Seven Pods in pages of two: four list requests, each with the continue token of the last.
    pages = [seen for seen in api.requests() if seen.path == "/api/v1/pods"]
    assert len(pages) == 4 and all(seen.query["limit"] == "2" for seen in pages)
    assert [bool(seen.query.get("continue")) for seen in pages] == [False, True, True, True]
    assert all(
        seen.query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed" for seen in pages
    )
    assert sorted(e["subject"] for e in events) == sorted(
        f"namespaces/{p['metadata']['namespace']}/pods/{p['metadata']['name']}" for p in missed
    )
    event = events[0]
    assert (event["type"], event["source"], event["mutators"], event["podnamespace"]) == (
        EVENT_TYPE,
        "/castslice/controller/drift",
        "gpu-slicing",
        event.data["namespace"],
    )
    assert event.data["outcome"] == "mutated" and "patch" not in event.data
    assert event.data["mutators"][0]["mutator"] == "gpu-slicing"
    # The pass's time, as every event's: microseconds always there, so stored times sort as text.
    assert event["time"].endswith("Z") and len(event["time"]) == len("2026-11-26T12:00:00.000000Z")
    assert gauge(drift.metrics) == {("gpu-slicing", "ml"): 3.0, ("gpu-slicing", "lab"): 1.0}
    summary = (
        "drift: 6 Pod(s) judged, 4 the webhook would change (gpu-slicing in lab: 1, gpu-slicing in ml: 3)"
    )
    assert summary in caplog.text


def test_the_next_pass_replaces_the_figures(api: FakeApiServer) -> None:
    lab = pod("missed-lab", "lab")
    api.load("/api/v1/pods", [pod("missed", "ml"), lab])
    drift = reconciler(api, [])
    drift.run_pass(lambda: view_of(api))
    assert gauge(drift.metrics) == {("gpu-slicing", "ml"): 1.0, ("gpu-slicing", "lab"): 1.0}
    api.delete("/api/v1/pods", lab["metadata"]["uid"])  # re-created through the webhook, say
    drift.run_pass(lambda: view_of(api))
    assert gauge(drift.metrics) == {("gpu-slicing", "ml"): 1.0}
    text = drift.metrics.render().decode()
    assert 'castslice_drift_passes_total{result="complete"} 2.0' in text
    assert "castslice_drift_judged_pods 1.0" in text


def test_a_failed_list_publishes_nothing_and_counts_a_failed_pass(api: FakeApiServer) -> None:
    api.load("/api/v1/pods", [pod(f"missed-{n}", "ml") for n in range(3)])
    drift = reconciler(api, [])
    drift.run_pass(lambda: view_of(api))
    api.expire_continue = 1  # the second page's continue token has expired: 410
    assert drift.run_pass(lambda: view_of(api)) is None
    assert gauge(drift.metrics) == {("gpu-slicing", "ml"): 3.0}  # the previous pass stands
    text = drift.metrics.render().decode()
    assert 'castslice_drift_passes_total{result="failed"} 1.0' in text
    assert 'castslice_drift_passes_total{result="complete"} 1.0' in text


def test_figures_go_stale_two_intervals_after_the_last_pass() -> None:
    """A replica that stopped leading stops passing: its figures must not stay on its /metrics."""
    clock = Clock()
    metrics = DriftMetrics(fresh_for=2 * 300 + 60, clock=clock)
    tally = Tally()
    tally.by_mutator_namespace[("spot", "web")] = 2
    metrics.publish(tally, 1.5, 1_700_000_000.0)
    assert gauge(metrics) == {("spot", "web"): 2.0}
    clock.now += 660
    assert gauge(metrics) == {("spot", "web"): 2.0}
    clock.now += 1
    text = metrics.render().decode()
    assert gauge(metrics) == {} and "# TYPE castslice_drift_pods gauge" in text
    assert "castslice_drift_last_pass_timestamp_seconds 1.7e+09" in text  # when, always


def test_under_the_runner_each_reconcile_reads_one_page_and_requeues(api: FakeApiServer) -> None:
    api.load("/api/v1/pods", [pod(f"missed-{n}", "ml") for n in range(5)])
    events: list[CloudEvent] = []
    clock = Clock()
    drift = reconciler(api, events, clock, interval=120)
    assert list(drift.keys(view_of(api))) == [PASS_KEY]
    context = Context(view_of(api), datetime.now(UTC))
    assert [drift.reconcile(PASS_KEY, context) for _ in range(3)] == [
        Requeue(0.0),
        Requeue(0.0),
        Requeue(120),
    ]
    assert len(events) == 5 and gauge(drift.metrics) == {("gpu-slicing", "ml"): 5.0}
    # Leadership lost mid-pass and regained a while later: the pass starts over.
    drift.reconcile(PASS_KEY, context)
    clock.now += 61
    assert drift.reconcile(PASS_KEY, context) == Requeue(0.0)
    first_pages = [
        seen for seen in api.requests() if seen.path == "/api/v1/pods" and not seen.query.get("continue")
    ]
    assert len(first_pages) == 3
    # A failed list: retried soon, not a whole interval later.
    api.fail = [500]
    assert drift.reconcile(PASS_KEY, Context(view_of(api), datetime.now(UTC))) == Requeue(30.0)


def test_the_plugin_is_on_by_default_with_the_configured_interval_and_page() -> None:
    assert "drift" in [plugin.name for plugin in PLUGINS]
    kube = transport_for("http://127.0.0.1:1")
    built = build(
        parse_config({"drift": {"intervalSeconds": 60, "pageSize": 100}, "audit": {"sink": "none"}}),
        kube,
        lambda event: None,
    )
    assert built is not None and (built.interval, built.page_size, built.resync_seconds) == (60, 100, 60)
    assert "namespaces" in [spec.index for spec in built.watches]
    assert build(parse_config({"drift": {"enabled": False}}), kube, lambda event: None) is None
    registry = CollectorRegistry()
    built.register(registry)
    assert built.metrics.registry is registry
    with pytest.raises(
        ConfigError, match=r"drift.intervalSeconds: Input should be greater than or equal to 10"
    ):
        parse_config({"drift": {"intervalSeconds": 1}})


def test_a_page_holds_about_page_bytes_whatever_the_pods_size(api: FakeApiServer) -> None:
    """Large Pods (a 300 kB argument each here) are listed a few at a time: memory holds about
    ``page_bytes`` of them, not ``page_size``."""
    large = []
    for n in range(40):
        big = pod(f"large-{n}", "ml")
        big["spec"]["containers"][0]["args"] = ["x" * 300_000]
        large.append(big)
    api.load("/api/v1/pods", large)
    drift = DriftReconciler(Engine(CONFIG), transport_for(api.url), lambda e: None,
                            page_size=500, page_bytes=2**20)  # fmt: skip
    tally = drift.run_pass(lambda: view_of(api))
    assert tally is not None and tally.judged == 40
    limits = [int(seen.query["limit"]) for seen in api.requests() if seen.path == "/api/v1/pods"]
    assert limits[0] == 16 and set(limits[1:]) == {3}  # 1 MiB // ~300 kB


def test_a_lost_lead_drops_the_pass_and_its_figures(api: FakeApiServer) -> None:
    api.load("/api/v1/pods", [pod("missed", "ml")])
    drift = reconciler(api, [])
    drift.run_pass(lambda: view_of(api))
    assert gauge(drift.metrics) == {("gpu-slicing", "ml"): 1.0}
    drift.forget_term()
    assert gauge(drift.metrics) == {}
