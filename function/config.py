"""The CastSlice configuration: one YAML file, typed, with embedded defaults.

Every model forbids unknown keys, so a typo (``invalidAnnotation: warn``) stops start-up with a
message naming the key instead of silently running on a default.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from function.contract import CONFIG_ENV, DEFAULT_EVENT_SOURCE, DEFAULT_EXCLUDED_NAMESPACES

# A Kubernetes extended resource name: a DNS-subdomain prefix, a slash, and a name segment.
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z"
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_SCHEDULER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")


def _check_resource_name(value: str) -> str:
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
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


class OnInternalError(StrEnum):
    admit = "admit"
    deny = "deny"


class OnInvalidAnnotation(StrEnum):
    deny = "deny"
    warn = "warn"


class GpuSlicingConfig(Strict):
    """CastSlice's own behaviour: opt-in slicing of a whole-GPU resource into shares."""

    enabled: bool = True
    sourceResource: ResourceName = "nvidia.com/gpu"
    targetResource: ResourceName = "nvidia.com/gpu-shared"
    presets: dict[str, PositiveInt] = Field(
        default_factory=lambda: {"training": 4, "inference": 2, "batch": 2, "dev": 1}
    )
    defaultSlices: PositiveInt = 1
    """Slices for an opted-in Pod with neither slice-ratio nor workload-type (the seed's v0.1.0 default)."""
    maxSliceRatio: PositiveInt = 1000
    """Upper bound for castops.io/slice-ratio: larger values are bad input, not a quantity overflow."""

    @field_validator("sourceResource", "targetResource")
    @classmethod
    def _resource(cls, value: str) -> str:
        return _check_resource_name(value)

    @model_validator(mode="after")
    def _distinct_resources(self) -> GpuSlicingConfig:
        if self.sourceResource == self.targetResource:
            raise ValueError("sourceResource and targetResource must differ")
        if not self.presets:
            raise ValueError("presets must name at least one workload type")
        return self


class VgpuDevice(Strict):
    """One vendor's vGPU resource names (HAMi's device table).

    A container asking for any of these resources but the priority makes its Pod a vGPU Pod (the
    priority resource only sets ``priorityEnv``, as in HAMi). Only ``countResource`` is required:
    HAMi's Cambricon, Hygon, Iluvatar and Ascend entries have a count and a memory resource (and
    mostly a cores resource), no percentage or priority.
    """

    vendor: str = Field(min_length=1)
    countResource: ResourceName
    memoryResource: ResourceName | None = None
    memoryPercentageResource: ResourceName | None = None
    """A share of the device's memory in percent: a whole number from 0 to 100."""
    coresResource: ResourceName | None = None
    """A share of the device's compute in percent: a whole number from 0 to 100."""
    priorityResource: ResourceName | None = None
    """Its value becomes the env ``priorityEnv`` of the container (HAMi's task priority); alone it
    does not make a vGPU Pod."""
    visibleDevicesEnv: str | None = None
    """With ``overwriteEnv``, a container with none of this device's resources (the priority aside)
    gets ``<env>=none``."""
    defaultExclusiveCores: bool = False
    """Give a container that takes whole GPUs of this device (a count with no memory size, or a
    memory percentage of 100, and no cores) ``<coresResource>: 100``, so the vGPU scheduler books
    the GPUs' compute as exclusive instead of 0 % of it (current HAMi, PR #1354). Left out, it is
    what HAMi does: on for vendor ``nvidia`` with a coresResource, off for other vendors (HAMi does
    it for NVIDIA only)."""

    @field_validator(
        "countResource", "memoryResource", "memoryPercentageResource", "coresResource", "priorityResource"
    )
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else _check_resource_name(value)

    @field_validator("visibleDevicesEnv")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid environment variable name")
        return value

    @model_validator(mode="before")
    @classmethod
    def _hamis_exclusive_cores_default(cls, data: Any) -> Any:
        # Resolved here rather than kept unset, so `castslice config show` prints what applies.
        if isinstance(data, dict) and "defaultExclusiveCores" not in data:
            nvidia = isinstance(data.get("vendor"), str) and data["vendor"].lower() == "nvidia"
            data = {**data, "defaultExclusiveCores": nvidia and data.get("coresResource") is not None}
        return data

    @model_validator(mode="after")
    def _exclusive_cores_need_a_cores_resource(self) -> VgpuDevice:
        if self.defaultExclusiveCores and self.coresResource is None:
            raise ValueError(
                f"devices entry {self.vendor!r}: defaultExclusiveCores needs a coresResource (the "
                "resource that carries the 100); set one or defaultExclusiveCores: false"
            )
        return self

    @property
    def resources(self) -> tuple[str, ...]:
        """Every resource name of this device, count first."""
        names = (
            self.countResource,
            self.memoryResource,
            self.memoryPercentageResource,
            self.coresResource,
            self.priorityResource,
        )
        return tuple(name for name in names if name is not None)

    @property
    def count_qualifiers(self) -> tuple[str, ...]:
        """The resources that, asked for without a count, get ``defaultCount`` added."""
        names = (self.memoryResource, self.memoryPercentageResource, self.coresResource)
        return tuple(name for name in names if name is not None)


def _nvidia_device() -> VgpuDevice:
    return VgpuDevice(
        vendor="nvidia",
        countResource="nvidia.com/gpu",
        memoryResource="nvidia.com/gpumem",
        memoryPercentageResource="nvidia.com/gpumem-percentage",
        coresResource="nvidia.com/gpucores",
        priorityResource="nvidia.com/priority",
        visibleDevicesEnv="NVIDIA_VISIBLE_DEVICES",
    )


