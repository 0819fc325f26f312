"""This process's recent GPU lease charges, until the cluster view shows their Pods (edge state).

The same reasoning as the spot ledger (``spot_ledger.py``): the charged-Pods watch lags admission,
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

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from function.admission.facts import AuditFacts
from function.admission.review import DecisionRecorder
from function.core.config import Config
from function.core.configtypes import MutatorMode
from function.core.engine import Decision
from function.core.leases import CHARGED_PODS
from function.core.mutators.gpu_leases import LEDGER_INDEX, LedgerCharge, ledger_charge
from function.core.view import ClusterView, Overlay
from function.serve.spot_ledger import DecisionTurns, WriteMarks


class LeaseLedger:
    def __init__(
        self,
        ttl_seconds: float = 60.0,
        max_per_lease: int = 4096,
        max_leases: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_per_lease = max_per_lease
        self.max_leases = max_leases
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, deque[tuple[float, LedgerCharge]]] = OrderedDict()
        self._writes = WriteMarks(max_leases)

    def record(self, lease_key: str, charge: LedgerCharge) -> None:
        with self._lock:
            queue = self._entries.get(lease_key)
            if queue is None:
                queue = self._entries[lease_key] = deque(maxlen=self.max_per_lease)
                while len(self._entries) > self.max_leases:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(lease_key)
            queue.append((self._clock(), charge))
            self._writes.write(lease_key)

    def written_since(self, pod: Mapping[str, Any] | None, mark: int) -> bool:
        """Whether a charge was written, after ``mark``, to the lease an admitted ``pod`` is charged
        to: a decision over an older snapshot may not have counted it."""
        found = ledger_charge(pod) if isinstance(pod, Mapping) else None
        with self._lock:
            return found is not None and self._writes.since(found[0], mark)

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

    def forget(self, decision: str) -> None:
        with self._lock:
            for key in list(self._entries):
                queue = self._entries[key]
                for item in queue:
                    if item[1].decision == decision:
                        queue.remove(item)
                        if not queue:
                            del self._entries[key]
                        return

    def observe_admitted(self, pod: Mapping[str, Any] | None) -> bool:
        """Record the charge an admitted Pod carries; True if it carried one."""
        if not isinstance(pod, Mapping):
            return False
        found = ledger_charge(pod)
        if found is None:
            return False
        self.record(*found)
        return True

    def snapshot(self) -> Mapping[str, tuple[LedgerCharge, ...]]:
        """The live entries by lease key (expired ones are dropped here). Read it *before* the
        view: an entry whose Pod the view then shows is counted once (the mutator matches it by
        its decision); read after, a Pod delivered in between would be counted by neither."""
        horizon = self._clock() - self.ttl_seconds
        with self._lock:
            result: dict[str, tuple[LedgerCharge, ...]] = {}
            for key in list(self._entries):
                queue = self._entries[key]
                while queue and queue[0][0] < horizon:
                    queue.popleft()
                if queue:
                    result[key] = tuple(entry for _, entry in queue)
                else:
                    del self._entries[key]
            return result


class LeaseLedgerRecorder:
    """Feeds the ledger with what reached the apiserver (a mutated decision of a request that is
    no dry run), then hands the decision on; ends the review's turn when ``turns`` is given (when
    the spot ledger's recorder is ``inner``, it ends the turn after its own recording)."""

    def __init__(
        self, inner: DecisionRecorder, ledger: LeaseLedger, turns: DecisionTurns | None = None
    ) -> None:
        self.inner, self.ledger, self.turns = inner, ledger, turns

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        try:
            if decision is not None and decision.outcome == "mutated" and not facts.dry_run:
                self.ledger.observe_admitted(decision.mutated_pod)
        finally:
            if self.turns is not None:
                self.turns.end()
        self.inner.record(facts, decision)


def lease_ledger_for(config: Config) -> LeaseLedger | None:
    """The ledger when the gpuLeases mutator enforces; a shadow one sends no charge to remember."""
    section = config.section("gpuLeases")
    if not section.enabled or section.mode != MutatorMode.enforce:
        return None
    return LeaseLedger(ttl_seconds=section.ledgerTTLSeconds)


def with_lease_ledger(
    snapshot: Callable[[], ClusterView],
    ledger: LeaseLedger | None,
    turns: DecisionTurns | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Callable[[], ClusterView]:
    """The per-review snapshot with the time and (when enforcing) the ledger's charges; with
    ``turns``, the review holds its turn from here until the recorder ends it."""

    def view() -> ClusterView:
        if turns is not None:
            turns.begin()
        entries = ledger.snapshot() if ledger is not None else {}
        return Overlay(snapshot(), {LEDGER_INDEX: entries}, now=now())

    return view
