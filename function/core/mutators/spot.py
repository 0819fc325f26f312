"""Spot placement (CAST AI's ``castai-pod-node-lifecycle`` webhook): which Pods go on spot nodes.

The configuration is CAST AI's ``staticConfig`` (same key names, so Helm values paste in) plus
CastSlice's own keys (label scheme, bare Pods, deletion cost). Each Pod gets exactly one answer,
from the first rule that applies, in this order (``docs``: README "Spot placement"):

 1. left alone: not a CREATE; the webhook's own namespace; a bare Pod (no controller) unless
    ``placeBarePods``; a Pod matching ``ignorePods``; with ``ignorePodsWithNodeSelectorsAffinities``
    a Pod with its own nodeSelector or node affinity; a Pod with a topology spread constraint on the
    spot label key (it spreads itself over spot and on-demand);
 2. sticky: a Pod that already carries ``castops.io/placement`` keeps that placement (so a
    reinvocation, or a Pod re-created from a dump, is not moved);
 3. DaemonSet Pods: the spot toleration only (they must run on every node, spot or not);
 4. bad workload annotations (``invalidAnnotations``: deny, or warn and leave the Pod alone);
 5. ``forcePodsToOnDemand``;  6. ``forcePodsToSpot``;
 7. the workload's ``scheduling.cast.ai/lifecycle`` annotation (``spot`` | ``on-demand``);
 8. partial spot for Pods of a ReplicaSet or StatefulSet: ``scheduling.cast.ai/spot-percentage``
    (1-99) or else ``spotPercentageOfReplicaSet`` (1-100), by the floor rule over the live siblings
    (``placement.partial_split``), or a hash split when the cluster view is missing or not synced;
 9. ``defaultToSpot``: spot; when false the Pod is left alone (CAST AI: "should the webhook add spot
    tolerations and node selectors to all pods which don't match other rules?").

A placed Pod gets ``castops.io/placement``, ``castops.io/placement-decision`` (the admission uid,
so the edge can tell its own recent decisions from what the cluster view already shows) and
``controller.kubernetes.io/pod-deletion-cost`` (spot lower, so a scale-down removes spot Pods
before the on-demand base), unless the Pod already names a deletion cost of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from function.contract import FUNCTION_NAMESPACE
from function.core.configtypes import MutatorConfig, OnInvalidAnnotation
from function.core.json_patch import copy_json
from function.core.mutators.base import InvalidAnnotation, MutatorResult, RequestContext
from function.core.mutators.registry import MutatorPlugin, Neighbours, Settings
from function.core.placement import (
    BUILTIN_SCHEMES,
    DECISION_ANNOTATION,
    ON_DEMAND,
    PLACEMENT_LABEL,
    SPOT,
    LabelScheme,
    Placement,
    SiblingCounts,
    apply_spot_mode,
    custom_scheme,
    hash_split,
    partial_split,
    pending_entries,
    placement_mode,
    placement_of,
    spot_target,
)
from function.core.pod import NO_OWNER, Owner, Pod, annotations_of, controller_of, labels_of, metadata_of
from function.core.podmutation.names import marked_by
from function.core.rules import label_key_problem
from function.core.selectors import LabelSelector
from function.core.view import PODS, REPLICASETS, ClusterView, PodRecord, ReplicaSetRecord, WatchSpec

LIFECYCLE = "scheduling.cast.ai/lifecycle"
NOT_PLACED = "Pod not placed"
SPOT_PERCENTAGE = "scheduling.cast.ai/spot-percentage"
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
PARTIAL_KINDS = ("ReplicaSet", "StatefulSet")
"""Controllers whose Pods are split by percentage (CAST AI: "per ReplicaSet"; StatefulSets too)."""

PODS_INDEX = PODS.index
REPLICASETS_INDEX = REPLICASETS.index
NAMESPACES_INDEX = "namespaces"

_PERCENTAGE = re.compile(r"[1-9][0-9]?")  # fullmatch: 1-99, no sign, no leading zero, no newline


# --- configuration --------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PodSelectorTerm(_Strict):
    """CAST AI's PodAffinityTerm-like selector. A Pod matches when its labels match ``labelSelector``
    (absent: any labels) and its namespace is in ``namespaces`` or matches ``namespaceSelector``
    (both absent: any namespace). ``topologyKey`` is accepted, as CAST AI does, and ignored."""

    labelSelector: LabelSelector | None = None
    namespaces: list[str] = Field(default_factory=list)
    namespaceSelector: LabelSelector | None = None
    """Not in CAST AI: needs the namespaces' labels, which the cluster view watches."""
    topologyKey: str | None = None

    @model_validator(mode="after")
    def _not_everything(self) -> PodSelectorTerm:
        if self.labelSelector is None and not self.namespaces and self.namespaceSelector is None:
            raise ValueError(
                "a selector term needs labelSelector, namespaces or namespaceSelector "
                "(an empty term would match every Pod)"
            )
        return self


