"""The CastSlice configuration: one YAML file, typed, with embedded defaults.

Every model forbids unknown keys, so a typo (``invalidAnnotation: warn``) stops start-up with a
message naming the key instead of silently running on a default. The file has the core settings
below plus one section per mutator plug-in (``function.core.mutators.PLUGINS``), each typed by the
model its mutator module declares: adding a mutator does not mean editing this module.

Pure: ``parse_config`` judges data already read; finding and reading the file is the edge's
(``function.config_file``).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Final, Literal

import yaml
from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from function.contract import DEFAULT_EVENT_SOURCE, DEFAULT_EXCLUDED_NAMESPACES
from function.core.configtypes import (
    MutatorConfig,
    MutatorMode,
    OnInternalError,
    OnInvalidAnnotation,
    PositiveInt,
    Strict,
)
from function.core.mutators import PLUGINS
from function.core.mutators.registry import MutatorPlugin, conflict
from function.core.view import WatchSpec, merge_specs

__all__ = [
    "AuditConfig",
    "Config",
    "ConfigError",
    "CoreConfig",
    "DriftConfig",
    "MutatorConfig",
    "MutatorMode",
    "OnInternalError",
    "OnInvalidAnnotation",
    "parse_config",
]


class AuditConfig(Strict):
    """Where decision events go. The sink is chosen from the environment unless forced here."""

    sink: Literal["auto", "knative", "dapr", "stdout", "none"] = "auto"
    """auto: K_SINK if set (Knative SinkBinding), else DAPR_HTTP_PORT if set, else stdout."""
    source: str = DEFAULT_EVENT_SOURCE
    daprPubsub: str = "pubsub"
    daprTopic: str = "castslice-decisions"
    queueSize: PositiveInt = 10000
    maxAttempts: PositiveInt = 5
    initialBackoffSeconds: float = Field(default=0.2, gt=0)
    maxBackoffSeconds: float = Field(default=5.0, gt=0)
    requestTimeoutSeconds: float = Field(default=2.0, gt=0)
    drainSeconds: float = Field(default=5.0, ge=0)
    """On shutdown, how long the queue may drain to the sink before the rest goes to stdout."""
    senders: int = Field(default=1, ge=1, le=8)
    """Threads posting events in parallel; one keeps up with hundreds of events/s to a nearby broker."""

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        # It travels as the ce-source HTTP header in binary mode: printable ASCII, no spaces.
        if not value or not all(33 <= ord(char) < 127 for char in value):
            raise ValueError(
                f"{value!r} is not a usable CloudEvents source (a URI-reference, e.g. /castslice/webhook)"
            )
        return value

    @field_validator("daprPubsub", "daprTopic")
    @classmethod
    def _dapr_name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _backoff_order(self) -> AuditConfig:
        if self.maxBackoffSeconds < self.initialBackoffSeconds:
            raise ValueError("maxBackoffSeconds must not be smaller than initialBackoffSeconds")
        return self


class DriftConfig(Strict):
    """The controller's drift reconciler (docs/operations.md): every stored Pod judged as the webhook
    would judge it today, one pass every ``intervalSeconds``, listing at most ``pageSize`` Pods and
    about ``pageBytes`` of them at a time (the page shrinks for large Pods: its memory is bounded
    whatever the Pods' size)."""

    enabled: bool = True
    intervalSeconds: float = Field(default=300.0, ge=10)
    pageSize: int = Field(default=500, ge=1, le=5000)
    pageBytes: int = Field(default=8 * 2**20, ge=2**20, le=2**28)


class CoreConfig(Strict):
    """The settings every mutator shares; ``Config`` adds one section per mutator plug-in."""

    onInternalError: OnInternalError = OnInternalError.admit
    invalidAnnotations: OnInvalidAnnotation = OnInvalidAnnotation.deny
    excludedNamespaces: list[str] = Field(default_factory=lambda: list(DEFAULT_EXCLUDED_NAMESPACES))
    audit: AuditConfig = Field(default_factory=AuditConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)

    def section(self, key: str) -> Any:
        """The configuration section of the plug-in whose ``config_key`` is ``key``."""
        return getattr(self, key)

    def enabled_plugins(self) -> list[tuple[MutatorPlugin, Any]]:
        """(plug-in, its section) for every enabled mutator, in the engine's order."""
        found = [(plugin, self.section(plugin.config_key)) for plugin in PLUGINS]
        return [(plugin, section) for plugin, section in found if section.enabled]

    @model_validator(mode="after")
    def _plugins_side_by_side(self) -> CoreConfig:
        """Each enabled mutator's declared claims against the others' (see registry.conflict)."""
        enabled = [(plugin, plugin.claims(section)) for plugin, section in self.enabled_plugins()]
        for plugin, claims in enabled:
            others = [(other, other_claims) for other, other_claims in enabled if other is not plugin]
            problem = conflict(plugin, claims, others)
            if problem:
                raise ValueError(problem)
        return self

    def digest(self) -> str:
        """A short, stable identity of the effective configuration (it goes into every decision)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _compose() -> type[CoreConfig]:
    keys = [plugin.config_key for plugin in PLUGINS]
    if len(set(keys)) != len(keys) or set(keys) & set(CoreConfig.model_fields):
        raise RuntimeError(f"mutator plug-ins need distinct configuration keys, got {keys}")
    sections: dict[str, Any] = {
        plugin.config_key: (plugin.config_model, Field(default_factory=plugin.config_model))
        for plugin in PLUGINS
    }
    return create_model("Config", __base__=CoreConfig, __doc__="The whole configuration file.", **sections)


if TYPE_CHECKING:
    Config = CoreConfig
else:
    Config = _compose()


class ConfigError(Exception):
    """The configuration file is missing, unreadable, or does not validate. The message says where."""


def watches_for(config: Config) -> tuple[WatchSpec, ...]:
    """What the enabled plug-ins (enforcing or shadow) need watched, one spec per index. Empty
    when none needs the cluster: then nothing is watched and no credentials are read."""
    return merge_specs(
        spec for plugin, section in config.enabled_plugins() for spec in plugin.watches(section)
    )


def _describe(error: ValidationError, origin: str) -> str:
    lines = [f"invalid CastSlice configuration in {origin}:"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        else:
            value = item.get("input")
            shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
            lines.append(f"  {key}: {item['msg']}{shown}")
    return "\n".join(lines)


KUSTOMIZE_HEADER: Final = {"apiVersion": "config.castops.io/v1alpha1", "kind": "CastSliceConfiguration"}
"""A configuration file may start like a Kubernetes object (these, plus ``metadata``), so that
kustomize can read it as a local-config resource: knative/base/config.yaml is the one source of
excludedNamespaces, copied by kustomize into the webhook's namespaceSelector. The function
checks and ignores the header."""


def _without_kustomize_header(data: dict[str, Any], origin: str) -> dict[str, Any]:
    if not any(key in data for key in (*KUSTOMIZE_HEADER, "metadata")):
        return data
    for key, accepted in KUSTOMIZE_HEADER.items():
        if data.get(key) != accepted:
            raise ConfigError(
                f"invalid CastSlice configuration in {origin}: {key}: {data.get(key)!r} is not valid; "
                f"accepted: {accepted!r} (with apiVersion, kind and metadata together, or none of them)"
            )
    if not isinstance(data.get("metadata"), dict):
        raise ConfigError(
            f"invalid CastSlice configuration in {origin}: metadata: {data.get('metadata')!r} is not valid; "
            "accepted: a mapping (the kustomize object's metadata)"
        )
    return {key: value for key, value in data.items() if key not in (*KUSTOMIZE_HEADER, "metadata")}


def parse_config(data: Any, origin: str = "configuration") -> Config:
    """``data`` (a parsed YAML document; None is the empty file) as a Config; ConfigError names
    ``origin`` and every key that is wrong."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid CastSlice configuration in {origin}: the top level must be a mapping")
    data = _without_kustomize_header(data, origin)
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, origin)) from None
