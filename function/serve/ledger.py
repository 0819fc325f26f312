"""This process's recent admitted decisions, until the cluster view shows their Pods (edge state):
the one shape the spot ledger and the lease ledger share.

A watch lags admission by milliseconds to seconds; during a burst (a Deployment scaled from 0 to
20, a queue of training Pods) many Pods are decided before any of them reaches the view, and a
mutator counting the view alone would decide each as if it were the first. So the edge remembers
what it admitted, per key (a controller, a lease) for ``ttl_seconds``, and hands the entries to
the mutator beside the view snapshot, as one more index (``Overlay``). The mutators stay pure: an
entry counts only while no Pod in the view carries its decision.

``DecisionTurns`` lets one review at a time go from taking the snapshot to recording its decision
(``with_ledgers`` begins the turn, ``LedgerRecorder`` ends it), so one process never decides two
Pods over the same entries. What a ledger cannot know: decisions of *other* serving processes,
and Pods the apiserver refused after admission (counted until the TTL ends). Bounded: at most
``max_per_key`` entries per key and ``max_keys`` keys (the oldest go first).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from function.admission.facts import AuditFacts
from function.admission.review import DecisionRecorder
from function.core.engine import Decision
from function.core.view import ClusterView, Overlay

log = logging.getLogger("castslice.spot")  # where the turns were first logged: operators filter on it

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


class Entry(Protocol):
    @property
    def decision(self) -> str:
        """The admission uid the entry's Pod carries, by which the mutator finds it in the view."""
        ...


E = TypeVar("E", bound=Entry)


class InFlightLedger(Generic[E]):
    """Entries of one kind by key, for ``ttl_seconds``; a subclass says which index the mutator
    reads them under (``index``) and what an admitted Pod contributes (``key_of``, ``entry_of``)."""

    index: str = ""

    def __init__(
        self,
        ttl_seconds: float = 60.0,
        max_per_key: int = 1024,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_per_key = max_per_key
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, deque[tuple[float, E]]] = OrderedDict()
        self._writes = WriteMarks(max_keys)

    # -- what a subclass says --------------------------------------------------------------------
    def key_of(self, pod: Mapping[str, Any]) -> str | None:
        """The key an admitted ``pod`` is recorded under, or None."""
        raise NotImplementedError

    def entry_of(self, pod: Mapping[str, Any]) -> E | None:
        """What an admitted ``pod`` leaves in the ledger, or None (nothing to remember)."""
        raise NotImplementedError

    # -- the ledger --------------------------------------------------------------------------------
    def add(self, key: str, entry: E) -> None:
        with self._lock:
            queue = self._entries.get(key)
            if queue is None:
                queue = self._entries[key] = deque(maxlen=self.max_per_key)
                while len(self._entries) > self.max_keys:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
            queue.append((self._clock(), entry))
            self._writes.write(key)

    def observe_admitted(self, pod: Mapping[str, Any] | None) -> bool:
        """Record what an admitted (patched) Pod carries; True if it carried something. Call it
        only for replies that were sent with the patch (not dry runs, not shadow decisions)."""
        if not isinstance(pod, Mapping):
            return False
        key, entry = self.key_of(pod), self.entry_of(pod)
        if not key or entry is None:
            return False
        self.add(key, entry)
        return True

    def written_since(self, pod: Mapping[str, Any] | None, mark: int) -> bool:
        """Whether an entry was written, after ``mark``, under the key an admitted ``pod`` would
        be recorded under: a decision over an older snapshot may not have counted it."""
        key = self.key_of(pod) if isinstance(pod, Mapping) else None
        with self._lock:
            return key is not None and self._writes.since(key, mark)

    def forget(self, decision: str) -> None:
        """The entry of ``decision`` leaves now (its Pod is in the view, or gone)."""
        with self._lock:
            for key in list(self._entries):
                queue = self._entries[key]
                for item in queue:
                    if item[1].decision == decision:
                        queue.remove(item)
                        if not queue:
                            del self._entries[key]
                        return

    def snapshot(self) -> Mapping[str, tuple[E, ...]]:
        """The live entries by key (expired ones are dropped here). Read it *before* the view:
        an entry whose Pod the view then shows is counted once (the mutator matches it by its
        decision); read after, a Pod delivered in between would be counted by neither."""
        horizon = self._clock() - self.ttl_seconds
        with self._lock:
            result: dict[str, tuple[E, ...]] = {}
            for key in list(self._entries):
                queue = self._entries[key]
                while queue and queue[0][0] < horizon:
                    queue.popleft()
                if queue:
                    result[key] = tuple(entry for _, entry in queue)
                else:
                    del self._entries[key]
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
    """A DecisionRecorder that feeds the ledgers, then hands the decision on to ``inner`` (audit).

    Only what reached the apiserver is remembered: a ``mutated`` decision (its patch was sent; a
    shadow mutator's decisions never are) of a request that is no dry run. Ends the review's turn."""

    def __init__(
        self,
        inner: DecisionRecorder,
        ledgers: Sequence[InFlightLedger[Any]],
        turns: DecisionTurns | None = None,
    ) -> None:
        self.inner = inner
        self.ledgers = tuple(ledgers)
        self.turns = turns

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        try:
            if decision is not None and decision.outcome == "mutated" and not facts.dry_run:
                for ledger in self.ledgers:
                    ledger.observe_admitted(decision.mutated_pod)
        finally:
            if self.turns is not None:
                self.turns.end()
        self.inner.record(facts, decision)


def with_ledgers(
    snapshot: Callable[[], ClusterView],
    ledgers: Sequence[InFlightLedger[Any]],
    turns: DecisionTurns | None = None,
    now: Callable[[], datetime] | None = None,
    fixed: Mapping[str, Mapping[str, Any]] | None = None,
) -> Callable[[], ClusterView]:
    """The per-review snapshot with each ledger's entries as its index, the ``fixed`` indices
    (the time zones GPU leases read) and, given ``now``, the snapshot's time; with ``turns``, the
    review holds its turn from here until the LedgerRecorder records its decision."""
    ledgers = tuple(ledgers)
    constant = dict(fixed or {})
    if not ledgers and now is None and not constant:
        return snapshot

    def view() -> ClusterView:
        if turns is not None:
            turns.begin()
        entries = {**constant, **{ledger.index: ledger.snapshot() for ledger in ledgers}}  # before the view
        return Overlay(snapshot(), entries, now=now() if now is not None else None)

    return view
