"""Prometheus metrics for admission and audit delivery, served at GET /metrics.

One registry per recorder (not prometheus_client's global one), so every webhook built in a
process (tests build many) counts on its own. Each gunicorn worker has its own registry: keep
WORKERS=1 (the default) and scale with Knative replicas, which Prometheus scrapes one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from function.contract import OUTCOMES

# The *_created series double the output for no use on a scrape target that restarts rarely.
disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
IGNORED: Final = "ignored"
"""Outcome label of a request that is not a Pod CREATE: passed through, no decision, no event."""
SPILL_REASONS: Final = ("queue_full", "rejected", "retries_exhausted", "shutdown")
"""Why an event went to stdout instead of the sink (the label values of events_spilled_total)."""

# Decisions take tens of microseconds to a few milliseconds: the buckets start low. They end at the
# webhook's timeoutSeconds (5): 2.5 s is half of it, 4 s the "nearing the timeout" of the alerts
# (knative/components/monitoring).
DECISION_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.5,
    1.0,
    2.5,
    4.0,
    5.0,
)
DELIVERY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AuditMetrics:
    def __init__(self, sink: str = "stdout", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.sink = sink
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.requests = Counter(
            "castslice_admission_requests",
            "Admission requests answered, by outcome (ignored: not a Pod CREATE) and dry run.",
            ["outcome", "dry_run"],
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "castslice_admission_decision_seconds",
            "Time the engine took to decide on a Pod.",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self.emitted = Counter(
            "castslice_audit_events_emitted",
            "Events built: one per decision that is not a dry run, one per event of the controller.",
            registry=self.registry,
        )
        self.delivered = Counter(
            "castslice_audit_events_delivered",
            "Decision events the sink acknowledged.",
            ["sink"],
            registry=self.registry,
        )
        self.retried = Counter(
            "castslice_audit_event_retries",
            "Delivery attempts repeated after a retryable failure.",
            ["sink"],
            registry=self.registry,
        )
        self.spilled = Counter(
            "castslice_audit_events_spilled",
            "Decision events written to stdout marked undelivered, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.dropped = Counter(
            "castslice_audit_events_dropped",
            "Decision events lost because stdout itself was blocked and the spill queue was full.",
            ["reason"],
            registry=self.registry,
        )
        self.delivery_seconds = Histogram(
            "castslice_audit_delivery_seconds",
            "Time from an event entering the queue to its acknowledgement by the sink.",
            ["sink"],
            buckets=DELIVERY_BUCKETS,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "castslice_audit_queue_depth", "Decision events waiting to be sent.", registry=self.registry
        )
        self.queue_capacity = Gauge(
            "castslice_audit_queue_capacity", "Size of the bounded event queue.", registry=self.registry
        )
        # Every label value exists from the start, so rate() works before the first increment.
        # The children are kept: labels() costs a lock and a tuple per call, on the admission path.
        self._requests = {
            (outcome, dry_run): self.requests.labels(outcome, "true" if dry_run else "false")
            for outcome in (*OUTCOMES, IGNORED)
            for dry_run in (False, True)
        }
        self._delivered = self.delivered.labels(sink)
        self._delivery_seconds: Any = None  # made at the first delivery: no empty series before one
        self._retried = self.retried.labels(sink)
        self._spilled = {reason: self.spilled.labels(reason) for reason in SPILL_REASONS}
        self._dropped = {reason: self.dropped.labels(reason) for reason in SPILL_REASONS}

    # -- the calls the recorder and the sender make ---------------------------------------------
    def admission(self, outcome: str, dry_run: bool, decision_seconds: float | None) -> None:
        child = self._requests.get((outcome, dry_run))
        if child is None:  # an outcome the contract does not list: counted all the same
            child = self.requests.labels(outcome, "true" if dry_run else "false")
        child.inc()
        if decision_seconds is not None:
            self.decision_seconds.observe(decision_seconds)

    def event_emitted(self) -> None:
        self.emitted.inc()

    def event_delivered(self, seconds: float) -> None:
        self.events_delivered([seconds])

    def events_delivered(self, seconds: list[float]) -> None:
        """event_delivered for each of a batch, the counter moved once."""
        if self._delivery_seconds is None:
            self._delivery_seconds = self.delivery_seconds.labels(self.sink)
        self._delivered.inc(len(seconds))
        for each in seconds:
            self._delivery_seconds.observe(each)

    def event_retried(self) -> None:
        self._retried.inc()

    def event_spilled(self, reason: str) -> None:
        child = self._spilled.get(reason)
        (self.spilled.labels(reason) if child is None else child).inc()

    def event_dropped(self, reason: str) -> None:
        child = self._dropped.get(reason)
        (self.dropped.labels(reason) if child is None else child).inc()

    def watch_queue(self, depth: Callable[[], int], capacity: int) -> None:
        self.queue_depth.set_function(lambda: float(depth()))
        self.queue_capacity.set(capacity)

    def render(self) -> bytes:
        return generate_latest(self.registry)
