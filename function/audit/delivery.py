"""Getting events to the sink off the admission path, and never losing one silently.

``submit`` is all the admission path does: a non-blocking append to a bounded backlog (a full
backlog hands that event, marked undelivered, to the spill writer: the admission path itself never
writes to stdout, since a log pipe that stops draining would block it). Background sender threads take
events from the backlog and post them, retrying connection errors, timeouts and the retryable
statuses with exponential backoff and jitter. An event that still fails is written whole to
stdout marked undelivered, with the reason. ``close`` lets the backlog drain for a bounded time
and writes whatever is left to stdout; ``close_all`` closes every sender of the process and runs
at shutdown (see shutdown.py for how it is reached under SIGTERM).

So every event id ends up either acknowledged by the sink or on stdout (at least once: an event
whose delivery was still in flight when the drain bound ran out can be both). The one exception
is stdout itself blocked long enough to fill the spill queue too: then events are dropped, counted
(castslice_audit_events_dropped) and reported on stderr once stdout moves again.

The backlog is a deque under one condition variable rather than a ``queue.Queue``: taking an event
and marking it in flight must be one step, or the drain could miss an event that is in neither
place for an instant, and that event would be lost at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cloudevents.http import CloudEvent

from function.audit.metrics import AuditMetrics
from function.audit.sinks import SendResult, Sink, StdoutWriter, WireEvent

log = logging.getLogger("castslice.audit")

SPILL_TEXT: Final = {
    "queue_full": "queue full",
    "rejected": "rejected by sink",
    "retries_exhausted": "retries exhausted",
    "shutdown": "shutdown",
}
"""The ``reason`` written on an undelivered stdout line, per metrics label."""

MIN_SPILL_CAPACITY: Final = 1000
"""The spill queue holds at least this many lines, however small the backlog is configured."""
MAX_BATCH: Final = 256
"""Most events a sender thread takes at once for a sink that sends batches (stdout): one wakeup,
one lock round and a few writes for all of them. The sender threads share the interpreter lock
with admission, so what a sender costs per event (above all, each wakeup) admission pays too."""
REST_SECONDS: Final = 0.02
"""After a batch, a batching sender rests this long (unless the backlog fills, see Backlog.rest)
so the next batch gathers: an event can reach stdout this much later, never admission."""

_started_senders: list[EventSender] = []
_registry_lock = threading.Lock()
_at_exit_registered_in: int | None = None
_pid = os.getpid()
"""This process's id, renewed in a forked child: submit checks it per event, and os.getpid is a
system call."""


def _renew_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_renew_pid)


def close_all(timeout: float | None = None) -> int:
    """Close (drain) every sender started in this process; how many events went to stdout.

    ``timeout`` bounds the whole call; by default each sender's own drain bound applies.
    """
    with _registry_lock:
        senders = [s for s in _started_senders if s.started_here]
    deadline = None if timeout is None else time.monotonic() + timeout
    left = 0
    for sender in senders:
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        left += sender.close(remaining)
    return left


def _register(sender: EventSender) -> None:
    global _at_exit_registered_in
    with _registry_lock:
        _started_senders.append(sender)
        if _at_exit_registered_in != os.getpid():
            # The last resort for servers that end the process with sys.exit (gunicorn's sync and
            # gthread workers). Under uvicorn SIGTERM kills the worker without running atexit
            # hooks, which is why `castslice serve` also drains on ASGI lifespan shutdown.
            atexit.register(close_all)
            _at_exit_registered_in = os.getpid()


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 5.0

    def delay(self, failed_attempts: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Exponential backoff with equal jitter: half the step fixed, half random, so senders
        that failed together do not retry together, and no retry comes immediately."""
        step = min(self.max_backoff, self.initial_backoff * 2.0 ** max(failed_attempts - 1, 0))
        wait: float = step / 2 + rng.uniform(0, step / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_backoff))
        return wait


@dataclass(slots=True)
class Pending:
    event: WireEvent
    enqueued_at: float

    @property
    def id(self) -> str:
        return self.event.id


