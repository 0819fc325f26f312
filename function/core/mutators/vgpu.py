"""vGPU redirection (HAMi's admission webhook): Pods asking for vGPU resources go to the vGPU scheduler.

Semantics of HAMi's current webhook (``pkg/scheduler/webhook.go``, ``pkg/device/*/device.go``):
- the label ``hami.io/webhook: ignore`` on the Pod leaves it alone (HAMi's objectSelector);
- a Pod with no containers is denied, before anything else is looked at;
- a Pod naming another scheduler is left alone entirely; ``default-scheduler`` counts as another
  scheduler only when ``forceOverwriteDefaultScheduler`` is off (``forceSchedulerName`` goes further
  than HAMi and takes every Pod). No schedulerName means ``default-scheduler``: the apiserver fills it
  in before any webhook runs, and ``castslice mutate`` (undefaulted templates) must agree with it;
- in every init and app container, a device resource (count, memory, memory percentage, cores)
  makes the Pod a vGPU Pod; memory, percentage or cores without a count get ``defaultCount``; the
  priority resource only becomes the env ``CUDA_TASK_PRIORITY`` (as in HAMi, it alone is no vGPU
  Pod); with ``overwriteEnv`` a container with none of a device's resources (the priority aside) gets
  ``NVIDIA_VISIBLE_DEVICES=none``;
- a vGPU Pod with a privileged container is denied, naming the container (``denyPrivileged: false``
  restores HAMi's old behaviour: privileged containers are skipped, with a warning here);
- a container taking whole GPUs (the count, no memory size, no cores, no memory percentage below
  100) gets the device's cores resource at 100, so the vGPU scheduler books the compute as
  exclusive (HAMi PR #1354; the rule is in exclusive_cores.py), per device entry
  (``defaultExclusiveCores``, on for NVIDIA as in HAMi);
- a vGPU Pod with ``spec.nodeName`` is denied; otherwise its schedulerName becomes the vGPU scheduler.

Where CastSlice differs from HAMi, deliberately: values are checked (whole numbers; the memory
percentage and the cores from 0 to 100, where HAMi clamps cores over 100) under the
``invalidAnnotations`` policy instead of reaching the scheduler; the default count goes into
requests and limits alike (the apiserver wants them equal), and so do the exclusive cores; a count
of 0 gets no cores; nothing is appended twice (HAMi appends env vars blindly, its webhook is never
reinvoked; ours can be); memory, percentage or cores make a vGPU Pod even with ``defaultCount: 0``;
HAMi's namespace quota check and runtimeClassName/core-policy injection need cluster state or belong
to its device plugin: not here. The full list, with reasons: docs/vgpu.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator, model_validator

from function.core.configtypes import (
    ENV_NAME,
    SCHEDULER_NAME,
    MutatorConfig,
    OnInvalidAnnotation,
    ResourceName,
    Strict,
    check_resource_name,
)
from function.core.mutators.base import MutatorResult, RequestContext
from function.core.mutators.exclusive_cores import EXCLUSIVE_CORES, whole_gpu_cores
from function.core.mutators.registry import Claims, MutatorPlugin, Neighbours, OwnedResource, Settings
from function.core.pod import (
    Pod,
    asked_resources,
    container_label,
    fit_warning,
    iter_containers,
    labels_of,
    resource_sections,
    set_resource,
    shown,
)
from function.core.quantity import QuantityError, parse_quantity


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
        return None if value is None else check_resource_name(value)

    @field_validator("visibleDevicesEnv")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
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


class VgpuConfig(MutatorConfig):
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
        if not SCHEDULER_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid scheduler name")
        return value

    @field_validator("priorityEnv")
    @classmethod
    def _env(cls, value: str) -> str:
        if not ENV_NAME.match(value):
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


DEFAULT_SCHEDULER = "default-scheduler"
VGPU_CONTAINER_LISTS = ("initContainers", "containers")
"""HAMi looks at init and app containers; ephemeral containers cannot ask for resources."""
NAME_LIMIT = 20
"""Container names in warnings are cut to this length, so the advice fits in 120 characters."""
VALUE_LIMIT = 10
"""Likewise for a value quoted in a warning (the denial quotes more)."""


def _short_name(container: dict[str, Any]) -> str:
    """The container's name cut to NAME_LIMIT, for warnings (names are unique across init and app
    containers, so the kind is left out there)."""
    name = str(container.get("name", "?"))
    return name if len(name) <= NAME_LIMIT else name[: NAME_LIMIT - 3] + "..."


class BadValue(Exception):
    """A vGPU resource value CastSlice cannot hand to the vGPU scheduler."""

    def __init__(
        self, where: str, name: str, resource: str, value: object, accepted: str, accepted_short: str
    ) -> None:
        self.where = where
        self.name = name
        self.resource = resource
        self.value = value
        self.accepted = accepted
        self.accepted_short = accepted_short
        super().__init__(self.message)

    @property
    def message(self) -> str:
        value = shown(self.value, 64)
        return f"{self.where}: {self.resource} {value} is not valid; accepted: {self.accepted}"

    @property
    def warning(self) -> str:
        # Warnings reach kubectl and are capped at 120 characters by the apiserver: the advice is kept.
        return fit_warning(
            f"castslice: {self.resource}={shown(self.value, VALUE_LIMIT)} in container {self.name} ignored; ",
            f"use {self.accepted_short}",
        )


@dataclass
class _Plan:
    """What one pass would do to one container, worked out before anything is touched."""

    kind: str
    index: int
    container: dict[str, Any]
    asks: list[str] = field(default_factory=list)
    """Every device resource the container asks for, priority included (for the reason)."""
    vgpu: bool = False
    """Whether one of them makes a vGPU Pod: any but the priority resource."""
    add_counts: list[str] = field(default_factory=list)
    add_cores: list[str] = field(default_factory=list)
    """Cores resources set to EXCLUSIVE_CORES: the container takes whole GPUs of that device."""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return container_label(self.kind, self.index, self.container)


def _is_privileged(container: dict[str, Any]) -> bool:
    context = container.get("securityContext")
    return isinstance(context, dict) and context.get("privileged") is True


def _env_by_name(container: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The container's env entries by name, or None when env is not a list. With duplicate names
    the last entry is the one the container gets, so it is the one kept here."""
    env = container.get("env", [])
    if env is None:
        return {}
    if not isinstance(env, list):
        return None
    found: dict[str, dict[str, Any]] = {}
    for entry in env:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found[entry["name"]] = entry
    return found


