"""Validation of PodMutation objects: the validating webhook (``POST /validate/podmutations``) and
``castslice mutations validate``.

The CRD schema and its CEL rules refuse what they can express (types, enums, ranges, the sum of the
distribution groups); this refuses the rest with a message naming the field: a regex that does not
compile, an unparsable patch path, an unknown patch operation, contradictory fields. Unknown fields
of a CAST AI object are warnings (they are dropped when loaded), of our own objects errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from function.admission.wire import AdmissionResponse, AdmissionReview, allowed, denied
from function.core.podmutation.compiled import CompiledMutation, compile_object, from_api_form
from function.core.podmutation.names import is_api_form

MESSAGE_LIMIT = 1000
"""The apiserver shows the whole status message to kubectl; keep it readable."""


@dataclass(frozen=True)
class Verdict:
    name: str
    problems: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems


def check(obj: Any) -> Verdict:
    """Validate one PodMutation object (either group) or one CAST AI API-form document."""
    if is_api_form(obj):
        try:
            obj = from_api_form(obj)
        except ValueError as error:
            return Verdict(str(obj.get("name", "")), (str(error),), ())
    if not isinstance(obj, Mapping):
        return Verdict("", ("not an object",), ())
    compiled = compile_object(obj)
    if isinstance(compiled, CompiledMutation):
        return Verdict(compiled.name, (), compiled.warnings)
    return Verdict(compiled.name, compiled.problems, ())


def review_podmutation(review: AdmissionReview) -> AdmissionResponse:
    """The validating webhook's answer: deny with every problem named, or allow with warnings."""
    request = review.request
    if request.operation not in ("CREATE", "UPDATE") or request.kind.kind != "PodMutation":
        return allowed(request.uid)
    verdict = check(request.object)
    if verdict.valid:
        return allowed(request.uid, warnings=verdict.warnings)
    message = f"PodMutation {verdict.name or '(unnamed)'} is invalid: " + "; ".join(verdict.problems)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return denied(request.uid, message)
