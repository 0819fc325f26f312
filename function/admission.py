"""From a parsed AdmissionReview to the reply: the engine's decision in the apiserver's terms."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from function.engine import Decision, Engine
from function.mutators.base import RequestInfo
from function.review import AdmissionReview, allowed, denied, patched, reply

log = logging.getLogger("castslice.admission")


class DecisionRecorder(Protocol):
    """Where decisions go after the reply is built (audit events, metrics). Must never block."""

    def record(self, review: AdmissionReview, decision: Decision | None, reply: dict[str, Any]) -> None: ...


class NoRecorder:
    def record(self, review: AdmissionReview, decision: Decision | None, reply: dict[str, Any]) -> None:
        return None


def request_info(review: AdmissionReview) -> RequestInfo:
    request = review.request
    pod = request.object if isinstance(request.object, dict) else {}
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    namespace = request.namespace or metadata.get("namespace") or ""
    return RequestInfo(
        uid=request.uid,
        namespace=namespace if isinstance(namespace, str) else "",
        operation=request.operation,
        dry_run=bool(request.dryRun),
        username=request.userInfo.username or "",
        groups=tuple(request.userInfo.groups or ()),
    )


def response_for(uid: str, decision: Decision) -> dict[str, Any]:
    audit: dict[str, str] = {"outcome": decision.outcome}
    # Name the mutators only when their work reaches the apiserver (a patch or a denial), not
    # when a safety check withheld it.
    if decision.outcome in ("mutated", "denied") and decision.acting_mutators:
        audit["mutators"] = ",".join(decision.acting_mutators)
    if not decision.allowed:
        return denied(uid, decision.denial or decision.reason, decision.warnings, audit)
    if decision.patch:
        return patched(uid, decision.patch, decision.warnings, audit)
    return allowed(uid, decision.warnings, audit)


class Admission:
    def __init__(self, engine: Engine, recorder: DecisionRecorder | None = None) -> None:
        self.engine = engine
        self.recorder: DecisionRecorder = recorder or NoRecorder()

    def review(self, review: AdmissionReview) -> tuple[dict[str, Any], Decision | None]:
        """The reply envelope, and the engine's decision (None when the request is not ours to judge)."""
        request = review.request
        decision: Decision | None = None
        if not request.is_pod_create():
            # Registered for pods CREATE only; anything else (a misconfigured rule) passes untouched.
            response = allowed(request.uid)
        else:
            info = request_info(review)
            try:
                decision = self.engine.decide(request.object, info)
                response = response_for(request.uid, decision)
            except Exception as error:  # decide() guards itself; this guards building the reply
                log.exception("internal error answering request uid %s", request.uid)
                decision = self.engine.internal_error(error, info)
                response = response_for(request.uid, decision)
        answer = reply(review.apiVersion, response)
        try:
            self.recorder.record(review, decision, answer)
        except Exception:  # recording must never turn an answer into a failure
            log.exception("recording the decision failed (request uid %s)", request.uid)
        return answer, decision
