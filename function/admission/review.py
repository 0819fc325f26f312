"""From a parsed AdmissionReview to the reply: the engine's decision in the apiserver's terms."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from function.admission.facts import AuditFacts, audit_facts
from function.admission.wire import AdmissionResponse, AdmissionReview, allowed, denied, patched
from function.core.engine import Decision, Engine
from function.core.mutators.base import RequestContext
from function.core.pod import describe_pod
from function.core.view import EMPTY_VIEW, ClusterView

log = logging.getLogger("castslice.admission")


class DecisionRecorder(Protocol):
    """Where decisions go after the reply is built (audit events, metrics), with the request's
    audit facts, never the review itself. Must never block."""

    def record(self, facts: AuditFacts, decision: Decision | None) -> None: ...


class NoRecorder:
    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        return None


class Answer(NamedTuple):
    """The reply to one review, the engine's decision (None when the request was not ours) and
    the audit facts it was recorded with (None if they could not be taken, which is logged)."""

    response: AdmissionResponse
    decision: Decision | None
    facts: AuditFacts | None = None

    def review(self, api_version: str) -> dict[str, object]:
        return self.response.review(api_version)


def request_context(review: AdmissionReview, cluster: ClusterView = EMPTY_VIEW) -> RequestContext:
    request = review.request
    pod = request.object if isinstance(request.object, dict) else {}
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    namespace = request.namespace or metadata.get("namespace") or ""
    return RequestContext(
        uid=request.uid,
        namespace=namespace if isinstance(namespace, str) else "",
        operation=request.operation,
        dry_run=bool(request.dryRun),
        username=request.userInfo.username or "",
        groups=tuple(request.userInfo.groups or ()),
        cluster=cluster,
        pod_from_json=True,  # parse_review reads the body with orjson
    )


def naming_pod(message: str, pod: str) -> str:
    """``castslice: pod ml/x: <what is wrong>``: the Pod first, as kubectl prints the message after
    'denied the request:'."""
    if not pod:
        return message
    head, sep, rest = message.partition("castslice: ")
    return f"castslice: {pod}: {rest}" if sep and not head else f"castslice: {pod}: {message}"


def response_for(uid: str, decision: Decision, pod: str = "") -> AdmissionResponse:
    """The reply to a decision; ``pod`` (``describe_pod``) ends a denial's message, so a
    multi-document ``kubectl apply`` says which Pod was refused."""
    audit: dict[str, str] = {"outcome": decision.outcome}
    # Name the mutators only when their work reaches the apiserver (a patch or a denial), not
    # when a safety check withheld it.
    if decision.outcome in ("mutated", "denied") and decision.acting_mutators:
        audit["mutators"] = ",".join(decision.acting_mutators)
    if not decision.allowed:
        return denied(uid, naming_pod(decision.denial or decision.reason, pod), decision.warnings, audit)
    if decision.patch:
        return patched(uid, decision.patch, decision.warnings, audit)
    return allowed(uid, decision.warnings, audit)


class Admission:
    def __init__(
        self,
        engine: Engine,
        recorder: DecisionRecorder | None = None,
        cluster: Callable[[], ClusterView] = lambda: EMPTY_VIEW,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``cluster`` gives the current read-only snapshot of the cluster; it is called once per
        review, before the engine runs, so every pass of the review sees the same cluster.
        ``clock`` times each decision (the engine, pure, reads none)."""
        self.engine = engine
        self.recorder: DecisionRecorder = recorder or NoRecorder()
        self.cluster = cluster
        self.clock = clock

    def review(self, review: AdmissionReview) -> Answer:
        request = review.request
        decision: Decision | None = None
        seconds = 0.0
        if not request.is_pod_create():
            # Registered for pods CREATE only; anything else (a misconfigured rule) passes untouched.
            response = allowed(request.uid)
        else:
            ctx = request_context(review, self.cluster())
            decision, seconds = self._decide(request.object, ctx)
            try:
                response = response_for(request.uid, decision, describe_pod(request.object, ctx.namespace))
            except Exception as error:  # a bug building the reply is this request's internal error
                log.exception("internal error answering request uid %s", request.uid)
                decision = self.engine.internal_error(error, ctx)
                response = response_for(request.uid, decision)
        facts: AuditFacts | None = None
        try:
            facts = audit_facts(review, decision, seconds)
        except Exception:  # recording must never turn an answer into a failure
            log.exception("taking the audit facts failed (request uid %s)", request.uid)
        else:
            self.record(facts, decision)
        return Answer(response, decision, facts)

    def undecided(self, review: AdmissionReview, why: str) -> Answer:
        """The answer to a review the serving process could not decide in time (``why``), recorded
        as any other: refused, saying why (``Engine.undecided``)."""
        request = review.request
        if not request.is_pod_create():
            return self.review(review)  # nothing to decide: allowed at once
        ctx = request_context(review)
        log.error("request uid %s: %s", request.uid, why)
        decision = self.engine.undecided(why, ctx)
        response = response_for(request.uid, decision, describe_pod(request.object, ctx.namespace))
        facts: AuditFacts | None = None
        try:
            facts = audit_facts(review, decision)
        except Exception:  # recording must never turn an answer into a failure
            log.exception("taking the audit facts failed (request uid %s)", request.uid)
        else:
            self.record(facts, decision)
        return Answer(response, decision, facts)

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        """Hands a decision to the recorder: also for one decided in another process."""
        try:
            self.recorder.record(facts, decision)
        except Exception:  # recording must never turn an answer into a failure
            log.exception("recording the decision failed (request uid %s)", facts.uid)

    def _decide(self, pod: Any, ctx: RequestContext) -> tuple[Decision, float]:
        """The engine's decision and the seconds it took, with what an operator must see logged:
        the traceback of an internal error, and why a patch was withheld."""
        started = self.clock()
        try:
            decision = self.engine.decide_or_raise(pod, ctx)
        except Exception as error:  # nothing escapes: a 500 would hand the Pod to failurePolicy
            log.exception("internal error deciding on pod (request uid %s)", ctx.uid)
            decision = self.engine.internal_error(error, ctx)
        else:
            if decision.outcome == "error":
                log.error("request uid %s: %s", ctx.uid, decision.reason)
        return decision, self.clock() - started
