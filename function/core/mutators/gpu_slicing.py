"""GPU slicing (CastSlice): opted-in Pods trade whole GPUs for a number of shared-GPU slices.

Semantics (the CastSlice design):
- ``castops.io/optimize`` must be exactly ``"true"``; anything else is as if absent;
- the slice count is ``castops.io/slice-ratio`` (a whole number; see slice_ratio.py), else the preset of
  ``castops.io/workload-type``, else ``defaultSlices`` (1);
- in every init, app and ephemeral container, the source resource (``nvidia.com/gpu``) is removed
  and the target (``nvidia.com/gpu-shared``) set to the slice count, in limits *and* requests:
  the apiserver rejects an extended resource with a request but no equal limit.

With ``backend: dra`` (function/core/dra.py) the GPU request is removed instead, and the Pod gets one
Pod-level claim from the ResourceClaimTemplate of its slice count, which every container that asked
for a GPU references: its GPU containers share one device and the slices of it. The slice count is
then at most what one device holds; a larger one is bad input.

An opted-in Pod that also asks for a HAMi resource of the device that owns the source
(``nvidia.com/gpumem``, ``gpucores``, ...) is bad input, vGPU mutator on or off: with it on, slicing
would take away the count those resources qualify and the vGPU mutator would add it back (see
docs/vgpu.md); with it off, the sliced Pod would keep asking for HAMi's resources and stay Pending.

A slice count never silently changes what a Pod asked for: the reason names the original count,
the Pod records it (``castops.io/original-gpu-request``), a container asking for more than one GPU
is not sliced unless ``slice-ratio`` says so (time slices of one device may all land on one GPU,
and a job on several GPUs, tensor parallel or NCCL, refuses duplicate devices), and an explicit
ratio below the count is warned about. With ``requireAdvertisedTarget`` a Pod is sliced only to a
resource some Node advertises (the cluster view's Nodes). Every reason to leave a Pod whole comes
before the check of HAMi's resources: a Pod left whole may become a vGPU Pod, and what the vgpu
mutator adds must not get it denied on the next pass.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from function.core.configmerge import merge_map
from function.core.configtypes import (
    MutatorConfig,
    OnInvalidAnnotation,
    PositiveInt,
    ResourceName,
    check_resource_name,
)
from function.core.dra import TEMPLATES, TEMPLATES_INDEX, DraConfig, Template, template_key, templates
from function.core.mutators.base import NO_KEY, InvalidAnnotation, Keys, MutatorResult, Reads, RequestContext
from function.core.mutators.registry import Claims, MutatorPlugin, Neighbours, Rename, Settings
from function.core.mutators.slice_ratio import accepted, accepted_short, parse_slice_ratio
from function.core.pod import (
    CONTAINER_LISTS,
    Pod,
    annotations_of,
    container_label,
    ensure_map,
    fit_warning,
    iter_containers,
    resource_sections,
    set_resource,
    shown,
)
from function.core.quantity import QuantityError, parse_quantity
from function.core.view import NODES, WatchSpec

OPTIMIZE = "castops.io/optimize"
NOT_SLICED = "Pod not sliced"
WORKLOAD_TYPE = "castops.io/workload-type"
SLICE_RATIO = "castops.io/slice-ratio"
ORIGINAL_REQUEST = "castops.io/original-gpu-request"
"""What a sliced Pod asked for, per container (``containers/vllm: nvidia.com/gpu=8``)."""
READS = Reads(
    labels=NO_KEY,
    annotations=Keys(frozenset({OPTIMIZE, WORKLOAD_TYPE, SLICE_RATIO, ORIGINAL_REQUEST})),
    paths=(*(("spec", kind) for kind in CONTAINER_LISTS), ("spec", "resourceClaims")),
)
"""What slicing reads and writes of a Pod: its own annotations, the containers' resources and the
Pod's claims (the Nodes and templates it reads come from the view, fixed for the review)."""

