"""Builders for the vGPU mutator's tests: containers with HAMi resources, Pods, and one pass (or
two, for reinvocation) of the mutator, every warning at most 120 characters long."""

from __future__ import annotations

import copy
from typing import Any

from function.core.config import OnInvalidAnnotation
from function.core.mutators.base import Action, MutatorResult, RequestContext
from function.core.mutators.vgpu import Vgpu, VgpuConfig

REQUEST = RequestContext(uid="u", namespace="ml")
DENY, WARN = OnInvalidAnnotation.deny, OnInvalidAnnotation.warn


def container(
    name: str = "cuda", env: list[Any] | None = None, privileged: bool = False, **limits: Any
) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "image": "cuda"}
    if limits:
        resources = {key.replace("__", "/").replace("_", "-"): value for key, value in limits.items()}
        result["resources"] = {"limits": resources, "requests": dict(resources)}
    if env is not None:
        result["env"] = env
    if privileged:
        result["securityContext"] = {"privileged": True}
    return result


GPU = {"nvidia.com__gpu": "1"}
MEM = {"nvidia.com__gpumem": "3k"}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": spec.pop("labels", {})},
        "spec": {"containers": list(containers), **spec},
    }
    if init:
        result["spec"]["initContainers"] = init
    return result


def run(
    p: dict[str, Any],
    on_invalid: OnInvalidAnnotation = DENY,
    renamed: dict[str, str] | None = None,
    **config: Any,
) -> tuple[MutatorResult, dict[str, Any]]:
    working = copy.deepcopy(p)
    result = Vgpu(VgpuConfig(enabled=True, **config), on_invalid, renamed).mutate(working, REQUEST)
    changed = working != p
    assert changed == (result.action is Action.mutated), result
    assert all(len(w) <= 120 for w in result.warnings)
    return result, working


def again(p: dict[str, Any], **config: Any) -> MutatorResult:
    """A second pass over the first pass's output changes nothing (reinvocation)."""
    first, out = run(p, **config)
    second, out2 = run(out, **config)
    assert second.action is not Action.mutated and out2 == out, second
    return first


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}
