"""Leader election on a Lease: one leader, takeover only after expiry by the candidate's own clock,
leadership given up before the lease can pass on, a term that ends at the renew deadline counted
from the start of the attempt that renewed (however late its answer), every request bounded by
the time left, and release on stop."""

from __future__ import annotations

import threading
import time

import pytest

from function.kube.client import ApiResponse
from function.kube.elector import LeaderElector, LeaseLock, Term, TermEnded
from tests.support.fake_api import FakeApi

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/castslice-control"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(api: FakeApi, identity: str, clock: Clock, events: list[str] | None = None) -> LeaderElector:
    events = events if events is not None else []
    return LeaderElector(
        LeaseLock(api, "ops", "castslice-control"),
        identity,
        on_started=lambda term: events.append(f"{identity} started"),
        on_stopped=lambda: events.append(f"{identity} stopped"),
        clock=clock,
    )


def holder(api: FakeApi) -> str:
    return str(api.objects[LEASE_PATH]["spec"]["holderIdentity"])


def test_the_first_candidate_creates_the_lease_and_leads() -> None:
    api, clock = FakeApi(), Clock()
    a = elector(api, "a", clock)
    assert a._try_acquire_or_renew()
    spec = api.objects[LEASE_PATH]["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"].endswith("Z") and "." in spec["renewTime"]


def test_a_held_lease_is_not_taken_before_it_expires_by_the_candidates_clock() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a._try_acquire_or_renew()
    assert not b._try_acquire_or_renew()  # b first sees the record now
    clock.now += 14.9
    assert not b._try_acquire_or_renew()
    clock.now += 0.2
    assert b._try_acquire_or_renew()
    assert holder(api) == "b"
    assert api.objects[LEASE_PATH]["spec"]["leaseTransitions"] == 1


def test_a_renewed_lease_restarts_the_candidates_count() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a._try_acquire_or_renew()
    assert not b._try_acquire_or_renew()
    clock.now += 10
    assert a._try_acquire_or_renew()  # renewal: a new record
    clock.now += 10
    assert not b._try_acquire_or_renew()  # 20 s since the first sight, but the renewal is new to b
    clock.now += 14.9
    assert not b._try_acquire_or_renew()
    clock.now += 0.2  # 15 s since b first saw the renewed record
    assert b._try_acquire_or_renew()


def test_two_candidates_racing_on_one_version_elect_one() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a._try_acquire_or_renew()
    clock.now += 20
    record_version = a.lock.get()
    assert record_version is not None
    # b read the expired record; a renews in between: b's write conflicts.
    assert a._try_acquire_or_renew()
    from function.kube.elector import LeaseRecord

    assert not b.lock.update(LeaseRecord("b", 15, "", "", 1), record_version[1])
    assert holder(api) == "a"


def test_a_released_lease_is_taken_at_once() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a._try_acquire_or_renew()
    assert not b._try_acquire_or_renew()
    a._release()
    assert holder(api) == ""
    assert b._try_acquire_or_renew()


def test_a_candidate_waits_until_the_observed_expiry_not_a_whole_retry_past_it() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a._try_acquire_or_renew()
    assert not b._try_acquire_or_renew()
    assert 2.0 <= b._candidate_wait() <= 2.4
    clock.now += 14.5
    assert b._candidate_wait() == pytest.approx(0.51)


def test_timings_are_checked_as_client_go_checks_them() -> None:
    with pytest.raises(ValueError, match=r"lease \(10s\) > renew deadline \(10.0s\)"):
        LeaderElector(LeaseLock(FakeApi(), "ops", "x"), "a", lambda t: None, lambda: None, lease_seconds=10)
    with pytest.raises(ValueError, match=r"1\.2 x retry period"):
        LeaderElector(LeaseLock(FakeApi(), "ops", "x"), "a", lambda t: None, lambda: None, retry_seconds=9)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(LeaseLock(FakeApi(), "ops", "x"), "", lambda t: None, lambda: None)


def running(
    api: FakeApi, identity: str, events: list[str], **timings: float
) -> tuple[LeaderElector, threading.Thread]:
    e = LeaderElector(
        LeaseLock(api, "ops", "castslice-control"),
        identity,
        on_started=lambda term: events.append(f"{identity} started"),
        on_stopped=lambda: events.append(f"{identity} stopped"),
        **timings,
    )
    thread = threading.Thread(target=e.run, daemon=True)
    thread.start()
    return e, thread


