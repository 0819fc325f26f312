"""GPU leases offline: the lease arithmetic ``castslice mutate --cluster`` and ``castslice explain``
show, from what ``kubectl get pods,gpuleases -A -o yaml`` printed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from function.core.config import Config
from function.core.engine import build_mutators
from function.core.leases import CHARGED_PODS, LEASES, gpus, until
from function.core.mutators.base import RequestContext
from function.core.mutators.gpu_leases import NAME, GpuLeases, Verdict
from function.core.schedule import ZONES_INDEX
from function.core.view import ClusterView, Overlay
from function.zones import ZONES

STATE_SPECS = (LEASES, CHARGED_PODS)
"""Always read from a state file: naming GpuLeases there is asking for their decisions."""


def with_gpu_leases(
    config: Config, cluster: ClusterView, now: datetime | None = None
) -> tuple[Config, ClusterView]:
    """With GpuLeases in the state (or gpuLeases enabled), the mutator on and the view timed."""
    section = config.section("gpuLeases")
    has_leases = cluster.available and bool(cluster.index(LEASES.index))
    if not has_leases and not section.enabled:
        return config, cluster
    if not section.enabled:
        config = config.model_copy(update={"gpuLeases": section.model_copy(update={"enabled": True})})
    return config, Overlay(cluster, {ZONES_INDEX: ZONES}, now=now or datetime.now(UTC))


def lease_lines(config: Config, pod: dict[str, Any], namespace: str, cluster: ClusterView) -> Iterator[str]:
    """The arithmetic of one Pod, for ``castslice explain``."""
    config, view = with_gpu_leases(config, cluster)
    context = RequestContext(uid="explain", namespace=namespace, cluster=view)
    # The lease charges the Pod as the mutators before it leave it (slicing into a claim, vGPU),
    # with the claims they declare: what the webhook would charge, not the manifest as written.
    judged = copy.deepcopy(pod)
    mutator: Any = None
    for candidate in build_mutators(config, config.section("gpuLeases").mode):
        if candidate.name == NAME:
            mutator = candidate
            break
        candidate.mutate(judged, context)
    if not isinstance(mutator, GpuLeases):
        mutator = GpuLeases(config.section("gpuLeases"))
    verdict = mutator.decide(judged, context)
    if verdict is None:
        yield "  gpu lease: asks for no GPU"
        return
    yield f"  gpu lease: {verdict.reason} ({'admitted' if verdict.admit else 'refused'})"
    yield from _arithmetic(verdict)
    yield f"    {verdict.message}"
    for warning in verdict.warnings:
        yield f"    warning: {warning}"


def _arithmetic(verdict: Verdict) -> Iterator[str]:
    lease = verdict.lease
    if lease is None:
        yield f"    this Pod:  {gpus(verdict.charge)} GPU"
        return
    usage = verdict.usage
    free = max(lease.count - usage.used, 0)
    mode = f"{lease.enforcement.value}, overflow {lease.overflow.value}"
    yield f"    lease:     {lease.key} ({lease.model}, {mode})"
    yield f"    window:    {until(lease.start)} .. {until(lease.end)}"
    yield (
        f"    count:     {gpus(lease.count)} GPU; used {gpus(usage.used)}, queued {gpus(usage.queued)}, "
        f"overflow {gpus(usage.overflow)} ({usage.pods} Pods); free {gpus(free)}"
    )
    after = gpus(usage.used + verdict.charge)
    yield f"    this Pod:  {gpus(verdict.charge)} GPU -> {after} of {gpus(lease.count)}"