HAMI_QUALIFIERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"nvidia.com/gpu": ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")}
)
"""HAMi's resources that qualify NVIDIA's GPU count (HAMi's documentation), for when the vGPU mutator is off
and so declares none: a HAMi Pod opted into slicing must not lose its count either way."""


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
    """Slices for an opted-in Pod with neither slice-ratio nor workload-type (v0.1.0's default)."""
    maxSliceRatio: PositiveInt = 1000
    """Upper bound for castops.io/slice-ratio: larger values are bad input, not a quantity overflow."""
    backend: Literal["extendedResource", "dra"] = "extendedResource"
    """extendedResource: containers get ``targetResource`` slices (a device plugin shares the GPU);
    dra: the Pod gets a ResourceClaim for the slices of one device (Kubernetes 1.34+, see docs/dra.md)."""
    dra: DraConfig = Field(default_factory=DraConfig)
    """How a slice count becomes a claim (``backend: dra`` only)."""
    requireAdvertisedTarget: bool = False
    """Slice only when some Node advertises ``targetResource`` (its status.allocatable, from a
    watch of the Nodes); otherwise the Pod is admitted whole with a warning. The shipped manifests
    turn it on; off in the built-in defaults, so that ``castslice serve`` and ``castslice mutate``
    need no cluster. Leave it off on a cluster whose autoscaler adds GPU nodes on demand (no node
    offers the shared resource until a Pod asks for it). ``backend: extendedResource`` only."""

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

    @model_validator(mode="after")
    def _within_one_device(self) -> GpuSlicingConfig:
        """With the dra backend a Pod's slices come from one device: a preset (or the default
        count) above what a device holds would make a claim no node can ever satisfy."""
        if self.backend != "dra":
            return self
        most = self.dra.max_slices
        above = [f"presets.{name}: {count}" for name, count in self.presets.items() if count > most]
        if self.defaultSlices > most:
            above.append(f"defaultSlices: {self.defaultSlices}")
        if above:
            raise ValueError(
                f"{', '.join(above)} {'is' if len(above) == 1 else 'are'} above what one device holds "
                f"with backend dra: {self.dra.holds()}"
            )
        return self

    @property
    def slice_limit(self) -> int:
        """The largest slice count a Pod may ask for."""
        if self.backend == "dra":
            return min(self.maxSliceRatio, self.dra.max_slices)
        return self.maxSliceRatio


