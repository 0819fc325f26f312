"""A PodMutation object compiled once, when it is loaded: regexes compiled, patch paths parsed, the
spec checked. The result is immutable and shared by every review (Gatekeeper's model); the cluster
view's index holds it (the WatchSpec's ``slim`` is ``compile_object``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from function.core.podmutation.jsonpatch_ext import CompiledOperation, compile_operations
from function.core.podmutation.names import (
    CASTAI_GROUP,
    CASTAI_VERSION,
    KIND,
    OUR_GROUP,
    OUR_VERSION,
    is_podmutation,
)
from function.core.podmutation.regex import LinearRegex, compile_linear
from function.core.podmutation.spec import (
    InvalidSpec,
    LabelsMatch,
    Matcher,
    PodMutationSpec,
    SpotMode,
    TolerationsMatch,
    is_regex,
    parse_spec,
)

EXACT, REGEX, NONE = 2, 1, 0
"""How well a filter value matched: exactly, through a regex, not at all."""


@dataclass(frozen=True)
class TextMatcher:
    value: str
    regex: LinearRegex | None = None  # RE2: linear in the text, whatever the pattern
    exact: bool = True  # False: a filterV2 ``regex`` matcher (never counts as an exact match)

    def level(self, text: str) -> int:
        if self.exact and text == self.value:
            return EXACT
        if self.regex is not None and self.regex.fullmatch(text):
            return REGEX
        return NONE

    @classmethod
    def plain_or_regex(cls, value: str) -> TextMatcher:
        return cls(value, compile_linear(value) if is_regex(value) else None)

    @classmethod
    def typed(cls, matcher: Matcher) -> TextMatcher:
        if matcher.type == "regex":
            return cls(matcher.value, compile_linear(matcher.value), exact=False)
        return cls(matcher.value)


ANY_VALUE = TextMatcher("", compile_linear(r"(?s).*"), exact=False)


@dataclass(frozen=True)
class LabelRule:
    operator: Literal["and", "or"]
    matchers: tuple[tuple[TextMatcher, TextMatcher | None], ...]  # (key, value); None: any value


@dataclass(frozen=True)
class TolerationRule:
    operator: Literal["and", "or"]
    # per matcher: (key, operator, value, effect); None: any
    matchers: tuple[tuple[TextMatcher | None, ...], ...]


@dataclass(frozen=True)
class Group:
    name: str
    percentage: int
    spot_mode: SpotMode | None
    sequences: tuple[tuple[CompiledOperation, ...], ...]


@dataclass(frozen=True)
class CompiledMutation:
    name: str
    group: str  # API group: castops.io or pod-mutations.cast.ai
    generation: int
    uid: str
    spec: PodMutationSpec
    warnings: tuple[str, ...]
    namespaces: tuple[TextMatcher, ...] = ()
    names: tuple[TextMatcher, ...] = ()
    kinds: tuple[TextMatcher, ...] = ()
    exclude_namespaces: tuple[TextMatcher, ...] = ()
    exclude_names: tuple[TextMatcher, ...] = ()
    exclude_kinds: tuple[TextMatcher, ...] = ()
    labels: LabelRule | None = None
    exclude_labels: LabelRule | None = None
    tolerations: TolerationRule | None = None
    sequences: tuple[tuple[CompiledOperation, ...], ...] = ()  # patches, then each patchesV2 entry
    groups: tuple[Group, ...] = field(default=())

    @property
    def ref(self) -> str:
        """How decisions, events and warnings name it: name and generation."""
        return f"{self.name}/{self.generation}"

    @property
    def sort_name(self) -> tuple[str, int]:
        return (self.name, 0 if self.group == OUR_GROUP else 1)


@dataclass(frozen=True)
class InvalidMutation:
    """A PodMutation that failed validation: kept in the index so a decision can say it was ignored."""

    name: str
    group: str
    generation: int
    problems: tuple[str, ...]
    uid: str = ""

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.generation}"


def _labels_v1(items: list[Any], operator: Literal["and", "or"]) -> LabelRule | None:
    if not items:
        return None
    return LabelRule(
        operator,
        tuple(
            (TextMatcher.plain_or_regex(i.key), TextMatcher.plain_or_regex(i.value) if i.value else None)
            for i in items
        ),
    )


def _labels_v2(match: LabelsMatch | None) -> LabelRule | None:
    if match is None or not match.matchers:
        return None
    return LabelRule(
        match.operator,
        tuple(
            (TextMatcher.typed(m.keyMatcher), TextMatcher.typed(m.valueMatcher) if m.valueMatcher else None)
            for m in match.matchers
        ),
    )


def _tolerations_v2(match: TolerationsMatch | None) -> TolerationRule | None:
    if match is None or not match.matchers:
        return None
    rows = tuple(
        tuple(
            TextMatcher.typed(m) if m is not None else None
            for m in (t.keyMatcher, t.operatorMatcher, t.valueMatcher, t.effectMatcher)
        )
        for t in match.matchers
    )
    return TolerationRule(match.operator, rows)


def compile_spec(
    name: str,
    spec: PodMutationSpec,
    warnings: tuple[str, ...] = (),
    group: str = OUR_GROUP,
    generation: int = 0,
    uid: str = "",
) -> CompiledMutation:
    parts: dict[str, Any] = {}
    if spec.filter is not None:
        w, p = spec.filter.workload, spec.filter.pod
        for attr in ("namespaces", "names", "kinds", "excludeNamespaces", "excludeNames", "excludeKinds"):
            parts[_snake(attr)] = tuple(TextMatcher.plain_or_regex(v) for v in getattr(w, attr))
        parts["labels"] = _labels_v1(p.labelsFilter, p.labelsOperator)
        parts["exclude_labels"] = _labels_v1(p.excludeLabelsFilter, p.excludeLabelsOperator)
    elif spec.filterV2 is not None:
        w2, p2 = spec.filterV2.workload, spec.filterV2.pod
        for attr in ("namespaces", "names", "kinds", "excludeNamespaces", "excludeNames", "excludeKinds"):
            parts[_snake(attr)] = tuple(TextMatcher.typed(m) for m in getattr(w2, attr))
        parts["labels"] = _labels_v2(p2.labels)
        parts["exclude_labels"] = _labels_v2(p2.excludeLabels)
        parts["tolerations"] = _tolerations_v2(p2.tolerations)
    sequences = []
    if spec.patches:
        sequences.append(compile_operations(spec.patches, "spec.patches"))
    for i, seq in enumerate(spec.patchesV2):
        sequences.append(compile_operations(seq.operations, f"spec.patchesV2[{i}].operations"))
    groups = []
    for i, g in enumerate(spec.distributionGroups):
        where = f"spec.distributionGroups[{i}].configuration"
        gseq = []
        if g.configuration.patches:
            gseq.append(compile_operations(g.configuration.patches, f"{where}.patches"))
        for j, seq in enumerate(g.configuration.patchesV2):
            gseq.append(compile_operations(seq.operations, f"{where}.patchesV2[{j}].operations"))
        groups.append(Group(g.name, g.percentage, g.configuration.spotMode, tuple(gseq)))
    return CompiledMutation(
        name=name, group=group, generation=generation, uid=uid, spec=spec, warnings=warnings,
        sequences=tuple(sequences), groups=tuple(groups), **parts,
    )  # fmt: skip


def _snake(attr: str) -> str:
    return {
        "excludeNamespaces": "exclude_namespaces",
        "excludeNames": "exclude_names",
        "excludeKinds": "exclude_kinds",
    }.get(attr, attr)


def compile_object(obj: Mapping[str, Any]) -> CompiledMutation | InvalidMutation:
    """A PodMutation object (either group) compiled, or the list of what is wrong with it."""
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    name = str(metadata.get("name") or "")
    group = str(obj.get("apiVersion", "")).split("/", 1)[0]
    generation = metadata.get("generation")
    generation = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
    # The view keys records by uid; a document read offline has none, its group and name do.
    uid = str(metadata.get("uid") or f"{group}/{name}")
    if not name:
        return InvalidMutation("", group, generation, ("metadata.name is required",), uid)
    if not is_podmutation(obj):
        return InvalidMutation(
            name, group, generation,
            (f"apiVersion {obj.get('apiVersion')!r} kind {obj.get('kind')!r} is not a PodMutation "
             f"(accepted: {OUR_GROUP}/{OUR_VERSION}, {CASTAI_GROUP}/{CASTAI_VERSION})",), uid,
        )  # fmt: skip
    try:
        spec, warnings = parse_spec(obj.get("spec"), lenient=group == CASTAI_GROUP)
        return compile_spec(name, spec, tuple(warnings), group, generation, uid)
    except InvalidSpec as error:
        return InvalidMutation(name, group, generation, tuple(error.problems), uid)
    except ValueError as error:  # patch compile errors carry their own field names
        return InvalidMutation(name, group, generation, (str(error),), uid)


# -- CAST AI's API form (the JSON of its PodMutations API and console) ------------------------------
_SPOT_TYPES = {
    "UNSPECIFIED_SPOT_TYPE": None,
    "OPTIONAL_SPOT": "optional-spot",
    "USE_ONLY_SPOT": "only-spot",
    "ONLY_SPOT": "only-spot",
    "PREFERRED_SPOT": "preferred-spot",
}
_API_IGNORED = ("organizationId", "clusterId", "id", "source", "createdAt", "updatedAt")


def from_api_form(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The PodMutation object (our group) equivalent to one CAST AI API document.

    ``objectFilter.names/namespaces/kinds`` become the workload filter, ``objectFilter.labels`` (a
    map) the pod label filter (and), ``spotType``/``spotDistributionPercentage`` the spotConfig,
    a plain ``nodeSelector`` map the ``nodeSelector.add``. ``enabled: false`` keeps it out (the
    caller skips it). Unknown fields are passed on, so they are refused by name."""
    rest = {k: v for k, v in doc.items() if k not in (*_API_IGNORED, "name", "enabled", "objectFilter")}
    spec: dict[str, Any] = {}
    object_filter = doc.get("objectFilter") or {}
    if not isinstance(object_filter, Mapping):
        raise ValueError("objectFilter: an object is expected")
    workload = {k: object_filter[k] for k in ("names", "namespaces", "kinds") if k in object_filter}
    pod: dict[str, Any] = {}
    labels = object_filter.get("labels")
    if isinstance(labels, Mapping) and labels:
        pod = {"labelsOperator": "and", "labelsFilter": [{"key": k, "value": v} for k, v in labels.items()]}
    unknown = sorted(set(object_filter) - {"names", "namespaces", "kinds", "labels"})
    if unknown:
        raise ValueError(
            f"objectFilter: unknown field(s) {', '.join(unknown)} "
            "(accepted: names, namespaces, kinds, labels)"
        )
    if workload or pod:
        spec["filter"] = {"workload": workload, "pod": pod}
    spot_type = rest.pop("spotType", None)
    percentage = rest.pop("spotDistributionPercentage", None)
    if spot_type is not None:
        if spot_type not in _SPOT_TYPES:
            raise ValueError(f"spotType: {spot_type!r} is not one of {', '.join(_SPOT_TYPES)}")
        mode = _SPOT_TYPES[spot_type]
        if mode is not None:
            spec["spotConfig"] = {"mode": mode}
            if percentage is not None:
                spec["spotConfig"]["distributionPercentage"] = percentage
    node_selector = rest.pop("nodeSelector", None)
    if isinstance(node_selector, Mapping) and node_selector and not set(node_selector) <= {"add", "remove"}:
        node_selector = {"add": dict(node_selector)}
    if node_selector:
        spec["nodeSelector"] = node_selector
    spec.update(rest)
    return {
        "apiVersion": f"{OUR_GROUP}/{OUR_VERSION}",
        "kind": KIND,
        "metadata": {"name": doc["name"]},
        "spec": spec,
    }
