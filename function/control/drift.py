"""The drift reconciler: every stored Pod judged, continuously, as the webhook would judge it today.

One pass lists the Pods in pages (``limit`` 500 with ``continue``, the apiserver's chunking: memory
holds one page, whatever the cluster's size), judges each with ``function.core.drift`` over the same
cluster view the webhook keeps (its watches run in this process too), emits one CloudEvent per Pod
found, and publishes, at the end of a complete pass only, ``castslice_drift_pods{mutator,namespace}``
and a one-line summary in the log. A pass that fails half-way publishes nothing (the previous pass
stands) and counts as failed. Pods in namespaces labelled ``castops.io/webhook: ignore`` (the view
watches Namespaces for it) are not judged: the registration never sends them to the webhook.

It decides nothing and writes nothing to the cluster: finding a Pod is the whole job (fixing it
means re-creating it, which its owner decides).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from cloudevents.http import CloudEvent
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from function.contract import OPT_OUT_LABEL, OPT_OUT_VALUE
from function.core.config import Config, watches_for
from function.core.drift import Finding, Tally, findings
from function.core.engine import Engine
from function.core.mutators.spot import NAMESPACES, NamespaceRecord
from function.core.view import POD_FIELD_SELECTOR, ClusterView, WatchSpec, merge_specs
from function.serve.watch import PAGE_SIZE, Transport

log = logging.getLogger("castslice.drift")

EVENT_TYPE: Final = "io.castops.castslice.drift.found.v1"
"""One event per Pod found, per pass. Not an admission decision: the reference consumer's Trigger
(types io.castops.castslice.admission.*) does not take it; subscribe to this type to collect them."""
EVENT_SOURCE: Final = "/castslice/controller/drift"
LIST_ACCEPT: Final = "application/json"
LIST_TIMEOUT: Final = 60.0


class ListFailed(Exception):
    """A page of the list could not be read: the pass ends, publishing nothing."""


class DriftMetrics:
    """The reconciler's series. One registry of its own (the controller serves it beside others)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.pods = Gauge(
            "castslice_drift_pods",
            "Stored Pods the webhook would change today (it did not see them, or the configuration "
            "changed since), by the mutator that would change them and namespace; the last complete pass.",
            ["mutator", "namespace"],
            registry=self.registry,
        )
        self.judged = Gauge(
            "castslice_drift_judged_pods", "Pods judged in the last complete pass.", registry=self.registry
        )
        self.passes = Counter(
            "castslice_drift_passes",
            "Passes over every stored Pod, by result (complete, failed).",
            ["result"],
            registry=self.registry,
        )
        for result in ("complete", "failed"):
            self.passes.labels(result)
        self.pass_seconds = Gauge(
            "castslice_drift_pass_seconds", "How long the last complete pass took.", registry=self.registry
        )
        self.last_pass = Gauge(
            "castslice_drift_last_pass_timestamp_seconds",
            "When the last complete pass ended (Unix time).",
            registry=self.registry,
        )
        self._shown: set[tuple[str, str]] = set()

    def publish(self, tally: Tally, seconds: float, ended: float) -> None:
        """A complete pass's counts replace the previous pass's: a (mutator, namespace) no longer
        found goes away rather than staying at its last value."""
        found = dict(tally.by_mutator_namespace)
        for gone in self._shown - found.keys():
            self.pods.remove(*gone)
        for (mutator, namespace), count in found.items():
            self.pods.labels(mutator, namespace).set(count)
        self._shown = set(found)
        self.judged.set(tally.judged)
        self.pass_seconds.set(seconds)
        self.last_pass.set(ended)
        self.passes.labels("complete").inc()

    def failed(self) -> None:
        self.passes.labels("failed").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def drift_event(finding: Finding, found_at: datetime) -> CloudEvent:
    """The CloudEvent for one Pod found. Its ``data`` names the Pod and what each mutator would do,
    never the patch (its values may come from the Pod, and env values can hold secrets)."""
    mutators = ",".join(finding.mutators)
    attributes = {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "source": EVENT_SOURCE,
        "type": EVENT_TYPE,
        "subject": f"namespaces/{finding.namespace}/pods/{finding.name}",
        "time": found_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        # Trigger filters see attributes only.
        "podnamespace": finding.namespace,
        "mutators": mutators,
    }
    data = {key: value for key, value in finding.as_dict().items() if key != "patch"}
    return CloudEvent(attributes, data)


def drift_watches(config: Config) -> tuple[WatchSpec, ...]:
    """What the reconciler reads from the view: what the webhook's mutators read (so each Pod is
    judged over the cluster they would see), and Namespaces for the opt-out label."""
    return merge_specs((*watches_for(config), NAMESPACES))


def opted_out_in(view: ClusterView) -> frozenset[str]:
    """The namespaces labelled ``castops.io/webhook: ignore``, from the view's Namespaces index."""
    return frozenset(
        record.name
        for record in view.index(NAMESPACES.index).values()
        if isinstance(record, NamespaceRecord) and (OPT_OUT_LABEL, OPT_OUT_VALUE) in record.labels
    )


class DriftReconciler:
    """``run_pass`` judges every stored Pod once; the controller calls it every ``interval`` seconds."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        view: Callable[[], ClusterView],
        emit: Callable[[CloudEvent], None],
        metrics: DriftMetrics | None = None,
        page_size: int = PAGE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.transport = transport
        self.view = view
        self.emit = emit
        self.metrics = metrics if metrics is not None else DriftMetrics()
        self.page_size = page_size
        self.clock = clock

    def run_pass(self) -> Tally | None:
        """One pass; its tally, or None when a list failed (logged, counted, nothing published)."""
        started = self.clock()
        tally = Tally()
        try:
            for page in self._pages("/api/v1/pods", {"fieldSelector": POD_FIELD_SELECTOR}):
                # One snapshot per page: each page is judged against one cluster.
                view = self.view()
                for finding in findings(self.engine, page, view, tally, opted_out_in(view)):
                    self.emit(drift_event(finding, datetime.fromtimestamp(self.clock(), UTC)))
        except ListFailed as error:
            log.warning("drift: pass abandoned, the previous pass's figures stand: %s", error)
            self.metrics.failed()
            return None
        ended = self.clock()
        self.metrics.publish(tally, ended - started, ended)
        log.info("%s in %.1f s", tally.summary(), ended - started)
        return tally

    def _pages(self, path: str, query: Mapping[str, str]) -> Iterator[list[Mapping[str, Any]]]:
        """The collection page by page. A continue token that expired (410) ends the pass: the
        next pass starts over, from a consistent snapshot again."""
        token = ""
        while True:
            page_query = {**query, "limit": str(self.page_size)}
            if token:
                page_query["continue"] = token
            try:
                response = self.transport.get(path, page_query, LIST_ACCEPT, LIST_TIMEOUT)
                try:
                    body = response.read()
                finally:
                    response.release_conn()
            except Exception as error:  # the transport raises what urllib3 raises
                raise ListFailed(f"GET {path}: {error}") from error
            if response.status != 200:
                raise ListFailed(f"GET {path}: HTTP {response.status}: {body[:200]!r}")
            listed = json.loads(body)
            items = listed.get("items") or []
            yield [item for item in items if isinstance(item, Mapping)]
            token = (listed.get("metadata") or {}).get("continue") or ""
            if not token:
                return
