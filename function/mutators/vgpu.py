"""vGPU redirection (HAMi's admission webhook): Pods asking for vGPU resources go to the vGPU scheduler.

Semantics of HAMi's current webhook (``pkg/scheduler/webhook.go``, ``pkg/device/*/device.go``):
- the label ``hami.io/webhook: ignore`` on the Pod leaves it alone (HAMi's objectSelector);
- a Pod with no containers is denied, before anything else is looked at;
- a Pod naming another scheduler is left alone entirely; ``default-scheduler`` counts as another
  scheduler only when ``forceOverwriteDefaultScheduler`` is off (``forceSchedulerName`` goes further
  than HAMi and takes every Pod);
- in every init and app container, a device resource (count, memory, memory percentage, cores,
  priority) makes the Pod a vGPU Pod; memory, percentage or cores without a count get
  ``defaultCount``; the priority resource becomes the env ``CUDA_TASK_PRIORITY``; with
  ``overwriteEnv`` a container with none of a device's resources gets ``NVIDIA_VISIBLE_DEVICES=none``;
- a vGPU Pod with a privileged container is denied, naming the container (``denyPrivileged: false``
  restores HAMi's old behaviour: privileged containers are skipped, with a warning here);
- a vGPU Pod with ``spec.nodeName`` is denied; otherwise its schedulerName becomes the vGPU scheduler.

Where CastSlice differs from HAMi, deliberately: values are checked (whole numbers, a percentage
from 0 to 100) under the ``invalidAnnotations`` policy instead of reaching the scheduler; the
default count goes into requests and limits alike (the apiserver wants them equal); nothing is
appended twice (HAMi appends env vars blindly, its webhook is never reinvoked; ours can be); any
vGPU resource makes a vGPU Pod even with ``defaultCount: 0``; HAMi's namespace quota check and
runtimeClassName/core-policy injection need cluster state or belong to its device plugin: not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from function.config import OnInvalidAnnotation, VgpuConfig, VgpuDevice
from function.mutators.base import MutatorResult, Pod, RequestInfo, labels_of, shown
from function.quantity import QuantityError, parse_quantity

DEFAULT_SCHEDULER = "default-scheduler"
VGPU_CONTAINER_LISTS = ("initContainers", "containers")
"""HAMi looks at init and app containers; ephemeral containers cannot ask for resources."""


class BadValue(Exception):
    """A vGPU resource value CastSlice cannot hand to the vGPU scheduler."""

    def __init__(self, where: str, resource: str, value: object, accepted: str, accepted_short: str) -> None:
        self.where = where
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
        # Warnings reach kubectl and are capped at 120 characters by the apiserver.
        return (
            f"castslice: {self.resource}={shown(self.value)} in {self.where} ignored, "
            f"Pod not redirected; use {self.accepted_short}"
        )[:120]


@dataclass
class _Plan:
    """What one pass would do to one container, worked out before anything is touched."""

    kind: str
    container: dict[str, Any]
    asks: list[str] = field(default_factory=list)
    add_counts: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.kind}/{self.container.get('name', '?')}"


def _sections(container: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return []
    return [
        (name, section) for name in ("limits", "requests") if isinstance(section := resources.get(name), dict)
    ]


def _asked(container: dict[str, Any]) -> set[str]:
    return {name for _, section in _sections(container) for name in section}


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
            owned = set(device.resources)
            if device.countResource in renamed:
                owned.add(renamed[device.countResource])
            previous = self._visible_env.get(device.visibleDevicesEnv, frozenset())
            self._visible_env[device.visibleDevicesEnv] = previous | owned

    # -- the decision ------------------------------------------------------------------------
    def mutate(self, pod: Pod, request: RequestInfo) -> MutatorResult:
        config = self.config
        if labels_of(pod).get(config.optOutLabel) == config.optOutValue:
            return MutatorResult.unchanged(f"opted out ({config.optOutLabel}={config.optOutValue})")
        spec = pod.get("spec")
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(containers, list) or not containers:
            return MutatorResult.denied(
                "castslice: Pod has no containers; spec.containers needs at least one"
            )

        scheduler = spec.get("schedulerName") or ""
        left_alone = self._other_scheduler(scheduler)
        if left_alone:
            return MutatorResult.unchanged(left_alone)

        try:
            plans, privileged, skipped = self._plan(spec)
        except BadValue as bad:
            if self.on_invalid is OnInvalidAnnotation.deny:
                return MutatorResult.denied(f"castslice: {bad.message}")
            return MutatorResult.unchanged(bad.message, bad.warning)

        warnings = tuple(
            f"castslice: {where} is privileged, so its vGPU resources are ignored; the Pod may stay Pending"
            for where in skipped
        )
        warnings = tuple(warning[:120] for warning in warnings)
        vgpu_pod = any(plan.asks for plan in plans)
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
        notes = [f"privileged {where} skipped (denyPrivileged: false)" for where in skipped]
        asks = ", ".join(f"{plan.where} ({', '.join(plan.asks)})" for plan in plans if plan.asks)
        subject = f"vGPU Pod: {asks}" if vgpu_pod else "not a vGPU Pod"
        if done:
            return MutatorResult.mutated("; ".join([subject, *done, *notes]), *warnings)
        if vgpu_pod:
            subject += f"; already for {config.schedulerName}"
        return MutatorResult.unchanged("; ".join([subject, *notes]), *warnings)

    def _other_scheduler(self, scheduler: str) -> str:
        """Why a Pod naming ``scheduler`` is left alone, or "" when the vGPU mutator handles it."""
        config = self.config
        if scheduler in ("", config.schedulerName):
            return ""
        if scheduler == DEFAULT_SCHEDULER:
            if config.forceOverwriteDefaultScheduler:
                return ""
            return f"Pod names {DEFAULT_SCHEDULER} and forceOverwriteDefaultScheduler is false: left alone"
        if config.forceSchedulerName:
            return ""
        return f"Pod names scheduler {shown(scheduler, 64)}: left alone"

    # -- planning: every check before any change -----------------------------------------------
    def _plan(self, spec: dict[str, Any]) -> tuple[list[_Plan], str, list[str]]:
        """Per-container plans, the first privileged container's name ("" if none), and the
        privileged containers skipped under ``denyPrivileged: false`` that asked for vGPU."""
        plans: list[_Plan] = []
        privileged = ""
        skipped: list[str] = []
        for kind in VGPU_CONTAINER_LISTS:
            listed = spec.get(kind)
            if not isinstance(listed, list):
                continue
            for container in listed:
                if not isinstance(container, dict):
                    continue
                plan = _Plan(kind, container)
                if _is_privileged(container):
                    privileged = privileged or str(container.get("name", "?"))
                    if not self.config.denyPrivileged:
                        # HAMi before the fix: a privileged container is not looked at at all.
                        if self._device_resources(container):
                            skipped.append(plan.where)
                        continue
                self._plan_container(plan)
                plans.append(plan)
        return plans, privileged, skipped

    def _device_resources(self, container: dict[str, Any]) -> list[str]:
        asked = _asked(container)
        return [name for device in self.devices for name in device.resources if name in asked]

    def _plan_container(self, plan: _Plan) -> None:
        container = plan.container
        asked = _asked(container)
        for device in self.devices:
            mine = [name for name in device.resources if name in asked]
            if not mine:
                continue
            values = {name: self._check(plan.where, device, name, container) for name in mine}
            plan.asks.extend(mine)
            if (
                device.countResource not in asked
                and self.config.defaultCount > 0
                and any(name in asked for name in device.count_qualifiers)
            ):
                plan.add_counts.append(device.countResource)
            if device.priorityResource in values:
                # The first device of the table wins when two map to the same env var.
                plan.env.setdefault(self.config.priorityEnv, str(values[device.priorityResource]))
        if self.config.overwriteEnv:
            for env_name, owned in self._visible_env.items():
                if not owned & asked:
                    plan.env.setdefault(env_name, "none")

    def _check(self, where: str, device: VgpuDevice, name: str, container: dict[str, Any]) -> int:
        """The resource's value as an integer (limits first): BadValue unless every value given is a
        whole number, from 0 to 100 for a percentage."""
        percentage = name == device.memoryPercentageResource
        accepted = "a whole number from 0 to 100" if percentage else "a whole number (0 or more)"
        short = "0-100" if percentage else "a whole number"
        result: int | None = None
        for _, section in _sections(container):
            if name not in section:
                continue
            raw = section[name]
            try:
                value = parse_quantity(raw)
            except QuantityError:
                raise BadValue(where, name, raw, accepted, short) from None
            if value.denominator != 1 or value < 0 or (percentage and value > 100):
                raise BadValue(where, name, raw, accepted, short)
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
                resources = container.setdefault("resources", {})
                for section_name in ("limits", "requests"):
                    section = resources.get(section_name)
                    if not isinstance(section, dict):
                        section = resources[section_name] = {}
                    section[count] = str(self.config.defaultCount)
                done.append(f"{count}: {self.config.defaultCount} added to {plan.where}")
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
                    done.append(f"{env_name}={value} in {plan.where} (was {_env_value(entry)})")
        return done


def _env_value(entry: dict[str, Any]) -> str:
    if "valueFrom" in entry:
        return "valueFrom"
    return shown(entry.get("value", ""))
