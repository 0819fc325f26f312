"""The PodMutations mutator itself (its plug-in declaration, configuration and order are in
pod_mutations.py beside it, which builds it only when ``podMutations`` is enabled, so nothing else
loads the PodMutation spec, its compiled form and matching).

The PodMutations come from the cluster view (watched ``castops.io/v1alpha1`` objects, and CAST AI's
``pod-mutations.cast.ai/v1`` ones when ``podMutations.castaiObjects`` is on), compiled once when
loaded (``function.core.podmutation.compiled``). For each Pod: the workload is found through the
controller chain, the most specific matching mutation is chosen, applied, and named (name and
generation) in the decision. A Pod already marked by a mutation is left alone, so the engine's
second pass and the apiserver's reinvocation add nothing.

It never denies: a patch list that fails is dropped with a warning, an invalid PodMutation is
skipped (and was refused at ``kubectl apply`` by the validating webhook in the first place).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from function.core.mutators.base import Action, Keys, MutatorResult, Reads, RequestContext
from function.core.placement import SiblingCounts, pending_entries
from function.core.pod import Owner, Pod, controller_of, fit_warning, labels_of, metadata_of
from function.core.podmutation.apply import Siblings, apply_mutation
from function.core.podmutation.compiled import CompiledMutation, InvalidMutation, compile_object
from function.core.podmutation.match import OwnerLookup, Workload, select, workload_of
from function.core.podmutation.names import (
    CASTAI_GROUP,
    CASTAI_VERSION,
    KIND,
    MARK_ANNOTATION,
    OUR_GROUP,
    OUR_VERSION,
    PLURAL,
    marked_by,
)
from function.core.view import PODS, REPLICASETS, ClusterView, WatchSpec

if TYPE_CHECKING:
    from function.core.mutators.pod_mutations import PodMutationsConfig

NAME = "pod-mutations"
"""The plug-in's name (function/core/mutators/pod_mutations.py declares it with this one)."""
CASTAI_OPT_OUT_LABEL = "pod-mutator.cast.ai/ignore"
"""CAST AI's pod mutator leaves a Pod labelled ``pod-mutator.cast.ai/ignore: "true"`` alone; so do we."""


class JobRecord(NamedTuple):
    namespace: str
    name: str
    uid: str
    owner: Owner


def slim_job(obj: Mapping[str, Any]) -> JobRecord | None:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("uid"), str) or not metadata["uid"]:
        return None
    return JobRecord(
        str(metadata.get("namespace", "")),
        str(metadata.get("name", "")),
        metadata["uid"],
        controller_of(metadata),
    )


def slim_podmutation(obj: Mapping[str, Any]) -> CompiledMutation | InvalidMutation | None:
    """The compiled PodMutation (or why it is invalid) kept in the index: parsed once, when loaded."""
    return compile_object(obj)


JOBS = WatchSpec(
    index="jobs", group="batch", version="v1", plural="jobs", kind="Job", slim=slim_job, metadata_only=True
)
"""Jobs, for Pod -> Job -> CronJob (the workload kind a CronJob's Pods match)."""
OUR_MUTATIONS = WatchSpec(
    index="podmutations", group=OUR_GROUP, version=OUR_VERSION, plural=PLURAL, kind=KIND,
    slim=slim_podmutation, namespaced=False,
)  # fmt: skip
CASTAI_MUTATIONS = WatchSpec(
    index="podmutations-castai", group=CASTAI_GROUP, version=CASTAI_VERSION, plural=PLURAL, kind=KIND,
    slim=slim_podmutation, namespaced=False,
)  # fmt: skip


def watches_for(castai_objects: bool) -> tuple[WatchSpec, ...]:
    """What the plug-in watches: our PodMutations (and CAST AI's with ``castaiObjects``), and the
    Pods, ReplicaSets and Jobs a Pod's workload and siblings are found through."""
    specs = (OUR_MUTATIONS, PODS, REPLICASETS, JOBS)
    return (*specs, CASTAI_MUTATIONS) if castai_objects else specs


