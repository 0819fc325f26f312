"""Mutators as plug-ins: what the engine and the configuration know of a mutator.

A mutator module declares one ``MutatorPlugin``: its name, its place in the engine's order, its
configuration section, how to build it, which resources it renames or owns (so conflicts are
declared by each mutator, not written pairwise), and what cluster state it needs watched. The
engine and the configuration read ``function.core.mutators.PLUGINS`` and import no concrete mutator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from function.core.configtypes import MutatorConfig, OnInvalidAnnotation
from function.core.mutators.base import Mutator
from function.core.view import WatchSpec


@dataclass(frozen=True)
class Rename:
    """A mutator rewrites requests for ``source`` into ``target`` (GPU slicing)."""

    source: str
    target: str
    source_field: str
    """Where the user configured it, for messages: ``gpuSlicing.sourceResource``."""
    target_field: str


@dataclass(frozen=True)
class OwnedResource:
    """A resource whose meaning a mutator defines (a vGPU device's memory, cores, ...)."""

    name: str
    field: str
    """Where the user configured it, for messages: ``vgpu.devices[0].memoryResource (nvidia)``."""
    is_count: bool = False
    """The device count itself: another mutator may rename it (slicing turns GPUs into slices)."""
    needs_count: str | None = None
    """The count this resource qualifies (memory and cores mean nothing without a device)."""


@dataclass(frozen=True)
class Claims:
    renames: tuple[Rename, ...] = ()
    owns: tuple[OwnedResource, ...] = ()
    places_pods: bool = False
    """The mutator may write a Pod's spot placement itself (PodMutation spot settings): the spot
    mutator then leaves a Pod it placed alone."""
    claim_templates: tuple[tuple[str, int], ...] = ()
    """ResourceClaimTemplates the mutator names in Pods, with the milli-GPU one claim made from
    each takes (gpuSlicing's dra backend): what GPU leases charge for them."""


@dataclass(frozen=True)
class Neighbours:
    """The claims of the *other* enabled mutators, handed to a mutator when it is built."""

    claims: tuple[Claims, ...] = ()

    def renamed(self) -> dict[str, str]:
        """Source -> target of every rename another mutator makes."""
        return {r.source: r.target for c in self.claims for r in c.renames}

    def place_pods(self) -> bool:
        """Whether another enabled mutator may write a Pod's spot placement."""
        return any(c.places_pods for c in self.claims)

    def claim_templates(self) -> dict[str, int]:
        """Template name -> milli-GPU of a claim made from it, of every other mutator."""
        return {name: milli for c in self.claims for name, milli in c.claim_templates}

    def qualifiers_of(self, count: str) -> tuple[str, ...]:
        """Resources owned elsewhere that need ``count`` to mean anything (vGPU memory, cores)."""
        return tuple(o.name for c in self.claims for o in c.owns if o.needs_count == count)


@dataclass(frozen=True)
class Settings:
    """The shared policy every mutator follows."""

    invalid_annotations: OnInvalidAnnotation = OnInvalidAnnotation.deny


def no_claims(config: Any) -> Claims:
    return Claims()


def no_watches(config: Any) -> tuple[WatchSpec, ...]:
    return ()


@dataclass(frozen=True)
class MutatorPlugin:
    name: str
    """Stable: it appears in decisions, events and metrics."""
    order: int
    """The engine runs mutators by ascending order (gpu-slicing 100, vgpu 200, ...)."""
    config_key: str
    """The mutator's section of the configuration file."""
    config_model: type[MutatorConfig]
    build: Callable[[Any, Settings, Neighbours], Mutator]
    """(its config section, shared settings, the other mutators' claims) -> the mutator."""
    claims: Callable[[Any], Claims] = no_claims
    watches: Callable[[Any], tuple[WatchSpec, ...]] = no_watches


def conflict(
    plugin: MutatorPlugin, claims: Claims, others: Iterable[tuple[MutatorPlugin, Claims]]
) -> str | None:
    """Why ``plugin`` (with ``claims``) cannot run beside ``others``, or None.

    A renaming mutator must not write a resource another mutator owns, and must not read one
    either, except a count (renaming a device count is what GPU slicing does): otherwise the
    other mutator would see its own resource appear or vanish, and the two would not converge.
    """
    for rename in claims.renames:
        for other, other_claims in others:
            for owned in other_claims.owns:
                for name, where in (
                    (rename.source, rename.source_field),
                    (rename.target, rename.target_field),
                ):
                    if owned.name != name or (owned.is_count and name == rename.source):
                        continue
                    return (
                        f"{where} {name!r} is also {owned.field}; {plugin.name} must not use a "
                        f"resource of {other.name} (only a device count may be renamed)"
                    )
    return None
