"""GPU slicing (CastSlice): opted-in Pods trade whole GPUs for a number of shared-GPU slices.

Semantics from the CastSlice design (seed 000):
- ``castops.io/optimize`` must be exactly ``"true"``; anything else is as if absent;
- the slice count is ``castops.io/slice-ratio`` (a whole number; see slice_ratio.py), else the preset of
  ``castops.io/workload-type``, else ``defaultSlices`` (1);
- in every init, app and ephemeral container, the source resource (``nvidia.com/gpu``) is removed
  and the target (``nvidia.com/gpu-shared``) set to the slice count, in limits *and* requests:
  the apiserver rejects an extended resource with a request but no equal limit.

With the vGPU mutator on, an opted-in Pod that also asks for a HAMi resource of the device that
owns the source (``nvidia.com/gpumem``, ``gpucores``, ...) is bad input: slicing would take away
the count those resources qualify, and the vGPU mutator would add it back (see docs/vgpu.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

from pydantic import Field, field_validator, model_validator

from function.core.configmerge import merge_map
from function.core.configtypes import (
    MutatorConfig,
    OnInvalidAnnotation,
    PositiveInt,
    ResourceName,
    check_resource_name,
)
from function.core.mutators.base import InvalidAnnotation, MutatorResult, RequestContext
from function.core.mutators.registry import Claims, MutatorPlugin, Neighbours, Rename, Settings
from function.core.mutators.slice_ratio import accepted, accepted_short, parse_slice_ratio
from function.core.pod import (
    Pod,
    annotations_of,
    container_label,
    fit_warning,
    iter_containers,
    resource_sections,
    set_resource,
    shown,
)
from function.core.quantity import QuantityError, parse_quantity

OPTIMIZE = "castops.io/optimize"
NOT_SLICED = "Pod not sliced"
WORKLOAD_TYPE = "castops.io/workload-type"
SLICE_RATIO = "castops.io/slice-ratio"


DEFAULT_PRESETS: Mapping[str, int] = MappingProxyType({"training": 4, "inference": 2, "batch": 2, "dev": 1})


class GpuSlicingConfig(MutatorConfig):
    """CastSlice's own behaviour: opt-in slicing of a whole-GPU resource into shares."""

    enabled: bool = True
    sourceResource: ResourceName = "nvidia.com/gpu"
    targetResource: ResourceName = "nvidia.com/gpu-shared"
    presets: dict[str, PositiveInt] = Field(default_factory=lambda: dict(DEFAULT_PRESETS))
    """Merged with the defaults: name only the presets to change; ``name: null`` removes one."""
    replacePresets: bool = False
    """True: ``presets`` is the whole map, as written (no default preset is kept)."""
    defaultSlices: PositiveInt = 1
    """Slices for an opted-in Pod with neither slice-ratio nor workload-type (the seed's v0.1.0 default)."""
    maxSliceRatio: PositiveInt = 1000
    """Upper bound for castops.io/slice-ratio: larger values are bad input, not a quantity overflow."""

    @model_validator(mode="before")
    @classmethod
    def _merge_presets(cls, data: Any) -> Any:
        if isinstance(data, dict) and "presets" in data:
            if data["presets"] is None:  # presets: null, like an absent key: the defaults
                return {key: value for key, value in data.items() if key != "presets"}
            replace = data.get("replacePresets") is True
            data = {**data, "presets": merge_map(DEFAULT_PRESETS, data["presets"], replace)}
        return data

    @field_validator("sourceResource", "targetResource")
    @classmethod
    def _resource(cls, value: str) -> str:
        return check_resource_name(value)

    @model_validator(mode="after")
    def _distinct_resources(self) -> GpuSlicingConfig:
        if self.sourceResource == self.targetResource:
            raise ValueError("sourceResource and targetResource must differ")
        if not self.presets:
            raise ValueError("presets must name at least one workload type")
        return self

    @model_validator(mode="after")
    def _within_max_slice_ratio(self) -> GpuSlicingConfig:
        """A preset (or the default count) above maxSliceRatio would slice a Pod into more shares
        than an explicit castops.io/slice-ratio may ask for: refused at load, not per Pod."""
        above = [
            f"presets.{name}: {count}" for name, count in self.presets.items() if count > self.maxSliceRatio
        ]
        if self.defaultSlices > self.maxSliceRatio:
            above.append(f"defaultSlices: {self.defaultSlices}")
        if above:
            raise ValueError(
                f"{', '.join(above)} {'is' if len(above) == 1 else 'are'} above maxSliceRatio "
                f"({self.maxSliceRatio}); "
                "lower it or raise maxSliceRatio"
            )
        return self