class Backlog:
    """Bounded: waiting events plus the ones in flight, under one lock.

    A sender waits in ``take`` for an event, or ``rest``s after a batch to let the next one
    gather. ``offer`` wakes a sender only when one is waiting for an event, or a rest should end
    early (the backlog is filling): each wakeup costs the admission thread a turn of the
    interpreter lock, so one per batch instead of one per event.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._waiting: deque[Pending] = deque()
        self._in_flight: dict[int, Pending] = {}
        self._changed = threading.Condition()
        self.abandoned = False
        self._takers = 0
        """Senders waiting in take for an event."""
        self._resting = 0
        self._enough = max(1, min(MAX_BATCH, capacity // 2))
        """A rest ends early once this many events wait: a full batch, or half the capacity."""
        self._hurry = False
        """Set by the drain: no more rests."""

    def offer(self, pending: Pending) -> str | None:
        """None when queued, else why not (a SPILL_TEXT key)."""
        with self._changed:
            if self.abandoned:
                return "shutdown"
            if len(self._waiting) >= self.capacity:
                return "queue_full"
            self._waiting.append(pending)
            if self._resting and len(self._waiting) >= self._enough:
                self._changed.notify_all()  # a rester may be first in line: wake them all
            elif self._takers:
                self._changed.notify()
            return None

    def take(self, limit: int = 1) -> list[Pending]:
        """The next events (oldest first, at most ``limit``), now in flight; none once the backlog
        is abandoned."""
        with self._changed:
            while not self._waiting and not self.abandoned:
                self._takers += 1
                try:
                    self._changed.wait()
                finally:
                    self._takers -= 1
            if self.abandoned:
                return []
            waiting = self._waiting
            taken = [waiting.popleft() for _ in range(min(limit, len(waiting)))]
            for pending in taken:
                self._in_flight[id(pending)] = pending
            return taken

    def rest(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a batch to gather; ends early when enough events wait (see
        ``offer``), or the backlog drains or is abandoned."""
        with self._changed:
            deadline = time.monotonic() + seconds
            self._resting += 1
            try:
                while len(self._waiting) < self._enough and not self._hurry and not self.abandoned:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._changed.wait(remaining)
            finally:
                self._resting -= 1

    def settle(self, pending: Pending) -> bool:
        """Mark an event's fate decided; False if the drain already took it (then leave it be)."""
        return self.settle_all([pending])[0]

    def settle_all(self, settled: list[Pending]) -> list[bool]:
        """settle for each, under one lock round."""
        with self._changed:
            owned = [self._in_flight.pop(id(pending), None) is not None for pending in settled]
            self._changed.notify_all()
            return owned

    def wait_idle(self, deadline: float) -> bool:
        with self._changed:
            self._hurry = True
            self._changed.notify_all()
            while self._waiting or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def abandon(self) -> list[Pending]:
        """Stop; return everything not yet settled (waiting and in flight), in order."""
        with self._changed:
            self.abandoned = True
            left = [*self._in_flight.values(), *self._waiting]
            self._in_flight.clear()
            self._waiting.clear()
            self._changed.notify_all()
            return left

    def depth(self) -> int:
        return len(self._waiting)


class SpillWriter:
    """Undelivered events on their way to stdout, written by one background thread.

    Callers only append (never block); the thread does the blocking writes. When stdout stops
    draining and this queue fills too, further events are dropped and counted, and the thread
    reports how many once a write succeeds again.
    """

    def __init__(self, writer: StdoutWriter, metrics: AuditMetrics, capacity: int) -> None:
        self.writer = writer
        self.metrics = metrics
        self.capacity = capacity
        self._items: deque[tuple[WireEvent, str, str, int]] = deque()
        self._changed = threading.Condition()
        self._writing = False
        self._dropped = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="castslice-audit-spill", daemon=True)
        self._thread.start()

    def put_nowait(self, event: WireEvent, reason: str, detail: str = "", attempts: int = 0) -> bool:
        with self._changed:
            if len(self._items) >= self.capacity:
                self._dropped += 1
                self.metrics.event_dropped(reason)
                return False
            self._items.append((event, reason, detail, attempts))
            self.metrics.event_spilled(reason)
            self._changed.notify_all()
            return True

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._items:
                    self._changed.wait()
                event, reason, detail, attempts = self._items[0]
                self._writing = True
            written = self.writer.undelivered(event, SPILL_TEXT[reason], detail, attempts)
            with self._changed:
                self._items.popleft()
                self._writing = False
                dropped, self._dropped = (self._dropped, 0) if written else (0, self._dropped)
                self._changed.notify_all()
            if dropped:
                log.error("audit: %d event(s) were dropped while stdout was blocked", dropped)

    def flush(self, deadline: float) -> bool:
        """Wait until every queued line is written, or the deadline passes."""
        with self._changed:
            while self._items or self._writing:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._changed.wait(remaining)
            return True


