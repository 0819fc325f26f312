"""Building blocks of the configuration, shared by the core and every mutator's own section.

They live apart from ``function.core.config`` so a mutator module can define its configuration model
without importing the composed ``Config`` (which imports every mutator).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# A Kubernetes extended resource name: a DNS-subdomain prefix, a slash, and a name segment.
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z"
)
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
SCHEDULER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")


def check_resource_name(value: str) -> str:
    if not _RESOURCE_NAME.match(value) or len(value) > 253:
        raise ValueError(
            f"{value!r} is not an extended resource name (expected '<domain>/<name>', "
            "for example 'nvidia.com/gpu')"
        )
    if value.split("/", 1)[0].endswith("kubernetes.io"):
        raise ValueError(f"{value!r} is in the kubernetes.io namespace, which is not an extended resource")
    return value


ResourceName = Annotated[str, Field(min_length=3)]
PositiveInt = Annotated[int, Field(ge=1)]


class Strict(BaseModel):
    """Every configuration model: unknown keys are refused, values are frozen after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


class OnInternalError(StrEnum):
    admit = "admit"
    deny = "deny"


class OnInvalidAnnotation(StrEnum):
    deny = "deny"
    warn = "warn"


class MutatorMode(StrEnum):
    enforce = "enforce"
    shadow = "shadow"
    """Decide and audit, but send no patch and deny nothing: how a new policy is rolled out."""


class MutatorConfig(Strict):
    """The base of every mutator's configuration section."""

    enabled: bool = False
    mode: MutatorMode = MutatorMode.enforce
