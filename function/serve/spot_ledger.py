"""This process's recent spot and PodMutation distribution decisions, until the cluster view shows
their Pods (edge state).

The pods watch lags admission by a few milliseconds to seconds; during a burst (a Deployment
scaled from 0 to 20) many sibling Pods are decided before any of them reaches the view, and
counting the view alone would put them all on spot. So the edge remembers every placement it
admitted, per controller, for ``ttl_seconds``, and hands the entries to the mutator with the view
snapshot (index ``spot-ledger``). The mutator stays pure: it counts an entry only while no Pod in
the view carries its ``castops.io/placement-decision`` (the admission uid).

What it cannot know: decisions of *other* serving processes (two replicas behind one Service each
see only their own), and Pods the apiserver rejected after admission (counted until the TTL ends).
Bounded as every in-flight ledger is (function/serve/ledger.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from function.core.config import Config
from function.core.configtypes import MutatorMode
from function.core.placement import DECISION_ANNOTATION, LEDGER_INDEX, LedgerEntry, Placement, placement_of
from function.core.pod import controller_of, metadata_of
from function.core.view import MUTATION_GROUP_ANNOTATION
from function.serve.ledger import InFlightLedger


class DecisionLedger(InFlightLedger[LedgerEntry]):
    """Placements and distribution groups by controller uid (index ``spot-ledger``)."""

    index = LEDGER_INDEX

    def record_decision(self, owner_uid: str, decision: str, placement: str | None, group: str = "") -> None:
        """Remember a decision that gave a placement, a PodMutation distribution group, or both."""
        entry = _entry(decision, placement, group)
        if owner_uid and entry is not None:
            self.add(owner_uid, entry)

    def key_of(self, pod: Mapping[str, Any]) -> str | None:
        return controller_of(metadata_of(pod)).uid or None

    def entry_of(self, pod: Mapping[str, Any]) -> LedgerEntry | None:
        annotations = metadata_of(pod).get("annotations")
        annotations = annotations if isinstance(annotations, Mapping) else {}
        decision, group = annotations.get(DECISION_ANNOTATION), annotations.get(MUTATION_GROUP_ANNOTATION)
        if not isinstance(decision, str):
            return None
        return _entry(decision, placement_of(dict(pod)), group if isinstance(group, str) else "")


def _entry(decision: str, placement: str | None, group: str) -> LedgerEntry | None:
    known: Placement | None = (
        "spot" if placement == "spot" else "on-demand" if placement == "on-demand" else None
    )
    if not decision or (known is None and not group):
        return None
    return LedgerEntry(decision, known, group)


def ledger_for(config: Config) -> DecisionLedger | None:
    """The ledger when the spot mutator or PodMutations (distribution groups and shares) enforce
    (a shadow one sends nothing to remember), else None. Its TTL is spot's ``cacheTTLSeconds``."""
    spot = config.section("spot")
    spot_enforces = spot.enabled and spot.mode == MutatorMode.enforce
    mutations = config.section("podMutations")
    if not spot_enforces and not (mutations.enabled and mutations.mode == MutatorMode.enforce):
        return None
    return DecisionLedger(ttl_seconds=spot.cacheTTLSeconds)
