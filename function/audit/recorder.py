"""The DecisionRecorder the webhook runs with: metrics for every answer, one event per decision.

``record`` runs on the admission path after the reply is built, so it only counts, builds the
event straight in its wire form (events.build_wire_event: a few microseconds) and hands it to
the sender without blocking. No event for:
- a dry run (the request's ``dryRun``): the webhook declares ``sideEffects: NoneOnDryRun``;
- a request that is not a Pod CREATE (``decision`` is None): the webhook is registered for Pod
  CREATE only, so such a request means a misconfigured rule; it is passed through untouched and
  nothing was decided. It is counted (outcome "ignored") so the misconfiguration shows.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Final

from prometheus_client import CollectorRegistry

from function.admission.facts import AuditFacts
from function.audit.delivery import EventSender, RetryPolicy
from function.audit.events import Event, build_wire_event, parse_extension_overrides, wire_event
from function.audit.metrics import IGNORED, AuditMetrics
from function.audit.sinks import DEFAULT_DAPR_PORT, DaprSink, KnativeSink, Sink, StdoutSink, StdoutWriter
from function.contract import ENGINE_VERSION
from function.core.config import AuditConfig, Config, ConfigError
from function.core.engine import Decision

log = logging.getLogger("castslice.audit")


def random_event_id() -> str:
    """A version-4 UUID from ``random.getrandbits``: event ids only need to be unique, and
    uuid.uuid4 reads os.urandom, a system call per event (tens of microseconds on some VMs).
    The generator is seeded from urandom at start and reseeded in every forked worker."""
    text = f"{random.getrandbits(128) & _UUID_KEEP | _UUID_SET:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_UUID_KEEP: Final = ~(0xF000 << 64) & ~(0xC000 << 48)
_UUID_SET: Final = (0x4000 << 64) | (0x8000 << 48)
"""The version (4) and RFC 4122 variant bits of random_event_id, set in one step."""


class AuditRecorder:
    def __init__(
        self,
        config: AuditConfig,
        config_digest: str,
        metrics: AuditMetrics,
        sender: EventSender | None,
        extensions: Mapping[str, str] | None = None,
        new_id: Callable[[], str] = lambda: random_event_id(),
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.config_digest = config_digest
        self.metrics = metrics
        self.sender = sender
        self.extensions = dict(extensions or {})
        self._new_id = new_id
        self._now = now

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        dry_run = facts.dry_run
        if decision is None:
            self.metrics.admission(IGNORED, dry_run, None)
            return
        self.metrics.admission(decision.outcome, dry_run, facts.duration_seconds)
        if dry_run or self.sender is None:
            return
        event = build_wire_event(
            facts,
            decision,
            event_id=self._new_id(),
            decided_at=self._now(),
            source=self.config.source,
            config_digest=self.config_digest,
            engine_version=ENGINE_VERSION,
            extensions=self.extensions,
        )
        self.metrics.event_emitted()
        self.sender.submit(event)

    def emit(self, event: Event) -> None:
        """An event besides a decision (the controller's), on the same sink, given its id and
        time as a decision's event is."""
        if self.sender is None:
            return
        self.metrics.event_emitted()
        self.sender.submit(
            wire_event(
                event, event_id=event.id or self._new_id(), time=self._now(), extensions=self.extensions
            )
        )

    def ready(self) -> bool:
        """Not ready once shutting down; a dead sink never makes the webhook unready (that would
        turn an audit outage into an admission outage)."""
        return self.sender is None or self.sender.accepting

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def close(self, timeout: float | None = None) -> int:
        return 0 if self.sender is None else self.sender.close(timeout)


def usable_overrides(raw: str | None) -> tuple[dict[str, str], list[str]]:
    """The K_CE_OVERRIDES extensions that can be applied, and what was wrong with the rest."""
    try:
        return parse_extension_overrides(raw), []
    except ValueError as whole:
        try:
            entries = json.loads(raw or "").get("extensions")
        except (ValueError, AttributeError):
            return {}, [str(whole)]
        if not isinstance(entries, dict):
            return {}, [str(whole)]
    kept: dict[str, str] = {}
    problems = []
    for name, value in entries.items():
        try:
            kept.update(parse_extension_overrides(json.dumps({"extensions": {name: value}})))
        except ValueError as problem:
            problems.append(str(problem))
    return kept, problems


def choose_sink(config: AuditConfig, environ: Mapping[str, str], writer: StdoutWriter) -> Sink | None:
    """auto: K_SINK (Knative SinkBinding), else DAPR_HTTP_PORT (Dapr sidecar), else stdout."""
    kind = config.sink
    k_sink = environ.get("K_SINK", "").strip()
    dapr_port = environ.get("DAPR_HTTP_PORT", "").strip()
    if kind == "auto":
        kind = "knative" if k_sink else "dapr" if dapr_port else "stdout"
    if kind == "none":
        return None
    if kind == "stdout":
        return StdoutSink(writer)
    if kind == "knative":
        if not k_sink:
            raise ConfigError("audit.sink is knative but K_SINK is not set (is the SinkBinding applied?)")
        ca_certs = environ.get("K_CA_CERTS", "").strip() or None
        try:
            return KnativeSink(k_sink, config.requestTimeoutSeconds, ca_certs)
        except ValueError as error:
            raise ConfigError(f"K_SINK: {error}") from None
    port_text = dapr_port or str(DEFAULT_DAPR_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"DAPR_HTTP_PORT must be a port number, got {port_text!r}")
    token = environ.get("DAPR_API_TOKEN", "").strip() or None
    return DaprSink(int(port_text), config.daprPubsub, config.daprTopic, config.requestTimeoutSeconds, token)


def build_recorder(
    config: Config, environ: Mapping[str, str], registry: CollectorRegistry | None = None
) -> AuditRecorder:
    """The recorder for this configuration and environment; its metrics in ``registry`` (the
    process's, served on its /metrics), else in one of its own.

    The sink's environment (K_SINK, K_CE_OVERRIDES, DAPR_HTTP_PORT) is injected by the platform,
    not written by the user, and arrives late (a SinkBinding binds after the first Pods start). An
    unusable one must not turn an audit problem into an admission outage: it is logged as an error
    and events go to stdout instead (the log pipeline keeps them); unusable K_CE_OVERRIDES entries
    are dropped the same way. Only the configuration file stops start-up.
    """
    audit = config.audit
    writer = StdoutWriter()
    try:
        sink = choose_sink(audit, environ, writer)
    except ConfigError as error:
        log.error("audit sink unusable, decision events go to stdout instead: %s", error)
        sink = StdoutSink(writer)
    extensions: dict[str, str] = {}
    if isinstance(sink, KnativeSink):
        # Knative's SinkBinding sets K_CE_OVERRIDES beside K_SINK; it means nothing to other sinks.
        extensions, problems = usable_overrides(environ.get("K_CE_OVERRIDES"))
        for problem in problems:
            log.error("ignoring part of K_CE_OVERRIDES: %s", problem)
    metrics = AuditMetrics(sink.name if sink else "none", registry)
    sender = None
    if sink is not None:
        sender = EventSender(
            sink,
            writer,
            metrics,
            capacity=audit.queueSize,
            policy=RetryPolicy(audit.maxAttempts, audit.initialBackoffSeconds, audit.maxBackoffSeconds),
            drain_seconds=audit.drainSeconds,
            senders=audit.senders,
        )
        log.info("audit events go to %s (source %s)", sink.name, audit.source)
    else:
        log.info("audit events are switched off (audit.sink: none)")
    return AuditRecorder(audit, config.digest(), metrics, sender, extensions)
