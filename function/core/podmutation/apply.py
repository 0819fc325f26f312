"""Applying the winning PodMutation to a Pod (a plain dict, edited in place).

Order (CAST AI's: "all preceding mutations have a priority, and the patch is applied at the end"):
labels, annotations, nodeSelector, tolerations, affinity, node-template consolidation, spot
settings, then the JSON patches, which therefore win on conflict. Every declarative step is
idempotent (a value already there is not added twice). A patch list that fails (a failed
``test``, a missing path) is dropped whole with a warning: the Pod keeps the rest of the decision.

Finally the Pod is marked ``castops.io/pod-mutation: <name>/<generation>``: a marked Pod is left
alone, so a second pass (the engine's fixed point, the apiserver's reinvocation) adds nothing,
even when a patch is not idempotent (``add /spec/tolerations/-``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from function.core.json_patch import copy_json, strings_in
from function.core.placement import (
    CASTAI,
    DECISION_ANNOTATION,
    PLACEMENT_LABEL,
    Placement,
    SiblingCounts,
    apply_spot_mode,
    partial_split,
)
from function.core.pod import CONTAINER_LISTS
from function.core.podmutation.compiled import CompiledMutation, Group
from function.core.podmutation.jsonpatch_ext import CompiledOperation, apply_sequence
from function.core.podmutation.names import MARK_ANNOTATION
from function.core.podmutation.spec import (
    NODE_TEMPLATE_KEY,
    NodeAffinity,
    NodeSelectorChange,
    PodMutationSpec,
    SpotMode,
)
from function.core.rules import introduced_violations, scheduling_violations
from function.core.view import MUTATION_GROUP_ANNOTATION

GROUP_ANNOTATION = MUTATION_GROUP_ANNOTATION
"""The distribution group chosen for this Pod (siblings are counted by it, through the view)."""

NODE_AFFINITY = "nodeAffinity"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True)
class Siblings:
    """The other live Pods of the same controller (from the cluster view); empty offline, so every
    Pod is then counted as the first of its controller."""

    counts: SiblingCounts = field(default_factory=SiblingCounts)
    groups: tuple[str, ...] = ()  # the GROUP_ANNOTATION of each sibling that has one


def choose_group(groups: Sequence[Group], siblings: Siblings) -> Group | None:
    """The group furthest below its share among T = siblings + this Pod; the remainder (100 % minus
    the groups' sum) is the "no group" share. Ties go to the earlier group, then to no group."""
    total = siblings.counts.total_with_new
    best: Group | None = None
    best_deficit = -math.inf
    for group in groups:
        deficit = total * group.percentage / 100 - sum(1 for g in siblings.groups if g == group.name)
        if group.percentage and deficit > best_deficit:
            best, best_deficit = group, deficit
    rest = 100 - sum(g.percentage for g in groups)
    if rest:
        known = {g.name for g in groups}
        rest_deficit = total * rest / 100 - sum(1 for g in siblings.groups if g not in known)
        if rest_deficit > best_deficit:
            return None
    return best


@dataclass
class Applied:
    changes: list[str] = field(default_factory=list)  # what changed, in order, for the decision
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # skipped extended paths and such (not warnings)
    placement: Placement | None = None
    group: str | None = None
    copied: set[str] = field(default_factory=set)  # strings copied or moved out of containers
    decision: str = ""  # the admission uid, written with a placement or group


def _map(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def _list(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    if not isinstance(value, list):
        value = parent[key] = []
    return value


def _same_toleration(a: Any, b: Mapping[str, Any]) -> bool:
    if not isinstance(a, Mapping):
        return False
    fields = ("key", "value", "effect", "tolerationSeconds")
    return all(
        (a.get(f) in (None, "") and b.get(f) in (None, "")) or a.get(f) == b.get(f) for f in fields
    ) and ((a.get("operator") or "Equal") == (b.get("operator") or "Equal"))


def add_toleration(spec: dict[str, Any], toleration: Mapping[str, Any]) -> bool:
    tolerations = _list(spec, "tolerations")
    if any(_same_toleration(t, toleration) for t in tolerations):
        return False
    tolerations.append(dict(toleration))
    return True


def and_into_required(spec: dict[str, Any], terms: Sequence[Mapping[str, Any]]) -> bool:
    """AND an OR of node selector terms into the Pod's required node affinity: every existing term
    gets each new term's expressions (the cross product), since appending a term would widen
    placement instead of narrowing it. Expressions already present are not repeated."""
    affinity = _map(_map(spec, "affinity"), NODE_AFFINITY)
    required = affinity.get(REQUIRED)
    existing = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(existing, list) or not existing:
        new_terms = [_term_copy(t) for t in terms]
    else:
        new_terms = []
        for old in existing:
            if isinstance(old, Mapping) and not _readable_term(old):
                # An empty term (no expressions: absent, null or []) matches no node, and ANDing
                # into it would make it match some: it stays as it is. So does a term the
                # apiserver rejects (parts that are not lists, a malformed expression).
                new_terms.append(_term_copy(old))
                continue
            for term in terms:
                merged = _term_copy(old) if isinstance(old, Mapping) else {}
                for part in ("matchExpressions", "matchFields"):
                    for expression in term.get(part) or ():
                        items = merged.get(part)
                        if not isinstance(items, list):  # absent or null: the same as []
                            items = merged[part] = []
                        if expression not in items:
                            items.append(copy_json(expression))  # one object per term, never shared
                new_terms.append(merged)
    before = existing if isinstance(existing, list) else None
    if before == new_terms:
        return False
    if not isinstance(required, dict):
        required = affinity[REQUIRED] = {}
    required["nodeSelectorTerms"] = new_terms
    return True


def _readable_term(term: Mapping[str, Any]) -> bool:
    """Whether a node selector term selects anything and can take more expressions: some
    matchExpressions or matchFields, each part a list or null, and no expression the apiserver
    refuses (such a Pod is rejected whatever is added; copying the term for each new one would
    only copy the problem to a new place)."""
    parts = [term.get("matchExpressions"), term.get("matchFields")]
    if not any(parts) or not all(part is None or isinstance(part, list) for part in parts):
        return False
    alone = {"spec": {"affinity": {NODE_AFFINITY: {REQUIRED: {"nodeSelectorTerms": [dict(term)]}}}}}
    return not scheduling_violations(alone)


def _term_copy(term: Mapping[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = copy_json(dict(term))
    return copied


def add_preferred(spec: dict[str, Any], preferred: Sequence[Mapping[str, Any]]) -> bool:
    items = _list(_map(_map(spec, "affinity"), NODE_AFFINITY), PREFERRED)
    changed = False
    for term in preferred:
        if term not in items:
            items.append(_term_copy(term))
            changed = True
    return changed


def pod_shape_problem(pod: Any, before: Any = None) -> str | None:
    """What the apiserver would refuse in the Pod that ``before`` did not already have, or None:
    in its placement fields (labels, annotations, nodeSelector, tolerations, node affinity:
    ``rules.scheduling_violations``) and in its extended resources (``rules``: whole numbers,
    a request with an equal limit). Not a full Pod validation: the checks the engine's proof runs,
    run here on one patch list, so a list that breaks them is dropped alone (the rest of the
    decision, GPU slicing included, stays) instead of the engine withholding the whole patch."""
    if (
        not isinstance(pod, dict)
        or not isinstance(pod.get("metadata"), dict)
        or not isinstance(pod.get("spec"), dict)
    ):
        return "metadata and spec must stay objects"
    introduced = scheduling_violations(pod) - (
        scheduling_violations(before) if isinstance(before, dict) else set()
    )
    introduced |= introduced_violations(before if isinstance(before, dict) else {}, pod)
    return "; ".join(sorted(introduced)) or None


def _run_sequences(
    pod: dict[str, Any], sequences: Sequence[Sequence[CompiledOperation]], what: str, done: Applied
) -> dict[str, Any]:
    for i, sequence in enumerate(sequences):
        outcome = apply_sequence(pod, sequence)
        label = what if len(sequences) == 1 else f"{what} #{i + 1}"
        done.notes.extend(f"{label} {note}" for note in outcome.skipped)
        if outcome.document is None:
            done.warnings.append(f"{label} not applied: {outcome.error}")
            continue
        problem = pod_shape_problem(outcome.document, pod)
        if problem:
            done.warnings.append(f"{label} not applied: the Pod would be invalid: {problem}")
            continue
        if outcome.applied:
            pod = outcome.document
            done.changes.append(f"{label} ({len(outcome.applied)} ops)")
            for source, value in outcome.copied:
                if _holds_containers(source):
                    strings_in(value, done.copied)
    return pod


_CONTAINER_LISTS = tuple(f"/spec/{kind}" for kind in CONTAINER_LISTS)
"""Where env values, commands and args live: what a copy takes from there may be a secret."""


def _holds_containers(source: str) -> bool:
    """Whether a copy from ``source`` takes something in a container list, or one whole."""
    return any(
        source == where or source.startswith(where + "/") or where.startswith(source + "/")
        for where in _CONTAINER_LISTS
    )


def _is_template(pod: dict[str, Any]) -> bool:
    metadata = pod.get("metadata")
    return not (isinstance(metadata, dict) and (metadata.get("name") or metadata.get("generateName")))


def _distributes(mutation: CompiledMutation) -> bool:
    """Whether the mutation splits a workload's Pods (a share below 100 %, or groups)."""
    spot = mutation.spec.spotConfig
    return bool(mutation.groups) or (spot is not None and spot.distributionPercentage < 100)


def apply_mutation(
    pod: dict[str, Any], mutation: CompiledMutation, siblings: Siblings = Siblings(), decision: str = ""
) -> tuple[dict[str, Any], Applied]:
    """The mutated Pod (``pod`` itself, edited, unless a patch replaced it) and what was done, in
    the module's order: the declarative fields, the distribution share and its spot placement,
    then the patches (the mutation's, then its chosen group's). ``decision`` (the admission uid)
    is written beside a placement or group chosen among siblings, so the edge can tell its recent
    decisions from what the view already shows."""
    wanted = mutation.spec
    done = Applied(decision=decision)
    metadata = _map(pod, "metadata")
    spec = _map(pod, "spec")
    _set_labels_and_annotations(metadata, wanted, done)
    _change_node_selector(spec, wanted.nodeSelector, done)
    added = sum(add_toleration(spec, t.as_pod_field()) for t in wanted.tolerations)
    if added:
        done.changes.append(f"tolerations +{added}")
    if wanted.affinity is not None:
        _add_node_affinity(spec, wanted.affinity.nodeAffinity, done)
    if wanted.nodeTemplatesToConsolidate:
        _consolidate_node_templates(spec, wanted.nodeTemplatesToConsolidate, done)
    group = _place(pod, mutation, siblings, done)

    # Our bookkeeping goes in before the patches (so /metadata/annotations exists for a patch that
    # adds one annotation, as CAST AI's Terraform example does) and again after them (so a patch
    # that removed the annotations cannot undo it).
    _mark(pod, mutation, done)
    pod = _run_sequences(pod, mutation.sequences, "patches", done)
    if group is not None and group.sequences:
        pod = _run_sequences(pod, group.sequences, f"group {group.name} patches", done)
    _mark(pod, mutation, done)
    return pod, done


def _set_labels_and_annotations(metadata: dict[str, Any], wanted: PodMutationSpec, done: Applied) -> None:
    for field_name, values in (("labels", wanted.labels), ("annotations", wanted.annotations)):
        if not values:
            continue
        current = _map(metadata, field_name)
        changed = [key for key, value in values.items() if current.get(key) != value]
        current.update(values)
        if changed:
            done.changes.append(f"{field_name} " + ",".join(changed))


def _change_node_selector(spec: dict[str, Any], wanted: NodeSelectorChange | None, done: Applied) -> None:
    if wanted is None:
        return
    current = spec.get("nodeSelector")
    selector: dict[str, Any] = current if isinstance(current, dict) else {}
    before = dict(selector)
    selector.update(wanted.add)
    for key in wanted.remove:
        selector.pop(key, None)
    if selector != before:
        done.changes.append("nodeSelector")
    if selector:
        spec["nodeSelector"] = selector
    else:
        spec.pop("nodeSelector", None)


def _add_node_affinity(spec: dict[str, Any], wanted: NodeAffinity, done: Applied) -> None:
    required = wanted.requiredDuringSchedulingIgnoredDuringExecution
    if required is not None:
        terms = [term.model_dump(exclude_defaults=True) for term in required.nodeSelectorTerms]
        if and_into_required(spec, terms):
            done.changes.append("required node affinity")
    preferred = [
        term.model_dump(exclude_defaults=True)
        for term in wanted.preferredDuringSchedulingIgnoredDuringExecution
    ]
    if preferred and add_preferred(spec, preferred):
        done.changes.append("preferred node affinity")


def _consolidate_node_templates(spec: dict[str, Any], templates: Sequence[str], done: Applied) -> None:
    """CAST AI's node-template consolidation: the Pod may run on any of the templates' nodes (a
    required affinity ``In`` them, which replaces a node-template nodeSelector) and tolerates each
    template's taint."""
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict) and NODE_TEMPLATE_KEY in selector:
        del selector[NODE_TEMPLATE_KEY]
        if not selector:
            del spec["nodeSelector"]
        done.changes.append("node-template nodeSelector -> affinity")
    term = {"matchExpressions": [{"key": NODE_TEMPLATE_KEY, "operator": "In", "values": list(templates)}]}
    if and_into_required(spec, [term]):
        done.changes.append("node templates " + ",".join(templates))
    for template in templates:
        toleration = {
            "key": NODE_TEMPLATE_KEY,
            "operator": "Equal",
            "value": template,
            "effect": "NoSchedule",
        }
        if add_toleration(spec, toleration):
            done.changes.append(f"toleration {template}")


def _place(
    pod: dict[str, Any], mutation: CompiledMutation, siblings: Siblings, done: Applied
) -> Group | None:
    """The distribution share this Pod gets and the spot placement that follows from it, applied
    and recorded in ``done``; the chosen group, whose patches run after the mutation's."""
    if _is_template(pod) and _distributes(mutation):
        # A workload's Pod template (castslice mutate: no name, no generateName): a share chosen
        # here would pin every Pod of the workload to one side. Each Pod is placed when created.
        done.notes.append("spot distribution and groups: chosen per Pod when each is created")
        return None
    group = choose_group(mutation.groups, siblings) if mutation.groups else None
    mode = _share(mutation, group, siblings, done)
    if done.placement is not None:
        # The spot placement machinery (function/core/placement.py), CAST AI's node labels and taint;
        # the on-demand share drops spot tolerations and selectors so it really runs on-demand.
        account = apply_spot_mode(pod, mode or "on-demand", CASTAI)
        done.changes.append(f"{done.placement}" + (f" ({account})" if account else ""))
    return group


def _share(
    mutation: CompiledMutation, group: Group | None, siblings: Siblings, done: Applied
) -> SpotMode | None:
    """Record the Pod's share in ``done`` (its group, "" for the rest, and its placement) and
    return the spot mode the share asks for (None: on-demand, or no placement at all)."""
    if group is not None:
        done.group = group.name
        if group.spot_mode is not None:
            done.placement = "spot"
        return group.spot_mode
    spot = mutation.spec.spotConfig
    if spot is not None:
        done.placement = partial_split(siblings.counts, spot.distributionPercentage)
        return spot.mode if done.placement == "spot" else None
    if mutation.groups:
        done.group = ""  # the remainder's share: no group
        if any(g.spot_mode for g in mutation.groups):
            done.placement = "on-demand"
    return None


def _mark(pod: dict[str, Any], mutation: CompiledMutation, done: Applied) -> None:
    annotations = _map(_map(pod, "metadata"), "annotations")
    annotations[MARK_ANNOTATION] = mutation.ref
    if done.placement is not None:
        # the label the spot mutator also writes and counts siblings by
        _map(pod["metadata"], "labels")[PLACEMENT_LABEL] = done.placement
    if done.group is not None:
        annotations[GROUP_ANNOTATION] = done.group or "none"
    if (done.placement is not None or done.group is not None) and done.decision:
        # as the spot mutator marks its own: the ledger matches the view's Pods by it
        annotations.setdefault(DECISION_ANNOTATION, done.decision)
