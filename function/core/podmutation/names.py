"""What a PodMutation is known by, and the checks that need nothing else: its API groups, kind and
plural, the annotation that marks a Pod it changed, and whether a document is a PodMutation.

Kept apart from the spec's models and the compiled form, so that what only needs to recognise a
PodMutation (spot placement, ``castslice mutate`` of a manifest without one, the plug-in's
declaration) does not load them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

OUR_GROUP = "castops.io"
OUR_VERSION = "v1alpha1"
CASTAI_GROUP = "pod-mutations.cast.ai"
CASTAI_VERSION = "v1"
KIND = "PodMutation"
PLURAL = "podmutations"

MARK_ANNOTATION = "castops.io/pod-mutation"
"""``<name>/<generation>`` of the PodMutation applied to this Pod."""

_MARK_FORM = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[0-9]{1,19}")
"""``<name>/<generation>``: a PodMutation's object name and its metadata.generation."""


def marked_by(pod: Mapping[str, Any]) -> str | None:
    """The PodMutation (``<name>/<generation>``) that marked the Pod, or None: an absent mark, or
    a value this mutator never writes (``""``, a stray string), which it overwrites."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(MARK_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) and _MARK_FORM.fullmatch(value) else None


def is_podmutation(obj: Any) -> bool:
    if not isinstance(obj, Mapping) or obj.get("kind") != KIND:
        return False
    return obj.get("apiVersion") in (f"{OUR_GROUP}/{OUR_VERSION}", f"{CASTAI_GROUP}/{CASTAI_VERSION}")


def is_api_form(doc: Any) -> bool:
    """CAST AI's API JSON: no apiVersion/kind, a ``name`` and an ``objectFilter``."""
    return isinstance(doc, Mapping) and "apiVersion" not in doc and "name" in doc and "objectFilter" in doc


def is_mutation_document(doc: Any) -> bool:
    """A PodMutation object (either group) or a CAST AI API-form document."""
    return is_podmutation(doc) or is_api_form(doc)