class Vgpu:
    name = "vgpu"
    idempotent = True

    def __init__(
        self,
        config: VgpuConfig,
        on_invalid: OnInvalidAnnotation,
        renamed_resources: Mapping[str, str] | None = None,
    ) -> None:
        """``renamed_resources`` maps a device's count resource to the name GPU slicing renames it
        to: a container holding the renamed resource still has that device's GPU, so
        ``overwriteEnv`` must not hide it (``NVIDIA_VISIBLE_DEVICES=none`` would)."""
        self.config = config
        self.on_invalid = on_invalid
        self.devices = list(config.devices)
        renamed = renamed_resources or {}
        # Env name -> every resource meaning "this container has one of those devices".
        self._visible_env: dict[str, frozenset[str]] = {}
        for device in self.devices:
            if device.visibleDevicesEnv is None:
                continue
            # The priority alone gives no device (HAMi: only a count keeps the devices visible).
            owned = {name for name in device.resources if name != device.priorityResource}
            if device.countResource in renamed:
                owned.add(renamed[device.countResource])
            previous = self._visible_env.get(device.visibleDevicesEnv, frozenset())
            self._visible_env[device.visibleDevicesEnv] = previous | owned

    # -- the decision ------------------------------------------------------------------------
    def mutate(self, pod: Pod, ctx: RequestContext) -> MutatorResult:
        config = self.config
        if labels_of(pod).get(config.optOutLabel) == config.optOutValue:
            return MutatorResult.unchanged(f"opted out ({config.optOutLabel}={config.optOutValue})")
        spec = pod.get("spec")
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(containers, list) or not containers:
            return MutatorResult.denied(
                "castslice: Pod has no containers; spec.containers needs at least one"
            )

        # Unset means default-scheduler (the apiserver's default): the same rules for both.
        scheduler = spec.get("schedulerName") or ""
        left_alone = self._other_scheduler(scheduler)
        if left_alone:
            return MutatorResult.unchanged(left_alone)

        try:
            plans, privileged, skipped = self._plan(pod)
        except BadValue as bad:
            if self.on_invalid is OnInvalidAnnotation.deny:
                return MutatorResult.denied(f"castslice: {bad.message}")
            return MutatorResult.unchanged(bad.message, bad.warning)

        warnings = tuple(
            fit_warning(
                f"castslice: container {name} is privileged, vGPU resources ignored, Pod may stay Pending; ",
                "remove privileged",
            )
            for _, name in skipped
        )
        vgpu_pod = any(plan.vgpu for plan in plans)
        if vgpu_pod and privileged and config.denyPrivileged:
            return MutatorResult.denied(
                f"castslice: vGPU Pod denied: container {privileged} is privileged and would see every GPU"
                " of the node; remove securityContext.privileged or the vGPU resources"
            )
        node = spec.get("nodeName")
        if vgpu_pod and node:
            return MutatorResult.denied(
                f"castslice: vGPU Pod denied: spec.nodeName is set ({shown(node, 64)}) but only "
                f"{config.schedulerName} may place a vGPU Pod; remove spec.nodeName"
            )

        done = self._apply(plans)
        if vgpu_pod and scheduler != config.schedulerName:
            spec["schedulerName"] = config.schedulerName
            done.insert(0, f"schedulerName {scheduler or '(unset)'} -> {config.schedulerName}")
        notes = [f"privileged {where} skipped (denyPrivileged: false)" for where, _ in skipped]
        asks = ", ".join(f"{plan.where} ({', '.join(plan.asks)})" for plan in plans if plan.asks)
        subject = f"vGPU Pod: {asks}" if vgpu_pod else "not a vGPU Pod"
        if done:
            return MutatorResult.mutated("; ".join([subject, *done, *notes]), *warnings)
        if vgpu_pod:
            subject += f"; already for {config.schedulerName}"
        return MutatorResult.unchanged("; ".join([subject, *notes]), *warnings)

    def _other_scheduler(self, scheduler: str) -> str:
        """Why a Pod naming ``scheduler`` ("" when unset, which means default-scheduler) is left
        alone, or "" when the vGPU mutator handles it."""
        config = self.config
        if scheduler == config.schedulerName:
            return ""
        if scheduler in ("", DEFAULT_SCHEDULER):
            if config.forceOverwriteDefaultScheduler:
                return ""
            named = DEFAULT_SCHEDULER if scheduler else f"no scheduler (so {DEFAULT_SCHEDULER})"
            return f"Pod names {named} and forceOverwriteDefaultScheduler is false: left alone"
        if config.forceSchedulerName:
            return ""
        return f"Pod names scheduler {shown(scheduler, 64)}: left alone"

    # -- planning: every check before any change -----------------------------------------------
    def _plan(self, pod: Pod) -> tuple[list[_Plan], str, list[tuple[str, str]]]:
        """Per-container plans, the first privileged container's name ("" if none), and the
        privileged containers skipped under ``denyPrivileged: false`` that asked for vGPU (where,
        short name)."""
        plans: list[_Plan] = []
        privileged = ""
        skipped: list[tuple[str, str]] = []
        for kind, index, container in iter_containers(pod, VGPU_CONTAINER_LISTS):
            plan = _Plan(kind, index, container)
            if _is_privileged(container):
                privileged = privileged or str(container.get("name", "?"))
                if not self.config.denyPrivileged:
                    # HAMi before the fix: a privileged container is not looked at at all.
                    if self._device_resources(container):
                        skipped.append((plan.where, _short_name(container)))
                    continue
            self._plan_container(plan)
            plans.append(plan)
        return plans, privileged, skipped

    def _device_resources(self, container: dict[str, Any]) -> list[str]:
        """The resources making a vGPU Pod that the container asks for (priority is not one)."""
        asked = asked_resources(container)
        return [
            name
            for device in self.devices
            for name in device.resources
            if name in asked and name != device.priorityResource
        ]

    def _plan_container(self, plan: _Plan) -> None:
        container = plan.container
        asked = asked_resources(container)
        for device in self.devices:
            mine = [name for name in device.resources if name in asked]
            if not mine:
                continue
            values = {name: self._check(plan, device, name) for name in mine}
            plan.asks.extend(mine)
            plan.vgpu = plan.vgpu or any(name != device.priorityResource for name in mine)
            adds_count = (
                device.countResource not in asked
                and self.config.defaultCount > 0
                and any(name in asked for name in device.count_qualifiers)
            )
            if adds_count:
                plan.add_counts.append(device.countResource)
            added = self.config.defaultCount if adds_count else 0
            if device.defaultExclusiveCores and (cores := whole_gpu_cores(device, values, added)):
                plan.add_cores.append(cores)
            if device.priorityResource in values:
                # The first device of the table wins when two map to the same env var.
                plan.env.setdefault(self.config.priorityEnv, str(values[device.priorityResource]))
        # A container referencing a DRA claim gets its devices through it (GPU slicing's dra
        # backend): hiding the visible devices would hide that GPU.
        if self.config.overwriteEnv and not _references_claims(plan.container):
            for env_name, owned in self._visible_env.items():
                if not owned & asked:
                    plan.env.setdefault(env_name, "none")

    def _check(self, plan: _Plan, device: VgpuDevice, name: str) -> int:
        """The resource's value as an integer (limits first): BadValue unless every value given is a
        whole number, from 0 to 100 for the memory percentage and the cores (a share of the device's
        compute in percent; HAMi clamps larger values, we refuse them), below 2^63 for the others
        (HAMi reads every quantity as an int64)."""
        percentage = name in (device.memoryPercentageResource, device.coresResource)
        accepted = "a whole number from 0 to 100" if percentage else "a whole number (0 or more)"
        short = "a whole number 0-100" if percentage else "a whole number >= 0"
        result: int | None = None
        for _, section in resource_sections(plan.container):
            if name not in section:
                continue
            raw = section[name]
            bad = BadValue(plan.where, _short_name(plan.container), name, raw, accepted, short)
            try:
                value = parse_quantity(raw)
            except QuantityError:
                raise bad from None
            if value.denominator != 1 or value < 0 or (percentage and value > 100):
                raise bad
            if value > INT64_MAX:
                raise BadValue(
                    plan.where,
                    _short_name(plan.container),
                    name,
                    raw,
                    "a whole number below 2^63",
                    "a whole number < 2^63",
                )
            if result is None:
                result = int(value)
        assert result is not None  # only called for resources the container asks for
        return result

    # -- applying ------------------------------------------------------------------------------
    def _apply(self, plans: list[_Plan]) -> list[str]:
        """Carry out the plans; what was done, one phrase per change, in container order."""
        done: list[str] = []
        for plan in plans:
            container = plan.container
            for count in plan.add_counts:
                set_resource(container, count, str(self.config.defaultCount))
                done.append(f"{count}: {self.config.defaultCount} added to {plan.where}")
            for cores in plan.add_cores:
                set_resource(container, cores, str(EXCLUSIVE_CORES))
                done.append(
                    f"{cores}: {EXCLUSIVE_CORES} added to {plan.where} (whole GPU: exclusive compute)"
                )
            existing = _env_by_name(container) if plan.env else None
            if existing is None:
                continue
            for env_name, value in plan.env.items():
                entry = existing.get(env_name)
                if env_name != self.config.priorityEnv and entry is not None:
                    continue  # the Pod's own NVIDIA_VISIBLE_DEVICES stays
                if entry is not None and entry.get("value") == value and "valueFrom" not in entry:
                    continue
                wanted = {"name": env_name, "value": value}
                env = container.setdefault("env", [])
                if env is None:
                    env = container["env"] = []
                if entry is None:
                    env.append(wanted)
                    done.append(f"{env_name}={value} in {plan.where}")
                else:
                    env[max(i for i, item in enumerate(env) if item is entry)] = wanted
                    # Never quote the value replaced: an env value may be a secret, and this
                    # phrase goes into the reason, the audit event and the logs.
                    done.append(f"{env_name}={value} in {plan.where} (replaces the Pod's {_env_kind(entry)})")
        return done


