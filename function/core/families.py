"""GPU model families: the models a GpuLease may be charged by (pure).

A lease names one model (``spec.gpuModel``) or several (``spec.gpuModels``); any name may be a
family of the configuration (``gpuLeases.modelFamilies``: ``{h100-class: [NVIDIA-H100-80GB-HBM3,
NVIDIA-H200]}``), which stands for its models. Every model is recognised whatever GPU feature
discovery appends to the product label (``base_model``): a time-sliced GPU's ``-SHARED`` and a
MIG device's ``-MIG-<profile>`` name the GPU they come from.

The webhook (charging and pinning), the validating webhook (a model no node offers), the
controller's inventory and status all ask ``models_of``, so they agree on what a lease covers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

SHARED_SUFFIX = "-SHARED"
_MIG_SUFFIX = re.compile(r"-MIG-\d+g\.\d+gb\Z")

ModelFamilies = Mapping[str, tuple[str, ...]]
"""Family name -> its models (``gpuLeases.modelFamilies``)."""
NO_FAMILIES: ModelFamilies = MappingProxyType({})


def base_model(product: str) -> str:
    """The GPU a product label names: GFD's ``-SHARED`` and ``-MIG-<profile>`` suffixes dropped
    (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` and ``NVIDIA-H100-80GB-HBM3-SHARED`` are A100 and H100)."""
    if product.endswith(SHARED_SUFFIX):
        product = product[: -len(SHARED_SUFFIX)]
    return _MIG_SUFFIX.sub("", product)


def expand(names: Iterable[str], families: ModelFamilies = NO_FAMILIES) -> tuple[str, ...]:
    """The models ``names`` stand for, in order, without repeats: a family by its models, every
    one as ``base_model``."""
    found: dict[str, None] = {}
    for name in names:
        for model in families.get(name, (name,)):
            found.setdefault(base_model(model), None)
    return tuple(found)


def named_models(lease: Any) -> tuple[str, ...]:
    """The names a lease gives, as written: ``spec.gpuModels``, else ``(spec.gpuModel,)``. Takes
    the GpuLease object, its spec, or the view's ``Lease`` record (its ``models``)."""
    if not isinstance(lease, Mapping):
        names = getattr(lease, "models", ())
        return tuple(name for name in names if isinstance(name, str) and name)
    inner = lease.get("spec")
    spec: Mapping[str, Any] = inner if isinstance(inner, Mapping) else lease
    listed = spec.get("gpuModels")
    if isinstance(listed, list):
        return tuple(name for name in listed if isinstance(name, str) and name)
    model = spec.get("gpuModel")
    return (model,) if isinstance(model, str) and model else ()


def models_of(lease: Any, families: ModelFamilies = NO_FAMILIES) -> tuple[str, ...]:
    """The GPU models a lease may be charged by (each a ``base_model``), in the lease's order:
    its names with each family replaced by its models. A family name is a known model for
    whoever asks "does any node offer this lease's model?": ask for each of these instead."""
    return expand(named_models(lease), families)


def is_family(lease: Any, families: ModelFamilies = NO_FAMILIES) -> bool:
    """Whether the lease names several models or a family (a lease of one model is charged by
    exactly that value of the model label, as it always was)."""
    names = named_models(lease)
    return len(names) != 1 or names[0] in families


def node_values(models: Iterable[str]) -> tuple[str, ...]:
    """The model label values a Node of these models may carry, for a Pod pinned to them: each
    model and its time-sliced ``-SHARED`` form (a MIG device's product names its profile, which
    the lease does not know: a Pod asking for such a node names it itself)."""
    values: list[str] = []
    for model in models:
        values += [model, model + SHARED_SUFFIX]
    return tuple(values)