class GpuSlicing:
    name = "gpu-slicing"

    def __init__(
        self, config: GpuSlicingConfig, on_invalid: OnInvalidAnnotation, vgpu_resources: Collection[str] = ()
    ) -> None:
        """``vgpu_resources``: resources of other mutators that qualify ``sourceResource`` (the
        vGPU memory, cores, ...; empty when vGPU is off); an opted-in Pod asking for one is not
        sliced, since the vGPU mutator would add back the count slicing removed."""
        self.config = config
        self.on_invalid = on_invalid
        self.vgpu_resources = frozenset(vgpu_resources)
        self._presets_text = ", ".join(f"{key} ({value})" for key, value in sorted(config.presets.items()))
        self._presets_short = ", ".join(sorted(config.presets))

    def slice_count(self, annotations: dict[str, object]) -> tuple[int, str, tuple[str, ...]]:
        """The slice count, where it came from, and warnings; InvalidAnnotation when unusable."""
        if SLICE_RATIO in annotations:
            raw = annotations[SLICE_RATIO]
            limit = self.config.maxSliceRatio
            slices = parse_slice_ratio(raw, limit)
            if slices is None:
                raise InvalidAnnotation(SLICE_RATIO, raw, accepted(limit), accepted_short(limit), NOT_SLICED)
            warnings: tuple[str, ...] = ()
            try:
                self._check_workload_type(annotations)
            except InvalidAnnotation as typo:
                # slice-ratio takes priority (the seed): slice, but say the workload type is a typo.
                warnings = (
                    fit_warning(
                        f"castslice: {WORKLOAD_TYPE}={shown(typo.value)} unknown"
                        f" (slice-ratio {slices} applies)",
                        f"; use {self._presets_short}",
                    ),
                )
            # "08" and "+8" mean 8: the reason shows both what the Pod said and how it was read.
            origin = (
                f"{SLICE_RATIO}={raw}"
                if raw == str(slices)
                else f"{SLICE_RATIO}={shown(raw)}, read as {slices}"
            )
            return slices, origin, warnings
        if WORKLOAD_TYPE in annotations:
            workload = self._check_workload_type(annotations)
            return self.config.presets[workload], f"{WORKLOAD_TYPE}={workload} preset", ()
        return self.config.defaultSlices, "default", ()

    def _check_workload_type(self, annotations: dict[str, object]) -> str:
        if WORKLOAD_TYPE not in annotations:
            return ""
        # Present but null (or any non-string) is a bad value, not an absent annotation.
        workload = annotations[WORKLOAD_TYPE]
        if not isinstance(workload, str) or workload not in self.config.presets:
            raise InvalidAnnotation(
                WORKLOAD_TYPE, workload, self._presets_text, self._presets_short, NOT_SLICED
            )
        return workload

    def mutate(self, pod: Pod, ctx: RequestContext) -> MutatorResult:
        annotations = annotations_of(pod)
        opt_in = annotations.get(OPTIMIZE)
        if opt_in != "true":
            if opt_in is None:
                return MutatorResult.unchanged(f"not opted in ({OPTIMIZE} absent)")
            return MutatorResult.unchanged(f'not opted in ({OPTIMIZE} is {shown(opt_in)}, not "true")')

        try:
            slices, origin, warnings = self.slice_count(annotations)
        except InvalidAnnotation as bad:
            if self.on_invalid is OnInvalidAnnotation.deny:
                return MutatorResult.denied(f"castslice: {bad.message}")
            return MutatorResult.unchanged(bad.message, bad.warning)

        conflict = self._vgpu_conflict(pod)
        if conflict:
            where, resource = conflict
            if self.on_invalid is OnInvalidAnnotation.deny:
                return MutatorResult.denied(
                    f"castslice: {where} asks for {resource}, a HAMi vGPU resource, and the Pod opts into "
                    f"GPU slicing ({OPTIMIZE}=true); use one or the other"
                )
            return MutatorResult.unchanged(
                f"opted in, but {where} asks for HAMi vGPU resource {resource}: not sliced",
                fit_warning(
                    f"castslice: Pod not sliced, {resource} is a HAMi vGPU resource",
                    f"; remove {OPTIMIZE} or it",
                ),
            )

        source, target = self.config.sourceResource, self.config.targetResource
        sliced, zero = [], []
        for kind, index, container in iter_containers(pod):
            asked = [section[source] for _, section in resource_sections(container) if source in section]
            if not asked:
                continue
            if all(_is_zero(quantity) for quantity in asked):
                # nvidia.com/gpu: 0 (common in templated charts) asks for no GPU: it gets no slice.
                zero.append(container_label(kind, index, container))
                continue
            for _, section in resource_sections(container):
                section.pop(source, None)
            set_resource(container, target, str(slices))
            sliced.append(container_label(kind, index, container))

        left = f"; {', '.join(zero)} asks for 0 {source}, left alone" if zero else ""
        if not sliced:
            return MutatorResult.unchanged(f"opted in, but no container requests {source}{left}", *warnings)
        return MutatorResult.mutated(
            f"{source} -> {target}: {slices} ({origin}) in {', '.join(sliced)}{left}", *warnings
        )

    def _vgpu_conflict(self, pod: Pod) -> tuple[str, str] | None:
        """The first container asking for a vGPU resource, and that resource, if any."""
        if not self.vgpu_resources:
            return None
        for kind, index, container in iter_containers(pod):
            for _, section in resource_sections(container):
                for resource in section:
                    if resource in self.vgpu_resources:
                        return container_label(kind, index, container), resource
        return None


def _is_zero(quantity: object) -> bool:
    try:
        return parse_quantity(quantity) == 0
    except QuantityError:
        return False  # not ours to judge: the apiserver rejects a malformed quantity itself


def _build(config: GpuSlicingConfig, settings: Settings, neighbours: Neighbours) -> GpuSlicing:
    return GpuSlicing(config, settings.invalid_annotations, neighbours.qualifiers_of(config.sourceResource))


def _claims(config: GpuSlicingConfig) -> Claims:
    return Claims(
        renames=(
            Rename(
                config.sourceResource,
                config.targetResource,
                "gpuSlicing.sourceResource",
                "gpuSlicing.targetResource",
            ),
        )
    )


PLUGIN = MutatorPlugin(
    name=GpuSlicing.name,
    # An explicit per-Pod opt-in (castops.io/optimize) wins over cluster-wide policies: first.
    order=100,
    config_key="gpuSlicing",
    config_model=GpuSlicingConfig,
    build=_build,
    claims=_claims,
)
