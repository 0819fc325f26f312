"""The runner: a key at most once in the queue, timers, backoff on failure (none for a terminal
one), reconcilers started and stopped with leadership (and reconciling only once their watches
have listed), each worker's writes made in its term and refused once it ends, a term's memory
dropped with it, watch changes routed by each reconciler's triggers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from function.control.fence import Fence
from function.control.reconciler import DONE, Context, Requeue, Terminal
from function.control.runner import Runner, WorkQueue
from function.core.view import StaticView
from function.kube.client import ApiError, ApiResponse
from function.kube.elector import Term
from tests.control.support import Recorder
from tests.support.fake_api import FakeApi


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    queue = WorkQueue(Clock())
    for _ in range(3):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert [queue.get(0), queue.get(0), queue.get(0)] == ["a", "b", None]


def test_a_timer_is_due_only_at_its_time_and_an_earlier_add_wins() -> None:
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add("lease", after=30)
    assert queue.get(0) is None and queue.ready() == 0
    clock.now = 29.9
    assert queue.get(0) is None
    queue.add("lease")  # a watch event: now, not in 0.1 s
    assert queue.get(0) == "lease"
    queue.done("lease")
    assert queue.get(0) is None  # the superseded timer does not fire a second time


def test_a_key_added_while_it_is_reconciled_runs_again_after_never_beside() -> None:
    queue = WorkQueue(Clock())
    queue.add("a")
    assert queue.get(0) == "a"
    queue.add("a")
    assert queue.get(0) is None  # not handed to a second worker
    queue.done("a")
    assert queue.get(0) == "a"


NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def listed(indices: Iterable[str], timeout: float) -> bool:
    return True  # a StaticView: everything is there from the start


def runner(reconciler: Recorder, registry: CollectorRegistry | None = None) -> Runner:
    return Runner(
        [reconciler], lambda: StaticView({}), registry or CollectorRegistry(), listed, now=lambda: NOW
    )


def wait_for(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_gaining_leadership_reconciles_every_key_with_the_injected_clock() -> None:
    recorder = Recorder(["thing/a", "thing/b"])
    r = runner(recorder)
    r.start_leading()
    try:
        wait_for(lambda: len(recorder.seen) == 2)
        assert sorted(recorder.seen) == [("thing/a", NOW), ("thing/b", NOW)]
    finally:
        r.stop_leading()


def test_a_leader_reconciles_nothing_until_the_watches_its_reconciler_declares_have_listed() -> None:
    recorder = Recorder(["thing/a", "thing/b"])
    synced = threading.Event()
    asked: list[list[str]] = []

    def wait_synced(indices: Iterable[str], timeout: float) -> bool:
        asked.append(list(indices))
        return synced.wait(timeout)

    r = Runner([recorder], lambda: StaticView({}), CollectorRegistry(), wait_synced, now=lambda: NOW)
    r.start_leading()
    try:
        wait_for(lambda: len(asked) >= 3)  # the worker asked, was told no, and asked again
        assert recorder.seen == []
        assert asked[0] == ["things"]  # the indices Recorder.watches declares
        synced.set()
        wait_for(lambda: len(recorder.seen) == 2)
        assert sorted(key for key, _ in recorder.seen) == ["thing/a", "thing/b"]
    finally:
        r.stop_leading()


def test_a_leader_stopped_while_its_watches_list_stops_without_reconciling() -> None:
    recorder = Recorder(["thing/a"])
    asked = threading.Event()

    def never(indices: Iterable[str], timeout: float) -> bool:
        asked.set()
        time.sleep(timeout)
        return False

    r = Runner([recorder], lambda: StaticView({}), CollectorRegistry(), never, now=lambda: NOW)
    r.start_leading()
    asked.wait(5)
    r.stop_leading()
    worker_threads = [t for t in threading.enumerate() if t.name == "castslice-reconcile-recorder"]
    assert worker_threads == [] and recorder.seen == []


def test_changes_are_ignored_while_not_leading_and_routed_while_leading() -> None:
    recorder = Recorder()
    r = runner(recorder)
    r.changed("things", None, {"metadata": {"name": "x"}})
    assert not r.leading
    r.start_leading()
    try:
        r.changed("things", {"metadata": {"name": "x"}}, {"metadata": {"name": "y"}})
        r.changed("other-index", None, {"metadata": {"name": "z"}})
        wait_for(lambda: len(recorder.seen) == 2)
        assert sorted(key for key, _ in recorder.seen) == ["thing/x", "thing/y"]
    finally:
        r.stop_leading()
    assert not r.leading


def test_a_whole_relist_makes_every_key_due() -> None:
    recorder = Recorder(["thing/a"])
    r = runner(recorder)
    r.start_leading()
    try:
        wait_for(lambda: len(recorder.seen) == 1)
        r.changed("things", None, None)
        wait_for(lambda: len(recorder.seen) == 2)
    finally:
        r.stop_leading()


def test_a_failing_key_is_counted_and_retried_with_backoff_while_the_others_go_on() -> None:
    recorder = Recorder()
    recorder.fail.add("thing/bad")
    registry = CollectorRegistry()
    r = runner(recorder, registry)
    r.start_leading()
    try:
        worker = r.worker("recorder")
        assert worker is not None
        worker.reconcile_one("thing/bad")
        worker.reconcile_one("thing/good")
        assert len(worker.queue) == 1  # the bad key, due again after the backoff
        metrics = generate_latest(registry).decode()
        assert 'castslice_control_reconcile_errors_total{reconciler="recorder"} 1.0' in metrics
        assert 'castslice_control_reconcile_seconds_count{reconciler="recorder"} 2.0' in metrics
    finally:
        r.stop_leading()


def test_a_requeue_is_a_timer() -> None:
    recorder = Recorder()
    recorder.after["thing/a"] = 3600
    r = runner(recorder)
    r.start_leading()
    try:
        worker = r.worker("recorder")
        assert worker is not None
        worker.reconcile_one("thing/a")
        assert len(worker.queue) == 1 and worker.queue.ready() == 0
    finally:
        r.stop_leading()


def test_is_leader_and_queue_depth_follow_leadership() -> None:
    registry = CollectorRegistry()
    recorder = Recorder()
    r = runner(recorder, registry)
    assert "castslice_control_is_leader 0.0" in generate_latest(registry).decode()
    r.start_leading()
    assert "castslice_control_is_leader 1.0" in generate_latest(registry).decode()
    r.stop_leading()
    metrics = generate_latest(registry).decode()
    assert "castslice_control_is_leader 0.0" in metrics
    assert 'castslice_control_queue_depth{reconciler="recorder"} 0.0' in metrics


def test_reconcilers_must_have_distinct_names() -> None:
    import pytest

    with pytest.raises(ValueError, match="share a name"):
        Runner([Recorder(), Recorder()], lambda: StaticView({}), CollectorRegistry(), listed)


class Writer(Recorder):
    """A Recorder that writes once per reconcile through the Api it was built with (a Fence), and
    remembers things during a term."""

    name = "writer"

    def __init__(self, api: Any, keys: Iterable[str] = ()) -> None:
        super().__init__(keys)
        self.api = api
        self.memory: list[str] = []
        self.raise_this: Exception | None = None
        self.before_write: Any = lambda: None

    def reconcile(self, key: str, ctx: Context) -> Requeue:
        self.seen.append((key, ctx.now))
        self.memory.append(key)
        if self.raise_this is not None:
            raise self.raise_this
        self.before_write()
        self.api.request("PATCH", f"/apis/example.io/v1/things/{key}", body={})
        return DONE

    def forget_term(self) -> None:
        self.memory.clear()


def test_a_workers_writes_are_made_in_its_term_and_refused_once_it_ends() -> None:
    clock = Clock()
    api = FakeApi()
    fence = Fence(api)
    writer = Writer(fence)
    registry = CollectorRegistry()
    r = Runner([writer], lambda: StaticView({}), registry, listed, now=lambda: NOW, fence=fence)
    term = Term("a", 7, 10.0, clock)
    r.start_leading(term)
    try:
        worker = r.worker("writer")
        assert worker is not None and worker.term is term
        fence.bind(term)  # this thread stands in for the worker's
        worker.reconcile_one("a")
        assert [path for _, path, _, _ in api.requests] == ["/apis/example.io/v1/things/a"]
        writer.before_write = term.revoke  # the lead lost in the middle of a reconcile
        worker.reconcile_one("b")
        assert len(api.requests) == 1  # its write was not sent
        assert "castslice_control_fenced_writes_total 1.0" in generate_latest(registry).decode()
        writer.seen.clear()
        worker.reconcile_one("c")
        assert writer.seen == []  # an ended term reconciles nothing more
    finally:
        r.stop_leading()


def test_a_lost_lead_drops_what_each_reconciler_remembered_of_the_term() -> None:
    fence = Fence(FakeApi())
    writer = Writer(fence, ["a"])
    r = Runner([writer], lambda: StaticView({}), CollectorRegistry(), listed, now=lambda: NOW, fence=fence)
    r.start_leading(Term("a", 1, time.monotonic() + 60, time.monotonic))
    wait_for(lambda: writer.memory == ["a"])
    r.stop_leading()
    assert writer.memory == []


def test_a_terminal_error_is_counted_and_not_retried() -> None:
    writer = Writer(FakeApi())
    registry = CollectorRegistry()
    r = Runner([writer], lambda: StaticView({}), registry, listed, now=lambda: NOW)
    r.start_leading()
    try:
        worker = r.worker("writer")
        assert worker is not None
        writer.raise_this = ApiError("apply status", ApiResponse(422, {"message": "spec.count: Invalid"}))
        worker.reconcile_one("a")
        assert len(worker.queue) == 0  # not retried: the same request gets the same 422
        writer.raise_this = Terminal("a lease that cannot be represented")
        worker.reconcile_one("b")
        writer.raise_this = ApiError("apply status", ApiResponse(409, {"message": "conflict"}))
        worker.reconcile_one("c")
        assert len(worker.queue) == 1  # a conflict is retried
        metrics = generate_latest(registry).decode()
        assert 'castslice_control_reconcile_terminal_errors_total{reconciler="writer"} 2.0' in metrics
        assert 'castslice_control_reconcile_errors_total{reconciler="writer"} 3.0' in metrics
    finally:
        r.stop_leading()
