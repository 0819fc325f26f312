"""What a PodMutation patch list does to extended resources (``nvidia.com/gpu``, ...), judged from
the operations alone, without a Pod: the apiserver's rules (function/core/rules.py) that any Pod the
list applies to would break are refused when the PodMutation is validated, and what breaks them on
some Pods only is a warning. At admission the list is checked again on the real Pod
(``apply.pod_shape_problem``) and dropped alone if it breaks them there.

Known without a Pod:
- a value that writes an extended resource quantity that is not a whole, non-negative number
  (``"0.5"``, ``"500m"``, ``-1``);
- a value holding a ``resources`` object whose requests of an extended resource have no equal limit;
- the removal of an extended resource's limit while its request stays: the Pod the webhook sees is
  defaulted (a limit comes with an equal request), so the list either fails (no such limit) or
  leaves a request without a limit.
Known only with a Pod (a warning): the removal of a whole ``resources.limits`` map, which breaks the
rules for the containers that ask for an extended resource.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from function.core.podmutation.jsonpatch_ext import CompiledOperation, compile_operations
from function.core.quantity import QuantityError, parse_quantity
from function.core.rules import is_extended_resource

ANY = "*"
"""A path token standing for any element: ``*``, ``[field=value]``, a list index."""


def _tokens(operation_path: Any) -> tuple[str, ...]:
    return tuple(segment.key if segment.kind == "key" else ANY for segment in operation_path.segments)


def _nodes(tokens: tuple[str, ...], value: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every node of ``value`` with the path tokens it lands at (list indices as ANY)."""
    yield tokens, value
    if isinstance(value, dict):
        for key, member in value.items():
            yield from _nodes((*tokens, str(key)), member)
    elif isinstance(value, list):
        for member in value:
            yield from _nodes((*tokens, ANY), member)


def _quantity_problem(value: Any) -> str | None:
    try:
        quantity = parse_quantity(value)
    except QuantityError:
        return "is not a valid quantity"
    if quantity.denominator != 1:
        return "must be a whole number"
    if quantity < 0:
        return "must not be negative"
    return None


def _resources_problems(resources: dict[str, Any]) -> list[str]:
    limits, requests = resources.get("limits"), resources.get("requests")
    limits = limits if isinstance(limits, dict) else {}
    requests = requests if isinstance(requests, dict) else {}
    problems = []
    for name, requested in requests.items():
        if not is_extended_resource(str(name)):
            continue
        if name not in limits:
            problems.append(f"{name} has a request but no limit")
        elif (
            _quantity_problem(requested) is None
            and _quantity_problem(limits[name]) is None
            and parse_quantity(requested) != parse_quantity(limits[name])
        ):
            problems.append(f"{name} request must equal its limit")
    return problems


def _value_problems(operation: CompiledOperation) -> list[str]:
    problems = []
    for tokens, node in _nodes(_tokens(operation.path), operation.value):
        if (
            len(tokens) >= 3
            and tokens[-3] == "resources"
            and tokens[-2] in ("limits", "requests")
            and is_extended_resource(tokens[-1])
        ):
            problem = _quantity_problem(node)
            if problem:
                problems.append(f"{tokens[-2]}[{tokens[-1]}] {node!r} {problem} (an extended resource)")
        if tokens and tokens[-1] == "resources" and isinstance(node, dict):
            problems.extend(_resources_problems(node))
    return problems


def _touches(operation: CompiledOperation, raw_path: str) -> bool:
    """Whether the operation writes or removes ``raw_path`` or a parent of it."""
    paths = [operation.path.raw] + ([operation.source.raw] if operation.source is not None else [])
    return any(raw_path == path or raw_path.startswith(path + "/") for path in paths)


def findings(operations: Sequence[CompiledOperation]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one patch list, each led by the operation's index (``[2]: ...``)."""
    problems: list[str] = []
    warnings: list[str] = []
    for index, operation in enumerate(operations):
        tokens = _tokens(operation.path)
        if operation.op in ("add", "replace"):
            problems.extend(f"[{index}]: {problem}" for problem in _value_problems(operation))
        if operation.op != "remove":
            continue
        if len(tokens) >= 3 and tokens[-3:-1] == ("resources", "limits") and is_extended_resource(tokens[-1]):
            raw = operation.path.raw
            request = raw[: raw.rindex("/limits/")] + "/requests/" + raw.rsplit("/", 1)[1]
            if not any(_touches(other, request) for other in operations if other is not operation):
                problems.append(
                    f"[{index}]: removes the limit of {tokens[-1]} but not its request: the apiserver "
                    "refuses an extended resource requested without a limit"
                )
        elif tokens[-2:] == ("resources", "limits"):
            warnings.append(
                f"[{index}]: removes resources.limits: on a Pod asking for an extended resource "
                "(nvidia.com/gpu, ...) the apiserver would refuse its request without a limit, so "
                "there this list is not applied"
            )
    return problems, warnings


def check_operations(raw: Any, where: str) -> list[str]:
    """``compile_operations`` and the refusals above (ValueError naming ``where``); the warnings."""
    problems, warnings = findings(compile_operations(raw, where))
    if problems:
        raise ValueError("; ".join(f"{where}{problem}" for problem in problems))
    return [f"{where}{warning}" for warning in warnings]