class CustomLabelScheme(_Strict):
    key: str
    spotValue: str
    tainted: bool
    """Spot nodes carry a NoSchedule taint on ``key``: on-demand Pods then need no node affinity."""
    labelOnlyOnSpot: bool = False
    """Only spot nodes carry ``key`` at all (then preferred spot is ``key Exists``)."""


class DeletionCost(_Strict):
    spot: int = Field(default=-100, ge=-(2**31), le=2**31 - 1)
    onDemand: int = Field(default=100, ge=-(2**31), le=2**31 - 1)

    @model_validator(mode="after")
    def _spot_goes_first(self) -> DeletionCost:
        if self.spot >= self.onDemand:
            raise ValueError("spot must be lower than onDemand, so a scale-down removes spot Pods first")
        return self


Preset = Literal["allSpot", "allSpotExceptKubeSystem", "partialSpot"]
PRESET_VALUES: dict[str, tuple[bool, int]] = {
    "allSpot": (True, 0),
    "allSpotExceptKubeSystem": (True, 0),
    "partialSpot": (True, 40),
}
"""Each preset's (defaultToSpot, spotPercentageOfReplicaSet), from CAST AI's chart."""


class SpotConfig(MutatorConfig):
    """The ``spot:`` section. Off by default (``enabled``, ``mode`` come from MutatorConfig)."""

    # CAST AI's staticConfig keys:
    preset: Preset | None = None
    defaultToSpot: bool = True
    spotPercentageOfReplicaSet: int = Field(default=0, ge=0, le=100)
    """0 turns partial spot off; 1-100 is the share of each ReplicaSet's Pods on spot."""
    ignorePods: list[PodSelectorTerm] = Field(default_factory=list)
    forcePodsToSpot: list[PodSelectorTerm] = Field(default_factory=list)
    forcePodsToOnDemand: list[PodSelectorTerm] = Field(default_factory=list)
    ignorePodsWithNodeSelectorsAffinities: bool = False
    cacheTTLSeconds: int = Field(default=60, ge=1, le=3600)
    """How long a decision is remembered until the cluster view shows its Pod (CAST AI's cache TTL)."""
    # CastSlice's own keys:
    labelScheme: Literal["castai", "karpenter", "gke", "eks", "aks", "custom"] = "castai"
    customLabelScheme: CustomLabelScheme | None = None
    placeBarePods: bool = False
    """CAST AI leaves Pods without a controller alone; true places them by the rules (no percentage)."""
    podDeletionCost: DeletionCost | None = Field(default_factory=DeletionCost)
    """null: no pod-deletion-cost annotation is written."""

    @model_validator(mode="after")
    def _coherent(self) -> SpotConfig:
        if self.preset is not None:
            default_to_spot, percentage = PRESET_VALUES[self.preset]
            for key, preset_value in (
                ("defaultToSpot", default_to_spot),
                ("spotPercentageOfReplicaSet", percentage),
            ):
                if key in self.model_fields_set and getattr(self, key) != preset_value:
                    raise ValueError(
                        f"preset {self.preset} sets {key} to {preset_value}; drop the preset or the key"
                    )
        if (self.labelScheme == "custom") != (self.customLabelScheme is not None):
            raise ValueError("customLabelScheme is needed with labelScheme: custom, and only then")
        if self.customLabelScheme is not None:
            custom = self.customLabelScheme
            custom_scheme(custom.key, custom.spotValue, custom.tainted, custom.labelOnlyOnSpot)
        for name in ("ignorePods", "forcePodsToSpot", "forcePodsToOnDemand"):
            for index, term in enumerate(getattr(self, name)):
                for key in _selector_keys(term):
                    problem = label_key_problem(key)
                    if problem:
                        raise ValueError(f"{name}[{index}]: {key!r} is not a valid label key: {problem}")
        return self

    @property
    def scheme(self) -> LabelScheme:
        if self.customLabelScheme is not None:
            custom = self.customLabelScheme
            return custom_scheme(custom.key, custom.spotValue, custom.tainted, custom.labelOnlyOnSpot)
        return BUILTIN_SCHEMES[self.labelScheme]

    @property
    def default_to_spot(self) -> bool:
        return PRESET_VALUES[self.preset][0] if self.preset else self.defaultToSpot

    @property
    def percentage(self) -> int:
        return PRESET_VALUES[self.preset][1] if self.preset else self.spotPercentageOfReplicaSet

    @property
    def on_demand_terms(self) -> tuple[PodSelectorTerm, ...]:
        extra = (
            (PodSelectorTerm(namespaces=["kube-system"]),) if self.preset == "allSpotExceptKubeSystem" else ()
        )
        return (*self.forcePodsToOnDemand, *extra)

    @property
    def uses_namespace_labels(self) -> bool:
        terms = (*self.ignorePods, *self.forcePodsToSpot, *self.forcePodsToOnDemand)
        return any(term.namespaceSelector is not None for term in terms)


