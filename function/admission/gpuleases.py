"""Validation of GpuLease objects: the validating webhook (``POST /validate/gpuleases``).

The CRD's schema and CEL refuse what they can (types, enums, patterns, window order, immutable
model); this refuses the rest and names every invalid field at once (``lease_problems``), so a
``kubectl apply`` says all that is wrong in one answer.

A valid lease of a model no Node offers (none of its models, for a lease of several or a family)
is admitted with a warning (kubectl prints it), read from the serving process's cluster view: the
Nodes it watches when GPU leases are enabled. No API call is made while a review is answered; a
view without Nodes, or not listed yet, says nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from function.admission.wire import AdmissionResponse, AdmissionReview, allowed, denied
from function.core.families import NO_FAMILIES, ModelFamilies, models_of
from function.core.inventory import POOL_SEPARATOR, not_offered_message, offered_any
from function.core.leases import KIND, lease_problems
from function.core.schedule import ZoneTable
from function.core.view import ClusterView

MESSAGE_LIMIT = 1000


def review_gpulease(
    review: AdmissionReview,
    zones: Mapping[str, ZoneTable] | None = None,
    cluster: Callable[[], ClusterView] | None = None,
    model_label: str = "",
    families: ModelFamilies | None = None,
) -> AdmissionResponse:
    """``zones``: the tz database the serving process knows (a time zone must be one of it).
    ``cluster``: the serving process's snapshot, read once, ``model_label`` the node label naming
    a GPU model and ``families`` the configuration's model families (``gpuLeases.modelLabel``,
    ``modelFamilies``): a lease of a model no Node offers is warned about, and a cap must name one
    of the lease's models (a family's by the configuration); without them (GPU leases not enabled
    in this process) neither is checked."""
    request = review.request
    if request.operation not in ("CREATE", "UPDATE") or request.kind.kind != KIND:
        return allowed(request.uid)
    obj = request.object
    problems = lease_problems(obj, zones, families)
    if not problems:
        return allowed(request.uid, offer_warnings(obj, cluster, model_label, families or NO_FAMILIES))
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    message = f"GpuLease {name or '(unnamed)'} is invalid: " + "; ".join(problems)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return denied(request.uid, message)


def offer_warnings(
    obj: Any, cluster: Callable[[], ClusterView] | None, model_label: str, families: ModelFamilies
) -> tuple[str, ...]:
    """A warning when no Node offers any of the lease's models (``models_of``: a family by its
    models), named as the controller's ModelOffered condition names them; none when the view
    cannot tell."""
    if cluster is None or not model_label:
        return ()
    models = models_of(obj, families)
    if offered_any(models, cluster(), model_label) is not False:
        return ()
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    pool = POOL_SEPARATOR.join(models)
    return (f"GpuLease {name or '(unnamed)'}: {not_offered_message(pool, model_label)} until one does",)