class GpuSlicing:
    name = "gpu-slicing"
    idempotent = True

    def reads(self, ctx: RequestContext) -> Reads:
        return READS

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
        dra = config.dra if config.backend == "dra" else None
        self.dra = dra
        self._templates: tuple[Template, ...] = templates(dra) if dra is not None else ()
        self._device_holds = (
            f" (one {dra.deviceClassName} device holds {dra.holds()})"
            if dra is not None and dra.max_slices < config.maxSliceRatio
            else ""
        )

    def slice_count(self, annotations: dict[str, object]) -> tuple[int, str, tuple[str, ...]]:
        """The slice count, where it came from, and warnings; InvalidAnnotation when unusable."""
        if SLICE_RATIO in annotations:
            raw = annotations[SLICE_RATIO]
            limit = self.config.slice_limit
            slices = parse_slice_ratio(raw, limit)
            if slices is None:
                raise InvalidAnnotation(
                    SLICE_RATIO, raw, accepted(limit) + self._device_holds, accepted_short(limit), NOT_SLICED
                )
            warnings: tuple[str, ...] = ()
            try:
                self._check_workload_type(annotations)
            except InvalidAnnotation as typo:
                # slice-ratio takes priority (as designed): slice, but say the workload type is a typo.
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

        # The order matters: every reason to leave the Pod whole comes before the check of HAMi's
        # resources, since a Pod left whole may become a vGPU Pod (the vgpu mutator adds
        # nvidia.com/gpucores to a whole GPU), and the next pass must leave it whole again, not
        # deny it for what the vgpu mutator added (docs/engine.md, "Mutators that compose").
        scan = self._scan(pod)
        left_whole = self._multi_gpu(scan, origin, warnings) or self._unoffered(scan, ctx, warnings)
        if left_whole is not None:
            return left_whole
        conflict = self._vgpu_conflict(scan)
        if conflict is not None:
            return conflict
        if self.dra is not None:
            return self._claim(pod, scan, slices, origin, warnings, ctx)
        return self._extended(pod, scan, slices, origin, warnings, ctx)

    def _scan(self, pod: Pod) -> list[_Asks]:
        """Every container that asks for the source resource or for a vGPU resource, read once:
        the one pass over the Pod's resources every later step works from."""
        source, vgpu = self.config.sourceResource, self.vgpu_resources
        found: list[_Asks] = []
        for kind, index, container in iter_containers(pod):
            quantities: list[object] = []
            hami: list[str] = []
            for _, section in resource_sections(container):
                for name, quantity in section.items():
                    if name == source:
                        quantities.append(quantity)
                    elif name in vgpu and name not in hami:
                        hami.append(name)
            if quantities or hami:
                count = _count(quantities) if quantities else None
                zero = bool(quantities) and all(_is_zero(quantity) for quantity in quantities)
                label = container_label(kind, index, container)
                found.append(
                    _Asks(kind, index, label, container, bool(quantities), count, zero, tuple(sorted(hami)))
                )
        return found

    def _multi_gpu(self, scan: list[_Asks], origin: str, warnings: tuple[str, ...]) -> MutatorResult | None:
        """Left whole when a container asks for more than one GPU and no castops.io/slice-ratio
        says to slice it: time slices of one device may all land on one physical GPU, and a job
        spread over several GPUs (torchrun, NCCL, tensor parallel vLLM) refuses duplicate
        devices and fails at start. An explicit ratio is the user's own choice (sliced; a ratio
        below the count is warned about, ``_asked``)."""
        if origin.startswith(SLICE_RATIO):
            return None
        source = self.config.sourceResource
        several = [asks for asks in scan if asks.gpus is not None and asks.gpus > 1]
        if not several:
            return None
        named = ", ".join(f"{asks.label} asks for {asks.gpus}" for asks in several)
        first = several[0]
        return MutatorResult.unchanged(
            f"opted in, but {named} {source}: not sliced, a job on several GPUs needs distinct devices "
            f"and the slices of one device may all land on one GPU; {SLICE_RATIO} slices it anyway "
            f"({_asked_text(scan, source)})",
            *warnings,
            fit_warning(
                f"castslice: multi-GPU {first.label} ({first.gpus} {source}) not sliced",
                f"; set {SLICE_RATIO} to force",
            ),
        )

    def _unoffered(
        self, scan: list[_Asks], ctx: RequestContext, warnings: tuple[str, ...]
    ) -> MutatorResult | None:
        """Left whole when no Node advertises the target resource: the device plugin keeps
        ``nvidia.com/gpu`` unless told to rename shared GPUs, and a Pod asking for a resource no
        node offers stays Pending for ever. Only with the extendedResource backend and
        ``requireAdvertisedTarget``; a view that cannot tell (offline without --cluster, or a
        state file without Nodes) is noted in the reason by ``_offer_note``."""
        if self.dra is not None or not self.config.requireAdvertisedTarget:
            return None
        view = ctx.cluster
        if not view.available or not view.synced(NODES.index):
            return None
        if not any(asks.asks_source and not asks.zero for asks in scan):
            return None  # nothing to slice: said by _extended
        target = self.config.targetResource
        # One lookup: the Nodes are grouped by what they advertise. The index is looked at only
        # when that group is empty (a view holding no Node at all cannot tell).
        if view.group(NODES.index, target) or not view.index(NODES.index):
            return None
        source = self.config.sourceResource
        return MutatorResult.unchanged(
            f"opted in, but no node advertises {target} (status.allocatable): not sliced, a Pod asking "
            f"for it would stay Pending; the device plugin must offer it (docs/gpu-slicing.md) "
            f"({_asked_text(scan, source)})",
            *warnings,
            fit_warning(f"castslice: not sliced, no node offers {target}", f"; Pod keeps its {source}"),
        )

    def _vgpu_conflict(self, scan: list[_Asks]) -> MutatorResult | None:
        """An opted-in Pod about to be sliced that asks for a vGPU resource: bad input (see the
        module). The first container asking for one is named, with its resources in name order,
        so the webhook (the apiserver serializes resources sorted) and ``castslice mutate`` (a
        file's own order) name the same one."""
        asks = next((asks for asks in scan if asks.hami), None)
        if asks is None:
            return None
        resources = ", ".join(asks.hami)
        several = len(asks.hami) > 1
        if self.on_invalid is OnInvalidAnnotation.deny:
            return MutatorResult.denied(
                f"castslice: {asks.label} asks for {resources}, "
                f"{'HAMi vGPU resources' if several else 'a HAMi vGPU resource'}, and the Pod opts into "
                f"GPU slicing ({OPTIMIZE}=true); use one or the other "
                f"({_asked_text(scan, self.config.sourceResource)})"
            )
        return MutatorResult.unchanged(
            f"opted in, but {asks.label} asks for HAMi vGPU {'resources' if several else 'resource'} "
            f"{resources}: not sliced",
            fit_warning(
                f"castslice: Pod not sliced, {asks.hami[0]} is a HAMi vGPU resource",
                f"; remove {OPTIMIZE} or it",
            ),
        )

    def _asked(self, asking: list[_Asks], slices: int) -> tuple[str, str, list[str]]:
        """What the slicing containers asked for: the record (``ORIGINAL_REQUEST``), the words for
        the reason (a count other than one is named) and the warnings for counts above ``slices``."""
        source, target = self.config.sourceResource, self.config.targetResource
        record = "; ".join(f"{asks.label}: {source}={_text(asks.gpus)}" for asks in asking)
        where = ", ".join(
            asks.label if asks.gpus == 1 else f"{asks.label} (asked {_text(asks.gpus)} {source})"
            for asks in asking
        )
        fewer = [
            fit_warning(
                f"castslice: {asks.label} asked for {asks.gpus} {source}, gets {slices} {target}",
                "; a multi-GPU job may not run",
            )
            for asks in asking
            if asks.gpus is not None and asks.gpus > slices
        ]
        return record, where, fewer

    @staticmethod
    def _slicing(
        scan: list[_Asks], kinds: tuple[str, ...] = CONTAINER_LISTS
    ) -> tuple[list[_Asks], list[str]]:
        """The containers of ``kinds`` asking for the source resource, and the labels of those
        asking for 0 of it (nvidia.com/gpu: 0, common in templated charts: no GPU, no slice)."""
        asking = [asks for asks in scan if asks.asks_source and not asks.zero and asks.kind in kinds]
        zero = [asks.label for asks in scan if asks.zero and asks.kind in kinds]
        return asking, zero

    def _extended(
        self,
        pod: Pod,
        scan: list[_Asks],
        slices: int,
        origin: str,
        warnings: tuple[str, ...],
        ctx: RequestContext,
    ) -> MutatorResult:
        source, target = self.config.sourceResource, self.config.targetResource
        asking, zero = self._slicing(scan)
        record, sliced, fewer = self._asked(asking, slices)
        for asks in asking:
            for _, section in resource_sections(asks.container):
                section.pop(source, None)
            set_resource(asks.container, target, str(slices))
        left = f"; {', '.join(zero)} asks for 0 {source}, left alone" if zero else ""
        if not asking:
            return MutatorResult.unchanged(f"opted in, but no container requests {source}{left}", *warnings)
        unrecorded = "" if _record(pod, record) else f"; {ORIGINAL_REQUEST} not recorded"
        return MutatorResult.mutated(
            f"{source} -> {target}: {slices} ({origin}) in {sliced}{left}{self._offer_note(ctx)}{unrecorded}",
            *warnings,
            *fewer,
            touched=(RECORD_PATH, *(asks.resources_path for asks in asking)),
        )

    def _offer_note(self, ctx: RequestContext) -> str:
        """Said in the reason when whether a node offers the target could not be checked."""
        if not self.config.requireAdvertisedTarget:
            return ""
        view = ctx.cluster
        if not view.available:
            why = "no cluster view"
        elif not view.synced(NODES.index):
            why = "cluster view not synced"
        elif not view.group(NODES.index, self.config.targetResource) and not view.index(NODES.index):
            why = "no Node in the cluster view"
        else:
            return ""
        return f"; whether a node offers {self.config.targetResource} not checked ({why})"

    def _claim(
        self,
        pod: Pod,
        scan: list[_Asks],
        slices: int,
        origin: str,
        warnings: tuple[str, ...],
        ctx: RequestContext,
    ) -> MutatorResult:
        """The dra backend: the GPU request goes, one Pod-level claim from the template of
        ``slices`` comes, and every container that asked for a GPU references it. Ephemeral
        containers are left out: the apiserver gives them no resources at all."""
        dra = self.dra
        assert dra is not None
        source = self.config.sourceResource
        asking, zero = self._slicing(scan, CLAIMING_LISTS)
        left = f"; {', '.join(zero)} asks for 0 {source}, left alone" if zero else ""
        if not asking:
            return MutatorResult.unchanged(f"opted in, but no container requests {source}{left}", *warnings)
        spec = pod["spec"]  # a dict: containers were found in it
        problem = _claims_problem(spec, asking, dra.claimName)
        if problem:
            if self.on_invalid is OnInvalidAnnotation.deny:
                return MutatorResult.denied(
                    f"castslice: {problem}; set gpuSlicing.dra.claimName to another name"
                )
            return MutatorResult.unchanged(
                f"opted in, but {problem}: not sliced",
                fit_warning(f"castslice: Pod not sliced, {problem}", ""),
            )
        chosen = self._templates[slices - 1]
        missing, note = self._template_state(chosen, ctx)
        if missing and dra.missingTemplate == "deny":
            return MutatorResult.denied(f"castslice: {missing}")
        if missing:
            warnings = (
                *warnings,
                fit_warning(
                    f"castslice: ResourceClaimTemplate {chosen.name} missing",
                    "; the Pod stays Pending until it exists",
                ),
            )
        record, sliced, fewer = self._asked(asking, slices)
        for asks in asking:
            container = asks.container
            resources = ensure_map(container, "resources")
            for name, section in resource_sections(container):
                section.pop(source, None)
                if not section:
                    del resources[name]  # limits: {nvidia.com/gpu: 1} leaves nothing to keep
            references = resources.get("claims")
            if not isinstance(references, list):
                references = resources["claims"] = []
            if not any(isinstance(ref, dict) and ref.get("name") == dra.claimName for ref in references):
                references.append({"name": dra.claimName})
        claims = spec.get("resourceClaims")
        if not isinstance(claims, list):
            claims = spec["resourceClaims"] = []
        claims.append({"name": dra.claimName, "resourceClaimTemplateName": chosen.name})
        amounts = ", ".join(f"{name} {amount}" for name, amount in _requests(chosen).items())
        unrecorded = "" if _record(pod, record) else f"; {ORIGINAL_REQUEST} not recorded"
        return MutatorResult.mutated(
            f"{source} -> claim {dra.claimName} from ResourceClaimTemplate {chosen.name} "
            f"({slices} slice{'' if slices == 1 else 's'}: {amounts}; {origin}) in {sliced}{left}{note}"
            f"{unrecorded}",
            *warnings,
            *fewer,
            touched=(RECORD_PATH, ("spec", "resourceClaims"), *(asks.resources_path for asks in asking)),
        )

    def _template_state(self, chosen: Template, ctx: RequestContext) -> tuple[str, str]:
        """(why the Pod's template is known to be missing, or ""; a note for the reason, saying
        when its presence could not be checked: offline without cluster state, or a view not
        listed yet)."""
        view = ctx.cluster
        if not view.available:
            return "", "; template presence not checked (no cluster view)"
        if not view.synced(TEMPLATES_INDEX):
            return "", "; template presence not checked (cluster view not synced)"
        if template_key(ctx.namespace, chosen.name) in view.index(TEMPLATES_INDEX):
            return "", ""
        dra = self.dra
        assert dra is not None
        remedy = (
            "the castslice controller creates it in every GPU namespace (gpuSlicing.dra.namespaceSelector)"
            if dra.templates == "managed"
            else f"apply it: castslice dra templates -n {ctx.namespace} | kubectl apply -f -"
        )
        missing = (
            f"ResourceClaimTemplate {chosen.name} ({chosen.slices} slice{'' if chosen.slices == 1 else 's'}) "
            f"is missing in namespace "
            f"{ctx.namespace}; {remedy}"
        )
        return missing, "; template missing"


