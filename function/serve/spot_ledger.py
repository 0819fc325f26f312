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
Bounded: at most ``max_per_owner`` entries per controller and ``max_owners`` controllers (the
oldest go first).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from function.admission.facts import AuditFacts
from function.admission.review import DecisionRecorder
from function.core.config import Config
from function.core.configtypes import MutatorMode
from function.core.engine import Decision
from function.core.placement import DECISION_ANNOTATION, LEDGER_INDEX, LedgerEntry, Placement, placement_of
from function.core.pod import controller_of, metadata_of
from function.core.view import MUTATION_GROUP_ANNOTATION, ClusterView, Overlay

log = logging.getLogger("castslice.spot")

_SEQUENCE = itertools.count(1)
"""One sequence for every ledger write and every mark in this process (``next`` is atomic)."""


def ledger_mark() -> int:
    """A number every later ledger write exceeds: a decision taken over a snapshot taken after
    this mark can ask each ledger whether its key was written since (``written_since``)."""
    return next(_SEQUENCE)


class WriteMarks:
    """Per key, the sequence number of the key's last write, kept after the entries themselves
    leave (expired, or shown by the view): a charge that moved from the ledger to the view
    meanwhile was still written after the mark. Bounded; a key pushed out counts as written
    after any mark older than the newest number pushed out."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._marks: OrderedDict[str, int] = OrderedDict()
        self._forgotten = 0

    def write(self, key: str) -> None:
        """Called under the ledger's lock, with the entry written: a mark taken after this number
        is taken after the entry is in (the snapshot takes the same lock)."""
        self._marks[key] = next(_SEQUENCE)
        self._marks.move_to_end(key)
        while len(self._marks) > self.max_keys:
            _, number = self._marks.popitem(last=False)
            self._forgotten = max(self._forgotten, number)

    def since(self, key: str, mark: int) -> bool:
        number = self._marks.get(key)
        return number > mark if number is not None else self._forgotten > mark


class DecisionLedger:
    def __init__(
        self,
        ttl_seconds: float = 60.0,
        max_per_owner: int = 1024,
        max_owners: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_per_owner = max_per_owner
        self.max_owners = max_owners
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, deque[tuple[float, LedgerEntry]]] = OrderedDict()
        self._writes = WriteMarks(max_owners)

    def record(self, owner_uid: str, decision: str, placement: str | None, group: str = "") -> None:
        """Remember a decision that gave a placement, a PodMutation distribution group, or both."""
        known: Placement | None = (
            "spot" if placement == "spot" else "on-demand" if placement == "on-demand" else None
        )
        if not owner_uid or not decision or (known is None and not group):
            return
        entry = LedgerEntry(decision, known, group)
        with self._lock:
            queue = self._entries.get(owner_uid)
            if queue is None:
                queue = self._entries[owner_uid] = deque(maxlen=self.max_per_owner)
                while len(self._entries) > self.max_owners:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(owner_uid)
            queue.append((self._clock(), entry))
            self._writes.write(owner_uid)

    def written_since(self, pod: Mapping[str, Any] | None, mark: int) -> bool:
        """Whether an entry was written, after ``mark``, under the key an admitted ``pod`` would be
        recorded under (its controller): a decision over an older snapshot may not have counted it."""
        owner = self._key(pod)
        with self._lock:
            return owner is not None and self._writes.since(owner, mark)

    @staticmethod
    def _key(pod: Mapping[str, Any] | None) -> str | None:
        if not isinstance(pod, Mapping):
            return None
        return controller_of(metadata_of(pod)).uid or None

    def observe_admitted(self, pod: Mapping[str, Any] | None) -> bool:
        """Record the decision an admitted (patched) Pod carries; True if it carried one. Call it only
        for replies that were sent with the patch (not dry runs, not shadow decisions)."""
        if not isinstance(pod, Mapping):
            return False
        metadata = metadata_of(pod)
        owner = controller_of(metadata)
        placement = placement_of(dict(pod))
        annotations = metadata.get("annotations")
        decision = annotations.get(DECISION_ANNOTATION) if isinstance(annotations, Mapping) else None
        group = annotations.get(MUTATION_GROUP_ANNOTATION) if isinstance(annotations, Mapping) else None
        group = group if isinstance(group, str) else ""
        if (
            not owner.uid
            or (placement is None and not group)
            or not isinstance(decision, str)
            or not decision
        ):
            return False
        self.record(owner.uid, decision, placement, group)
        return True

    def snapshot(self) -> Mapping[str, tuple[LedgerEntry, ...]]:
        """The live entries by owner uid (expired ones are dropped here)."""
        horizon = self._clock() - self.ttl_seconds
        with self._lock:
            result: dict[str, tuple[LedgerEntry, ...]] = {}
            for owner_uid in list(self._entries):
                queue = self._entries[owner_uid]
                while queue and queue[0][0] < horizon:
                    queue.popleft()
                if queue:
                    result[owner_uid] = tuple(entry for _, entry in queue)
                else:
                    del self._entries[owner_uid]
            return result


class DecisionTurns:
    """One review at a time from taking the snapshot to recording the decision, in this process.

    Two concurrent reviews of sibling Pods would otherwise both read the ledger before either
    decision is in it, and both go to spot where only one may. A decision takes well under a
    millisecond, so the turns cost little. Robust to a review that never records (an exception
    between snapshot and recording): the same thread's next turn releases it, and another thread
    waits at most ``wait_seconds`` before deciding without a turn (then it can overshoot, as two
    processes can)."""

    def __init__(self, wait_seconds: float = 0.5) -> None:
        self.wait_seconds = wait_seconds
        self._lock = threading.Lock()
        self._mine = threading.local()

    def begin(self) -> None:
        if getattr(self._mine, "held", False):
            return  # this thread's previous review never recorded: it keeps the turn
        if self._lock.acquire(timeout=self.wait_seconds):
            self._mine.held = True
        else:
            log.warning("spot decision without a turn: another review held it over %.1f s", self.wait_seconds)

    def end(self) -> None:
        if getattr(self._mine, "held", False):
            self._mine.held = False
            self._lock.release()


class LedgerRecorder:
    """A DecisionRecorder that feeds the ledger, then hands the decision on to ``inner`` (audit).

    Only what reached the apiserver is remembered: a ``mutated`` decision (its patch was sent; a
    shadow mutator's decisions never are) of a request that is no dry run. Ends the review's turn."""

    def __init__(
        self, inner: DecisionRecorder, ledger: DecisionLedger, turns: DecisionTurns | None = None
    ) -> None:
        self.inner = inner
        self.ledger = ledger
        self.turns = turns

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        try:
            if decision is not None and decision.outcome == "mutated" and not facts.dry_run:
                self.ledger.observe_admitted(decision.mutated_pod)
        finally:
            if self.turns is not None:
                self.turns.end()
        self.inner.record(facts, decision)


def ledger_for(config: Config) -> DecisionLedger | None:
    """The ledger when the spot mutator or PodMutations (distribution groups and shares) enforce
    (a shadow one sends nothing to remember), else None. Its TTL is spot's ``cacheTTLSeconds``."""
    spot = config.section("spot")
    spot_enforces = spot.enabled and spot.mode == MutatorMode.enforce
    mutations = config.section("podMutations")
    if not spot_enforces and not (mutations.enabled and mutations.mode == MutatorMode.enforce):
        return None
    return DecisionLedger(ttl_seconds=spot.cacheTTLSeconds)


def with_ledger(
    snapshot: Callable[[], ClusterView], ledger: DecisionLedger | None, turns: DecisionTurns | None = None
) -> Callable[[], ClusterView]:
    """The per-review snapshot, with the ledger's entries added when there is a ledger; with
    ``turns``, the review holds its turn from here until LedgerRecorder records its decision."""
    if ledger is None:
        return snapshot

    def view() -> ClusterView:
        if turns is not None:
            turns.begin()
        return Overlay(snapshot(), {LEDGER_INDEX: ledger.snapshot()})

    return view