def _owner_lookup(view: ClusterView) -> OwnerLookup | None:
    replicasets, jobs = view.index(REPLICASETS.index), view.index(JOBS.index)

    def owner_of(kind: str, name: str, uid: str) -> tuple[str, str, str] | None:
        index = replicasets if kind == "ReplicaSet" else jobs if kind == "Job" else None
        record = index.get(uid) if index is not None else None
        owner = getattr(record, "owner", None)
        if isinstance(owner, Owner) and owner.uid:
            return owner.kind, owner.name, owner.uid
        return None

    return owner_of if view.available else None


def siblings_of(pod: Pod, view: ClusterView) -> Siblings:
    """The live Pods of the same controller, by placement and group: from the view's Pods grouped
    by owner, plus this process's recent decisions the view does not show yet (the edge's ledger,
    matched by ``castops.io/placement-decision``), so a burst of siblings sees each other."""
    owner = controller_of(metadata_of(pod))
    if not owner.uid or not view.available:
        return Siblings()
    spot = on_demand = unplaced = 0
    groups: list[str] = []
    seen: set[str] = set()
    for record in view.group(PODS.index, owner.uid).values():
        decision = getattr(record, "decision", "")
        if decision:
            seen.add(decision)  # a terminating Pod is shown too: its decision is not pending
        if getattr(record, "terminating", False):
            continue
        placement = getattr(record, "placement", "")
        spot += placement == "spot"
        on_demand += placement == "on-demand"
        unplaced += placement not in ("spot", "on-demand")
        group = getattr(record, "group", "")
        if group:
            groups.append(group)
    for entry in pending_entries(view, owner.uid, seen):
        spot += entry.placement == "spot"
        on_demand += entry.placement == "on-demand"
        unplaced += entry.placement is None
        if entry.group:
            groups.append(entry.group)
    return Siblings(SiblingCounts(spot=spot, on_demand=on_demand, unplaced=unplaced), tuple(groups))


def loaded_mutations(view: ClusterView, castai: bool) -> tuple[list[CompiledMutation], list[InvalidMutation]]:
    indices = [OUR_MUTATIONS.index, CASTAI_MUTATIONS.index] if castai else [OUR_MUTATIONS.index]
    valid: list[CompiledMutation] = []
    invalid: list[InvalidMutation] = []
    for name in indices:
        for record in view.index(name).values():
            if isinstance(record, CompiledMutation):
                valid.append(record)
            elif isinstance(record, InvalidMutation):
                invalid.append(record)
    return valid, invalid


MARK_READS = Reads(
    labels=Keys(frozenset({CASTAI_OPT_OUT_LABEL})), annotations=Keys(frozenset({MARK_ANNOTATION})), paths=()
)
"""What a run reads when no PodMutation may match the namespace: the mark and the opt-out label."""
WORKLOAD_PATHS = (("metadata", "name"), ("metadata", "generateName"), ("metadata", "ownerReferences"))
"""What the workload a Pod belongs to is read from (with the pod-template-hash label and the view)."""


def may_match_namespace(mutation: CompiledMutation, namespace: str) -> bool:
    """Whether ``mutation``'s namespace filters let it match a Pod of ``namespace`` at all."""
    if mutation.namespaces and not any(m.level(namespace) for m in mutation.namespaces):
        return False
    return not any(m.level(namespace) for m in mutation.exclude_namespaces)