def wait_for(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


FAST = {"lease_seconds": 1.5, "renew_deadline": 1.0, "retry_seconds": 0.2}


def test_stop_stops_the_work_then_releases_and_the_standby_leads() -> None:
    api, events = FakeApi(), []
    a, a_thread = running(api, "a", events, **FAST)
    wait_for(lambda: a.leading)
    b, b_thread = running(api, "b", events, **FAST)
    a.stop()
    a_thread.join(10)
    assert events[:2] == ["a started", "a stopped"]
    assert not a_thread.is_alive()
    wait_for(lambda: b.leading)
    assert holder(api) == "b"
    b.stop()
    b_thread.join(10)
    assert holder(api) == ""
    assert events == ["a started", "a stopped", "b started", "b stopped"]


def test_a_leader_that_cannot_renew_stops_leading_before_the_lease_can_expire() -> None:
    api, events = FakeApi(), []
    a, thread = running(api, "a", events, **FAST)
    wait_for(lambda: a.leading)
    api.down = True
    began = time.monotonic()
    # It gave up after the renew deadline (1 s) and before the lease (1.5 s) let another lead. Its
    # term ends by the clock (``leading`` is False from then on) a moment before the loop sees it
    # and stops the work: wait for the work to stop, not for ``leading``.
    wait_for(lambda: "a stopped" in events)
    assert not a.leading
    assert events == ["a started", "a stopped"]
    assert time.monotonic() - began < FAST["lease_seconds"] + 5  # does not hang
    api.down = False
    wait_for(lambda: a.leading)  # it competes again, and wins its own lease back
    a.stop()
    thread.join(10)


class SlowApi(FakeApi):
    """The fake apiserver behind a link that holds every answer ``delay`` seconds (of the test's
    clock): the request takes effect at once, the caller learns of it late. Records each
    request's timeout."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.delay = clock, 0.0
        self.timeouts: list[tuple[str, float]] = []

    def request(self, method: str, path: str, **kwargs: object) -> ApiResponse:
        timeout = float(kwargs.get("timeout", 10.0))  # type: ignore[arg-type]
        self.timeouts.append((method, timeout))
        response = super().request(method, path, **kwargs)  # type: ignore[arg-type]
        if self.delay > timeout:
            self.clock.now += timeout
            raise OSError("read timed out")
        self.clock.now += self.delay
        return response


def test_every_request_of_a_renewal_is_bounded_by_the_time_left_in_the_term() -> None:
    clock = Clock()
    api = SlowApi(clock)
    a = elector(api, "a", clock)
    assert a._try_acquire_or_renew()
    a.term = Term("a", 0, clock.now + 10.0, clock)  # leading, 10 s left
    clock.now += 7.5
    api.timeouts.clear()
    assert a._try_acquire_or_renew()
    (get_method, get_timeout), (put_method, put_timeout) = api.timeouts
    assert (get_method, put_method) == ("GET", "PUT")
    assert get_timeout == pytest.approx(2.5) and put_timeout <= 2.5


def test_a_renewal_whose_answer_is_held_past_the_deadline_does_not_extend_the_term() -> None:
    """The GET takes 4 s of the 7 left, so the PUT has 3: held 4, it times out at the deadline and
    the term is not extended (the renewal may have landed: others count from it, so ending is safe)."""
    clock = Clock()
    api = SlowApi(clock)
    a = elector(api, "a", clock)
    assert a._try_acquire_or_renew()
    term = Term("a", 0, clock.now + 10.0, clock)
    a.term = term
    api.delay = 4.0
    clock.now += 3.0
    assert not a._try_acquire_or_renew()
    assert term.deadline == pytest.approx(110.0) and clock.now == pytest.approx(110.0)
    with pytest.raises(TermEnded):
        term.check("a write")


def test_an_acquisition_known_only_after_a_renew_deadline_leads_to_nothing() -> None:
    """A candidate whose GET and PUT answers take 6 s each learns it acquired 12 s after it
    started: past its term's deadline, so it does not lead (its next attempt renews, and leads)."""
    clock = Clock()
    api = SlowApi(clock)
    a = elector(api, "a", clock)
    api.delay = 6.0
    assert not a._try_acquire_or_renew()
    assert holder(api) == "a" and a._won is None
    api.delay = 0.0
    assert a._try_acquire_or_renew()
    assert a._won is not None and a._won[1] == pytest.approx(clock.now + 10.0)


def test_a_term_ends_at_its_deadline_and_when_revoked() -> None:
    clock = Clock()
    term = Term("a", 3, clock.now + 5, clock)
    assert term.check("w") == pytest.approx(5)
    term.extend(clock.now + 2)  # never shortened
    assert term.deadline == clock.now + 5
    clock.now += 5
    with pytest.raises(TermEnded, match="term 3 of a has ended"):
        term.check("w")
    fresh = Term("a", 4, clock.now + 5, clock)
    fresh.revoke()
    assert not fresh.valid() and fresh.remaining() == 0


def test_losing_the_lead_revokes_the_term_before_the_work_is_stopped() -> None:
    api, events = FakeApi(), []
    seen: list[bool] = []
    e = LeaderElector(
        LeaseLock(api, "ops", "castslice-control"),
        "a",
        on_started=lambda term: events.append(term),
        on_stopped=lambda: seen.append(events[0].valid()),
        **FAST,
    )
    thread = threading.Thread(target=e.run, daemon=True)
    thread.start()
    wait_for(lambda: bool(events))  # on_started runs after ``leading`` turns True, on the elector's thread
    term = events[0]
    # The work is handed its term (not asked to be valid still: on a busy machine its renew
    # deadline of 1 s can pass before this line runs, and the term is then revoked).
    assert isinstance(term, Term) and term.number == 0
    api.down = True
    wait_for(lambda: seen)
    assert seen == [False]  # revoked first: no write of the term can start while it stops
    e.stop()
    thread.join(10)
