"""The view's list+watch edge against a stand-in apiserver over real HTTP (tests/support/view.py).

The same ClusterWatcher runs against a real kube-apiserver in tests/e2e/test_view_e2e.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from function.core.view import PODS, REPLICASETS
from function.kube import watch
from function.kube.watch import ClusterWatcher
from tests.support.view import FakeApiServer, make_pod, transport_for

POD_PATH, RS_PATH = PODS.path(), REPLICASETS.path()


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def started(api: FakeApiServer, specs: tuple = (PODS,), **options: object) -> ClusterWatcher:
    options.setdefault("backoff", (0.01, 0.05))
    watcher = ClusterWatcher(specs, transport_for(api.url, token="t0ken"), **options)  # type: ignore[arg-type]
    watcher.start()
    return watcher


@pytest.fixture
def watchers() -> Iterator[list[ClusterWatcher]]:
    running: list[ClusterWatcher] = []
    yield running
    for watcher in running:
        watcher.stop()


def test_lists_in_pages_then_is_synced(
    api: FakeApiServer, watchers: list[ClusterWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "PAGE_SIZE", 4)
    owner = str(uuid.uuid4())
    api.load(POD_PATH, [make_pod(f"p{i:02}", owner) for i in range(10)])
    watcher = started(api)
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    view = watcher.snapshot()
    assert len(view.index("pods")) == 10 and len(view.group("pods", owner)) == 10
    lists = api.requests("list")
    assert [s.query.get("continue", "") for s in lists] == ["", "4::110", "8::110"]
    assert all(s.query["limit"] == "4" for s in lists)
    # Pods as metadata only, filtered on the server, with the ServiceAccount's token.
    assert all("as=PartialObjectMetadataList;g=meta.k8s.io;v=v1" in s.accept for s in lists)
    assert all(s.query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed" for s in lists)
    assert all(s.authorization == "Bearer t0ken" for s in api.seen)
    eventually(lambda: len(api.requests("watch")) == 1)
    seen = api.requests("watch")[0]
    assert seen.query["resourceVersion"] == "110" and seen.query["allowWatchBookmarks"] == "true"
    assert "as=PartialObjectMetadata;g=meta.k8s.io;v=v1" in seen.accept
    assert 240 <= int(seen.query["timeoutSeconds"]) <= 360


def test_not_synced_until_every_index_listed(api: FakeApiServer, watchers: list[ClusterWatcher]) -> None:
    api.fail = [500, 500, 500]  # the first lists fail (whichever index asks first)
    watcher = ClusterWatcher((PODS, REPLICASETS), transport_for(api.url), backoff=(0.2, 0.2))
    assert not watcher.synced()
    watcher.start()
    watchers.append(watcher)
    assert not watcher.synced()
    assert watcher.wait_synced(5)
    view = watcher.snapshot()
    assert view.synced("pods") and view.synced("replicasets")
    text = watcher.metrics_text().decode()
    assert 'castslice_view_errors_total{index="pods"}' in text
    errors = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("castslice_view_errors_total")
    )
    assert errors == 3


class Unreachable:
    """The real client, except that requests for one path never get through."""

    def __init__(self, inner: Any, refused: str) -> None:
        self.inner, self.refused = inner, refused

    def get(self, path: str, query: Any, accept: str, read_timeout: float) -> Any:
        if path == self.refused:
            raise OSError(f"{path}: connection refused")
        return self.inner.get(path, query, accept, read_timeout)

    def interrupt(self, response: Any) -> None:
        self.inner.interrupt(response)


def test_the_barrier_waits_for_the_indices_asked_for_only(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    unreachable = Unreachable(transport_for(api.url), RS_PATH)
    watcher = ClusterWatcher((PODS, REPLICASETS), unreachable, backoff=(0.05, 0.05))  # type: ignore[arg-type]
    watcher.start()
    watchers.append(watcher)
    assert watcher.wait_synced(5, ["pods"])
    assert not watcher.wait_synced(0.3, ["pods", "replicasets"])
    assert not watcher.wait_synced(0.3)  # every index, by default
    assert watcher.wait_synced(0, [])
    with pytest.raises(ValueError, match="does not watch 'nodes'"):
        watcher.wait_synced(0, ["nodes"])


def test_events_reach_new_snapshots_and_old_snapshots_stay(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    owner = str(uuid.uuid4())
    first = make_pod("a", owner)
    api.load(POD_PATH, [first])
    watcher = started(api)
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    eventually(lambda: len(api.requests("watch")) == 1)
    before = watcher.snapshot()

    second = make_pod("b", owner, placement="spot")
    api.put(POD_PATH, second)
    eventually(lambda: len(watcher.snapshot().group("pods", owner)) == 2)
    assert watcher.snapshot().index("pods")[second["metadata"]["uid"]].placement == "spot"

    second["metadata"]["deletionTimestamp"] = "2026-11-23T20:00:00Z"
    api.put(POD_PATH, second)
    eventually(lambda: watcher.snapshot().index("pods")[second["metadata"]["uid"]].terminating)

    api.delete(POD_PATH, first["metadata"]["uid"])
    eventually(lambda: first["metadata"]["uid"] not in watcher.snapshot().index("pods"))
    assert list(before.group("pods", owner)) == [first["metadata"]["uid"]]  # frozen
    text = watcher.metrics_text().decode()
    assert 'castslice_view_objects{index="pods"} 1.0' in text
    assert 'castslice_view_synced{index="pods"} 1.0' in text


def test_a_dropped_watch_resumes_from_the_last_version_without_relisting(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    api.load(POD_PATH, [make_pod("a")])
    watcher = started(api)
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    eventually(lambda: len(api.requests("watch")) == 1)
    api.put(POD_PATH, make_pod("b"))
    eventually(lambda: len(watcher.snapshot().index("pods")) == 2)
    seen_version = str(api.version)
    api.drop_watches()
    eventually(lambda: len(api.requests("watch")) == 2)
    assert api.requests("watch")[1].query["resourceVersion"] == seen_version
    api.put(POD_PATH, make_pod("c"))
    eventually(lambda: len(watcher.snapshot().index("pods")) == 3)
    assert len(api.requests("list")) == 1
    assert 'castslice_view_relists_total{index="pods"} 0.0' in watcher.metrics_text().decode()


def test_bookmarks_move_the_resume_point(api: FakeApiServer, watchers: list[ClusterWatcher]) -> None:
    api.bookmark_every_event = True
    watcher = started(api, (REPLICASETS,))
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    eventually(lambda: len(api.requests("watch")) == 1)
    api.put(
        RS_PATH,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "r", "namespace": "n", "uid": "rs-1"},
            "spec": {"replicas": 4},
        },
    )
    eventually(lambda: "rs-1" in watcher.snapshot().index("replicasets"))
    assert watcher.snapshot().index("replicasets")["rs-1"].replicas == 4
    assert api.requests("watch")[0].accept == "application/json"  # ReplicaSets whole: spec.replicas
    api.drop_watches()
    eventually(lambda: len(api.requests("watch")) == 2)
    assert api.requests("watch")[1].query["resourceVersion"] == str(api.version)


@pytest.mark.parametrize("gone_as_event", [False, True], ids=["410-status", "410-error-event"])
def test_gone_relists_and_drops_what_was_deleted_meanwhile(
    api: FakeApiServer, watchers: list[ClusterWatcher], gone_as_event: bool
) -> None:
    api.gone_as_event = gone_as_event
    keep, lose = make_pod("keep"), make_pod("lose")
    api.load(POD_PATH, [keep, lose])
    watcher = started(api)
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    eventually(lambda: len(api.requests("watch")) == 1)
    # While the watcher is disconnected, one Pod goes and one comes, and the history is compacted.
    with api.lock:
        api.delete(POD_PATH, lose["metadata"]["uid"], notify=False)
        api.put(POD_PATH, make_pod("new"), notify=False)
        api.compact()
        api.drop_watches()
    eventually(lambda: len(api.requests("list")) == 2)
    eventually(lambda: sorted(r.name for r in watcher.snapshot().index("pods").values()) == ["keep", "new"])
    assert 'castslice_view_relists_total{index="pods"} 1.0' in watcher.metrics_text().decode()
    assert watcher.synced()


def test_an_expired_continue_token_restarts_the_list(
    api: FakeApiServer, watchers: list[ClusterWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "PAGE_SIZE", 2)
    api.load(POD_PATH, [make_pod(f"p{i}") for i in range(5)])
    api.expire_continue = 1
    watcher = started(api)
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    assert len(watcher.snapshot().index("pods")) == 5  # no duplicates, none lost
    assert [s.query.get("continue", "") for s in api.requests("list")] == [
        "",
        "2::105",
        "",
        "2::105",
        "4::105",
    ]


def test_seconds_since_last_event_is_computed_at_scrape(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    now = [1000.0]
    watcher = ClusterWatcher((PODS,), transport_for(api.url), clock=lambda: now[0])
    watchers.append(watcher)
    before = watcher.metrics_text().decode()
    watcher.start()
    assert watcher.wait_synced(5)
    now[0] += 42.5
    text = watcher.metrics_text().decode()
    # Before the first list the gauge is -1: never heard from the apiserver.
    assert 'castslice_view_seconds_since_last_event{index="pods"} -1.0' in before
    assert 'castslice_view_seconds_since_last_event{index="pods"} 42.5' in text


def test_no_specs_means_no_thread_no_request_and_ready() -> None:
    class NoTransport:
        def get(self, *args: object) -> object:
            raise AssertionError("no request expected")

        def interrupt(self, response: object) -> None:
            raise AssertionError("nothing to interrupt")

    watcher = ClusterWatcher((), NoTransport())  # type: ignore[arg-type]
    watcher.start()
    assert watcher.synced() and watcher.snapshot().available
    assert watcher._threads == []
    watcher.stop()


def test_stop_ends_an_idle_watch_promptly(api: FakeApiServer) -> None:
    watcher = started(api)
    assert watcher.wait_synced(5)
    eventually(lambda: len(api.requests("watch")) == 1)
    began = time.monotonic()
    watcher.stop(timeout=5)
    assert time.monotonic() - began < 2
    assert not any(thread.is_alive() for thread in watcher._threads)


def test_a_version_gone_right_after_listing_backs_off_instead_of_spinning(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    api.oldest = 10**9  # every watch is 410 Gone, even from a fresh list
    watcher = started(api, backoff=(0.2, 0.2))
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    time.sleep(1.0)
    assert 2 <= len(api.requests("list")) <= 15  # ~1 every 0.1 s on average, not hundreds


def test_a_watch_closed_at_once_backs_off_instead_of_spinning(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    watcher = started(api, backoff=(0.2, 0.2))
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # the server ends every watch as soon as it opens
        api.drop_watches()
        time.sleep(0.005)
    assert len(api.requests("watch")) <= 20
    assert len(api.requests("list")) == 1  # resumed, never relisted


def test_freeze_gc_keeps_the_collector_off_the_view(
    api: FakeApiServer, watchers: list[ClusterWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "FREEZE_EVERY", 3)
    frozen: list[int] = []
    api.load(POD_PATH, [make_pod(f"p{i}") for i in range(5)])
    watcher = ClusterWatcher((PODS,), transport_for(api.url), backoff=(0.01, 0.05), freeze_gc=True)
    watcher._gc_freeze = lambda: frozen.append(1)  # the test process's collector stays as it is
    watcher.start()
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    assert len(frozen) == 1  # after the list
    eventually(lambda: len(api.requests("watch")) == 1)
    for i in range(6):
        api.put(POD_PATH, make_pod(f"n{i}"))
    eventually(lambda: len(watcher.snapshot().index("pods")) == 11)
    assert len(frozen) == 3  # and every FREEZE_EVERY events
    off = ClusterWatcher((PODS,), transport_for(api.url))  # the default leaves the collector alone
    off._gc_freeze = lambda: frozen.append(2)
    off.start()
    watchers.append(off)
    assert off.wait_synced(5) and 2 not in frozen


def test_an_object_the_view_cannot_read_is_left_out_counted_and_named_and_the_watch_goes_on(
    api: FakeApiServer, watchers: list[ClusterWatcher]
) -> None:
    """A reader that raises on one object (one that skipped validation, say) costs that object
    only: the list and the watch go on, the others are kept and followed, the object is named for
    readiness and counted, and it leaves the count once fixed or deleted."""
    import dataclasses

    from function.core.view import slim_pod

    def fussy(obj: dict[str, Any]) -> Any:
        if (obj["metadata"].get("labels") or {}).get("castops.io/placement") == "poison":
            raise OverflowError("date value out of range")
        return slim_pod(obj)

    spec = dataclasses.replace(PODS, slim=fussy)
    good, bad = make_pod("good"), make_pod("bad", placement="poison")
    api.load(POD_PATH, [good, bad])
    watcher = started(api, (spec,))
    watchers.append(watcher)
    assert watcher.wait_synced(5)
    assert list(watcher.snapshot().index("pods")) == [good["metadata"]["uid"]]
    assert watcher.unreadable() == {"pods": {"default/bad": "OverflowError: date value out of range"}}
    assert 'castslice_view_unreadable_objects{index="pods"} 1.0' in watcher.metrics_text().decode()
    eventually(lambda: len(api.requests("watch")) == 1)
    later = make_pod("later")
    api.put(POD_PATH, later)  # created after the bad one: still seen
    eventually(lambda: later["metadata"]["uid"] in watcher.snapshot().index("pods"))
    good["metadata"]["labels"] = {"castops.io/placement": "poison"}  # a known object turns bad
    api.put(POD_PATH, good)
    eventually(lambda: good["metadata"]["uid"] not in watcher.snapshot().index("pods"))
    assert set(watcher.unreadable()["pods"]) == {"default/bad", "default/good"}
    api.delete(POD_PATH, bad["metadata"]["uid"])  # deleting the bad one heals, without a restart
    good["metadata"]["labels"] = {}
    api.put(POD_PATH, good)
    eventually(lambda: good["metadata"]["uid"] in watcher.snapshot().index("pods"))
    assert watcher.unreadable() == {}
    assert 'castslice_view_unreadable_objects{index="pods"} 0.0' in watcher.metrics_text().decode()
    assert len(api.requests("list")) == 1  # never relisted for it
