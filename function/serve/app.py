"""The composition root: configuration in, a ready-to-serve webhook out.

Everything with side effects (reading the config file, logging set-up, the audit event sender,
the watches) is wired here, once per serving process, so the layers below stay pure and
testable. Nothing here runs at import: a host builds its webhook where it serves it
(``WebhookOnDemand``), so importing an entry point (function/func.py) builds none.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from function.admission.review import Admission, DecisionRecorder
from function.audit.recorder import AuditRecorder, build_recorder
from function.config_file import load_config
from function.core.config import Config, watches_for
from function.core.engine import Engine
from function.core.schedule import ZONES_INDEX
from function.core.view import EMPTY_VIEW, ClusterView, WatchSpec
from function.kube.watch import ClusterWatcher, Transport
from function.logs import configure_logging
from function.serve.draining import DRAINING
from function.serve.http_api import HttpReply, WebhookHttp, problem, validators_with_view
from function.serve.lease_ledger import lease_ledger_for
from function.serve.ledger import DecisionTurns, LedgerRecorder, with_ledgers
from function.serve.offload import LargeReviews
from function.serve.spot_ledger import ledger_for
from function.zones import ZONES

log = logging.getLogger("castslice.app")


def build_webhook(
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    transport: Transport | None = None,
    watches: tuple[WatchSpec, ...] | None = None,
    freeze_gc: bool = True,
    large_reviews: bool = False,
) -> WebhookHttp:
    """Raises ConfigError (naming the bad key) when the configuration is invalid: start-up stops.

    ``config`` defaults to the file ``environ`` names (CASTSLICE_CONFIG). ``environ`` (default
    os.environ) chooses the audit sink: K_SINK, DAPR_HTTP_PORT, else stdout, and, when an enabled
    mutator needs cluster state, the credentials of the watches (in-cluster ServiceAccount, else
    $KUBECONFIG). ``transport`` and ``watches`` replace those (tests). ``freeze_gc``: keep the
    garbage collector off the view's objects (see ClusterWatcher); tests that build many webhooks
    in one process turn it off. ``large_reviews``: decide reviews larger than LARGE_BODY_BYTES in
    a child process (function/serve/offload.py), spawned on the first one.
    """
    return build_webhook_and_recorder(
        config,
        environ,
        transport=transport,
        watches=watches,
        freeze_gc=freeze_gc,
        large_reviews=large_reviews,
    )[0]


def build_webhook_and_recorder(
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    transport: Transport | None = None,
    watches: tuple[WatchSpec, ...] | None = None,
    freeze_gc: bool = True,
    large_reviews: bool = False,
) -> tuple[WebhookHttp, AuditRecorder]:
    """build_webhook, plus its recorder for hosts that start and drain the audit sender
    themselves (the Knative Functions instance in func.py); ``environ`` also names the config."""
    configure_logging()
    environ = os.environ if environ is None else environ
    config = load_config(dict(environ)) if config is None else config
    engine = Engine(config)
    recorder = build_recorder(config, environ)
    # GPU leases: this process's recent charges and the time join each snapshot, under the same
    # turns (one review at a time from snapshot to record), so one process never over-charges;
    # a charge leaves the ledger as soon as the watch delivers its Pod.
    lease_ledger = lease_ledger_for(config)
    watcher = start_watcher(
        watches_for(config) if watches is None else watches,
        environ,
        transport,
        recorder.metrics.registry,
        freeze_gc,
        listener=lease_ledger.watched if lease_ledger is not None else None,
    )
    snapshot: Callable[[], ClusterView] = (lambda: EMPTY_VIEW) if watcher is None else watcher.snapshot
    # Spot placement and PodMutation groups: this process's recent decisions join each snapshot
    # until the view shows them, as the lease charges do (function/serve/ledger.py). One review at
    # a time from snapshot to record, so concurrent siblings see each other.
    ledgers = tuple(kept for kept in (ledger_for(config), lease_ledger) if kept is not None)
    turns = DecisionTurns() if ledgers else None
    decisions: DecisionRecorder = LedgerRecorder(recorder, ledgers, turns) if ledgers else recorder
    # GPU leases read the snapshot's time (the core reads no clock) and the time zones of their
    # recurring windows and budget periods (function/zones.py).
    leases_on = config.section("gpuLeases").enabled
    now: Callable[[], datetime] | None = (lambda: datetime.now(UTC)) if leases_on else None
    zones = {ZONES_INDEX: ZONES} if leases_on else None
    cluster = with_ledgers(snapshot, ledgers, turns, now, zones)
    admission = Admission(engine, decisions, cluster=cluster)
    # What a large review decided in the child process reads (function/serve/offload.py): the same
    # snapshot and ledgers, without a turn (held across the child's decision, it would stop the
    # event loop's own reviews); its decision is checked against the ledgers when it is recorded.
    unturned = with_ledgers(snapshot, ledgers, None, now, zones)
    offload = (
        LargeReviews(config, unturned if watcher is not None else None, ledgers) if large_reviews else None
    )

    def ready() -> bool:
        # Not ready until every watch an enabled mutator needs has listed once: a decision over a
        # half-known cluster would be a guess; nor while the large-review process is starting.
        # Not ready either once draining after SIGTERM.
        return (
            recorder.ready()
            and not DRAINING.is_set()
            and (watcher is None or watcher.synced())
            and (offload is None or offload.ready())
        )

    # A GpuLease of a model no Node offers is warned about at apply, from this snapshot's Nodes.
    leases = config.section("gpuLeases")
    webhook = WebhookHttp(
        admission,
        ready=ready,
        metrics=recorder.metrics_text,
        large_reviews=offload,
        unreadable=(lambda: {}) if watcher is None else watcher.unreadable,
        validators=validators_with_view(snapshot, leases.modelLabel, leases.families())
        if leases_on
        else None,
    )
    webhook.watcher = watcher
    return webhook, recorder


class WebhookOnDemand:
    """A serving process's webhook, built once, where it is served: when the server starts
    (``start``, at ASGI lifespan startup) or, for servers that announce no start (the
    functions-framework CLI's app, a test client), on the first request. Answers as the
    webhook it builds, so every host takes it where it takes a WebhookHttp."""

    def __init__(self, build: Callable[[], WebhookHttp]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self.built: WebhookHttp | None = None

    def start(self) -> WebhookHttp:
        """The webhook, built now if it is not yet (a bad configuration raises, naming the key)."""
        webhook = self.built
        if webhook is None:
            with self._lock:
                if self.built is None:
                    self.built = self._build()
                webhook = self.built
        return webhook

    def handle(self, method: str, path: str, body: bytes | None) -> HttpReply:
        webhook = self.built or self._built_or_why_not()
        return webhook if isinstance(webhook, HttpReply) else webhook.handle(method, path, body)

    async def answer(self, method: str, path: str, body: bytes | None) -> HttpReply:
        webhook = self.built or self._built_or_why_not()
        return webhook if isinstance(webhook, HttpReply) else await webhook.answer(method, path, body)

    def _built_or_why_not(self) -> WebhookHttp | HttpReply:
        # Built on a request: a failure answers (503, naming it) instead of raising into the host,
        # and the next request tries again (a mounted configuration may be fixed meanwhile).
        try:
            return self.start()
        except Exception as error:
            log.exception("the webhook could not be built")
            return problem(503, f"not started: {error}")


def view_client(environ: Mapping[str, str]) -> Transport:
    """The process's client, for the watches an enabled mutator needs (its only use of the apiserver)."""
    from function.kube.client import kube_client
    from function.kube.credentials import NoCredentials

    try:
        return kube_client(environ, user_agent="castslice-view")
    except NoCredentials as error:
        raise NoCredentials(f"an enabled mutator needs the cluster view (list/watch): {error}") from error


def start_watcher(
    specs: tuple[WatchSpec, ...],
    environ: Mapping[str, str],
    transport: Transport | None,
    registry: CollectorRegistry,
    freeze_gc: bool = True,
    listener: Callable[[str, Any, Any], None] | None = None,
) -> ClusterWatcher | None:
    """The cluster view's watches, started; None (no thread, no credentials read) when no enabled
    mutator needs any."""
    if not specs:
        return None
    watched = ", ".join(f"{spec.plural}" + (" (metadata)" if spec.metadata_only else "") for spec in specs)
    log.info("cluster view: watching %s", watched)
    watcher = ClusterWatcher(
        specs,
        transport if transport is not None else view_client(environ),
        registry=registry,
        freeze_gc=freeze_gc,
        listener=listener,
    )
    watcher.start()
    return watcher
