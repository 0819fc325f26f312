"""Kubernetes label selectors (``metav1.LabelSelector``): one meaning for every selector the core reads.

A selector holds when every ``matchLabels`` pair and every ``matchExpressions`` requirement holds;
an empty one selects everything (as in Kubernetes). Two forms share that meaning:

- ``LabelSelector``, a configuration model (spot's Pod terms, DRA's namespace selector), refusing
  what the apiserver would refuse when the configuration loads;
- ``selector_problems`` / ``compile_selector`` / ``selects`` for a selector inside a watched object
  (a GpuLease's ``podSelector``): judged with every problem named by its field, then compiled once
  into ``Requirement`` tuples a review matches without revalidating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any, Literal, NamedTuple

from pydantic import Field, model_validator

from function.core.configtypes import Strict

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class Requirement(NamedTuple):
    key: str
    operator: str
    values: frozenset[str]


def values_problem(operator: str, values: Any) -> str | None:
    """What is wrong with a requirement's values for its operator, or None."""
    if operator in ("In", "NotIn") and (not isinstance(values, list) or not values):
        return f"{operator} needs at least one value"
    if operator in ("Exists", "DoesNotExist") and values:
        return f"{operator} takes no values"
    return None


def selector_problems(selector: Any, where: str) -> list[str]:
    """A metav1.LabelSelector's problems, each naming its field."""
    if selector is None:
        return []
    if not isinstance(selector, Mapping):
        return [f"{where}: must be a label selector (matchLabels, matchExpressions)"]
    problems = [
        f"{where}.{key}: unknown field" for key in selector if key not in ("matchLabels", "matchExpressions")
    ]
    labels = selector.get("matchLabels")
    if labels is not None and (
        not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values())
    ):
        problems.append(f"{where}.matchLabels: must map label keys to string values")
    expressions = selector.get("matchExpressions")
    if expressions is None:
        return problems
    if not isinstance(expressions, list):
        return [*problems, f"{where}.matchExpressions: must be a list"]
    for index, expression in enumerate(expressions):
        at = f"{where}.matchExpressions[{index}]"
        if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
            problems.append(f"{at}: needs a key")
            continue
        operator = expression.get("operator")
        if operator not in SELECTOR_OPERATORS:
            problems.append(f"{at}.operator: {operator!r} is not one of {', '.join(SELECTOR_OPERATORS)}")
            continue
        problem = values_problem(operator, expression.get("values"))
        if problem:
            problems.append(f"{at}.values: {problem}")
    return problems


def compile_selector(selector: Any) -> tuple[Requirement, ...]:
    """A valid selector as requirements (matchLabels become In of one value); None/{}: all Pods."""
    if not isinstance(selector, Mapping):
        return ()
    found = [
        Requirement(str(k), "In", frozenset((str(v),)))
        for k, v in (selector.get("matchLabels") or {}).items()
    ]
    for expression in selector.get("matchExpressions") or ():
        values = frozenset(str(v) for v in expression.get("values") or ())
        found.append(Requirement(str(expression["key"]), str(expression["operator"]), values))
    return tuple(found)


def selects(requirements: Iterable[Requirement], labels: Mapping[str, Any]) -> bool:
    for key, operator, values in requirements:
        value = labels.get(key)
        if operator == "In" and value not in values:
            return False
        if operator == "NotIn" and value in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


class LabelSelectorRequirement(Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        problem = values_problem(self.operator, self.values)
        if problem:
            raise ValueError(f"operator {problem}")
        return self


class LabelSelector(Strict):
    """A selector in the configuration; ``matches`` is ``selects`` over its compiled requirements."""

    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @cached_property
    def requirements(self) -> tuple[Requirement, ...]:
        return compile_selector(self.model_dump())

    def matches(self, labels: Mapping[str, Any]) -> bool:
        return selects(self.requirements, labels)