MAX_COUNT = 1_000_000
"""Above this a GPU count is shown as ``?`` (no node has that many; the apiserver judges it)."""


RECORD_PATH = ("metadata", "annotations")
"""Where ``_record`` writes (metadata itself when it adds the annotations: see ``_record``)."""


class _Asks(NamedTuple):
    """One container's part in slicing, read once (``GpuSlicing._scan``)."""

    kind: str
    position: int
    label: str
    container: dict[str, Any]
    asks_source: bool
    gpus: int | None
    """The whole number of source devices asked (the larger of limit and request); None when
    unreadable or not asked (the apiserver judges a malformed quantity itself)."""
    zero: bool
    """It asks for 0 of the source: no GPU, no slice."""
    hami: tuple[str, ...]
    """The vGPU resources it asks for, in name order."""

    @property
    def resources_path(self) -> tuple[str, str, int, str]:
        """Where slicing changes this container: its resources."""
        return ("spec", self.kind, self.position, "resources")


def _count(quantities: list[object]) -> int | None:
    """The whole number of devices the quantities ask (the largest), None if one is unreadable."""
    counts = []
    for quantity in quantities:
        try:
            counts.append(parse_quantity(quantity))
        except QuantityError:
            return None
    largest = max(counts)
    # A count beyond any node is not a number to write out (nor to convert: thousands of digits).
    if largest > MAX_COUNT:
        return None
    return int(largest) if largest == int(largest) else None