def _selector_keys(term: PodSelectorTerm) -> Iterable[str]:
    for selector in (term.labelSelector, term.namespaceSelector):
        if selector is not None:
            yield from selector.matchLabels
            yield from (expression.key for expression in selector.matchExpressions)


# --- what the cluster view holds for this mutator ----------------------------------------------------
# Pods and ReplicaSets come from the shared specs of function/core/view.py (Pods grouped by owner uid,
# PodRecord.decision carries DECISION_ANNOTATION). Namespaces are watched only when a selector term
# has a namespaceSelector: their labels are not in the AdmissionReview.


class NamespaceRecord(NamedTuple):
    uid: str
    name: str
    labels: tuple[tuple[str, str], ...]


def slim_namespace(obj: Mapping[str, Any]) -> NamespaceRecord | None:
    """A Namespace (or its metadata) -> NamespaceRecord; None without a uid."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    uid, name, labels = metadata.get("uid"), metadata.get("name"), metadata.get("labels")
    if not isinstance(uid, str) or not uid:
        return None
    pairs = tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(labels, Mapping) else ()
    return NamespaceRecord(uid, name if isinstance(name, str) else "", pairs)


def namespace_name(record: Any) -> str:
    return record.name if isinstance(record, NamespaceRecord) else ""


NAMESPACES = WatchSpec(
    index=NAMESPACES_INDEX,
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    slim=slim_namespace,
    namespaced=False,
    metadata_only=True,
    group_by=namespace_name,
)
"""Namespaces and their labels, grouped by name (the key a Pod's namespace gives)."""


# --- the decision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """What the rules decided: a placement, and the rule (for the reason)."""

    placement: Placement
    rule: str


@dataclass(frozen=True)
class Split:
    """A percentage rule applies: each Pod's placement depends on its live siblings."""

    percentage: int
    source: str


TEMPLATE_NOTE = "placed per Pod when each is created"


def is_template(pod: Pod) -> bool:
    """The apiserver creates no Pod without a name or generateName: this is a workload's Pod
    template (``castslice mutate``)."""
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return not metadata.get("name") and not metadata.get("generateName")


class Spot:
    name = "spot"
    idempotent = True

    def __init__(
        self, config: SpotConfig, deny_invalid: bool, own_namespace: str, placed_by_podmutations: bool = False
    ) -> None:
        """``deny_invalid``: invalidAnnotations is deny (else warn); ``own_namespace``: the
        webhook's namespace, never placed; ``placed_by_podmutations``: another enabled mutator
        (PodMutations) may place a Pod, and marks it so."""
        self.config = config
        self.deny_invalid = deny_invalid
        self.own_namespace = own_namespace
        self.placed_by_podmutations = placed_by_podmutations
        self.scheme = config.scheme

    # -- entry point ---------------------------------------------------------------------------
    def mutate(self, pod: Pod, ctx: RequestContext) -> MutatorResult:
        metadata = pod.get("metadata")
        namespace = ctx.namespace or (metadata.get("namespace", "") if isinstance(metadata, dict) else "")
        skip = self._left_alone(pod, ctx, str(namespace))
        if skip:
            return MutatorResult.unchanged(skip)
        owner = controller_of(metadata_of(pod))
        if is_template(pod):
            return self._template(pod, ctx, str(namespace), owner)
        sticky = placement_of(pod)
        if sticky is not None:
            return self._place(pod, ctx, sticky, f"already placed ({PLACEMENT_LABEL}={sticky})")
        if owner.kind == "DaemonSet":
            account = apply_spot_mode(pod, "optional-spot", self.scheme)
            if account is None:
                return MutatorResult.unchanged("DaemonSet Pod already tolerates spot")
            return MutatorResult.mutated(f"DaemonSet Pod: spot toleration only ({account})")
        try:
            choice = self._choose(pod, ctx, str(namespace), owner)
        except InvalidAnnotation as bad:
            if self.deny_invalid:
                return MutatorResult.denied(f"castslice: {bad.message}")
            return MutatorResult.unchanged(f"{bad.message}; Pod not placed", bad.warning)
        if choice is None:
            return MutatorResult.unchanged("no rule matched and defaultToSpot is false: left alone")
        assert isinstance(choice, Choice)  # a split is only described, for templates
        return self._place(pod, ctx, choice.placement, choice.rule)

    def _template(self, pod: Pod, ctx: RequestContext, namespace: str, owner: Owner) -> MutatorResult:
        """A workload's Pod template (``castslice mutate``): what each Pod made from it will get,
        by the same rules, without writing anything into the template (a placement there would pin
        every Pod to it). A bad scheduling.cast.ai annotation is judged as the webhook will judge
        each Pod: denied, or warned about."""
        head = f"a Pod template: {TEMPLATE_NOTE}"
        sticky = placement_of(pod)
        if sticky is not None:
            return MutatorResult.unchanged(
                f"{head}; every Pod carries {PLACEMENT_LABEL}={sticky} from the template and keeps it: "
                f"{self._account(pod, sticky)}"
            )
        if owner.kind == "DaemonSet":
            account = self._account(pod, "optional-spot")
            return MutatorResult.unchanged(
                f"{head}; each DaemonSet Pod gets the spot toleration only: {account}"
            )
        try:
            choice = self._choose(pod, ctx, namespace, owner, template=True)
        except InvalidAnnotation as bad:
            if self.deny_invalid:
                return MutatorResult.denied(f"castslice: {bad.message}")
            return MutatorResult.unchanged(f"{bad.message}; its Pods are not placed", bad.warning)
        if choice is None:
            return MutatorResult.unchanged(f"{head}; no rule matches and defaultToSpot is false: left alone")
        if isinstance(choice, Split):
            where = f"{owner.kind} {owner.name}" if owner is not NO_OWNER else "its controller"
            share = choice.percentage
            return MutatorResult.unchanged(
                f"{head}; rule {choice.source}: of the n live Pods of {where}, floor(n x {share}/100) "
                f"on spot ({share * 10 // 100} of 10), the others on-demand; spot: "
                f"{self._account(pod, SPOT)}; on-demand: {self._account(pod, ON_DEMAND)}"
            )
        return MutatorResult.unchanged(
            f"{head}; each Pod: {choice.placement} by {choice.rule}: {self._account(pod, choice.placement)}"
        )

    def _account(self, pod: Pod, placement: Placement | Literal["optional-spot"]) -> str:
        """What placing a copy of ``pod`` would change, in words (the Pod itself is left as is)."""
        scratch = copy_json(pod)
        mode = placement if placement == "optional-spot" else placement_mode(placement)
        return apply_spot_mode(scratch, mode, self.scheme) or "nothing to change"

    def _left_alone(self, pod: Pod, ctx: RequestContext, namespace: str) -> str | None:
        """Why the Pod is not placed at all, or None."""
        if ctx.operation != "CREATE":
            return f"{ctx.operation}: only Pod creation is placed"
        mutation = marked_by(pod)
        if self.placed_by_podmutations and mutation is not None and placement_of(pod) is not None:
            # A PodMutation with spot settings placed it (pod-mutations runs before spot): its
            # mode (optional/preferred/only) and distribution stand. Any other mark (PodMutations
            # off, an empty or stray value) is no placement: the label is sticky, as always.
            return f"placed by podmutation {mutation}"
        if namespace == self.own_namespace:
            return f"namespace {namespace} is the webhook's own"
        metadata = pod.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        for key in ("labels", "annotations"):
            if not isinstance(metadata.get(key), dict | None):
                # No placement label could be written, so a reinvocation would decide again:
                # the apiserver rejects such a Pod anyway.
                return f"metadata.{key} is not a map: left for the apiserver to reject"
        if controller_of(metadata_of(pod)) is NO_OWNER and is_template(pod):
            # A template with no workload named (the engine used directly): nothing to describe.
            return f"a Pod template (no name or generateName): {TEMPLATE_NOTE}"
        if controller_of(metadata_of(pod)) is NO_OWNER and not self.config.placeBarePods:
            return "bare Pod (no controller): left alone (placeBarePods: false)"
        for index, term in enumerate(self.config.ignorePods):
            if self._matches(term, pod, namespace, ctx):
                return f"matches ignorePods[{index}]"
        spec = pod.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        if self.config.ignorePodsWithNodeSelectorsAffinities and placement_of(pod) is None:
            affinity = spec.get("affinity")
            if spec.get("nodeSelector") or (isinstance(affinity, dict) and affinity.get("nodeAffinity")):
                return "has its own nodeSelector or node affinity (ignorePodsWithNodeSelectorsAffinities)"
        constraints = spec.get("topologySpreadConstraints")
        for constraint in constraints if isinstance(constraints, list) else ():
            if isinstance(constraint, dict) and constraint.get("topologyKey") == self.scheme.key:
                return f"spreads itself over {self.scheme.key} (topologySpreadConstraints)"
        return None

    def _choose(
        self, pod: Pod, ctx: RequestContext, namespace: str, owner: Owner, template: bool = False
    ) -> Choice | Split | None:
        annotations = annotations_of(pod)
        lifecycle = annotations.get(LIFECYCLE)
        if lifecycle is not None and lifecycle not in (SPOT, ON_DEMAND):
            raise InvalidAnnotation(LIFECYCLE, lifecycle, '"spot" or "on-demand"', consequence=NOT_PLACED)
        raw_percentage = annotations.get(SPOT_PERCENTAGE)
        if raw_percentage is not None and (
            not isinstance(raw_percentage, str) or not _PERCENTAGE.fullmatch(raw_percentage)
        ):
            raise InvalidAnnotation(
                SPOT_PERCENTAGE, raw_percentage, "a whole number from 1 to 99", consequence=NOT_PLACED
            )

        for index, term in enumerate(self.config.on_demand_terms):
            if self._matches(term, pod, namespace, ctx):
                name = (
                    f"forcePodsToOnDemand[{index}]"
                    if index < len(self.config.forcePodsToOnDemand)
                    else "preset allSpotExceptKubeSystem (kube-system)"
                )
                return Choice(ON_DEMAND, f"rule {name}")
        for index, term in enumerate(self.config.forcePodsToSpot):
            if self._matches(term, pod, namespace, ctx):
                return Choice(SPOT, f"rule forcePodsToSpot[{index}]")
        if lifecycle is not None:
            placement: Placement = SPOT if lifecycle == SPOT else ON_DEMAND  # validated above
            return Choice(placement, f"rule workload annotation {LIFECYCLE}={lifecycle}")
        if owner.kind in PARTIAL_KINDS:
            split = None
            if raw_percentage is not None:
                split = Split(int(raw_percentage), f"{SPOT_PERCENTAGE}={raw_percentage}")
            elif self.config.percentage > 0:
                split = Split(self.config.percentage, f"spotPercentageOfReplicaSet={self.config.percentage}")
            if split is not None:
                return split if template else self._partial(ctx, owner, split.percentage, split.source)
        if self.config.default_to_spot:
            return Choice(SPOT, "rule defaultToSpot")
        return None

    def _partial(self, ctx: RequestContext, owner: Owner, percentage: int, source: str) -> Choice:
        view = ctx.cluster
        where = f"{owner.kind} {owner.name or owner.uid}{_desired(view, owner)}"
        if not view.available or not view.synced(PODS_INDEX):
            state = "no cluster view" if not view.available else "cluster view not synced"
            placement = hash_split(f"{owner.uid}/{ctx.uid}", percentage)
            return Choice(placement, f"rule {source} by hash split ({state}) for {where}")
        counts, pending = sibling_counts(view, owner.uid)
        placement = partial_split(counts, percentage)
        target = spot_target(counts, percentage)
        return Choice(
            placement,
            f"rule {source} for {where}: siblings {counts} (of which {pending} recent decisions not yet "
            f"in view); spot target floor({counts.total_with_new}x{percentage}/100)={target}",
        )

    def _matches(self, term: PodSelectorTerm, pod: Pod, namespace: str, ctx: RequestContext) -> bool:
        if term.labelSelector is not None and not term.labelSelector.matches(labels_of(pod)):
            return False
        if not term.namespaces and term.namespaceSelector is None:
            return True
        if namespace in term.namespaces:
            return True
        if term.namespaceSelector is None:
            return False
        namespace_labels = _namespace_labels(ctx.cluster, namespace)
        # Unknown namespace labels (no view, namespace not seen yet): the selector cannot match.
        return namespace_labels is not None and term.namespaceSelector.matches(namespace_labels)

    def _place(self, pod: Pod, ctx: RequestContext, placement: Placement, rule: str) -> MutatorResult:
        account = apply_spot_mode(pod, placement_mode(placement), self.scheme)
        marks = self._mark(pod, ctx, placement)
        done = ", ".join(part for part in (account, marks) if part)
        if not done:
            return MutatorResult.unchanged(f"{placement}: {rule}; nothing to change")
        return MutatorResult.mutated(f"{placement}: {rule}; {done}")

    def _mark(self, pod: Pod, ctx: RequestContext, placement: Placement) -> str | None:
        """Label, decision uid and deletion cost; what changed, or None. A malformed metadata part
        (labels or annotations not a map) is left for the apiserver and nothing is marked."""
        metadata = pod.get("metadata")
        if not isinstance(metadata, dict):
            return None
        if not all(isinstance(metadata.get(key), dict | None) for key in ("labels", "annotations")):
            return None
        labels: dict[str, Any] = metadata.get("labels") or {}
        annotations: dict[str, Any] = metadata.get("annotations") or {}
        done = []
        if labels.get(PLACEMENT_LABEL) != placement:
            labels[PLACEMENT_LABEL] = placement
            done.append(f"label {PLACEMENT_LABEL}={placement}")
        cost = self.config.podDeletionCost
        if cost is not None and POD_DELETION_COST not in annotations:
            annotations[POD_DELETION_COST] = str(cost.spot if placement == SPOT else cost.onDemand)
            done.append(f"{POD_DELETION_COST}={annotations[POD_DELETION_COST]}")
        if ctx.uid and DECISION_ANNOTATION not in annotations:
            annotations[DECISION_ANNOTATION] = ctx.uid
            if not done:  # named only when it is the one change, to keep reasons short
                done.append(f"annotation {DECISION_ANNOTATION}")
        metadata["labels"] = labels
        if annotations:
            metadata["annotations"] = annotations
        return ", ".join(done) or None


def sibling_counts(view: ClusterView, owner_uid: str) -> tuple[SiblingCounts, int]:
    """The live siblings of an owner's Pods in the view, plus this process's recent decisions the
    view does not show yet (matched by ``castops.io/placement-decision``); and how many of those."""
    spot = on_demand = unplaced = 0
    seen: set[str] = set()
    for record in view.group(PODS_INDEX, owner_uid).values():
        if not isinstance(record, PodRecord):
            continue
        if record.decision:
            seen.add(record.decision)  # a terminating Pod is shown too: its decision is not pending
        if record.terminating:
            continue
        if record.placement == SPOT:
            spot += 1
        elif record.placement == ON_DEMAND:
            on_demand += 1
        else:
            unplaced += 1
    pending = pending_entries(view, owner_uid, seen)
    for entry in pending:
        if entry.placement == SPOT:
            spot += 1
        elif entry.placement == ON_DEMAND:
            on_demand += 1
        else:
            unplaced += 1  # a PodMutation group without a placement
    return SiblingCounts(spot, on_demand, unplaced), len(pending)


def _namespace_labels(view: ClusterView, namespace: str) -> Mapping[str, str] | None:
    """The namespace's labels from the view, or None when the view has not seen it."""
    for record in view.group(NAMESPACES_INDEX, namespace).values():
        if isinstance(record, NamespaceRecord):
            return dict(record.labels)
    return None


def _desired(view: ClusterView, owner: Owner) -> str:
    """ " (wants N)" for a ReplicaSet the view knows with a replica count, else ""."""
    record = view.index(REPLICASETS_INDEX).get(owner.uid) if owner.kind == "ReplicaSet" else None
    if isinstance(record, ReplicaSetRecord) and record.replicas is not None:
        return f" (wants {record.replicas})"
    return ""


def _build(config: SpotConfig, settings: Settings, neighbours: Neighbours) -> Spot:
    return Spot(
        config,
        settings.invalid_annotations is OnInvalidAnnotation.deny,
        FUNCTION_NAMESPACE,
        placed_by_podmutations=neighbours.place_pods(),
    )


def _watches(config: SpotConfig) -> tuple[WatchSpec, ...]:
    """Pods (metadata only, grouped by owner) and ReplicaSets; Namespaces only for namespaceSelectors."""
    return (PODS, REPLICASETS, NAMESPACES) if config.uses_namespace_labels else (PODS, REPLICASETS)


PLUGIN = MutatorPlugin(
    name=Spot.name,
    # After the resource mutators (slicing 100, vGPU 200, PodMutation 250): placement is about
    # where the Pod runs, and a PodMutation's own spot mode (issue-podmut) takes the Pod first.
    order=300,
    config_key="spot",
    config_model=SpotConfig,
    build=_build,
    watches=_watches,
)