INT64_MAX = 2**63 - 1
"""HAMi reads vGPU quantities as int64: a larger value is bad input (and has no decimal string)."""


def _env_kind(entry: dict[str, Any]) -> str:
    return "valueFrom" if "valueFrom" in entry else "value"


def _build(config: VgpuConfig, settings: Settings, neighbours: Neighbours) -> Vgpu:
    return Vgpu(config, settings.invalid_annotations, neighbours.renamed())


def _claims(config: VgpuConfig) -> Claims:
    owned: list[OwnedResource] = []
    keys = (
        "countResource",
        "memoryResource",
        "memoryPercentageResource",
        "coresResource",
        "priorityResource",
    )
    for index, device in enumerate(config.devices):
        for key in keys:
            name = getattr(device, key)
            if name is None:
                continue
            owned.append(
                OwnedResource(
                    name,
                    f"vgpu.devices[{index}].{key} ({device.vendor})",
                    is_count=key == "countResource",
                    # The priority only becomes an env var, which a sliced Pod can carry as well.
                    needs_count=device.countResource if name in device.count_qualifiers else None,
                )
            )
    return Claims(owns=tuple(owned))


PLUGIN = MutatorPlugin(
    name=Vgpu.name,
    # After GPU slicing: an opted-in Pod is sliced first, and is then no vGPU Pod.
    order=200,
    config_key="vgpu",
    config_model=VgpuConfig,
    build=_build,
    claims=_claims,
)


def _references_claims(container: dict[str, Any]) -> bool:
    resources = container.get("resources")
    return isinstance(resources, dict) and bool(resources.get("claims"))