def _asked_text(scan: list[_Asks], source: str) -> str:
    """Every container's request of the source resource, for messages: what the Pod asked."""
    asked = [f"{asks.label}: {source}={_text(asks.gpus)}" for asks in scan if asks.asks_source]
    return "asked: " + ("; ".join(asked) or f"no {source}")


def _text(count: int | None) -> str:
    return "?" if count is None else str(count)


def _record(pod: Pod, original: str) -> bool:
    """Write what the Pod asked for into ``ORIGINAL_REQUEST``; False when metadata.annotations
    cannot hold it (not a map: the apiserver rejects that Pod anyway). The first record stays: a
    reinvocation sees no source resource left and never gets here."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return False
    annotations = metadata.setdefault("annotations", {})
    if annotations is None:
        annotations = metadata["annotations"] = {}
    if not isinstance(annotations, dict):
        return False
    annotations.setdefault(ORIGINAL_REQUEST, original)
    return True


CLAIMING_LISTS = ("initContainers", "containers")
"""The containers that may reference a claim (the apiserver gives ephemeral ones no resources)."""


def _claims_problem(spec: dict[str, Any], asking: list[_Asks], name: str) -> str:
    """Why the claim cannot be added as is: the Pod's own claims are kept, so its name must be free."""
    claims = spec.get("resourceClaims")
    if claims is not None and not isinstance(claims, list):
        return "spec.resourceClaims is not a list"
    if any(isinstance(claim, dict) and claim.get("name") == name for claim in claims or ()):
        return f"spec.resourceClaims already has a claim named {name}"
    for asks in asking:
        resources = asks.container.get("resources")
        references = resources.get("claims") if isinstance(resources, dict) else None
        if references is not None and not isinstance(references, list):
            return f"{asks.label} has resources.claims that is not a list"
    return ""


