"""GPU leases at admission (configuration ``gpuLeases``): charge each GPU Pod to a GpuLease of its
namespace, or refuse it with the lease arithmetic and a remedy.

Runs after slicing, vGPU and PodMutations (it charges what the Pod will really ask for) and before
spot placement (an overflowing Pod is put on spot here, and spot placement keeps it there).

For each created Pod that asks for GPUs (``function.core.leases.pod_charge``, in milli-GPU):

1. the lease: the one the annotation ``castops.io/gpu-lease`` names, else one of the Pod's GPU
   model (its nodeSelector or required node affinity on ``modelLabel``), else the namespace's only
   model (its nodeSelector is then added, so a Pod charged to H100 runs on H100); among several
   leases of one model, the first in (active, higher priority, older, name) order that fits;
2. the window: before it ``LeaseNotStarted``, after it ``LeaseExpired`` (``Queue``: gated until the
   start);
3. the count: ``used`` (charged Pods the view shows, admitted-but-unscheduled included, plus this
   process's charges the view does not show yet) + the Pod <= ``count``: ``Charged``; else
   ``LeaseExhausted`` (or ``ExceedsLease`` when the Pod alone is larger than the lease);
   ``overflow: Preemptible`` admits beyond the lease on spot (``Overflow``); ``enforcement: Queue``
   gates every Pod (``Queued``) and the controller starts it when it fits; ``Audit`` admits and warns.

The charge is stamped on the Pod (labels ``castops.io/gpu-lease``, ``castops.io/gpu-lease-state``;
annotations ``castops.io/gpu-lease-charge``, ``-decision``, ``-priority``) so the metadata-only watch
and the controller count it. Namespaces without a GpuLease are left alone unless ``requireLease``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field, field_validator

from function.core.budget import BudgetNow
from function.core.configtypes import MutatorConfig, PositiveInt, ResourceName, check_resource_name
from function.core.families import ModelFamilies, base_model, is_family, models_of, node_values
from function.core.json_patch import copy_json
from function.core.leases import (
    AUDIT,
    CHARGE_ANNOTATION,
    CHARGED,
    CHARGED_PODS,
    CHOICE_ANNOTATION,
    DECISION_ANNOTATION,
    ENDS_ANNOTATION,
    FORGED_ANNOTATION,
    GATE,
    LABEL_VALUE,
    LEASE_LABEL,
    LEASE_NAMESPACES,
    LEASES,
    MAPPING,
    MAX_MODELS,
    MODEL_ANNOTATION,
    OVERFLOW,
    PRIORITY_ANNOTATION,
    QUEUED,
    REQUIRED_LABEL,
    REQUIRED_VALUE,
    STAMP_ANNOTATIONS,
    STAMP_LABELS,
    STATE_LABEL,
    ChargeUnits,
    Enforcement,
    Lease,
    Models,
    Overflow,
    Phase,
    Usage,
    charge_text,
    depends_on_model,
    gpu_ask,
    gpus,
    parse_charge,
    pod_charge,
    pod_models,
    until,
    usage_from,
)
from function.core.mutators.base import MutatorResult, RequestContext
from function.core.mutators.registry import MutatorPlugin, Neighbours, Settings
from function.core.placement import BUILTIN_SCHEMES, PLACEMENT_LABEL, SPOT, apply_spot_mode
from function.core.pod import Pod, annotations_of, ensure_map, fit_warning, labels_of
from function.core.schedule import NO_ZONES, ZONES_INDEX, ZoneTable
from function.core.view import NODES, ClusterView, WatchSpec

NAME = "gpu-leases"
LEDGER_INDEX = "gpu-lease-ledger"
"""The edge's recent charges (this process's), by lease key: ``LedgerCharge`` tuples."""

NO_USAGE = Usage()

REASONS = (
    "Charged",
    "LeaseExhausted",
    "ExceedsLease",
    "NoMatchingLease",
    "AmbiguousModel",
    "LeaseNotStarted",
    "LeaseExpired",
    "Queued",
    "Overflow",
    "ViewNotReady",
    "ForgedStamp",
    "WindowClosed",
    "BudgetExhausted",
    "UnknownGpuResource",
    "UnknownClaim",
    "NotCharged",
)


@dataclass(frozen=True)
class LedgerCharge:
    """One charge this process admitted, until the view shows its Pod (by the decision uid)."""

    decision: str
    charge: int
    state: str
    model: str = ""
    """MODEL_ANNOTATION: the model of a family lease the Pod is charged as ("" any)."""


class GpuLeasesConfig(MutatorConfig):
    """``gpuLeases``: off by default."""

    modelLabel: str = "nvidia.com/gpu.product"
    """The node label naming the GPU model (GPU Feature Discovery's); a lease's gpuModel is its value."""
    wholeResources: tuple[ResourceName, ...] = ("nvidia.com/gpu",)
    sharedResource: ResourceName = "nvidia.com/gpu-shared"
    """A time slice: 1/replicas of a GPU of its model (gpuSlicing.targetResource)."""
    sharedReplicas: PositiveInt = 8
    sharedReplicasByModel: dict[str, PositiveInt] = Field(default_factory=dict)
    migResourcePrefix: str = "nvidia.com/mig-"
    """MIG profiles ``<prefix><g>g.<memory>gb``: g / migSlices of a GPU."""
    migSlices: PositiveInt = 7
    memoryPercentageResource: ResourceName = "nvidia.com/gpumem-percentage"
    coresResource: ResourceName = "nvidia.com/gpucores"
    memoryResource: ResourceName = "nvidia.com/gpumem"
    memoryMiBByModel: dict[str, PositiveInt] = Field(default_factory=dict)
    """A model's memory (MiB), to charge ``nvidia.com/gpumem`` as a share; unknown: a whole GPU."""
    warnAtPercent: int = Field(default=80, ge=1, le=100)
    requireLease: bool = False
    """True: every namespace is lease-required, as if labelled ``castops.io/gpu-leases: required``:
    a GPU Pod in a namespace without any GpuLease is refused (NoMatchingLease)."""
    whenViewNotReady: Literal["deny", "admit"] = "deny"
    """Before the leases and charged Pods are listed: refuse GPU Pods of leased namespaces (retry
    in seconds) or admit them uncharged."""
    overflowSpotScheme: str = "castai"
    """How spot nodes are marked, for ``overflow: Preemptible`` (castai, karpenter, gke, eks, aks)."""
    ledgerTTLSeconds: PositiveInt = 60
    modelFamilies: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Family name -> its GPU models (values of ``modelLabel``): a lease whose gpuModel (or one of
    whose gpuModels) is a family is charged by Pods on any of its models, to one count
    (``function.core.families``; GFD's ``-SHARED`` and MIG suffixes name the same model)."""

    @field_validator("modelFamilies")
    @classmethod
    def _families(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for name, models in value.items():
            for what in (name, *models):
                if not isinstance(what, str) or len(what) > 63 or not LABEL_VALUE.match(what):
                    raise ValueError(f"{what!r} is not a label value (at most 63 of A-Z a-z 0-9 - _ .)")
            if not 1 <= len(models) <= MAX_MODELS:
                raise ValueError(f"family {name!r}: 1 to {MAX_MODELS} models")
            nested = [model for model in models if model in value]
            if nested:
                raise ValueError(f"family {name!r} names the family {nested[0]!r}: list its models instead")
        return value

    def families(self) -> ModelFamilies:
        return MappingProxyType(dict(self.modelFamilies))

    @field_validator(
        "wholeResources", "sharedResource", "memoryPercentageResource", "coresResource", "memoryResource"
    )
    @classmethod
    def _resource_names(cls, value: Any) -> Any:
        for name in value if isinstance(value, tuple) else (value,):
            check_resource_name(name)
        return value

    @field_validator("overflowSpotScheme")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if value not in BUILTIN_SCHEMES:
            raise ValueError(f"{value!r} is not one of {', '.join(sorted(BUILTIN_SCHEMES))}")
        return value

    def units(self, claim_templates: Mapping[str, int] | None = None) -> ChargeUnits:
        return ChargeUnits(
            whole=tuple(self.wholeResources),
            shared=self.sharedResource,
            shared_replicas=self.sharedReplicas,
            shared_replicas_by_model=dict(self.sharedReplicasByModel),
            mig_prefix=self.migResourcePrefix,
            mig_slices=self.migSlices,
            memory_percentage=self.memoryPercentageResource,
            cores=self.coresResource,
            memory=self.memoryResource,
            memory_mib_by_model=dict(self.memoryMiBByModel),
            claim_templates=dict(claim_templates or {}),
        )


# -- what the mutator reads of the view ----------------------------------------------------------
def namespace_leases(view: ClusterView, namespace: str) -> list[Lease]:
    return [lease for lease in view.group(LEASES.index, namespace).values() if isinstance(lease, Lease)]


def lease_usage(view: ClusterView, lease_key: str, replacing: str = "") -> Usage:
    """What the view counts against a lease (``Lease.charged_key``), plus this process's charges
    it does not show yet (the ledger, read before the view: an entry whose Pod the view shows
    is counted once, by the view), but the entry of decision ``replacing`` (the Pod judged)."""
    usage = usage_from(view.tally(CHARGED_PODS.index, lease_key))
    entries = view.index(LEDGER_INDEX).get(lease_key, ())
    if not entries:
        return usage
    # Records are keyed by Pod uid: a charge in flight is matched by its decision among the
    # lease's Pods (only while this process has charges in flight for the lease).
    shown = {getattr(record, "decision", "") for record in view.group(CHARGED_PODS.index, lease_key).values()}
    for entry in entries:
        if entry.decision in shown or (replacing and entry.decision == replacing):
            continue
        if entry.state == QUEUED:
            usage = usage.plus(Usage(queued=entry.charge, pods=1))
        elif entry.state == OVERFLOW:
            usage = usage.plus(Usage(overflow=entry.charge, pods=1))
        else:
            usage = usage.plus(Usage(used=entry.charge, pods=1))
    return usage


def lease_required(view: ClusterView, namespace: str, require_everywhere: bool) -> bool:
    """Whether a GPU Pod in ``namespace`` needs a lease: ``requireLease``, or the namespace label
    (as the view shows it; the ValidatingAdmissionPolicy closes the namespace either way)."""
    return require_everywhere or namespace in view.index(LEASE_NAMESPACES.index)


def zones_of(view: ClusterView) -> Mapping[str, ZoneTable]:
    """The time zones the edge knows (index ZONES_INDEX; without it, UTC only)."""
    return view.index(ZONES_INDEX)


# -- the decision -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """The lease arithmetic for one Pod, as the mutator and ``castslice explain`` show it."""

    reason: str
    message: str
    lease: Lease | None = None
    charge: int = 0
    usage: Usage = NO_USAGE
    state: str = ""
    """The stamp (charged, queued, overflow, audit); "" when the Pod is not admitted or not charged."""
    admit: bool = True
    inject_model: bool = False
    warnings: tuple[str, ...] = ()
    ends: datetime | None = None
    """When the time the Pod is admitted for ends (ENDS_ANNOTATION)."""
    budget: BudgetNow | None = None
    model: str = ""
    """A lease of several models or a family: the model the Pod is charged as ("" any of targets)."""
    targets: tuple[str, ...] = ()
    """A lease of several models or a family: the models the Pod is pinned to (inject_model)."""


@dataclass(frozen=True)
class Placement:
    """Where a Pod charged to a lease of several models or a family may run, and as what."""

    model: str
    """The model it is charged as (MODEL_ANNOTATION; "" any of ``targets``)."""
    targets: tuple[str, ...]
    """The lease's models it may run on (it is pinned to them when it could run elsewhere)."""
    pin: bool
    full: str = ""
    """The cap of ``model`` this Pod would exceed, described ("" within it)."""


def family_candidates(models: Models, family: tuple[str, ...]) -> list[str]:
    """The models of ``family`` a Pod that may run on ``models`` may run on (a product label with
    GFD's suffixes is the model it names)."""
    if models.only is not None:
        named = {base_model(value) for value in models.only}
        return [model for model in family if model in named]
    return [model for model in family if model not in models.excluded]


def model_used(view: ClusterView, lease: Lease, model: str, replacing: str = "") -> int:
    """milli-GPU charged (or queued) as ``model`` to the lease: its Pods the view shows and this
    process's charges it does not show yet. Walks the lease's Pods: only for a capped model."""
    used = 0
    shown: set[str] = set()
    for record in view.group(CHARGED_PODS.index, lease.charged_key).values():
        shown.add(getattr(record, "decision", ""))
        if getattr(record, "model", "") == model and getattr(record, "state", "") != OVERFLOW:
            used += getattr(record, "charge", 0)
    for entry in view.index(LEDGER_INDEX).get(lease.charged_key, ()):
        counted = entry.decision in shown or (replacing and entry.decision == replacing)
        if entry.model == model and entry.state != OVERFLOW and not counted:
            used += entry.charge
    return used


_PHASE_RANK = {Phase.Active: 0, Phase.Pending: 1, Phase.Closed: 1, Phase.Exhausted: 1}
"""The lease a Pod is judged against when none fits now: an active one, else one that will admit
again (still to come, its window closed until the next occurrence, its budget spent until the next
period: its denial says when), and only then one that never will (over, released, invalid)."""


def _order(lease: Lease, now: datetime, zones: Mapping[str, ZoneTable]) -> tuple[int, int, str, str]:
    rank = _PHASE_RANK.get(lease.phase(now, zones), 2)
    created = lease.created.isoformat() if lease.created else ""
    return (rank, -lease.priority, created, lease.name)


def _names(leases: Iterable[Lease]) -> str:
    shown = [f"{lease.name} ({lease.model})" for lease in leases]
    return ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


class GpuLeases:
    name = NAME

    def __init__(self, config: GpuLeasesConfig, claim_templates: Mapping[str, int] | None = None) -> None:
        self.config = config
        self.units = config.units(claim_templates)
        self.scheme = BUILTIN_SCHEMES[config.overflowSpotScheme]
        self.families = config.families()

    def mutate(self, pod: Pod, ctx: RequestContext) -> MutatorResult:
        if ctx.operation != "CREATE":
            return MutatorResult.unchanged(f"{ctx.operation}: only Pod creation is charged")
        annotations = annotations_of(pod)
        written = annotations.get(FORGED_ANNOTATION)
        if written is not None:
            # The apiserver itself marked it (the MutatingAdmissionPolicy castslice-gpulease-witness,
            # before any webhook): the creator wrote stamp keys. The policy castslice-gpulease-stamp
            # refuses it too, even where this webhook is not called.
            return MutatorResult.denied(forged_message(written))
        charged_to = labels_of(pod).get(LEASE_LABEL)
        # A stamp without the witness's mark was written by this webhook earlier in this request
        # (a reinvocation, after another webhook changed the Pod, carries a new uid), or comes
        # from a cluster without the witness policy: only this review's own is kept as it is; any
        # other is recomputed from the Pod's resources, keeping its decision (the ledger entry of
        # the earlier pass is this very Pod: counted once, and matched when the Pod is stored).
        arrived = str(annotations.get(DECISION_ANNOTATION) or "") if charged_to else ""
        restamp = bool(charged_to) and arrived != ctx.uid
        if charged_to and not restamp:
            return MutatorResult.unchanged(f"already charged to gpu lease {charged_to}")
        view = ctx.cluster
        if (
            not self.config.requireLease
            and view.available
            and view.synced(LEASES.index)
            and not view.group(LEASES.index, ctx.namespace)
            and ctx.namespace not in view.index(LEASE_NAMESPACES.index)
        ):
            # Most namespaces lease nothing: two lookups, not the charge arithmetic.
            return self._unstamped(pod, restamp, f"namespace {ctx.namespace} has no GpuLease: not charged")
        verdict = self.decide(pod, ctx, replacing=arrived if restamp else "")
        if verdict is None:
            return self._unstamped(pod, restamp, "asks for no GPU")
        if not verdict.admit:
            return MutatorResult.denied(verdict.message)
        if not verdict.state or verdict.lease is None:
            return self._unstamped(pod, restamp, verdict.message, *verdict.warnings)
        if not restamp:
            self.stamp(pod, ctx, verdict, ctx.uid)
            return MutatorResult.mutated(verdict.message, *verdict.warnings)
        before = copy_json(pod)  # only a Pod that arrived stamped: a reinvocation
        remove_stamp(pod)
        self.stamp(pod, ctx, verdict, arrived or ctx.uid)
        if pod == before:
            return MutatorResult.unchanged(f"already charged to gpu lease {charged_to} ({verdict.reason})")
        return MutatorResult.mutated(verdict.message, *verdict.warnings)

    @staticmethod
    def _unstamped(pod: Pod, restamp: bool, reason: str, *warnings: str) -> MutatorResult:
        """Not charged: a stamp the Pod arrived with goes (it would count against a lease)."""
        if restamp and remove_stamp(pod):
            return MutatorResult.mutated(f"{reason}; the gpu lease stamp it came with removed", *warnings)
        return MutatorResult.unchanged(reason, *warnings)

    # -- deciding --------------------------------------------------------------------------------
    def decide(self, pod: Pod, ctx: RequestContext, replacing: str = "") -> Verdict | None:
        """The lease arithmetic for the Pod; None when it asks for no GPU. ``replacing``: the
        decision of the stamp it arrived with, whose ledger entry is this Pod (not counted twice)."""
        ask = gpu_ask(pod, self.units)
        if not ask.asks:
            return None
        view = ctx.cluster
        models = pod_models(pod, self.config.modelLabel)
        charge = pod_charge(pod, self.units, models.exactly or "")
        if not view.available:
            return Verdict("ViewNotReady", "no cluster state: GPU leases not checked", charge=charge)
        namespace = ctx.namespace
        now = view.now
        if now is None or not (view.synced(LEASES.index) and view.synced(CHARGED_PODS.index)):
            admit = self.config.whenViewNotReady == "admit"
            return Verdict(
                "ViewNotReady",
                "castslice: ViewNotReady: the GPU leases are not loaded yet; "
                + ("admitted uncharged" if admit else "retry in a few seconds"),
                charge=charge,
                admit=admit,
            )
        required = lease_required(view, namespace, self.config.requireLease)
        why = (
            f"namespace {namespace} is labelled {REQUIRED_LABEL}={REQUIRED_VALUE}"
            if not self.config.requireLease
            else "gpuLeases.requireLease is set"
        )
        warnings: tuple[str, ...] = ()
        if ask.uncharged or ask.unknown_claims:
            what = ", ".join(
                [f"resource {name}" for name in ask.uncharged] + [f"claim {c}" for c in ask.unknown_claims]
            )
            if required:
                reason = "UnknownClaim" if ask.unknown_claims else "UnknownGpuResource"
                remedy = (
                    "ask for nvidia.com/gpu (or slices through gpuSlicing), whose use the lease counts"
                    if ask.unknown_claims
                    else "ask for a resource gpuLeases charges (wholeResources, sharedResource, MIG, vGPU)"
                )
                return self._refuse(
                    reason,
                    f"{why}, and this Pod asks for GPUs no GpuLease can count: {what} (what a claim "
                    f"holds is not known at admission); remedy: {remedy}",
                    charge,
                )
            warnings = (fit_warning("castslice: not charged to a gpu lease: ", what),)
        if charge <= 0:
            return Verdict("NotCharged", f"asks for {ask.resources or ask.unknown_claims}: not charged",
                           warnings=warnings)  # fmt: skip
        leases = namespace_leases(view, namespace)
        if not leases:
            if required:
                return self._refuse(
                    "NoMatchingLease",
                    f"{why}: GPU Pods need an active GpuLease of their model, and namespace "
                    f"{namespace} has none; this Pod asks for {gpus(charge)} GPU; remedy: ask your "
                    "platform team for a GpuLease in this namespace (kubectl get gpuleases)",
                    charge,
                )
            return Verdict(
                "NoMatchingLease", f"namespace {namespace} has no GpuLease: not charged", charge=charge
            )
        chosen = self._choose(pod, leases, now, models, view, replacing, charge)
        if isinstance(chosen, Verdict):
            return chosen
        lease, pin = chosen
        family = self.family_of(lease)
        if family is not None:
            return self._decide_family(pod, lease, family, models, view, replacing, charge, warnings)
        if lease.model != (models.exactly or "") and depends_on_model(pod, self.units):
            charge = pod_charge(pod, self.units, lease.model)  # a slice's or a memory size's share
        usage = lease_usage(view, lease.charged_key, replacing)
        verdict = self._judge(lease, charge, usage, now, pin, zones_of(view))
        if warnings:
            return replace(verdict, warnings=verdict.warnings + warnings)
        return verdict

    def _decide_family(
        self,
        pod: Pod,
        lease: Lease,
        family: tuple[str, ...],
        models: Models,
        view: ClusterView,
        replacing: str,
        charge: int,
        warnings: tuple[str, ...],
    ) -> Verdict:
        """A lease of several models or a family: one count for all of them, a cap per model."""
        placement = self._place(lease, family, models, view, replacing, charge)
        if depends_on_model(pod, self.units):
            # A slice's or a memory size's share: the largest over the models it may land on.
            charge = max(pod_charge(pod, self.units, model) for model in placement.targets)
            placement = self._place(lease, family, models, view, replacing, charge)
        usage = lease_usage(view, lease.charged_key, replacing)
        assert view.now is not None
        verdict = self._judge(lease, charge, usage, view.now, placement.pin, zones_of(view))
        if placement.full and verdict.state in (CHARGED, QUEUED, AUDIT):
            head = f"gpu lease {lease.name} ({lease.model})"
            text = (
                f"{head}: {placement.full}; remedy: wait for a Pod on {placement.model} to finish, use "
                f"another model of the lease ({', '.join(family)}), or ask for a bigger cap"
            )
            if lease.enforcement != Enforcement.Audit:
                return self._refuse("LeaseExhausted", text, charge, lease, usage)
            verdict = replace(
                verdict,
                state=AUDIT,
                warnings=(fit_warning("castslice: audit lease, would be LeaseExhausted: ", text)[:120],),
            )
        verdict = replace(
            verdict, model=placement.model, targets=placement.targets, warnings=verdict.warnings + warnings
        )
        return verdict

    def _refuse(
        self, reason: str, text: str, charge: int, lease: Lease | None = None, usage: Usage = NO_USAGE
    ) -> Verdict:
        return Verdict(reason, f"castslice: {reason}: {text}", lease, charge, usage, admit=False)

    def _choose(
        self,
        pod: Pod,
        leases: list[Lease],
        now: datetime,
        models: Models,
        view: ClusterView,
        replacing: str,
        charge: int,
    ) -> tuple[Lease, bool] | Verdict:
        """The lease, and whether to pin the Pod to its model (it may run on another model);
        ``charge``: the Pod's, as its own model makes it (for the refusals)."""
        namespace = leases[0].namespace
        labels = labels_of(pod)
        zones = zones_of(view)
        valid = [lease for lease in leases if not lease.problems and not lease.zone_problems(zones)]
        label = self.config.modelLabel
        named = annotations_of(pod).get(CHOICE_ANNOTATION)
        if named is not None:
            found = [lease for lease in valid if lease.name == named]
            if not found:
                return self._refuse(
                    "NoMatchingLease",
                    f"annotation {CHOICE_ANNOTATION}={named!r} names no valid GpuLease in namespace "
                    f"{namespace}; leases here: {_names(valid) or 'none valid'}",
                    charge,
                )
            lease = found[0]
            if not lease.matches(labels):
                return self._refuse(
                    "NoMatchingLease",
                    f"gpu lease {lease.name} does not select this Pod (its podSelector); "
                    "remedy: label the Pod as the lease's podSelector asks, or name another lease",
                    charge,
                )
            if not self._allows(models, lease):
                return self._refuse(
                    "NoMatchingLease",
                    f"gpu lease {lease.name} is for {lease.model}, but the Pod may run only on "
                    f"{models.describe()} ({label}: its nodeSelector and required node affinity)",
                    charge,
                )
            return lease, self._pins(models, lease)
        candidates = [lease for lease in valid if lease.matches(labels)]
        if models.constrained:
            of_model = [lease for lease in candidates if self._allows(models, lease)]
            if not of_model:
                return self._refuse(
                    "NoMatchingLease",
                    f"no GpuLease in namespace {namespace} for {models.describe()} selects this Pod; "
                    f"leases here: {_names(leases)}; remedy: ask for a lease of that model, or use one "
                    f"of these models ({label})",
                    charge,
                )
            candidates = of_model
        elif not candidates:
            return self._refuse(
                "NoMatchingLease",
                f"no GpuLease in namespace {namespace} selects this Pod (podSelector); leases here: "
                f"{_names(leases)}",
                charge,
            )
        distinct = sorted({lease.model for lease in candidates})
        if len(distinct) > 1 and models.only is None:
            return self._refuse(
                "AmbiguousModel",
                f"namespace {namespace} leases {', '.join(distinct)} and the Pod may run on "
                f"{models.describe()}; remedy: set nodeSelector {label}, or annotation "
                f"{CHOICE_ANNOTATION}: <lease>",
                charge,
            )
        lease = self._best(pod, candidates, now, view, replacing)
        # A Pod that may run on another model than its lease's is pinned to it (nodeSelector is
        # ANDed with its affinity), so a Pod charged to H100 runs on H100.
        return lease, self._pins(models, lease)

    # -- leases of several models or a family ----------------------------------------------------
    def family_of(self, lease: Lease) -> tuple[str, ...] | None:
        """The models of a lease of several models or a family; None for a lease of one model.
        Worked out once per lease record and configuration (asked several times per decision)."""
        known = lease.memo.get("family")
        if known is not None and known[0] is self.families:
            family: tuple[str, ...] | None = known[1]
            return family
        family = models_of(lease, self.families) if is_family(lease, self.families) else None
        lease.memo["family"] = (self.families, family)
        return family

    def _allows(self, models: Models, lease: Lease) -> bool:
        family = self.family_of(lease)
        if family is None:
            return models.allows(lease.model)
        return bool(family_candidates(models, family))

    def _pins(self, models: Models, lease: Lease) -> bool:
        family = self.family_of(lease)
        if family is None:
            return models.exactly != lease.model
        return models.only is None or any(base_model(value) not in family for value in models.only)

    def _place(
        self,
        lease: Lease,
        family: tuple[str, ...],
        models: Models,
        view: ClusterView,
        replacing: str,
        charge: int,
    ) -> Placement:
        """The model a Pod is charged as and the models it is pinned to: the one model of the
        lease it may run on; else those of them without a cap (charged to the lease as a whole,
        "any"); else the first capped model with room under its cap (the lease's order)."""
        candidates = family_candidates(models, family)
        caps = dict(lease.caps)
        targets = candidates
        if len(candidates) > 1 and any(model in caps for model in candidates):
            uncapped = [model for model in candidates if model not in caps]
            if uncapped:
                targets = uncapped
            else:
                room = [m for m in candidates if model_used(view, lease, m, replacing) + charge <= caps[m]]
                targets = (room or candidates)[:1]
        model = targets[0] if len(targets) == 1 else ""
        full = ""
        if model in caps:
            used = model_used(view, lease, model, replacing)
            if used + charge > caps[model]:
                full = (
                    f"the cap of {model} is {gpus(caps[model])} GPU, {gpus(used)} in use, "
                    f"this Pod needs {gpus(charge)}"
                )
        pin = models.only is None or any(base_model(value) not in targets for value in models.only)
        return Placement(model, tuple(targets), pin, full)

    def _best(self, pod: Pod, leases: list[Lease], now: datetime, view: ClusterView, replacing: str) -> Lease:
        if len(leases) == 1:
            return leases[0]
        zones = zones_of(view)
        ordered = sorted(leases, key=lambda lease: _order(lease, now, zones))
        for lease in ordered:
            if (
                lease.phase(now, zones) == Phase.Active
                and lease_usage(view, lease.charged_key, replacing).used
                + pod_charge(pod, self.units, lease.model)
                <= lease.count
            ):
                return lease
        return ordered[0]

    def _judge(
        self,
        lease: Lease,
        charge: int,
        usage: Usage,
        now: datetime,
        inject: bool,
        zones: Mapping[str, ZoneTable] = NO_ZONES,
    ) -> Verdict:
        head = f"gpu lease {lease.name} ({lease.model})"
        phase = lease.phase(now, zones)
        ends = lease.ends_at(now, zones)
        reading = lease.budget_at(now, zones)
        numbers = (
            f"{gpus(usage.used)} of {gpus(lease.count)} GPU in use, this Pod needs {gpus(charge)}, "
            f"window ends {until(ends)}"
        )
        if reading is not None:
            numbers += f"; {budget_numbers(reading)}"
        audit = lease.enforcement == Enforcement.Audit
        judged = _Judged(self, lease, charge, usage, inject, ends, reading)
        if phase in (Phase.Pending, Phase.Closed, Phase.Exhausted):
            opens = lease.opens_at(now, zones)
            if phase == Phase.Pending:
                reason, closed = "LeaseNotStarted", f"starts at {until(lease.start)}"
                waits = f"until the window starts at {until(lease.start)}"
            elif phase == Phase.Closed:
                assert lease.recurrence is not None
                reason = "WindowClosed"
                closed = (
                    f"is closed until {until(opens)} (open {lease.recurrence.cron.text!r} for "
                    f"{_duration(lease.recurrence.duration)}, {lease.recurrence.zone or 'UTC'})"
                )
                waits = f"until the window opens at {until(opens)}"
            else:
                assert reading is not None
                reason = "BudgetExhausted"
                closed = f"has spent its budget: {budget_numbers(reading)}"
                waits = f"until the budget's next period at {until(reading.end)}"
            if lease.enforcement == Enforcement.Queue and (opens is not None or phase == Phase.Pending):
                return judged.admit("Queued", f"{head}: queued {waits}", QUEUED)
            remedy = (
                "ask for a bigger budget, wait for the next period, or use enforcement Queue"
                if phase == Phase.Exhausted
                else "create the Pod then, or enforcement Queue"
            )
            text = f"{head} {closed}; remedy: {remedy}"
            if audit:
                return judged.admit(reason, refused(head, reason), AUDIT, text)
            return self._refuse(reason, text, charge, lease, usage)
        if phase in (Phase.Expired, Phase.Released):
            ended = "was deleted" if phase == Phase.Released else f"ended at {until(lease.end)}"
            text = f"{head} {ended}; remedy: ask for a new lease or an extension of this one"
            if audit:
                return judged.admit("LeaseExpired", refused(head, "LeaseExpired"), AUDIT, text)
            return self._refuse("LeaseExpired", text, charge, lease, usage)
        preemptible = lease.overflow == Overflow.Preemptible
        if charge > lease.count:
            text = (
                f"{head}: this Pod needs {gpus(charge)} GPU, more than the whole lease ({gpus(lease.count)});"
                " remedy: ask for fewer GPUs or a bigger lease"
            )
            if preemptible:
                return judged.admit("Overflow", f"{head}: beyond the lease, on spot ({numbers})", OVERFLOW)
            if audit:
                return judged.admit("ExceedsLease", refused(head, "ExceedsLease"), AUDIT, text)
            return self._refuse("ExceedsLease", text, charge, lease, usage)
        if lease.enforcement == Enforcement.Queue:
            text = f"{head}: queued, started by the controller when it fits ({numbers})"
            return judged.admit("Queued", text, QUEUED)
        if usage.used + charge <= lease.count:
            return judged.admit("Charged", f"{head}: charged ({numbers})", CHARGED)
        if preemptible:
            return judged.admit("Overflow", f"{head}: beyond the lease, on spot ({numbers})", OVERFLOW)
        text = (
            f"{head}: {numbers}; remedy: wait for a Pod of the lease to finish, ask for a bigger lease, "
            "or use enforcement Queue"
        )
        if audit:
            return judged.admit("LeaseExhausted", refused(head, "LeaseExhausted"), AUDIT, text)
        return self._refuse("LeaseExhausted", text, charge, lease, usage)

    def _admit(
        self,
        reason: str,
        text: str,
        lease: Lease,
        charge: int,
        usage: Usage,
        state: str,
        inject: bool,
        refusal: str = "",
        ends: datetime | None = None,
        reading: BudgetNow | None = None,
    ) -> Verdict:
        warnings: list[str] = []
        if refusal:
            warnings.append(fit_warning(f"castslice: audit lease, would be {reason}: ", refusal)[:120])
        after = usage.used + (charge if state in (CHARGED, AUDIT) else 0)
        if state in (CHARGED, AUDIT) and after * 100 >= self.config.warnAtPercent * lease.count:
            percent = after * 100 // lease.count
            warnings.append(
                fit_warning(
                    f"castslice: gpu lease {lease.name} at {percent}% "
                    f"({gpus(after)} of {gpus(lease.count)} GPU)",
                    f", until {until(lease.end)}",
                )
            )
        if state == OVERFLOW:
            warnings.append(
                fit_warning(
                    f"castslice: gpu lease {lease.name} is full",
                    ": this Pod runs on spot capacity and may be preempted",
                )
            )
        if state == QUEUED:
            warnings.append(
                fit_warning(
                    f"castslice: gpu lease {lease.name}",
                    ": Pod queued (scheduling gate) until it fits the lease",
                )
            )
        if (
            reading is not None
            and state in (CHARGED, AUDIT)
            and reading.used * 100 >= self.config.warnAtPercent * reading.limit
        ):
            warnings.append(
                fit_warning(
                    f"castslice: gpu lease {lease.name} budget at {reading.used * 100 // reading.limit}%",
                    f" ({budget_numbers(reading)})",
                )
            )
        message = f"{reason}: {text}"
        return Verdict(
            reason, message, lease, charge, usage, state, True, inject, tuple(warnings), ends, reading
        )

    # -- stamping --------------------------------------------------------------------------------
    def stamp(self, pod: Pod, ctx: RequestContext, verdict: Verdict, decision: str) -> None:
        lease = verdict.lease
        assert lease is not None
        metadata = ensure_map(pod, "metadata")
        labels = ensure_map(metadata, "labels")
        labels[LEASE_LABEL] = lease.label
        labels[STATE_LABEL] = verdict.state
        annotations = ensure_map(metadata, "annotations")
        annotations[CHARGE_ANNOTATION] = charge_text(verdict.charge)
        if decision:
            annotations[DECISION_ANNOTATION] = decision
        spec = ensure_map(pod, "spec")
        priority = spec.get("priority")
        if isinstance(priority, int) and not isinstance(priority, bool) and priority:
            annotations[PRIORITY_ANNOTATION] = str(priority)
        if verdict.ends is not None and verdict.state != QUEUED:
            # Readable by the Pod through the downward API; a queued Pod gets it when it starts.
            annotations[ENDS_ANNOTATION] = until(verdict.ends)
        if verdict.model:
            annotations[MODEL_ANNOTATION] = verdict.model
        if verdict.inject_model and verdict.targets:
            pin_to(pod, self.config.modelLabel, node_values(verdict.targets))
        elif verdict.inject_model:
            ensure_map(spec, "nodeSelector")[self.config.modelLabel] = lease.model
        if verdict.state == QUEUED:
            gates = spec.get("schedulingGates")
            if not isinstance(gates, list):
                gates = spec["schedulingGates"] = []
            if not any(isinstance(g, dict) and g.get("name") == GATE for g in gates):
                gates.append({"name": GATE})
        if verdict.state == OVERFLOW:
            apply_spot_mode(pod, "only-spot", self.scheme)
            labels[PLACEMENT_LABEL] = SPOT


@dataclass(frozen=True)
class _Judged:
    """One judgement's fixed parts, so each answer names only what differs."""

    leases: GpuLeases
    lease: Lease
    charge: int
    usage: Usage
    inject: bool
    ends: datetime | None
    reading: BudgetNow | None

    def admit(self, reason: str, text: str, state: str, refusal: str = "") -> Verdict:
        return self.leases._admit(
            reason,
            text,
            self.lease,
            self.charge,
            self.usage,
            state,
            self.inject,
            refusal,
            self.ends,
            self.reading,
        )


def pin_to(pod: Pod, label: str, values: tuple[str, ...]) -> None:
    """ANDs ``label In values`` into each required node selector term of the Pod (a new term when
    it has none), so it runs only on a node of those models, wherever else it may run."""
    expression = {"key": label, "operator": "In", "values": list(values)}
    spec = ensure_map(pod, "spec")
    node = ensure_map(ensure_map(spec, "affinity"), "nodeAffinity")
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(required, dict) or not isinstance(terms, list) or not terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": [expression]}]
        }
        return
    for term in terms:
        # An empty term matches no node: it stays empty rather than start matching these models.
        if isinstance(term, dict) and (term.get("matchExpressions") or term.get("matchFields")):
            expressions = term.get("matchExpressions")
            if not isinstance(expressions, list):
                expressions = term["matchExpressions"] = []
            expressions.append({**expression, "values": list(values)})


def refused(head: str, reason: str) -> str:
    return f"{head}: audit: would be refused: {reason}"


def budget_numbers(reading: BudgetNow) -> str:
    """A budget's figures as an answer names them: used, left, and when the period ends."""
    window = "in the last window" if reading.history or reading.start == reading.end else "this period"
    return (
        f"budget {hours(reading.used)} of {hours(reading.limit)} GPU-hours used {window}, "
        f"{hours(reading.left)} left, period ends {until(reading.end)}"
    )


def hours(value: Decimal) -> str:
    """GPU-hours for people: to 4 decimals (a third of a GPU-second), trailing zeros dropped."""
    text = f"{value.quantize(Decimal('0.0001')):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    parts = [(seconds // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def remove_stamp(pod: Pod) -> bool:
    """Takes the stamp's labels and annotations off the Pod; True if there was any."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return False
    removed = False
    for section, keys in (("labels", STAMP_LABELS), ("annotations", STAMP_ANNOTATIONS)):
        values = metadata.get(section)
        if isinstance(values, dict):
            for key in keys:
                if key in values:
                    del values[key]
                    removed = True
    return removed


def forged_message(written: str) -> str:
    return (
        f"castslice: ForgedStamp: the Pod was created with {written or 'GPU lease stamp keys'}, which only "
        "CastSlice writes (they say what the Pod is charged to a GpuLease); remedy: remove the "
        f"{LEASE_LABEL}* labels and annotations from the Pod or its template (a copy of "
        f"`kubectl get pod -o yaml` carries them); to choose a lease, use the annotation {CHOICE_ANNOTATION}"
    )


def build(config: GpuLeasesConfig, settings: Settings, neighbours: Neighbours) -> GpuLeases:
    return GpuLeases(config, neighbours.claim_templates())


def watches(config: GpuLeasesConfig) -> tuple[WatchSpec, ...]:
    # The Nodes (labels and allocatable) for the validating webhook: a GpuLease of a model no Node
    # offers is warned about at apply (function/admission/gpuleases.py).
    return (LEASES, CHARGED_PODS, LEASE_NAMESPACES, NODES)


PLUGIN = MutatorPlugin(
    name=NAME,
    order=280,
    config_key="gpuLeases",
    config_model=GpuLeasesConfig,
    build=build,
    watches=watches,
)


def ledger_charge(pod: Mapping[str, Any]) -> tuple[str, LedgerCharge] | None:
    """(lease key, charge) an admitted Pod carries, for the edge's ledger; None if not charged."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, MAPPING):
        return None
    labels, annotations = metadata.get("labels"), metadata.get("annotations")
    if not isinstance(labels, MAPPING) or not isinstance(annotations, MAPPING):
        return None  # a charge is stamped with both
    lease, decision = labels.get(LEASE_LABEL), annotations.get(DECISION_ANNOTATION)
    namespace = metadata.get("namespace")
    if (
        not isinstance(lease, str)
        or not isinstance(decision, str)
        or not decision
        or not isinstance(namespace, str)
    ):
        return None
    state = labels.get(STATE_LABEL)
    model = annotations.get(MODEL_ANNOTATION)
    return f"{namespace}/{lease}", LedgerCharge(
        decision,
        parse_charge(annotations.get(CHARGE_ANNOTATION)),
        state if isinstance(state, str) else CHARGED,
        model if isinstance(model, str) else "",
    )