class VgpuConfig(Strict):
    """HAMi-style redirection of vGPU Pods to the vGPU scheduler. Off unless switched on."""

    enabled: bool = False
    schedulerName: str = "hami-scheduler"
    forceOverwriteDefaultScheduler: bool = True
    """HAMi's flag of the same name (its Helm default is true): a vGPU Pod naming
    ``default-scheduler`` is redirected. No schedulerName counts as ``default-scheduler`` (the
    apiserver fills it in before any webhook sees the Pod; ``castslice mutate`` treats it the same).
    False leaves such Pods alone, so only Pods naming the vGPU scheduler itself are handled."""
    forceSchedulerName: bool = False
    """True also redirects a vGPU Pod that names another scheduler (HAMi never does: it leaves the
    Pod alone). The default-scheduler case is ``forceOverwriteDefaultScheduler``."""
    defaultCount: int = Field(default=1, ge=0)
    """Count added to a container asking only for memory, memory percentage or cores; 0 adds none."""
    overwriteEnv: bool = False
    """Give containers without a device of the table ``<visibleDevicesEnv>=none`` (NVIDIA_VISIBLE_DEVICES)."""
    denyPrivileged: bool = True
    """Current HAMi denies vGPU Pods with a privileged container; False restores the old skip + warning."""
    priorityEnv: str = "CUDA_TASK_PRIORITY"
    optOutLabel: str = "hami.io/webhook"
    optOutValue: str = "ignore"
    devices: list[VgpuDevice] = Field(default_factory=lambda: [_nvidia_device()], min_length=1)

    @field_validator("schedulerName")
    @classmethod
    def _scheduler(cls, value: str) -> str:
        if not _SCHEDULER_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid scheduler name")
        return value

    @field_validator("priorityEnv")
    @classmethod
    def _env(cls, value: str) -> str:
        if not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _distinct_devices(self) -> VgpuConfig:
        if self.schedulerName == "default-scheduler":
            raise ValueError("schedulerName must name the vGPU scheduler, not default-scheduler")
        owners: dict[str, str] = {}
        for device in self.devices:
            if device.vendor in owners.values():
                raise ValueError(f"vendor {device.vendor!r} appears twice in devices")
            for name in device.resources:
                if name in owners:
                    raise ValueError(f"resource {name!r} is listed twice in devices ({owners[name]})")
                owners[name] = device.vendor
        return self

    def resources_needing_count(self, count_resource: str) -> tuple[str, ...]:
        """The other resources of the device counted by ``count_resource`` (memory, cores, ...):
        they mean nothing to anything but the vGPU scheduler. Not the priority: it only becomes
        an env var, which a sliced Pod can carry as well."""
        for device in self.devices:
            if device.countResource == count_resource:
                skip = {count_resource, device.priorityResource}
                return tuple(name for name in device.resources if name not in skip)
        return ()


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


class Config(Strict):
    """The whole configuration file."""

    onInternalError: OnInternalError = OnInternalError.admit
    invalidAnnotations: OnInvalidAnnotation = OnInvalidAnnotation.deny
    excludedNamespaces: list[str] = Field(default_factory=lambda: list(DEFAULT_EXCLUDED_NAMESPACES))
    gpuSlicing: GpuSlicingConfig = Field(default_factory=GpuSlicingConfig)
    vgpu: VgpuConfig = Field(default_factory=VgpuConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)

    @model_validator(mode="after")
    def _slicing_beside_vgpu(self) -> Config:
        """With both mutators on, GPU slicing must not read or write a vGPU resource other than a
        count: slicing into one would make an opted-in Pod a vGPU Pod on reinvocation (mutated on
        the first call, denied on the second). The count may be slicing's source (nvidia.com/gpu)."""
        slicing, vgpu = self.gpuSlicing, self.vgpu
        if not (vgpu.enabled and slicing.enabled):
            return self
        keys = (
            "countResource",
            "memoryResource",
            "memoryPercentageResource",
            "coresResource",
            "priorityResource",
        )
        for index, device in enumerate(vgpu.devices):
            for key in keys:
                name = getattr(device, key)
                if name is None:
                    continue
                for own_key in ("sourceResource", "targetResource"):
                    if key == "countResource" and own_key == "sourceResource":
                        continue
                    if getattr(slicing, own_key) == name:
                        raise ValueError(
                            f"gpuSlicing.{own_key} {name!r} is also vgpu.devices[{index}].{key} "
                            f"({device.vendor}); GPU slicing must not use a vGPU resource "
                            "(only a device's countResource may be gpuSlicing.sourceResource)"
                        )
        return self

    def digest(self) -> str:
        """A short, stable identity of the effective configuration (it goes into every decision)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


class ConfigError(Exception):
    """The configuration file is missing, unreadable, or does not validate. The message says where."""


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


def parse_config(data: Any, origin: str = "configuration") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid CastSlice configuration in {origin}: the top level must be a mapping")
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, origin)) from None


def load_config_file(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read CastSlice configuration {path}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"CastSlice configuration {path} is not valid YAML: {error}") from None
    return parse_config(data, str(path))


def load_config(environ: dict[str, str] | None = None) -> Config:
    """The effective configuration: the file named by CASTSLICE_CONFIG, else the embedded defaults."""
    env = os.environ if environ is None else environ
    path = env.get(CONFIG_ENV, "").strip()
    return load_config_file(path) if path else Config()