def _requests(chosen: Template) -> dict[str, str]:
    requests: dict[str, str] = chosen.spec["spec"]["devices"]["requests"][0]["exactly"]["capacity"][
        "requests"
    ]
    return requests


def _is_zero(quantity: object) -> bool:
    try:
        return parse_quantity(quantity) == 0
    except QuantityError:
        return False  # not ours to judge: the apiserver rejects a malformed quantity itself


def _build(config: GpuSlicingConfig, settings: Settings, neighbours: Neighbours) -> GpuSlicing:
    qualifiers = neighbours.qualifiers_of(config.sourceResource)
    return GpuSlicing(
        config, settings.invalid_annotations, qualifiers or HAMI_QUALIFIERS.get(config.sourceResource, ())
    )


def _claims(config: GpuSlicingConfig) -> Claims:
    if config.backend == "dra":
        # The source resource is removed, not renamed: no resource of its own; its templates,
        # each a share of one device, are what GPU leases charge.
        return Claims(claim_templates=tuple((t.name, t.milli_gpu) for t in templates(config.dra)))
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


def _watches(config: GpuSlicingConfig) -> tuple[WatchSpec, ...]:
    """With the dra backend: the templates' metadata, to tell a Pod its template is missing;
    else, unless switched off, the Nodes, to slice only to a resource some node offers."""
    if config.backend == "dra":
        return (TEMPLATES,)
    return (NODES,) if config.requireAdvertisedTarget else ()


PLUGIN = MutatorPlugin(
    name=GpuSlicing.name,
    # An explicit per-Pod opt-in (castops.io/optimize) wins over cluster-wide policies: first.
    order=100,
    config_key="gpuSlicing",
    config_model=GpuSlicingConfig,
    build=_build,
    claims=_claims,
    watches=_watches,
)
