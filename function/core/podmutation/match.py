"""Which PodMutations match a Pod, how specific each match is, and the one that applies.

Workload identity: the kind and name of the Pod's controller chain, walked up to the top
(Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob); a bare Pod is kind ``Pod`` and its own
name. The walk asks ``owner_of`` (the cluster view's ReplicaSet and Job indices); without a view a
ReplicaSet whose name is ``<deployment>-<pod-template-hash>`` is read as that Deployment, which is
how the Deployment controller names them.

Ranking ("the most specific filter wins", CAST AI's rule, whose order it never published): each
dimension scores ``2`` for an exact match, ``1`` for a regex match, ``0`` when the mutation does
not filter on it; the scores compare in this order, the first difference decides:

    1. workload names   2. pod labels (score, then how many label matchers hit)
    3. pod tolerations  4. workload kinds   5. namespaces

Equal ranks are broken by mutation name (then our group before CAST AI's), and reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from function.core.pod import controller_of, metadata_of
from function.core.podmutation.compiled import (
    EXACT,
    NONE,
    CompiledMutation,
    LabelRule,
    TextMatcher,
    TolerationRule,
)

OwnerLookup = Callable[[str, str, str], tuple[str, str, str] | None]
"""(kind, name, uid) of an owner -> (kind, name, uid) of its own controller, or None."""


@dataclass(frozen=True)
class Workload:
    namespace: str
    kind: str
    name: str


def workload_of(pod: Mapping[str, Any], namespace: str, owner_of: OwnerLookup | None = None) -> Workload:
    metadata = metadata_of(pod)
    controller = controller_of(metadata)
    if not controller.uid:
        return Workload(namespace, "Pod", str(metadata.get("name") or metadata.get("generateName") or ""))
    owner = controller.kind, controller.name, controller.uid
    for _ in range(8):  # owner chains are short; a cycle in a broken view must not hang a review
        parent = owner_of(*owner) if owner_of is not None else None
        if parent is None:
            break
        owner = parent
    kind, name, _uid = owner
    if kind == "ReplicaSet" and (owner_of is None or owner_of(*owner) is None):
        labels = metadata.get("labels") if isinstance(metadata.get("labels"), Mapping) else {}
        assert isinstance(labels, Mapping)
        template_hash = labels.get("pod-template-hash")
        if isinstance(template_hash, str) and template_hash and name.endswith("-" + template_hash):
            return Workload(namespace, "Deployment", name[: -len(template_hash) - 1])
    return Workload(namespace, kind, name)


@dataclass(frozen=True, order=True)
class Rank:
    names: int = NONE
    labels: int = NONE
    label_hits: int = 0
    tolerations: int = NONE
    kinds: int = NONE
    namespaces: int = NONE

    def describe(self) -> str:
        def word(score: int) -> str:
            return {2: "exact", 1: "regex", 0: "-"}[score]

        return (
            f"names {word(self.names)}, labels {word(self.labels)} ({self.label_hits}), "
            f"tolerations {word(self.tolerations)}, kinds {word(self.kinds)}, "
            f"namespaces {word(self.namespaces)}"
        )


def _best(matchers: Sequence[TextMatcher], text: str) -> int:
    best = NONE
    for matcher in matchers:
        level = matcher.level(text)
        if level == EXACT:
            return EXACT
        best = max(best, level)
    return best


def _labels(rule: LabelRule, labels: Mapping[str, Any]) -> tuple[int, int]:
    """(score, hits); score NONE when the rule is not satisfied."""
    scores = []
    for key_matcher, value_matcher in rule.matchers:
        best = NONE
        for key, value in labels.items():
            level = key_matcher.level(str(key))
            if level and value_matcher is not None:
                level = min(level, value_matcher.level(str(value)))
            best = max(best, level)
        scores.append(best)
    hits = [s for s in scores if s]
    if rule.operator == "and":
        return (min(scores) if scores and all(scores) else NONE), len(hits)
    return (max(hits) if hits else NONE), len(hits)


def _tolerations(rule: TolerationRule, tolerations: Sequence[Any]) -> int:
    scores = []
    for row in rule.matchers:
        best = NONE
        for toleration in tolerations:
            if not isinstance(toleration, Mapping):
                continue
            fields = (
                str(toleration.get("key", "")),
                str(toleration.get("operator") or "Equal"),
                str(toleration.get("value", "")),
                str(toleration.get("effect", "")),
            )
            levels = [m.level(text) for m, text in zip(row, fields, strict=True) if m is not None]
            best = max(best, min(levels, default=EXACT))
        scores.append(best)
    if rule.operator == "and":
        return min(scores) if scores and all(scores) else NONE
    return max(scores, default=NONE)


def _pod_parts(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[Any]]:
    """The Pod's labels and tolerations ({} and [] when absent or malformed)."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    spec = pod.get("spec")
    tolerations = spec.get("tolerations") if isinstance(spec, dict) else None
    return (labels if isinstance(labels, dict) else {}), (
        tolerations if isinstance(tolerations, list) else []
    )


