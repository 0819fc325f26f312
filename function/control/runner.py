"""The runner: watches for every replica, a work queue and a worker per reconciler for the leader.

Level-triggered. A key becomes due when a watch changes a record that ``triggers`` maps to it,
when its own ``Requeue(after)`` timer fires (a lease boundary), after a failure (backoff), and for
every key at each ``keys`` pass (gaining leadership, a whole relist, every ``resync_seconds``). The
queue holds each key once however often it is triggered (client-go's rule: a key triggered while
it is reconciled runs again after, never twice at once), so a burst of Pod events costs one
reconcile of their lease.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from function.control.fence import Fence
from function.control.reconciler import Context, Reconciler, Terminal
from function.core.view import ClusterView, Record
from function.kube.client import ApiError
from function.kube.elector import Term, TermEnded

log = logging.getLogger("castslice.control")

BACKOFF_START, BACKOFF_MAX = 0.5, 60.0
SYNC_POLL = 0.2
"""How often a worker waiting for its watches to list looks whether it was stopped meanwhile."""

WaitSynced = Callable[[Iterable[str], float], bool]
"""``(indices, timeout) -> listed``: blocks until the view has listed those indices once, at most
``timeout`` seconds (the watcher's ``wait_synced``)."""


class ControlMetrics:
    """Per process (scrape each replica, not a Service: ``sum(castslice_control_is_leader) < 1``
    means nobody reconciles)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.is_leader = Gauge(
            "castslice_control_is_leader", "1 while this process leads (reconciles).", registry=registry
        )
        self.duration = Histogram(
            "castslice_control_reconcile_seconds",
            "Time one reconcile took, by reconciler.",
            ["reconciler"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.errors = Counter(
            "castslice_control_reconcile_errors",
            "Reconciles that raised (each retried with backoff, unless terminal), by reconciler.",
            ["reconciler"],
            registry=registry,
        )
        self.terminal = Counter(
            "castslice_control_reconcile_terminal_errors",
            "Reconciles that failed in a way no retry fixes (a 4xx such as 422 Invalid or 403): "
            "not retried until the object changes or the resync, by reconciler.",
            ["reconciler"],
            registry=registry,
        )
        self.fenced = Counter(
            "castslice_control_fenced_writes",
            "Writes refused, never sent, because the term of leadership they were started in had ended.",
            registry=registry,
        )
        self.depth = Gauge(
            "castslice_control_queue_depth",
            "Keys due now and not yet reconciled, by reconciler (timers not yet due excluded).",
            ["reconciler"],
            registry=registry,
        )


class WorkQueue:
    """Keys with a due time; each key at most once (the earliest due time wins), FIFO among equals.
    ``get`` blocks until a key is due or the queue is shut down (then it returns None)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._due: dict[str, float] = {}
        self._active: set[str] = set()
        self._again: dict[str, float] = {}
        self._sequence = 0
        self._closed = False

    def add(self, key: str, after: float = 0.0) -> None:
        with self._cond:
            if self._closed:
                return
            due = self._clock() + max(after, 0.0)
            if key in self._active:  # being reconciled: run again once it is done
                self._again[key] = min(due, self._again.get(key, due))
                return
            known = self._due.get(key)
            if known is not None and known <= due:
                return
            self._due[key] = due
            self._sequence += 1
            heapq.heappush(self._heap, (due, self._sequence, key))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> str | None:
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while not self._closed:
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier due time
                now = self._clock()
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._active.add(key)
                    return key
                wait = self._heap[0][0] - now if self._heap else None
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
            return None

    def done(self, key: str) -> None:
        with self._cond:
            self._active.discard(key)
            again = self._again.pop(key, None)
        if again is not None:
            self.add(key, max(again - self._clock(), 0.0))

    def ready(self) -> int:
        now = self._clock()
        with self._cond:
            return sum(1 for due in self._due.values() if due <= now)

    def __len__(self) -> int:
        with self._cond:
            return len(self._due)

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


TERMINAL_STATUSES = frozenset({400, 403, 405, 406, 413, 415, 422})
"""Answers a retry of the same request gets again: the request is wrong, or not allowed. (A 404 is
each reconciler's to judge; 408, 409, 429 and 5xx are retried with backoff.)"""


def is_terminal(error: BaseException) -> bool:
    if isinstance(error, Terminal):
        return True
    return isinstance(error, ApiError) and error.status in TERMINAL_STATUSES


class Worker:
    """One reconciler's queue and thread, alive for one term of leadership: its thread writes in
    that term (``fence.bind``) and stops reconciling once the term has ended."""

    def __init__(
        self,
        reconciler: Reconciler,
        snapshot: Callable[[], ClusterView],
        wait_synced: WaitSynced,
        metrics: ControlMetrics,
        now: Callable[[], datetime],
        clock: Callable[[], float],
        term: Term | None = None,
        fence: Fence | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.queue = WorkQueue(clock)
        self._snapshot, self._metrics, self._now, self._clock = snapshot, metrics, now, clock
        self._wait_synced = wait_synced
        self.term, self._fence = term, fence
        self._failures: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._last_resync = clock()
        name = reconciler.name
        metrics.depth.labels(name).set_function(self.queue.ready)
        metrics.errors.labels(name)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"castslice-reconcile-{self.reconciler.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self.queue.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("reconciler %s did not stop within %.1fs", self.reconciler.name, timeout)

    def enqueue_all(self) -> None:
        view = self._snapshot()
        for key in self.reconciler.keys(view):
            self.queue.add(key)
        self._last_resync = self._clock()

    def _run(self) -> None:
        if self._fence is not None:
            self._fence.bind(self.term)
        # No work before the watches this reconciler reads have listed: its first pass over
        # ``keys`` would judge a half-known cluster (and act on it: delete, evict, write status).
        indices = [spec.index for spec in self.reconciler.watches]
        if not self._wait_synced(indices, 0.0):
            log.info("reconciler %s waits for its watches to list: %s", self.reconciler.name, indices)
            while not self._wait_synced(indices, SYNC_POLL):
                if self._closed():
                    return
        self.enqueue_all()
        while True:
            key = self.queue.get(timeout=1.0)
            if key is None:
                if self._closed():
                    return
                if self._clock() - self._last_resync >= self.reconciler.resync_seconds:
                    self.enqueue_all()
                continue
            try:
                self.reconcile_one(key)
            finally:
                self.queue.done(key)

    def _closed(self) -> bool:
        return self.queue.closed or (self.term is not None and not self.term.valid())

    def reconcile_one(self, key: str) -> None:
        """Reconcile ``key`` once, now: what the thread does per key (and what tests call)."""
        name = self.reconciler.name
        if self.term is not None and not self.term.valid():
            return  # the term is over: its work is the next term's
        began = time.perf_counter()
        try:
            outcome = self.reconciler.reconcile(key, Context(self._snapshot(), self._now(), self.term))
        except TermEnded as ended:
            self._metrics.fenced.inc()
            log.info("reconcile %s %s stopped: %s", name, key, ended)
        except Exception as error:
            if is_terminal(error):
                self._failures.pop(key, None)
                self._metrics.errors.labels(name).inc()
                self._metrics.terminal.labels(name).inc()
                log.error(
                    "reconcile %s %s failed and is not retried (a retry gets the same answer; "
                    "it runs again when what it reads changes, or at the resync): %s",
                    name,
                    key,
                    error,
                )
                return
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = min(BACKOFF_START * 2 ** (failures - 1), BACKOFF_MAX)
            self._metrics.errors.labels(name).inc()
            log.exception(
                "reconcile %s %s failed (attempt %d); retrying in %.1fs", name, key, failures, delay
            )
            self.queue.add(key, delay)
        else:
            self._failures.pop(key, None)
            if outcome.after is not None:
                self.queue.add(key, outcome.after)
        finally:
            self._metrics.duration.labels(name).observe(time.perf_counter() - began)


class Runner:
    """Starts the reconcilers' workers on gaining leadership and stops them on losing it, and
    routes watch changes to their queues. ``snapshot`` is the view (the watcher's), ``now`` the
    wall clock handed to reconciles."""

    def __init__(
        self,
        reconcilers: Sequence[Reconciler],
        snapshot: Callable[[], ClusterView],
        registry: CollectorRegistry,
        wait_synced: WaitSynced,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
        stop_timeout: float = 4.0,
        fence: Fence | None = None,
    ) -> None:
        """``wait_synced``: the view's barrier; each worker starts reconciling once the indices
        its reconciler watches have listed. ``stop_timeout``: how long losing leadership waits for
        a reconcile in flight; it must stay under lease duration - renew deadline (5 s by default)
        so the old leader is quiet before another can lead."""
        names = [reconciler.name for reconciler in reconcilers]
        if len(set(names)) != len(names):
            raise ValueError(f"two reconcilers share a name: {names}")
        self.reconcilers = tuple(reconcilers)
        self.metrics = ControlMetrics(registry)
        self.metrics.is_leader.set(0)
        for reconciler in self.reconcilers:
            register = getattr(reconciler, "register", None)
            if callable(register):  # optional: a reconciler's own metrics, on the process's /metrics
                register(registry)
        self._snapshot, self._now, self._clock = snapshot, now, clock
        self._wait_synced = wait_synced
        self._stop_timeout = stop_timeout
        self._fence = fence
        self._lock = threading.Lock()
        self._workers: dict[str, Worker] = {}
        self._by_index: dict[str, list[Reconciler]] = {}
        for reconciler in self.reconcilers:
            for spec in reconciler.watches:
                self._by_index.setdefault(spec.index, []).append(reconciler)

    @property
    def leading(self) -> bool:
        return bool(self._workers)

    def start_leading(self, term: Term | None = None) -> None:
        """A term begins: a worker per reconciler, its thread writing in ``term``."""
        with self._lock:
            self.metrics.is_leader.set(1)
            for reconciler in self.reconcilers:
                worker = Worker(
                    reconciler,
                    self._snapshot,
                    self._wait_synced,
                    self.metrics,
                    self._now,
                    self._clock,
                    term,
                    self._fence,
                )
                self._workers[reconciler.name] = worker
                worker.start()

    def stop_leading(self) -> None:
        """The term has ended (the elector revoked it first, so none of its writes is sent from
        now on): stop its workers, then drop everything it knew (each reconciler's memory of the
        term, its gauges), so nothing of it reaches the next term or stays on /metrics."""
        with self._lock:
            workers, self._workers = self._workers, {}
            self.metrics.is_leader.set(0)
        for worker in workers.values():
            worker.queue.shutdown()
        for worker in workers.values():
            worker.stop(self._stop_timeout)
            self.metrics.depth.labels(worker.reconciler.name).set_function(lambda: 0.0)
        for reconciler in self.reconcilers:
            forget = getattr(reconciler, "forget_term", None)
            if callable(forget):
                forget()

    def changed(self, index: str, old: Record | None, new: Record | None) -> None:
        """The watcher's listener: make the keys the change touches due (only while leading)."""
        workers = self._workers
        if not workers:
            return
        for reconciler in self._by_index.get(index, ()):
            worker = workers.get(reconciler.name)
            if worker is None:
                continue
            if old is None and new is None:  # a whole list: anything may have changed
                worker.enqueue_all()
                continue
            for record in (old, new):
                if record is not None:
                    for key in reconciler.triggers(index, record):
                        worker.queue.add(key)

    def worker(self, name: str) -> Worker | None:
        return self._workers.get(name)
