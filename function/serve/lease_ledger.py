"""This process's recent GPU lease charges, until the cluster view shows their Pods (edge state).

The same reasoning as every in-flight ledger (``ledger.py``): the charged-Pods watch lags admission,
and during a burst many Pods of one lease are decided before any reaches the view. So every
charge this process admits is remembered per lease for ``ttl_seconds`` and handed to the mutator
with the snapshot (index ``gpu-lease-ledger``), together with the snapshot's wall-clock time; the
mutator counts an entry only while the view shows no Pod with its decision uid. With the turns
(one review at a time from snapshot to record) one process never charges past a lease.

What it cannot know: the charges of *other* serving processes (each of R replicas is exact for
itself, so R processes can over-admit by at most (R - 1) x the lease's count while their views
lag) and Pods the apiserver refused after admission (counted until the TTL ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from function.core.config import Config
from function.core.configtypes import MutatorMode
from function.core.leases import CHARGED_PODS
from function.core.mutators.gpu_leases import LEDGER_INDEX, LedgerCharge, ledger_charge
from function.serve.ledger import InFlightLedger


class LeaseLedger(InFlightLedger[LedgerCharge]):
    """Charges by lease key (index ``gpu-lease-ledger``)."""

    index = LEDGER_INDEX

    def __init__(
        self,
        ttl_seconds: float = 60.0,
        max_per_key: int = 4096,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ttl_seconds, max_per_key, max_keys, clock)

    def key_of(self, pod: Mapping[str, Any]) -> str | None:
        found = ledger_charge(pod)
        return found[0] if found is not None else None

    def entry_of(self, pod: Mapping[str, Any]) -> LedgerCharge | None:
        found = ledger_charge(pod)
        return found[1] if found is not None else None

    def observe_admitted(self, pod: Mapping[str, Any] | None) -> bool:
        """The charge an admitted Pod carries, read once (key and entry come from one stamp)."""
        found = ledger_charge(pod) if isinstance(pod, Mapping) else None
        if found is None:
            return False
        self.add(*found)
        return True

    def watched(self, index: str, old: Any, new: Any) -> None:
        """The watch's listener: a charged Pod the view now holds (or held: one deleted before
        any review saw it) is counted by the view, or gone; its entry leaves the ledger at once,
        so a Pod admitted and deleted between two reviews is not counted for the whole TTL."""
        if index != CHARGED_PODS.index:
            return
        for record in (old, new):
            decision = getattr(record, "decision", "")
            if decision:
                self.forget(decision)


def lease_ledger_for(config: Config) -> LeaseLedger | None:
    """The ledger when the gpuLeases mutator enforces; a shadow one sends no charge to remember."""
    section = config.section("gpuLeases")
    if not section.enabled or section.mode != MutatorMode.enforce:
        return None
    return LeaseLedger(ttl_seconds=section.ledgerTTLSeconds)
