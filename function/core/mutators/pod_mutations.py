"""PodMutation policies: CAST AI's pod mutator as a Kubernetes resource, one mutator plug-in.

This module is the plug-in's declaration: its configuration, order and claims, the watches it
needs and how it is built. The mutator (pod_mutations_mutator.py beside it) is imported only when
the plug-in is built or its watches asked for: every process reads this module's configuration
model, and most never apply a PodMutation.

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

from typing import TYPE_CHECKING

from function.core.configtypes import MutatorConfig
from function.core.mutators.registry import Claims, MutatorPlugin, Neighbours, Settings
from function.core.view import WatchSpec

if TYPE_CHECKING:
    from function.core.mutators.pod_mutations_mutator import PodMutations

NAME = "pod-mutations"


class PodMutationsConfig(MutatorConfig):
    """``podMutations``: off by default (running locally needs no cluster); on in the manifests."""

    castaiObjects: bool = False
    """Also read CAST AI's own ``pod-mutations.cast.ai/v1`` PodMutation objects (same spec), so a
    migrating cluster needs no rewrite. Needs list/watch on that group (see the README)."""


def watches(config: PodMutationsConfig) -> tuple[WatchSpec, ...]:
    from function.core.mutators.pod_mutations_mutator import watches_for

    return watches_for(config.castaiObjects)


def build(config: PodMutationsConfig, settings: Settings, neighbours: Neighbours) -> PodMutations:
    from function.core.mutators.pod_mutations_mutator import PodMutations

    return PodMutations(config)


def claims(config: PodMutationsConfig) -> Claims:
    return Claims(places_pods=True)


PLUGIN = MutatorPlugin(
    name=NAME,
    order=250,
    config_key="podMutations",
    config_model=PodMutationsConfig,
    build=build,
    claims=claims,
    watches=watches,
)
