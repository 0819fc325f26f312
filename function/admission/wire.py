"""The AdmissionReview wire format, in one place: what the apiserver sends, and what it gets back.

The request envelope is typed with pydantic and rejects unknown fields; the Pod inside
``request.object`` is deliberately left a raw dict (a typed Pod model would drop fields it does
not know, and a patch built from it would remove them from the user's Pod). The reply is a typed
``AdmissionResponse`` built by named constructors (controller-runtime's style: ``allowed``,
``patched``, ``denied``), serialized only by ``AdmissionResponse.review``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from function.contract import MAX_JSON_DEPTH, MAX_QUOTED_CHARS
from function.core.json_patch import Operation
from function.core.pod import cap_warning

SUPPORTED_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GroupVersionKind(_Envelope):
    group: str = ""
    version: str
    kind: str


class GroupVersionResource(_Envelope):
    group: str = ""
    version: str
    resource: str


class UserInfo(_Envelope):
    username: str | None = None
    uid: str | None = None
    groups: list[str] | None = None
    extra: dict[str, list[str]] | None = None


class AdmissionRequest(_Envelope):
    """Every field of admission.k8s.io/v1 AdmissionRequest (v1beta1 has the same set)."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str | None = None
    requestKind: GroupVersionKind | None = None
    requestResource: GroupVersionResource | None = None
    requestSubResource: str | None = None
    name: str | None = None
    namespace: str | None = None
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    userInfo: UserInfo
    object: Any = None
    oldObject: Any = None
    dryRun: bool | None = None
    options: Any = None

    def is_pod_create(self) -> bool:
        return (
            self.operation == "CREATE"
            and self.resource.group == ""
            and self.resource.resource == "pods"
            and not self.subResource
        )


class AdmissionReview(_Envelope):
    apiVersion: Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class BadReview(Exception):
    """The body is not an AdmissionReview we can answer; the message says exactly why (HTTP 400)."""


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages a Kubernetes user understands."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {"str": "string", "list": "array", "dict": "object"}.get(
        type(value).__name__, type(value).__name__
    )


def quoted(value: object) -> str:
    """Client input quoted in an error message (the reply and the log line): a string or number
    cut to MAX_QUOTED_CHARS, anything else named by its JSON type, never echoed whole."""
    if isinstance(value, str):
        if len(value) > MAX_QUOTED_CHARS:
            return repr(value[:MAX_QUOTED_CHARS]) + f"... ({len(value)} characters)"
        return repr(value)
    if value is None or isinstance(value, bool | int | float):
        text = repr(value)
        if len(text) > MAX_QUOTED_CHARS:  # a huge int has no repr past 4,300 digits anyway
            return f"a number of {len(text)} characters"
        return text
    return f"a JSON {json_type(value)}"


def _where(loc: tuple[Any, ...]) -> str:
    # A location may hold a client's key (an unknown field): cut each part like any quoted input.
    return ".".join(str(part)[:MAX_QUOTED_CHARS] for part in loc)


def _field_problem(item: Any) -> str:
    where = _where(item["loc"])
    kind = item["type"]
    if kind == "missing":
        return f"{where} is missing"
    if kind == "extra_forbidden":
        return f"{where} is not a field of AdmissionReview"
    if kind in ("literal_error", "enum"):
        expected = item["ctx"].get("expected", "one of the accepted values")
        return f"{where} must be {expected} (got {quoted(item['input'])})"
    if kind == "string_too_short":
        return f"{where} must not be empty"
    if kind.startswith("string"):
        return f"{where} must be a string (got {json_type(item['input'])})"
    if kind.startswith("bool"):
        return f"{where} must be true or false (got {quoted(item['input'])})"
    return f"{where}: {item['msg'][:MAX_QUOTED_CHARS]}"


TOO_DEEP = f"body is nested too deeply: more than {MAX_JSON_DEPTH} levels of arrays and objects"