class EventSender:
    def __init__(
        self,
        sink: Sink,
        writer: StdoutWriter,
        metrics: AuditMetrics,
        *,
        capacity: int = 10000,
        policy: RetryPolicy | None = None,
        drain_seconds: float = 5.0,
        senders: int = 1,
        rng: random.Random | None = None,
    ) -> None:
        self.sink = sink
        self.writer = writer
        self.metrics = metrics
        self.capacity = capacity
        self.policy = policy or RetryPolicy()
        self.drain_seconds = drain_seconds
        self.senders = senders
        self._rng = rng or random.Random()
        self._backlog = Backlog(capacity)
        self._threads: list[threading.Thread] = []
        self._started_in: int | None = None
        self._start_lock = threading.Lock()
        self._closing = False
        self._deadline: float | None = None
        self._stopped = threading.Event()
        self._spills = SpillWriter(writer, metrics, max(capacity, MIN_SPILL_CAPACITY))
        metrics.watch_queue(self.depth, capacity)

    # -- the admission side ---------------------------------------------------------------------
    def submit(self, event: WireEvent | CloudEvent) -> None:
        """Never blocks: the event is queued, or handed to the spill writer with the reason."""
        if self._started_in != _pid:
            self._ensure_started()
        if not isinstance(event, WireEvent):
            event = WireEvent.of(event)  # serialized once, here: see sinks.WireEvent
        refused = "shutdown" if self._closing else self._backlog.offer(Pending(event, time.monotonic()))
        if refused is not None:
            detail = f"backlog of {self.capacity} events" if refused == "queue_full" else ""
            self._spill(event, refused, detail)

    @property
    def accepting(self) -> bool:
        return not self._closing

    @property
    def started_here(self) -> bool:
        return self._started_in == os.getpid()

    def depth(self) -> int:
        return self._backlog.depth()

    # -- threads --------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        # Started lazily, in the process that submits: the app is built in gunicorn's master and
        # the workers are forked from it, and threads do not survive a fork.
        if self._started_in == os.getpid():
            return
        with self._start_lock:
            if self._started_in == os.getpid():
                return
            if self._started_in is not None:
                # A forked child: the parent's backlog and threads are not ours.
                self._backlog = Backlog(self.capacity)
                self._spills = SpillWriter(self.writer, self.metrics, max(self.capacity, MIN_SPILL_CAPACITY))
                self._threads = []
            self._started_in = os.getpid()
            self._spills.start()
            for number in range(self.senders):
                thread = threading.Thread(target=self._run, name=f"castslice-audit-{number}", daemon=True)
                thread.start()
                self._threads.append(thread)
            _register(self)

    def start(self) -> None:
        self._ensure_started()

    def _run(self) -> None:
        send_all: Callable[[list[WireEvent]], list[SendResult]] | None = getattr(self.sink, "send_all", None)
        while True:
            batch = self._backlog.take(1 if send_all is None else MAX_BATCH)
            if not batch:
                return
            first: list[SendResult | None] = [None] * len(batch)
            if send_all is not None:
                first = [*self._send_all(send_all, batch)]
            delivered: list[Pending] = []
            for pending, result in zip(batch, first, strict=True):
                if result is not None and result.delivered:
                    delivered.append(pending)
                    continue
                try:
                    self._deliver(pending, result)
                except Exception:
                    log.exception("audit sender failed on event %s", pending.id)
                    if self._backlog.settle(pending):
                        self._spill(pending.event, "rejected", "sender error (see log)")
            if delivered:
                now = time.monotonic()
                owned = self._backlog.settle_all(delivered)
                seconds = [now - p.enqueued_at for p, mine in zip(delivered, owned, strict=True) if mine]
                if seconds:
                    self.metrics.events_delivered(seconds)
            if send_all is not None:
                self._backlog.rest(REST_SECONDS)

    @staticmethod
    def _send_all(
        send_all: Callable[[list[WireEvent]], list[SendResult]], batch: list[Pending]
    ) -> list[SendResult]:
        """The first attempt for a whole batch; a failing call fails each event's attempt."""
        try:
            results = send_all([pending.event for pending in batch])
            if len(results) == len(batch):
                return results
            failed = SendResult(
                False, retryable=True, detail=f"{len(results)} results for {len(batch)} events"
            )
        except Exception as error:  # noqa: BLE001 - a sink bug is a failed attempt, not a lost event
            failed = SendResult(False, retryable=True, detail=f"{type(error).__name__}: {error}")
        return [failed] * len(batch)

    def _deliver(self, pending: Pending, first: SendResult | None = None) -> None:
        """Send (the first attempt's result is ``first`` when already known), retry, settle."""
        attempts = 0
        while True:
            attempts += 1
            result = first
            first = None
            if result is None:
                try:
                    result = self.sink.send(pending.event)
                except Exception as error:  # noqa: BLE001 - a sink bug is a failed attempt, not a lost event
                    result = SendResult(False, retryable=True, detail=f"{type(error).__name__}: {error}")
            if result.delivered:
                if self._backlog.settle(pending):
                    self.metrics.event_delivered(time.monotonic() - pending.enqueued_at)
                return
            if not result.retryable or attempts >= self.policy.max_attempts:
                if self._backlog.settle(pending):
                    reason = "rejected" if not result.retryable else "retries_exhausted"
                    self._spill(pending.event, reason, result.detail, attempts)
                return
            wait = self.policy.delay(attempts, self._rng, result.retry_after)
            if self._deadline is not None:
                wait = min(wait, max(self._deadline - time.monotonic(), 0.0))
            self.metrics.event_retried()
            log.debug(
                "audit event %s: attempt %d failed (%s), retry in %.2fs",
                pending.id,
                attempts,
                result.detail,
                wait,
            )
            if self._stopped.wait(wait):
                return  # the drain ran out of time and wrote this event to stdout

    def _spill(self, event: WireEvent, reason: str, detail: str = "", attempts: int = 0) -> None:
        if self._started_in == _pid:
            self._spills.put_nowait(event, reason, detail, attempts)
        else:  # never started in this process (closed before any submit): no writer thread
            self.metrics.event_spilled(reason)
            self.writer.undelivered(event, SPILL_TEXT[reason], detail, attempts)

    # -- shutdown -------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> int:
        """Drain for at most ``timeout`` (default drain_seconds), then write the rest to stdout.
        Returns how many events were left for stdout. Safe to call more than once."""
        with self._start_lock:
            if self._closing:
                return 0
            self._closing = True
        bound = self.drain_seconds if timeout is None else timeout
        self._deadline = time.monotonic() + bound
        started = self._started_in == os.getpid()
        drained = self._backlog.wait_idle(time.monotonic() + bound) if started else True
        left = self._backlog.abandon()
        self._stopped.set()
        for pending in left:
            self._spill(pending.event, "shutdown", f"not delivered within the {bound:g}s drain bound")
        if started and not self._spills.flush(max(self._deadline, time.monotonic() + 1.0)):
            log.error("audit: stdout did not take every undelivered event before shutdown")
        if left or not drained:
            log.warning("audit: %d event(s) not delivered by shutdown were written to stdout", len(left))
        self.sink.close()
        return len(left)