def selection_reads(mutations: list[CompiledMutation], namespace: str) -> Reads:
    """What of a Pod decides whether one of ``mutations`` applies to it in ``namespace``: what a run
    that changes nothing depends on (a run that applies one marks the Pod, and a run on a marked
    Pod reads only the mark): the label keys the filters name or match (by regex), tolerations when
    one filters on them, the workload."""
    candidates = [m for m in mutations if may_match_namespace(m, namespace)]
    if not candidates:
        return MARK_READS
    keys = {CASTAI_OPT_OUT_LABEL, "pod-template-hash"}
    tests: list[Callable[[str], object]] = []
    tolerations = False
    for mutation in candidates:
        for rule in (mutation.labels, mutation.exclude_labels):
            for key, _value in rule.matchers if rule is not None else ():
                keys.add(key.value)
                if key.regex is not None:
                    tests.append(key.regex.fullmatch)
        tolerations = tolerations or mutation.tolerations is not None
    paths = (*WORKLOAD_PATHS, ("spec", "tolerations")) if tolerations else WORKLOAD_PATHS
    return Reads(Keys(frozenset(keys), tests=tuple(tests)), MARK_READS.annotations, paths)


def describe_workload(workload: Workload) -> str:
    return f"{workload.kind}/{workload.name}"


class PodMutations:
    name = NAME

    def __init__(self, config: PodMutationsConfig) -> None:
        self.config = config
        # The valid mutations of the last index state seen: the view hands out the same immutable
        # index object until a PodMutation changes, so most reviews skip the sorting-out.
        self._loaded: tuple[tuple[object, ...], list[CompiledMutation]] = ((), [])

    def _mutations(self, view: ClusterView) -> list[CompiledMutation]:
        names = (
            [OUR_MUTATIONS.index, CASTAI_MUTATIONS.index]
            if self.config.castaiObjects
            else [OUR_MUTATIONS.index]
        )
        indices = tuple(view.index(name) for name in names)
        key, valid = self._loaded
        if len(key) == len(indices) and all(a is b for a, b in zip(key, indices, strict=True)):
            return valid
        valid, _invalid = loaded_mutations(view, self.config.castaiObjects)
        self._loaded = (indices, valid)
        return valid

    def reads(self, ctx: RequestContext) -> Reads:
        return selection_reads(self._mutations(ctx.cluster), ctx.namespace)

    def mutate(self, pod: Pod, ctx: RequestContext) -> MutatorResult:
        marked = marked_by(pod)
        if marked is not None:
            return MutatorResult.unchanged(f"already mutated by podmutation {marked}")
        if labels_of(pod).get(CASTAI_OPT_OUT_LABEL) == "true":
            return MutatorResult.unchanged(f"pod opted out ({CASTAI_OPT_OUT_LABEL}=true)")
        view = ctx.cluster
        mutations = self._mutations(view)
        if not mutations:
            return MutatorResult.unchanged("no PodMutation loaded")
        workload = workload_of(pod, ctx.namespace, _owner_lookup(view))
        selection = select(mutations, workload, pod)
        chosen = selection.winner
        if chosen is None:
            return MutatorResult.unchanged(f"no PodMutation matches {describe_workload(workload)}")
        mutation = chosen.mutation
        result, done = apply_mutation(pod, mutation, siblings_of(pod, view), ctx.uid)
        if result is not pod:  # a patch replaced the whole Pod object: the engine reads ``pod``
            pod.clear()
            pod.update(result)
        label = f"podmutation {mutation.name} (generation {mutation.generation})"
        # The warning (120 characters at most) says what failed; the decision's reason has it whole.
        warnings = [fit_warning(f"podmutation {mutation.ref}: {w}") for w in done.warnings]
        if selection.tied:
            others = ", ".join(c.mutation.name for c in selection.tied)
            warnings.append(fit_warning(f"{label} chosen by name over equally specific {others}"))
        changes = "; ".join(done.changes + done.warnings) or "no change but the mark"
        reason = f"{label} for {describe_workload(workload)}: {changes}"
        if done.notes:  # extended paths that selected nothing: skipped, and said so
            reason += "; skipped: " + "; ".join(done.notes)
        return MutatorResult(Action.mutated, reason, tuple(warnings), frozenset(done.copied))
