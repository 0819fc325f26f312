"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it,
with a term that fences every write.

Written here rather than taken from the Python client's ``kubernetes.leaderelection``: that module
never cancels the leading callback when leadership is lost (the old leader keeps working beside
the new one) and does not release the Lease on stop (a rolling update waits a whole lease duration
for the next leader). This one:

- acquires when the Lease is free (no holder), expired (its record has not changed for
  ``lease_seconds`` by *our* monotonic clock, counted from when we read it, so clock skew between
  replicas and a slow answer both make a candidate wait longer, never shorter), or already ours;
  writes are optimistic (``resourceVersion``), so two candidates never both win;
- leading is a ``Term``: its number (the Lease's ``leaseTransitions``), and a deadline of
  ``renew_deadline`` after the *start* of the last attempt that renewed (the moment the record
  other candidates count from can only be later), so no answer held up on its way back can stretch
  it. Every request of an attempt (the GET and the PUT) is bounded by the time left before the
  deadline; at the deadline the term ends, whatever a request in flight would still say, before
  any other candidate can take over (``renew_deadline < lease_seconds``). A write checks the term
  it was started in (``Term.check``: ``function/control/fence.py``), so none is sent after it;
- a candidate sleeps until the moment the observed Lease would expire rather than a whole retry
  period past it, so after the leader dies the takeover comes at most ``lease_seconds`` +
  ``retry_seconds`` after its last renewal;
- a term that ends is revoked first (every write of it refused from then on), then the leading
  work is stopped (``on_stopped``: the workers, and every memory of the term);
- ``stop()`` (SIGTERM) ends the term, then releases (empty holder, duration 1 s), so the next
  candidate takes over at its next try (within ``retry_seconds``).

Defaults: lease 15 s, renew deadline 10 s, retry 2 s (kubernetes/component-base
``config/v1alpha1/defaults.go``), with client-go's rule lease > renew deadline > 1.2 x retry.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from function.contract import LEASE_SECONDS as CONTRACT_LEASE_SECONDS
from function.contract import RENEW_DEADLINE_SECONDS
from function.contract import RETRY_SECONDS as CONTRACT_RETRY_SECONDS
from function.kube.client import Api, ApiError, collection_path, object_path

log = logging.getLogger("castslice.control.elector")

LEASE_SECONDS, RENEW_DEADLINE, RETRY_SECONDS = (
    CONTRACT_LEASE_SECONDS,
    RENEW_DEADLINE_SECONDS,
    CONTRACT_RETRY_SECONDS,
)
JITTER = 1.2


class TermEnded(RuntimeError):
    """A write whose term has ended (or that has no term): it was not sent."""


class Term:
    """One term of leadership: who leads, its number (the Lease's ``leaseTransitions`` as acquired),
    and until when (monotonic). Writes made in it call ``check`` first; once ``revoke``d, or past
    the deadline, every check raises TermEnded."""

    def __init__(self, identity: str, number: int, deadline: float, clock: Callable[[], float]) -> None:
        self.identity, self.number = identity, number
        self._deadline, self._clock = deadline, clock
        self._revoked = threading.Event()

    @property
    def deadline(self) -> float:
        return self._deadline

    @property
    def revoked(self) -> bool:
        return self._revoked.is_set()

    def remaining(self) -> float:
        """Seconds left (0 once ended)."""
        if self._revoked.is_set():
            return 0.0
        return max(self._deadline - self._clock(), 0.0)

    def valid(self) -> bool:
        return self.remaining() > 0

    def check(self, what: str) -> float:
        """The seconds left for ``what`` (a write); TermEnded when there are none."""
        left = self.remaining()
        if left <= 0:
            raise TermEnded(f"{what}: term {self.number} of {self.identity} has ended; not sent")
        return left

    def extend(self, deadline: float) -> None:
        """A renewal started in time: the term lasts until ``deadline`` (never shortened)."""
        if not self._revoked.is_set():
            self._deadline = max(self._deadline, deadline)

    def revoke(self) -> None:
        self._revoked.set()

    def __repr__(self) -> str:
        return f"Term({self.identity!r}, {self.number}, remaining={self.remaining():.1f}s)"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    lease_seconds: int
    acquire_time: str
    renew_time: str
    transitions: int


def micro_time(moment: datetime) -> str:
    """A MicroTime as the apiserver writes it (RFC 3339, microseconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseLock:
    """The Lease object: read it, create it, replace it at a resourceVersion."""

    def __init__(self, api: Api, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name

    def path(self) -> str:
        return object_path("coordination.k8s.io", "v1", "leases", self.namespace, self.name)

    def get(self, timeout: float = 5.0) -> tuple[LeaseRecord, str] | None:
        """The record and its resourceVersion; None when there is no Lease yet."""
        response = self.api.request("GET", self.path(), timeout=timeout)
        if response.status == 404:
            return None
        if not response.ok:
            raise ApiError(f"get lease {self.namespace}/{self.name}", response)
        spec = response.body.get("spec") or {}
        metadata = response.body.get("metadata") or {}
        record = LeaseRecord(
            holder=spec.get("holderIdentity") or "",
            lease_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime") or "",
            renew_time=spec.get("renewTime") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
        )
        return record, str(metadata.get("resourceVersion") or "")

    def _body(self, record: LeaseRecord, version: str = "") -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version:
            metadata["resourceVersion"] = version
        spec: dict[str, Any] = {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.lease_seconds,
            "leaseTransitions": record.transitions,
        }
        if record.acquire_time:
            spec["acquireTime"] = record.acquire_time
        if record.renew_time:
            spec["renewTime"] = record.renew_time
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def create(self, record: LeaseRecord, timeout: float = 5.0) -> bool:
        """False when another candidate created it first."""
        path = collection_path("coordination.k8s.io", "v1", "leases", self.namespace)
        response = self.api.request("POST", path, body=self._body(record), timeout=timeout)
        if response.status == 409:
            return False
        if not response.ok:
            raise ApiError(f"create lease {self.namespace}/{self.name}", response)
        return True

    def update(self, record: LeaseRecord, version: str, timeout: float = 5.0) -> bool:
        """False when the Lease changed since ``version`` was read (someone else wrote)."""
        response = self.api.request("PUT", self.path(), body=self._body(record, version), timeout=timeout)
        if response.status == 409:
            return False
        if not response.ok:
            raise ApiError(f"update lease {self.namespace}/{self.name}", response)
        return True


class LeaderElector:
    """Run ``run()`` on a thread; ``on_started(term)`` / ``on_stopped()`` are called on that thread
    when a term begins and ends (``on_stopped`` must return once the leading work has stopped;
    the term is revoked before it is called)."""

    def __init__(
        self,
        lock: LeaseLock,
        identity: str,
        on_started: Callable[[Term], None],
        on_stopped: Callable[[], None],
        *,
        lease_seconds: float = LEASE_SECONDS,
        renew_deadline: float = RENEW_DEADLINE,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_leading_changed: Callable[[bool], None] = lambda leading: None,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity (the Pod's name)")
        if not lease_seconds > renew_deadline > JITTER * retry_seconds > 0:
            raise ValueError(
                f"leader election timings must satisfy lease ({lease_seconds}s) > renew deadline "
                f"({renew_deadline}s) > {JITTER} x retry period ({retry_seconds}s) > 0"
            )
        self.lock, self.identity = lock, identity
        self.on_started, self.on_stopped = on_started, on_stopped
        self.on_leading_changed = on_leading_changed
        self.lease_seconds, self.renew_deadline, self.retry_seconds = (
            lease_seconds,
            renew_deadline,
            retry_seconds,
        )
        self._clock, self._wall = clock, wall
        self._stop = threading.Event()
        self._observed: tuple[LeaseRecord, str] | None = None
        self._observed_at = 0.0
        self.term: Term | None = None
        """The term under way (None while a candidate)."""
        self._won: tuple[int, float] | None = None
        """(term number, deadline) of the last attempt that acquired or renewed in time."""
        self.last_loop = clock()
        """When the loop last ran (``/healthz``: a stuck elector is an unhealthy process)."""

    @property
    def leading(self) -> bool:
        term = self.term
        return term is not None and term.valid()

    def stop(self) -> None:
        self._stop.set()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Compete, lead, renew, until ``stop()``; then end the term and release the Lease."""
        try:
            while not self._stop.is_set():
                if self._try_acquire_or_renew():
                    self._lead()
                else:
                    self._stop.wait(self._candidate_wait())
        finally:
            if self.term is not None:
                self._end_term()
                self._release()

    def _lead(self) -> None:
        assert self._won is not None
        number, deadline = self._won
        self.term = Term(self.identity, number, deadline, self._clock)
        log.info("leader election: %s leads (lease %s, term %d)", self.identity, self.lock.name, number)
        self.on_leading_changed(True)
        self.on_started(self.term)
        term = self.term
        while not self._stop.is_set():
            self._stop.wait(min(self.retry_seconds, term.remaining()))
            if self._stop.is_set():
                return  # run()'s finally ends the term and releases
            if not term.valid():
                break
            if self._try_acquire_or_renew():
                assert self._won is not None
                term.extend(self._won[1])
            elif not term.valid() or not self._still_ours():
                break
        log.warning(
            "leader election: %s lost the lease %s (term %d not renewed before its deadline)",
            self.identity,
            self.lock.name,
            term.number,
        )
        self._end_term()

    def _end_term(self) -> None:
        """Revoke the term (its writes are refused from now on), then stop its work."""
        term, self.term = self.term, None
        if term is None:
            return
        term.revoke()
        self.on_stopped()
        self.on_leading_changed(False)
        log.info("leader election: %s stopped leading (term %d)", self.identity, term.number)

    def _still_ours(self) -> bool:
        return self._observed is not None and self._observed[0].holder == self.identity

    def _candidate_wait(self) -> float:
        """A retry period with jitter, or less: until the observed lease would expire."""
        wait = self.retry_seconds * random.uniform(1.0, JITTER)
        if self._observed is not None and self._observed[0].holder:
            expires_in = self._observed_at + self._lease_of(self._observed[0]) - self._clock()
            wait = min(wait, max(expires_in, 0.0) + 0.01)
        return wait

    def _lease_of(self, record: LeaseRecord) -> float:
        return float(record.lease_seconds) if record.lease_seconds > 0 else self.lease_seconds

    def _budget(self) -> float:
        """How long the next request of an attempt may take: a leader, until its term's deadline;
        a candidate, a renew deadline (a term it wins starts when its attempt did)."""
        term = self.term
        return term.remaining() if term is not None else self.renew_deadline

    def _try_acquire_or_renew(self) -> bool:
        """One attempt, every request bounded by ``_budget``. True when it acquired or renewed and
        knows so before ``renew_deadline`` after the attempt started (``_won`` then holds the term
        number and that deadline)."""
        started = self.last_loop = self._clock()
        deadline = started + self.renew_deadline
        self._won = None
        now = micro_time(self._wall())
        budget = self._budget()
        if budget <= 0:
            return False
        try:
            current = self.lock.get(timeout=budget)
        except Exception as error:  # noqa: BLE001 - the apiserver unreachable or slow: try again later
            log.warning("leader election: cannot read the lease: %s", error)
            return False
        if current is None:
            record = LeaseRecord(self.identity, int(self.lease_seconds), now, now, 0)
            try:
                won = self._in_time(lambda left: self.lock.create(record, timeout=left))
            except Exception as error:  # noqa: BLE001
                log.warning("leader election: cannot create the lease: %s", error)
                return False
            if won:
                self._observe(record, "")
            return self._won_by(won, record, deadline)
        record, version = current
        if self._observed is None or self._observed[0] != record:
            self._observe(record, version)
        ours = record.holder == self.identity
        expired = self._observed_at + self._lease_of(record) <= self._clock()
        if not ours and record.holder and not expired:
            return False
        taken = LeaseRecord(
            holder=self.identity,
            lease_seconds=int(self.lease_seconds),
            acquire_time=record.acquire_time if ours else now,
            renew_time=now,
            transitions=record.transitions if ours else record.transitions + 1,
        )
        try:
            won = self._in_time(lambda left: self.lock.update(taken, version, timeout=left))
        except Exception as error:  # noqa: BLE001
            log.warning("leader election: cannot update the lease: %s", error)
            return False
        if won:
            self._observe(taken, "")
        return self._won_by(won, taken, deadline)

    def _in_time(self, write: Callable[[float], bool]) -> bool:
        budget = self._budget()
        return write(budget) if budget > 0 else False

    def _won_by(self, won: bool, record: LeaseRecord, deadline: float) -> bool:
        if not won or self._clock() >= deadline:
            return False  # a success known too late leads to nothing: the next attempt renews
        self._won = (record.transitions, deadline)
        return True

    def _observe(self, record: LeaseRecord, version: str) -> None:
        self._observed = (record, version)
        self._observed_at = self._clock()

    def _release(self) -> None:
        """Give the Lease up (empty holder) so the next candidate need not wait for it to expire
        (at the version read: never over a record another candidate wrote meanwhile)."""
        try:
            current = self.lock.get()
            if current is None or current[0].holder != self.identity:
                return
            record, version = current
            now = micro_time(self._wall())
            released = LeaseRecord("", 1, now, now, record.transitions)
            if self.lock.update(released, version):
                log.info("leader election: %s released the lease %s", self.identity, self.lock.name)
        except Exception as error:  # noqa: BLE001 - it expires on its own
            log.warning("leader election: could not release the lease (it expires by itself): %s", error)