def rank(mutation: CompiledMutation, workload: Workload, pod: Mapping[str, Any]) -> Rank | None:
    """How specifically ``mutation`` matches the Pod, or None when it does not match it."""
    labels, tolerations = _pod_parts(pod)
    return _rank(mutation, workload, labels, tolerations)


def _rank(
    mutation: CompiledMutation, workload: Workload, labels: Mapping[str, Any], tolerations: list[Any]
) -> Rank | None:
    # The cheap, most selective dimensions first: most mutations are rejected by one comparison.
    namespaces = names = kinds = NONE
    if mutation.namespaces:
        namespaces = _best(mutation.namespaces, workload.namespace)
        if not namespaces:
            return None
    if mutation.kinds:
        kinds = _best(mutation.kinds, workload.kind)
        if not kinds:
            return None
    if mutation.names:
        names = _best(mutation.names, workload.name)
        if not names:
            return None
    if (
        (mutation.exclude_namespaces and _best(mutation.exclude_namespaces, workload.namespace))
        or (mutation.exclude_names and _best(mutation.exclude_names, workload.name))
        or (mutation.exclude_kinds and _best(mutation.exclude_kinds, workload.kind))
    ):
        return None
    if mutation.exclude_labels is not None and _labels(mutation.exclude_labels, labels)[0]:
        return None
    label_score, hits = NONE, 0
    if mutation.labels is not None:
        label_score, hits = _labels(mutation.labels, labels)
        if not label_score:
            return None
    toleration_score = NONE
    if mutation.tolerations is not None:
        toleration_score = _tolerations(mutation.tolerations, tolerations)
        if not toleration_score:
            return None
    return Rank(names, label_score, hits, toleration_score, kinds, namespaces)


@dataclass(frozen=True)
class Candidate:
    mutation: CompiledMutation
    rank: Rank


@dataclass(frozen=True)
class Selection:
    """Every matching mutation, most specific first; ``winner`` applies, ``tied`` lost only by name."""

    candidates: tuple[Candidate, ...]

    @property
    def winner(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def tied(self) -> tuple[Candidate, ...]:
        if not self.candidates:
            return ()
        top = self.candidates[0].rank
        return tuple(c for c in self.candidates[1:] if c.rank == top)


def select(mutations: Iterable[CompiledMutation], workload: Workload, pod: Mapping[str, Any]) -> Selection:
    found = []
    labels, tolerations = _pod_parts(pod)
    for mutation in mutations:
        found_rank = _rank(mutation, workload, labels, tolerations)
        if found_rank is not None:
            found.append(Candidate(mutation, found_rank))
    # Highest rank first; equal ranks by name, ours before CAST AI's.
    found.sort(key=lambda c: c.mutation.sort_name)
    found.sort(key=lambda c: c.rank, reverse=True)
    return Selection(tuple(found))