def load_json(body: bytes) -> Any:
    """The body as JSON, strictly: orjson (C) refuses NaN and Infinity, which are not JSON and
    which the apiserver never sends, and numbers out of float range; then one nesting limit,
    MAX_JSON_DEPTH, checked here for every body, so nothing deeper reaches the engine."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        if "depth limit" in str(error):  # orjson's decoder stops at 1024 levels
            raise BadReview(TOO_DEEP) from None
        raise BadReview(f"body is not JSON: {str(error)[:MAX_QUOTED_CHARS]}") from None
    # Nesting never goes deeper than the body has opening brackets (those inside strings only
    # add to the count): counting them (memchr-fast) spares most bodies the encoder's pass.
    if isinstance(data, dict | list) and body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH:
        try:
            # orjson's encoder refuses more than 254 levels: the cheapest exact depth check there is
            # (C, a few microseconds for a typical review). The limit itself is MAX_JSON_DEPTH.
            orjson.dumps(data)
        except orjson.JSONEncodeError:
            raise BadReview(TOO_DEEP) from None
    return data


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate a request body, raising BadReview with a precise message."""
    if not body or not body.strip():
        raise BadReview("empty body: expected an AdmissionReview JSON object")
    data = load_json(body)
    if not isinstance(data, dict):
        raise BadReview(f"body must be a JSON object (an AdmissionReview), got a JSON {json_type(data)}")
    if data.get("kind") != "AdmissionReview":
        raise BadReview(f"kind must be 'AdmissionReview' (got {quoted(data.get('kind'))})")
    if data.get("apiVersion") not in SUPPORTED_VERSIONS:
        got = quoted(data.get("apiVersion"))
        raise BadReview(f"apiVersion must be one of {', '.join(SUPPORTED_VERSIONS)} (got {got})")
    if "request" not in data:
        raise BadReview("request is missing: an AdmissionReview sent to a webhook carries a request")
    if not isinstance(data["request"], dict):
        raise BadReview(f"request must be a JSON object (got {json_type(data['request'])})")
    try:
        review = AdmissionReview.model_validate(data)
    except ValidationError as error:
        raise BadReview(
            "invalid AdmissionReview: " + "; ".join(_field_problem(e) for e in error.errors()[:5])
        ) from None
    if review.request.is_pod_create():
        pod = review.request.object
        if not isinstance(pod, dict) or pod.get("kind") != "Pod" or not isinstance(pod.get("spec"), dict):
            got = f"kind {quoted(pod.get('kind'))}" if isinstance(pod, dict) else json_type(pod)
            if isinstance(pod, dict) and pod.get("kind") == "Pod":
                got = "a Pod without a spec object"
            raise BadReview(
                f"request.object must be a Pod (kind 'Pod' with a spec) for a pods CREATE request (got {got})"
            )
    return review


# -- The reply ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionResponse:
    """admission.k8s.io AdmissionResponse, as CastSlice sends it. Build it with ``allowed``,
    ``patched`` or ``denied``; ``review(api_version)`` is the only serialization."""

    uid: str
    allowed: bool
    patch: tuple[Operation, ...] = ()
    denial: str | None = None
    """The 403 status message a denied user reads."""
    warnings: tuple[str, ...] = ()
    audit_annotations: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        response: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        if self.patch:
            encoded = orjson.dumps(self.patch)
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(encoded).decode()
        if not self.allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": self.denial or ""}
        if self.warnings:
            response["warnings"] = [cap_warning(w) for w in self.warnings]
        if self.audit_annotations:
            response["auditAnnotations"] = dict(self.audit_annotations)
        return response

    def review(self, api_version: str) -> dict[str, Any]:
        """The AdmissionReview envelope around this response, in the version the request came in."""
        return {"apiVersion": api_version, "kind": "AdmissionReview", "response": self.as_dict()}


def allowed(
    uid: str, warnings: tuple[str, ...] = (), audit: dict[str, str] | None = None
) -> AdmissionResponse:
    return AdmissionResponse(uid, True, warnings=warnings, audit_annotations=dict(audit or {}))


def patched(
    uid: str,
    patch: list[Operation] | tuple[Operation, ...],
    warnings: tuple[str, ...] = (),
    audit: dict[str, str] | None = None,
) -> AdmissionResponse:
    return AdmissionResponse(uid, True, tuple(patch), warnings=warnings, audit_annotations=dict(audit or {}))


def denied(
    uid: str, message: str, warnings: tuple[str, ...] = (), audit: dict[str, str] | None = None
) -> AdmissionResponse:
    return AdmissionResponse(
        uid, False, denial=message, warnings=warnings, audit_annotations=dict(audit or {})
    )
