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

from collections.abc import Collection

from function.config import GpuSlicingConfig, OnInvalidAnnotation
from function.mutators.base import MutatorResult, Pod, RequestInfo, annotations_of, fit_warning, shown
from function.mutators.slice_ratio import accepted, accepted_short, parse_slice_ratio
from function.quantity import QuantityError, parse_quantity
from function.rules import iter_containers

OPTIMIZE = "castops.io/optimize"
WORKLOAD_TYPE = "castops.io/workload-type"
SLICE_RATIO = "castops.io/slice-ratio"


class InvalidAnnotation(Exception):
    """An opted-in Pod carries an annotation value CastSlice cannot act on."""

    def __init__(self, annotation: str, value: object, accepted: str, accepted_short: str = "") -> None:
        self.annotation = annotation
        self.value = value
        self.accepted = accepted
        self.accepted_short = accepted_short or accepted
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return (
            f"annotation {self.annotation}: {shown(self.value, 64)} is not valid; accepted: {self.accepted}"
        )

    @property
    def warning(self) -> str:
        # Warnings reach kubectl and are capped at 120 characters by the apiserver.
        return fit_warning(
            f"castslice: {self.annotation}={shown(self.value)} ignored, Pod not sliced",
            f"; use {self.accepted_short}",
        )


class GpuSlicing:
    name = "gpu-slicing"

    def __init__(
        self, config: GpuSlicingConfig, on_invalid: OnInvalidAnnotation, vgpu_resources: Collection[str] = ()
    ) -> None:
        """``vgpu_resources``: the vGPU mutator's resources that qualify ``sourceResource`` (empty
        when vGPU is off); an opted-in Pod asking for one is not sliced."""
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
                raise InvalidAnnotation(SLICE_RATIO, raw, accepted(limit), accepted_short(limit))
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
        workload = annotations.get(WORKLOAD_TYPE)
        if workload is None:
            return ""
        if not isinstance(workload, str) or workload not in self.config.presets:
            raise InvalidAnnotation(WORKLOAD_TYPE, workload, self._presets_text, self._presets_short)
        return workload

    def mutate(self, pod: Pod, request: RequestInfo) -> MutatorResult:
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
            resources = container.get("resources")
            if not isinstance(resources, dict):
                continue
            sections = [resources.get("limits"), resources.get("requests")]
            asked = [sec[source] for sec in sections if isinstance(sec, dict) and source in sec]
            if not asked:
                continue
            if all(_is_zero(quantity) for quantity in asked):
                # nvidia.com/gpu: 0 (common in templated charts) asks for no GPU: it gets no slice.
                zero.append(f"{kind}/{container.get('name', index)}")
                continue
            for section_name in ("limits", "requests"):
                section = resources.get(section_name)
                if not isinstance(section, dict):
                    section = resources[section_name] = {}
                section.pop(source, None)
                section[target] = str(slices)
            sliced.append(f"{kind}/{container.get('name', index)}")

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
            resources = container.get("resources")
            if not isinstance(resources, dict):
                continue
            for section_name in ("limits", "requests"):
                section = resources.get(section_name)
                if isinstance(section, dict):
                    for resource in section:
                        if resource in self.vgpu_resources:
                            return f"{kind}/{container.get('name', index)}", resource
        return None


def _is_zero(quantity: object) -> bool:
    try:
        return parse_quantity(quantity) == 0
    except QuantityError:
        return False  # not ours to judge: the apiserver rejects a malformed quantity itself
