"""Validation of GpuLease objects: the validating webhook (``POST /validate/gpuleases``).

The CRD's schema and CEL refuse what they can (types, enums, patterns, window order, immutable
model); this refuses the rest and names every invalid field at once (``lease_problems``), so a
``kubectl apply`` says all that is wrong in one answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from function.admission.wire import AdmissionResponse, AdmissionReview, allowed, denied
from function.core.leases import KIND, lease_problems
from function.core.schedule import ZoneTable

MESSAGE_LIMIT = 1000


def review_gpulease(
    review: AdmissionReview, zones: Mapping[str, ZoneTable] | None = None
) -> AdmissionResponse:
    """``zones``: the tz database the serving process knows (a time zone must be one of it)."""
    request = review.request
    if request.operation not in ("CREATE", "UPDATE") or request.kind.kind != KIND:
        return allowed(request.uid)
    obj = request.object
    problems = lease_problems(obj, zones)
    if not problems:
        return allowed(request.uid)
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    message = f"GpuLease {name or '(unnamed)'} is invalid: " + "; ".join(problems)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return denied(request.uid, message)
