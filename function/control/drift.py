"""The drift reconciler: every stored Pod judged, continuously, as the webhook would judge it today.

A pass lists the Pods in pages (``limit`` with ``continue``, the apiserver's chunking: memory holds
one page, whatever the cluster's size), judges each with ``function.core.drift`` over the same
cluster view the webhook keeps (the controller runs the same watches) at the reconcile's time (the
GPU leases' windows), emits one event per Pod found, and at the end of a complete pass
publishes ``castslice_drift_pods{mutator,namespace}`` and logs a one-line summary. A page is
bounded in bytes as well as in Pods: the first asks for a few Pods, and each next one for as many
as fit ``pageBytes`` at the size of the largest Pod seen so far, so Pods of 1.5 MB are listed a few
at a time and small ones ``pageSize`` at a time. A pass whose list fails half-way publishes nothing
(the previous pass stands) and counts as failed. Pods in namespaces labelled ``castops.io/webhook:
ignore`` (the view watches Namespaces for it) are held to their namespace's GPU leases only: the
registration never sends them to the webhook, and a lease holds for every Pod of its namespace.

Under ``castslice control`` (function/control/reconcilers/drift.py) each reconcile reads one page
and requeues itself at once until the pass is done, then after ``drift.intervalSeconds``: a replica
that stops leading stops within a page and drops its figures (``forget_term``), so only the leader
shows them.

It decides nothing and writes nothing to the cluster: finding a Pod is the whole job (fixing it
means re-creating it, which its owner decides).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, NoReturn

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from urllib3.exceptions import HTTPError

from function.audit.events import Event
from function.control.reconciler import DONE, Context, Emit, Permission, Requeue
from function.core.config import Config, watches_for
from function.core.drift import Finding, Tally, findings, opted_out_in
from function.core.engine import Engine
from function.core.mutators.spot import NAMESPACES
from function.core.schedule import ZONES_INDEX
from function.core.view import POD_FIELD_SELECTOR, ClusterView, Overlay, Record, WatchSpec, merge_specs
from function.kube.client import Api, ApiError
from function.kube.pages import PAGE_BYTES, Pager
from function.zones import ZONES

log = logging.getLogger("castslice.drift")

NAME: Final = "drift"
PASS_KEY: Final = "pass"
"""The reconciler's one key: the whole cluster is one pass."""
EVENT_TYPE: Final = "io.castops.castslice.drift.found.v1"
"""One event per Pod found, per pass. Not an admission decision: the reference consumer's Trigger
(types io.castops.castslice.admission.*) does not take it; subscribe to this type to collect them."""
EVENT_SOURCE: Final = "/castslice/controller/drift"
LIST_TIMEOUT: Final = 60.0
STALE_SECONDS: Final = 60.0
"""A pass left this long (leadership lost, regained later) starts over: its continue token would
have expired, and the cluster moved on."""
RETRY_SECONDS: Final = 30.0
"""After a failed list, the next pass starts this soon (not a whole interval later)."""


class ListFailed(Exception):
    """A page of the list could not be read: the pass ends, publishing nothing."""


def drift_watches(config: Config) -> tuple[WatchSpec, ...]:
    """What the reconciler reads from the view: what the webhook's mutators read (so each Pod is
    judged over the cluster they would see), and Namespaces for the opt-out label."""
    return merge_specs((*watches_for(config), NAMESPACES))


def drift_event(finding: Finding, found_at: datetime) -> Event:
    """The event for one Pod found, at the pass's time. Its ``data`` names the Pod and what each
    mutator would do, never the patch (its values may come from the Pod, and env values can hold
    secrets)."""
    return Event(
        type=EVENT_TYPE,
        source=EVENT_SOURCE,
        subject=f"namespaces/{finding.namespace}/pods/{finding.name}",
        data={key: value for key, value in finding.as_dict().items() if key != "patch"},
        filters={"podnamespace": finding.namespace, "mutators": ",".join(finding.mutators)},
        time=found_at,
    )


@dataclass(frozen=True)
class Published:
    """The last complete pass, as the metrics show it."""

    tally: Tally
    seconds: float
    ended: float
    """Wall-clock time (Unix) the pass ended."""
    ended_monotonic: float


