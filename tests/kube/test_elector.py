"""Leader election on a Lease: one leader, takeover only after expiry by the candidate's own clock,
leadership given up before the lease can pass on, and release on stop."""

from __future__ import annotations

import threading
import time

import pytest

from function.kube.elector import LeaderElector, LeaseLock
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
        on_started=lambda: events.append(f"{identity} started"),
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
    a._leading = True
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
        LeaderElector(LeaseLock(FakeApi(), "ops", "x"), "a", lambda: None, lambda: None, lease_seconds=10)
    with pytest.raises(ValueError, match=r"1\.2 x retry period"):
        LeaderElector(LeaseLock(FakeApi(), "ops", "x"), "a", lambda: None, lambda: None, retry_seconds=9)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(LeaseLock(FakeApi(), "ops", "x"), "", lambda: None, lambda: None)


def running(
    api: FakeApi, identity: str, events: list[str], **timings: float
) -> tuple[LeaderElector, threading.Thread]:
    e = LeaderElector(
        LeaseLock(api, "ops", "castslice-control"),
        identity,
        on_started=lambda: events.append(f"{identity} started"),
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
    wait_for(lambda: not a.leading)
    # It gave up after the renew deadline (1 s) and before the lease (1.5 s) let another lead.
    assert events == ["a started", "a stopped"]
    assert time.monotonic() - began < FAST["lease_seconds"] + 5  # does not hang
    api.down = False
    wait_for(lambda: a.leading)  # it competes again, and wins its own lease back
    a.stop()
    thread.join(10)
