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
- a vGPU Pod with ``spec.nodeName`` is denied; otherwise its schedulerName becomes the vGPU scheduler.

Where CastSlice differs from HAMi, deliberately: values are checked (whole numbers; the memory
percentage and the cores from 0 to 100, where HAMi clamps cores over 100) under the
``invalidAnnotations`` policy instead of reaching the scheduler; the default count goes into
requests and limits alike (the apiserver wants them equal); nothing is appended twice (HAMi appends
env vars blindly, its webhook is never reinvoked; ours can be); memory, percentage or cores make a
vGPU Pod even with ``defaultCount: 0``; HAMi's namespace quota check and
runtimeClassName/core-policy injection need cluster state or belong to its device plugin: not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from function.config import OnInvalidAnnotation, VgpuConfig, VgpuDevice
from function.mutators.base import MutatorResult, Pod, RequestInfo, fit_warning, labels_of, shown
from function.mutators.exclusive_cores import EXCLUSIVE_CORES, whole_gpu_cores
from function.quantity import QuantityError, parse_quantity

DEFAULT_SCHEDULER = "default-scheduler"
VGPU_CONTAINER_LISTS = ("initContainers", "containers")
"""HAMi looks at init and app containers; ephemeral containers cannot ask for resources."""
NAME_LIMIT = 20
"""Container names in warnings are cut to this length, so the advice fits in 120 characters."""
VALUE_LIMIT = 10
"""Likewise for a value quoted in a warning (the denial quotes more)."""


def _where(kind: str, container: dict[str, Any]) -> str:
    return f"{kind}/{container.get('name', '?')}"


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
        return _where(self.kind, self.container)


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
            # The priority alone gives no device (HAMi: only a count keeps the devices visible).
            owned = {name for name in device.resources if name != device.priorityResource}
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

        # Unset means default-scheduler (the apiserver's default): the same rules for both.
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
    def _plan(self, spec: dict[str, Any]) -> tuple[list[_Plan], str, list[tuple[str, str]]]:
        """Per-container plans, the first privileged container's name ("" if none), and the
        privileged containers skipped under ``denyPrivileged: false`` that asked for vGPU (where,
        short name)."""
        plans: list[_Plan] = []
        privileged = ""
        skipped: list[tuple[str, str]] = []
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
                            skipped.append((plan.where, _short_name(container)))
                        continue
                self._plan_container(plan)
                plans.append(plan)
        return plans, privileged, skipped

    def _device_resources(self, container: dict[str, Any]) -> list[str]:
        """The resources making a vGPU Pod that the container asks for (priority is not one)."""
        asked = _asked(container)
        return [
            name
            for device in self.devices
            for name in device.resources
            if name in asked and name != device.priorityResource
        ]

    def _plan_container(self, plan: _Plan) -> None:
        container = plan.container
        asked = _asked(container)
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
        if self.config.overwriteEnv:
            for env_name, owned in self._visible_env.items():
                if not owned & asked:
                    plan.env.setdefault(env_name, "none")

    def _check(self, plan: _Plan, device: VgpuDevice, name: str) -> int:
        """The resource's value as an integer (limits first): BadValue unless every value given is a
        whole number, from 0 to 100 for the memory percentage and the cores (a share of the device's
        compute in percent; HAMi clamps larger values, we refuse them)."""
        percentage = name in (device.memoryPercentageResource, device.coresResource)
        accepted = "a whole number from 0 to 100" if percentage else "a whole number (0 or more)"
        short = "a whole number 0-100" if percentage else "a whole number >= 0"
        result: int | None = None
        for _, section in _sections(plan.container):
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
                _set_in_limits_and_requests(container, count, str(self.config.defaultCount))
                done.append(f"{count}: {self.config.defaultCount} added to {plan.where}")
            for cores in plan.add_cores:
                _set_in_limits_and_requests(container, cores, str(EXCLUSIVE_CORES))
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
                    done.append(f"{env_name}={value} in {plan.where} (was {_env_value(entry)})")
        return done


def _set_in_limits_and_requests(container: dict[str, Any], name: str, value: str) -> None:
    """Both sections: the apiserver wants an extended resource's request equal to its limit (and
    has already copied limits into requests before the webhook sees the Pod)."""
    resources = container.setdefault("resources", {})
    for section_name in ("limits", "requests"):
        section = resources.get(section_name)
        if not isinstance(section, dict):
            section = resources[section_name] = {}
        section[name] = value


def _env_value(entry: dict[str, Any]) -> str:
    if "valueFrom" in entry:
        return "valueFrom"
    return shown(entry.get("value", ""))