class DriftMetrics(Collector):
    """``castslice_drift_*``. The figures of the last complete pass are shown while fresh (``fresh_for``
    seconds after it ended), so a replica that stopped leading stops showing them."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        fresh_for: float = float("inf"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.fresh_for, self.clock = fresh_for, clock
        self.last: Published | None = None
        self.passes = Counter(
            "castslice_drift_passes",
            "Passes over every stored Pod, by result (complete, failed).",
            ["result"],
            registry=self.registry,
        )
        for result in ("complete", "failed"):
            self.passes.labels(result)
        self.registry.register(self)

    def publish(self, tally: Tally, seconds: float, ended: float) -> None:
        self.last = Published(tally, seconds, ended, self.clock())
        self.passes.labels("complete").inc()

    def failed(self) -> None:
        self.passes.labels("failed").inc()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pods = GaugeMetricFamily(
            "castslice_drift_pods",
            "Stored Pods the webhook would change today (it did not see them, or the configuration "
            "changed since), by the mutator that would change them and namespace; the last complete "
            "pass, while fresh.",
            labels=["mutator", "namespace"],
        )
        judged = GaugeMetricFamily("castslice_drift_judged_pods", "Pods judged in the last complete pass.")
        seconds = GaugeMetricFamily("castslice_drift_pass_seconds", "How long the last complete pass took.")
        ended = GaugeMetricFamily(
            "castslice_drift_last_pass_timestamp_seconds", "When the last complete pass ended (Unix time)."
        )
        last = self.last
        if last is not None:
            ended.add_metric([], last.ended)
            if self.clock() - last.ended_monotonic <= self.fresh_for:
                for (mutator, namespace), count in sorted(last.tally.by_mutator_namespace.items()):
                    pods.add_metric([mutator, namespace], count)
                judged.add_metric([], last.tally.judged)
                seconds.add_metric([], last.seconds)
        yield from (pods, judged, seconds, ended)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class _Pass:
    pager: Pager
    tally: Tally = field(default_factory=Tally)
    started: float = 0.0
    """Wall clock (Unix), for the figures."""
    began: float = 0.0
    last_step: float = 0.0
    """Monotonic clock, for staleness and the duration."""


class DriftReconciler:
    """The reconciler (``function/control/reconciler.py``'s protocol): one key, one page per
    reconcile. ``run_pass`` does a whole pass at once (tests, and anything outside the runner)."""

    name: str = NAME
    permissions: tuple[Permission, ...] = (
        # The paged lists of whole Pods (the view keeps only their metadata): list, never get.
        Permission("", "pods", ("list",)),
    )

    def __init__(
        self,
        engine: Engine,
        api: Api,
        emit: Emit,
        *,
        watches: tuple[WatchSpec, ...] = (),
        interval: float = 300.0,
        page_size: int = 500,
        page_bytes: int = PAGE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.engine, self.api, self.emit = engine, api, emit
        self.watches = watches
        self.interval, self.page_size, self.page_bytes = interval, page_size, page_bytes
        self.resync_seconds = interval
        self.clock, self.wall = clock, wall
        self.metrics = DriftMetrics(fresh_for=2 * interval + 60, clock=clock)
        self._pass: _Pass | None = None

    def register(self, registry: CollectorRegistry) -> None:
        """The process's registry: the figures go on its /metrics."""
        self.metrics = DriftMetrics(registry, fresh_for=2 * self.interval + 60, clock=self.clock)

    def forget_term(self) -> None:
        """The lead is lost: the pass under way ends, and the last pass's figures go (the next
        leader publishes its own; two replicas never show figures at once)."""
        self._pass = None
        self.metrics.last = None

    # -- the protocol ---------------------------------------------------------------------------
    def triggers(self, index: str, record: Record) -> tuple[str, ...]:
        return ()  # a timer, not events: a Pod that skipped the webhook changes nothing watched

    def keys(self, view: ClusterView) -> tuple[str, ...]:
        return (PASS_KEY,)

    def reconcile(self, key: str, ctx: Context) -> Requeue:
        if key != PASS_KEY:
            return DONE
        try:
            done = self.step(ctx.view, ctx.now)
        except ListFailed:
            return Requeue(min(RETRY_SECONDS, self.interval))
        return Requeue(self.interval if done else 0.0)

    # -- the pass ---------------------------------------------------------------------------------
    def run_pass(self, view: Callable[[], ClusterView]) -> Tally | None:
        """A whole pass now: its tally, or None when a list failed (logged, counted)."""
        self._pass = None
        while True:
            try:
                if self.step(view(), datetime.fromtimestamp(self.wall(), UTC)):
                    break
            except ListFailed:
                return None
        last = self.metrics.last
        return last.tally if last is not None else None

    def step(self, view: ClusterView, at: datetime) -> bool:
        """One page of the pass (a new pass when none is under way, or it went stale): judged at
        ``at``, each Pod found emitted. True when the pass is complete (and published). ListFailed
        when the page could not be read (the pass is abandoned, nothing published)."""
        now = self.clock()
        current = self._pass
        if current is None or now - current.last_step > STALE_SECONDS:
            pager = Pager(
                self.api,
                "/api/v1/pods",
                {"fieldSelector": POD_FIELD_SELECTOR},
                page_size=self.page_size,
                page_bytes=self.page_bytes,
            )
            current = self._pass = _Pass(pager, started=self.wall(), began=now)
        current.last_step = now
        try:
            pods = current.pager.next(LIST_TIMEOUT)
        except (OSError, HTTPError, ApiError) as error:  # the apiserver unreachable, or refusing
            self._abandon(f"GET /api/v1/pods: {error}")
        found_at = datetime.fromtimestamp(self.wall(), UTC)
        # Recurring windows and budget periods are read in their time zones.
        zoned = Overlay(view, {ZONES_INDEX: ZONES})
        for finding in findings(self.engine, pods, zoned, current.tally, opted_out_in(view), at):
            self.emit(drift_event(finding, found_at))
        del pods  # the page goes before the next is read
        if not current.pager.done:
            return False
        self._pass = None
        seconds = self.clock() - current.began
        self.metrics.publish(current.tally, seconds, self.wall())
        log.info("%s in %.1f s", current.tally.summary(), seconds)
        return True

    def _abandon(self, why: str) -> NoReturn:
        self._pass = None
        self.metrics.failed()
        log.warning("drift: pass abandoned, the previous pass's figures stand: %s", why)
        raise ListFailed(why)
