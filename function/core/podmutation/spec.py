"""The PodMutation spec: field-compatible with CAST AI's ``pod-mutations.cast.ai/v1`` schema, plus
the fields of CAST AI's API form (labels, annotations, tolerations, nodeSelector, affinity,
nodeTemplatesToConsolidate).

Unknown fields: our own ``castops.io`` objects are refused (a typo such as ``nodeselector`` must
not silently do nothing, the project's rule for every input it owns). CAST AI's objects are read
leniently: their controller evolves its CRD on its own schedule (``podEviction`` came late), so an
unknown field there is dropped with a warning rather than making a migrating cluster lose the
whole mutation. The lenient path is ``parse_spec(..., lenient=True)``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from function.core.podmutation.regex import RegexError, compile_linear
from function.core.podmutation.resource_rules import check_operations

NODE_TEMPLATE_KEY = "scheduling.cast.ai/node-template"

# Kubernetes' own syntax for the keys and values the declarative fields write (the apiserver
# rejects a Pod carrying anything else, and CastSlice never sends such a patch).
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_QUALIFIED_NAME = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME_PART}\Z"
)
_LABEL_VALUE = re.compile(rf"^({_NAME_PART})?\Z")
MAX_REGEX = 256
"""Filter regexes run on every admission, in linear time (RE2, function/core/podmutation/regex.py);
the bound keeps their compiled form small."""


def check_qualified_name(value: str, what: str) -> str:
    prefix = value.rsplit("/", 1)[0] if "/" in value else ""
    if not _QUALIFIED_NAME.match(value) or len(prefix) > 253:
        raise ValueError(f"{what} {value!r} is not a Kubernetes qualified name (e.g. 'example.com/name')")
    return value


def check_label_value(value: str, what: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"{what} {value!r} is not a label value (63 characters: A-Z a-z 0-9 - _ .)")
    return value


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# -- filter (v1): plain strings or regexes ----------------------------------------------------------
_REGEX_CHARS = re.compile(r"[\\^$.|?*+()\[\]{}]")


def is_regex(value: str) -> bool:
    """A v1 filter value is a regex when it has a regex metacharacter (a plain name never does, a
    dotted one is still compared exactly first)."""
    return bool(_REGEX_CHARS.search(value))


def check_pattern(value: str) -> str:
    if len(value) > MAX_REGEX:
        raise ValueError(f"{value[:40]!r}... is longer than {MAX_REGEX} characters")
    if is_regex(value):
        try:
            compile_linear(value)
        except RegexError as error:
            raise ValueError(str(error)) from None
    return value


Pattern = str


class WorkloadFilter(Model):
    namespaces: list[Pattern] = Field(default_factory=list)
    names: list[Pattern] = Field(default_factory=list)
    kinds: list[Pattern] = Field(default_factory=list)
    excludeNamespaces: list[Pattern] = Field(default_factory=list)
    excludeNames: list[Pattern] = Field(default_factory=list)
    excludeKinds: list[Pattern] = Field(default_factory=list)

    @field_validator("*")
    @classmethod
    def _patterns(cls, values: list[str]) -> list[str]:
        return [check_pattern(v) for v in values]


class LabelKV(Model):
    key: Pattern
    value: Pattern = ""

    @field_validator("key", "value")
    @classmethod
    def _pattern(cls, value: str) -> str:
        return check_pattern(value)


class PodFilter(Model):
    labelsFilter: list[LabelKV] = Field(default_factory=list)
    labelsOperator: Literal["and", "or"] = "and"
    excludeLabelsFilter: list[LabelKV] = Field(default_factory=list)
    excludeLabelsOperator: Literal["and", "or"] = "and"


class Filter(Model):
    workload: WorkloadFilter = Field(default_factory=WorkloadFilter)
    pod: PodFilter = Field(default_factory=PodFilter)


# -- filterV2: typed matchers -----------------------------------------------------------------------
class Matcher(Model):
    type: Literal["exact", "regex"] = "exact"
    value: str

    @model_validator(mode="after")
    def _regex(self) -> Matcher:
        if len(self.value) > MAX_REGEX:
            raise ValueError(f"value is longer than {MAX_REGEX} characters")
        if self.type == "regex":
            try:
                compile_linear(self.value)
            except RegexError as error:
                raise ValueError(f"value {error}") from None
        return self


class WorkloadFilterV2(Model):
    namespaces: list[Matcher] = Field(default_factory=list)
    names: list[Matcher] = Field(default_factory=list)
    kinds: list[Matcher] = Field(default_factory=list)
    excludeNamespaces: list[Matcher] = Field(default_factory=list)
    excludeNames: list[Matcher] = Field(default_factory=list)
    excludeKinds: list[Matcher] = Field(default_factory=list)


class LabelMatcher(Model):
    keyMatcher: Matcher
    valueMatcher: Matcher | None = None


class LabelsMatch(Model):
    operator: Literal["and", "or"] = "and"
    matchers: list[LabelMatcher] = Field(default_factory=list)


class TolerationMatcher(Model):
    keyMatcher: Matcher | None = None
    operatorMatcher: Matcher | None = None
    valueMatcher: Matcher | None = None
    effectMatcher: Matcher | None = None


class TolerationsMatch(Model):
    operator: Literal["and", "or"] = "and"
    matchers: list[TolerationMatcher] = Field(default_factory=list)


class PodFilterV2(Model):
    labels: LabelsMatch | None = None
    excludeLabels: LabelsMatch | None = None
    tolerations: TolerationsMatch | None = None


class FilterV2(Model):
    workload: WorkloadFilterV2 = Field(default_factory=WorkloadFilterV2)
    pod: PodFilterV2 = Field(default_factory=PodFilterV2)


# -- what a mutation changes ------------------------------------------------------------------------
SpotMode = Literal["optional-spot", "only-spot", "preferred-spot"]
Percentage = int


def _check_operations(raw: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    check_operations(raw, where)  # parses every path, refuses what breaks extended resources
    return raw


_FORBIDDEN_PATCH_ROOTS = ("/apiVersion", "/kind", "/metadata/name", "/metadata/namespace", "/metadata/uid")


def _check_patch_roots(raw: list[dict[str, Any]], where: str) -> None:
    for i, op in enumerate(raw):
        for key in ("path", "from"):
            value = op.get(key)
            if isinstance(value, str) and any(
                value == root or value.startswith(root + "/") for root in _FORBIDDEN_PATCH_ROOTS
            ):
                raise ValueError(
                    f"{where}[{i}].{key}: {value!r} is the Pod's identity, which the apiserver keeps"
                )


class PatchSequence(Model):
    operations: list[dict[str, Any]]

    @field_validator("operations")
    @classmethod
    def _ops(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _check_patch_roots(value, "operations")
        return _check_operations(value, "operations")


class SpotConfig(Model):
    mode: SpotMode
    distributionPercentage: Percentage = Field(default=100, ge=0, le=100)


class GroupConfiguration(Model):
    patches: list[dict[str, Any]] = Field(default_factory=list)
    patchesV2: list[PatchSequence] = Field(default_factory=list)
    spotMode: SpotMode | None = None

    @field_validator("patches")
    @classmethod
    def _ops(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _check_patch_roots(value, "patches")
        return _check_operations(value, "patches")


class DistributionGroup(Model):
    name: str = Field(min_length=1, max_length=63)
    percentage: Percentage = Field(ge=0, le=100)
    configuration: GroupConfiguration = Field(default_factory=GroupConfiguration)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_label_value(value, "group name")


class NodeSelectorChange(Model):
    add: dict[str, str] = Field(default_factory=dict)
    remove: list[str] = Field(default_factory=list)

    @field_validator("add")
    @classmethod
    def _add(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            check_qualified_name(key, "key")
            check_label_value(item, f"value of {key!r}")
        return value

    @model_validator(mode="after")
    def _no_contradiction(self) -> NodeSelectorChange:
        both = sorted(set(self.add) & set(self.remove))
        if both:
            raise ValueError(f"keys both added and removed: {', '.join(both)}")
        return self


class Toleration(Model):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    tolerationSeconds: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> Toleration:
        if self.key:
            check_qualified_name(self.key, "key")
        elif self.operator != "Exists":
            raise ValueError("a toleration without key must have operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.operator == "Equal":
            check_label_value(self.value, "value")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is only for effect NoExecute")
        return self

    def as_pod_field(self) -> dict[str, Any]:
        """The toleration as the apiserver stores it (empty fields dropped)."""
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.tolerationSeconds is not None:
            out["tolerationSeconds"] = self.tolerationSeconds
        return out


class NodeSelectorRequirement(Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> NodeSelectorRequirement:
        check_qualified_name(self.key, "key")
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (
            len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()
        ):
            raise ValueError(f"operator {self.operator} needs one integer value")
        return self


class NodeSelectorTerm(Model):
    matchExpressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    matchFields: list[NodeSelectorRequirement] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> NodeSelectorTerm:
        if not self.matchExpressions and not self.matchFields:
            raise ValueError("a node selector term needs matchExpressions or matchFields")
        return self


class RequiredNodeAffinity(Model):
    nodeSelectorTerms: list[NodeSelectorTerm] = Field(min_length=1)


class PreferredTerm(Model):
    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(Model):
    requiredDuringSchedulingIgnoredDuringExecution: RequiredNodeAffinity | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredTerm] = Field(default_factory=list)


class Affinity(Model):
    """Node affinity only: what CAST AI's API form offers (pod affinity is workload design, not
    placement policy; write it with a patch if you must)."""

    nodeAffinity: NodeAffinity


class PodEviction(Model):
    enabled: bool = False


class PodMutationSpec(Model):
    # CAST AI's CRD
    filter: Filter | None = None
    filterV2: FilterV2 | None = None
    patches: list[dict[str, Any]] = Field(default_factory=list)
    patchesV2: list[PatchSequence] = Field(default_factory=list)
    spotConfig: SpotConfig | None = None
    distributionGroups: list[DistributionGroup] = Field(default_factory=list)
    restartPolicy: Literal["deferred", "immediate"] = "deferred"
    podEviction: PodEviction | None = None
    # CAST AI's API form
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    nodeSelector: NodeSelectorChange | None = None
    affinity: Affinity | None = None
    nodeTemplatesToConsolidate: list[str] = Field(default_factory=list)

    @field_validator("patches")
    @classmethod
    def _patches(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _check_patch_roots(value, "patches")
        return _check_operations(value, "patches")

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            check_qualified_name(key, "label")
            check_label_value(item, f"value of label {key!r}")
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            check_qualified_name(key, "annotation")
        return value

    @field_validator("nodeTemplatesToConsolidate")
    @classmethod
    def _templates(cls, value: list[str]) -> list[str]:
        for name in value:
            check_label_value(name, "node template")
            if not name:
                raise ValueError("a node template name is not empty")
        if len(set(value)) != len(value):
            raise ValueError("node templates are listed twice")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PodMutationSpec:
        if self.filter is not None and self.filterV2 is not None:
            raise ValueError("filter and filterV2 are both set: use one (filterV2 is the typed form)")
        total = sum(g.percentage for g in self.distributionGroups)
        if total > 100:
            raise ValueError(f"distributionGroups: percentages add up to {total} %, more than 100 %")
        names = [g.name for g in self.distributionGroups]
        if len(set(names)) != len(names):
            raise ValueError("distributionGroups: group names must be unique")
        if self.spotConfig is not None and any(g.configuration.spotMode for g in self.distributionGroups):
            raise ValueError("spotConfig and a distribution group's spotMode both set the spot mode: use one")
        if (
            self.nodeTemplatesToConsolidate
            and self.nodeSelector
            and NODE_TEMPLATE_KEY in self.nodeSelector.add
        ):
            raise ValueError(
                f"nodeTemplatesToConsolidate and nodeSelector.add[{NODE_TEMPLATE_KEY}] contradict: "
                "consolidation replaces that node selector with an affinity"
            )
        return self


class InvalidSpec(ValueError):
    """Every problem of a spec, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _location(loc: tuple[int | str, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def describe(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{_location(tuple(item['loc']))}: {message}")
    return problems


def _drop(data: Any, loc: tuple[int | str, ...]) -> bool:
    node = data
    for part in loc[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(node, dict) and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


def _patch_warnings(spec: PodMutationSpec) -> list[str]:
    """What the patch lists do that breaks the apiserver's rules on some Pods (resource_rules)."""
    lists: list[tuple[str, list[dict[str, Any]]]] = [("spec.patches", spec.patches)]
    lists += [(f"spec.patchesV2[{i}].operations", s.operations) for i, s in enumerate(spec.patchesV2)]
    for i, group in enumerate(spec.distributionGroups):
        where = f"spec.distributionGroups[{i}].configuration"
        lists.append((f"{where}.patches", group.configuration.patches))
        lists += [
            (f"{where}.patchesV2[{j}].operations", s.operations)
            for j, s in enumerate(group.configuration.patchesV2)
        ]
    return [warning for where, raw in lists if raw for warning in check_operations(raw, where)]


def parse_spec(raw: Any, lenient: bool = False) -> tuple[PodMutationSpec, list[str]]:
    """The typed spec and its warnings, or InvalidSpec. ``lenient`` drops unknown fields with a
    warning (CAST AI's own objects) instead of refusing them."""
    import copy

    data = copy.deepcopy(raw) if raw is not None else {}
    if not isinstance(data, dict):
        raise InvalidSpec([f"spec: an object is expected, got {type(raw).__name__}"])
    warnings: list[str] = []
    for _ in range(20):  # each round drops the unknown fields pydantic reported
        try:
            spec = PodMutationSpec.model_validate(data)
        except ValidationError as error:
            extra = [tuple(e["loc"]) for e in error.errors() if e["type"] == "extra_forbidden"]
            if lenient and extra and len(extra) == len(error.errors()):
                for loc in extra:
                    if _drop(data, loc):
                        warnings.append(f"{_location(loc)}: unknown field ignored")
                continue
            raise InvalidSpec(describe(error)) from None
        warnings.extend(_patch_warnings(spec))
        if spec.restartPolicy == "immediate":
            warnings.append("spec.restartPolicy: immediate is accepted, but CastSlice restarts nothing")
        if spec.podEviction is not None and spec.podEviction.enabled:
            warnings.append("spec.podEviction.enabled is accepted, but CastSlice evicts nothing")
        return spec, warnings
    raise InvalidSpec(["spec: too many unknown fields"])
