"""The one place for HTTP concerns: routing, methods, size limits, status codes, JSON bodies.

``WebhookHttp`` is the review handler every host calls (controller-runtime's ``Handle``): the
protocol's fast path (function/serve/protocol.py), the ASGI hosts (function/serve/asgi.py: the
bare review endpoint, the functions-framework target, the Knative Functions instance) and tests.
Hosts only read a body and write the reply; ``problem`` writes every error body. Every admission
outcome (denials included) is HTTP 200: a non-200 makes the apiserver apply failurePolicy instead
of our answer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from function.admission.facts import AuditFacts
from function.admission.gpuleases import review_gpulease
from function.admission.podmutations import review_podmutation
from function.admission.review import Admission
from function.admission.wire import AdmissionResponse, AdmissionReview, BadReview, parse_review
from function.contract import (
    HEALTHZ_PATH,
    LARGE_BODY_BYTES,
    MAX_BODY_BYTES,
    METRICS_PATH,
    MUTATE_PATHS,
    READYZ_PATH,
    VALIDATE_GPULEASES_PATH,
    VALIDATE_PODMUTATIONS_PATH,
)
from function.core.engine import Decision
from function.core.families import ModelFamilies
from function.core.view import ClusterView
from function.zones import ZONES

if TYPE_CHECKING:
    from function.serve.offload import LargeReviews

log = logging.getLogger("castslice.http")

JSON = "application/json"


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(status: int, payload: object, headers: dict[str, str] | None = None) -> HttpReply:
    return HttpReply(status, orjson.dumps(payload), JSON, headers or {})


def problem(status: int, message: str, headers: dict[str, str] | None = None) -> HttpReply:
    return json_reply(status, {"error": message, "status": status}, headers)


TOO_LARGE = problem(413, f"request body larger than {MAX_BODY_BYTES} bytes")
INTERNAL_ERROR = problem(500, "internal error (logged by the webhook)")
CLIENT_GONE = HttpReply(408, b"")
"""What a host answers a client that left before its body arrived: the server drops it unread."""


class ReviewHandler(Protocol):
    """What every host calls (controller-runtime's ``Handle``): WebhookHttp, or the
    WebhookOnDemand (function/serve/app.py) that builds one where it is served. ``body`` is None
    when the transport found it larger than MAX_BODY_BYTES; neither call raises."""

    def handle(self, method: str, path: str, body: bytes | None) -> HttpReply:
        """The answer, decided in this thread (the protocol's parser callback calls this)."""
        ...

    async def answer(self, method: str, path: str, body: bytes | None) -> HttpReply:
        """The answer, for hosts on an event loop (may decide a large review elsewhere)."""
        ...


Validator = tuple[str, Callable[[AdmissionReview], AdmissionResponse]]
"""A validating webhook: what it validates (named in a bad request's log line), and the judge."""


def is_review(method: str, path: str) -> bool:
    """An admission review: the one test every host and the router make."""
    return method == "POST" and path in MUTATE_PATHS


class WebhookHttp:
    def __init__(
        self,
        admission: Admission,
        ready: Callable[[], bool] = lambda: True,
        metrics: Callable[[], bytes] | None = None,
        large_reviews: LargeReviews | None = None,
        unreadable: Callable[[], Mapping[str, Mapping[str, str]]] = lambda: {},
        validators: Mapping[str, Validator] | None = None,
    ) -> None:
        """``large_reviews``: where ``answer`` sends reviews larger than LARGE_BODY_BYTES (a child
        process, function/serve/offload.py); None decides every review in this process.
        ``unreadable``: objects the cluster view could not read and left out, by index (named in
        the readiness answer). ``validators``: the validating webhooks answered, by path
        (default VALIDATORS, which read no cluster view)."""
        self.admission = admission
        self.ready = ready
        self.unreadable = unreadable
        self.metrics = metrics
        self.large_reviews = large_reviews
        self.validators = VALIDATORS if validators is None else validators
        self.watcher: Any = None
        """The cluster view's ClusterWatcher when an enabled mutator needs one (its owner stops it)."""

    def handle(self, method: str, path: str, body: bytes | None) -> HttpReply:
        """``body`` is None when the transport found it larger than MAX_BODY_BYTES. Never raises:
        a bug below answers a JSON 500 (the apiserver then applies failurePolicy) and is logged."""
        try:
            return self._route(method, path, body)
        except Exception:  # the last resort; the engine and the admission layer guard themselves
            log.exception("unexpected error serving %s %s", method, path)
            return INTERNAL_ERROR

    async def answer(self, method: str, path: str, body: bytes | None) -> HttpReply:
        """``handle`` for hosts on an event loop: a large review goes to ``large_reviews`` when
        there is one, because a large Pod would stall every other request on this loop for up
        to a second."""
        if (
            self.large_reviews is None
            or body is None
            or len(body) <= LARGE_BODY_BYTES
            or not is_review(method, path)
        ):
            return self.handle(method, path, body)
        try:
            return await self.large_reviews.answer(self, path, body)
        except Exception:  # a dead child must not fail the review: decide it here instead
            log.exception("large-review process failed; deciding in-process")
            return self.handle(method, path, body)

    def _route(self, method: str, path: str, body: bytes | None) -> HttpReply:
        if is_review(method, path):
            return TOO_LARGE if body is None else self.mutate(body)
        validate = self.validators.get(path)
        if validate is not None or path in MUTATE_PATHS:
            if method != "POST" or validate is None:  # a review path is here when not POSTed
                return problem(405, f"{method} not allowed on {path}: use POST", {"Allow": "POST"})
            return TOO_LARGE if body is None else self.validate(body, *validate)
        if path in (HEALTHZ_PATH, READYZ_PATH, METRICS_PATH):
            if method not in ("GET", "HEAD"):
                return problem(405, f"{method} not allowed on {path}: use GET", {"Allow": "GET, HEAD"})
            if path == HEALTHZ_PATH:
                return json_reply(200, {"status": "ok"})
            if path == READYZ_PATH:
                ok = self.ready()
                answer: dict[str, Any] = {"status": "ready" if ok else "not ready"}
                unreadable = self.unreadable()
                if unreadable:  # left out of the view, so their objects are not enforced
                    answer["unreadable"] = unreadable
                return json_reply(200 if ok else 503, answer)
            if self.metrics is None:
                return problem(404, "metrics are not enabled")
            return HttpReply(200, self.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        return problem(404, f"no such path: {path}")

    def recorded(
        self, status: int, body: bytes, facts: AuditFacts | None, decision: Decision | None
    ) -> HttpReply:
        """A reply decided elsewhere (function/serve/offload.py), recorded here as ``mutate`` records:
        ``facts`` are the request's audit facts, None for a 400."""
        if facts is not None:
            self.admission.record(facts, decision)
        return HttpReply(status, body)

    def undecided(self, body: bytes, why: str) -> HttpReply:
        """The reply to a review not decided in time (``why``; Admission.undecided), recorded."""
        try:
            review = parse_review(body)
        except BadReview as bad:
            log.warning("bad admission request: %s", bad)
            return problem(400, str(bad))
        return json_reply(200, self.admission.undecided(review, why).review(review.apiVersion))

    def mutate(self, body: bytes) -> HttpReply:
        try:
            review = parse_review(body)
        except BadReview as bad:
            log.warning("bad admission request: %s", bad)
            return problem(400, str(bad))
        answer = self.admission.review(review)
        return json_reply(200, answer.review(review.apiVersion))

    def validate(
        self, body: bytes, kind: str, review_object: Callable[[AdmissionReview], AdmissionResponse]
    ) -> HttpReply:
        """A validating webhook's answer (VALIDATORS): ``review_object`` judges the object."""
        try:
            review = parse_review(body)
        except BadReview as bad:
            log.warning("bad %s validation request: %s", kind, bad)
            return problem(400, str(bad))
        return json_reply(200, review_object(review).review(review.apiVersion))


VALIDATORS: Mapping[str, Validator] = {
    VALIDATE_PODMUTATIONS_PATH: ("PodMutation", review_podmutation),
    VALIDATE_GPULEASES_PATH: ("GpuLease", functools.partial(review_gpulease, zones=ZONES)),
}
"""The validating webhooks this server answers, by path: what they validate, and the judge."""


def validators_with_view(
    cluster: Callable[[], ClusterView], model_label: str, families: ModelFamilies
) -> dict[str, Validator]:
    """VALIDATORS, the GpuLease one reading the serving process's snapshot (``cluster``) for the
    Nodes: a lease of a model no Node offers (``model_label``; a family by its models) is
    admitted with a warning."""
    judge = functools.partial(
        review_gpulease, zones=ZONES, cluster=cluster, model_label=model_label, families=families
    )
    return {**VALIDATORS, VALIDATE_GPULEASES_PATH: ("GpuLease", judge)}
