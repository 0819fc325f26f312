"""The edge that feeds the cluster view: one list+watch thread per WatchSpec.

Each thread lists its resource (paginated), publishes the whole index at once, then watches from
the list's resourceVersion with bookmarks. A closed or broken stream resumes from the last
resourceVersion seen; ``410 Gone`` (the apiserver no longer has that history) means a fresh list,
swapped in whole so a review never sees half a relist. Errors back off exponentially with full
jitter (0.5 s doubling to 30 s). ``snapshot()`` is what a review reads: a reference to the
current immutable states (``function/core/view.py``), O(number of indices), no lock, no request.

Why our own list+watch over urllib3 rather than ``kubernetes.watch.Watch``: that helper is built
around the generated API methods and their typed models, and PartialObjectMetadata needs a custom
``Accept`` header the generated methods do not take; the generated ``ApiClient.call_api`` changed
its signature in client 35+. What we need is small (GET, a header, JSON lines), so the kubernetes
client is used for what it is good at - loading in-cluster or kubeconfig credentials, TLS and token
refresh (its ``Configuration`` and urllib3 pool) - and the protocol is ~100 lines here. Threads,
not asyncio: the app's servers differ (Flask, ASGI, plain WSGI) and a thread per index is two
threads; the work per event is microseconds.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from function.core.pod import metadata_of
from function.core.view import ClusterView, IndexState, Record, View, WatchSpec, merge_specs
from function.kube.client import ApiError, ApiResponse

log = logging.getLogger("castslice.view")

PAGE_SIZE = 500
"""Items per list page: the apiserver's recommended chunk, so 100k Pods never sit in one response."""
WATCH_SECONDS = (240, 360)
"""The server ends each watch after a random time in this range (as client-go does, spreading
reconnections); our read timeout is a little longer, so a silent dead connection is noticed."""
BACKOFF_START, BACKOFF_MAX = 0.5, 30.0
UNREADABLE_NAMED = 20
"""Unreadable objects named per index in the readiness detail (all of them are counted)."""
FREEZE_EVERY = 10_000
"""Watch events between two ``gc.freeze()`` calls (see ClusterWatcher's ``freeze_gc``)."""

LIST_ACCEPT_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
WATCH_ACCEPT_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


class Response(Protocol):
    """The part of a urllib3 response the watcher uses."""

    status: int

    def read(self) -> bytes: ...

    def stream(self, amt: int, decode_content: bool = True) -> Iterator[bytes]: ...

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """GET against the apiserver with the process's credentials (``function/kube/client.py``'s
    KubeClient, or a test's stand-in). The only way the view talks to it."""

    def get(self, path: str, query: Mapping[str, str], accept: str, read_timeout: float) -> Response: ...

    def interrupt(self, response: Response) -> None:
        """Unblock a thread reading ``response`` (stopping)."""
        ...


class Gone(Exception):
    """410: the resourceVersion (or continue token) is too old; the index must be listed again."""


class ViewMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.objects = Gauge(
            "castslice_view_objects",
            "Objects held in the cluster view, by index.",
            ["index"],
            registry=registry,
        )
        self.relists = Counter(
            "castslice_view_relists",
            "Lists after the first one (410 Gone, or an error that lost the watch), by index.",
            ["index"],
            registry=registry,
        )
        self.since_event = Gauge(
            "castslice_view_seconds_since_last_event",
            "Seconds since the index last heard from the apiserver (an event, a bookmark or a list).",
            ["index"],
            registry=registry,
        )
        self.synced = Gauge(
            "castslice_view_synced",
            "1 once the index has been listed completely.",
            ["index"],
            registry=registry,
        )
        self.requests = Counter(
            "castslice_view_api_requests",
            "Requests the view made to the apiserver (its watch threads only), by index and verb.",
            ["index", "verb"],
            registry=registry,
        )
        self.errors = Counter(
            "castslice_view_errors",
            "Failed lists or watches (each followed by a backoff), by index.",
            ["index"],
            registry=registry,
        )
        self.unreadable = Gauge(
            "castslice_view_unreadable_objects",
            "Objects the view could not read (its reader raised on them: they skipped validation) and "
            "left out, by index; the watch goes on. Named in the readiness answer.",
            ["index"],
            registry=registry,
        )


class ClusterWatcher:
    """Keeps the indices of ``specs`` current; ``snapshot()`` gives a review its frozen view."""

    def __init__(
        self,
        specs: Iterable[WatchSpec],
        transport: Transport,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff: tuple[float, float] = (BACKOFF_START, BACKOFF_MAX),
        watch_seconds: tuple[int, int] = WATCH_SECONDS,
        freeze_gc: bool = False,
        listener: Callable[[str, Record | None, Record | None], None] | None = None,
    ) -> None:
        """``listener`` (the controller's runner; the webhook passes none) is told of every change
        after it is published: ``(index, old, new)`` records, either None for an add or a delete,
        and ``(index, None, None)`` after a whole list (anything may have changed). It runs on the
        watch thread and must be quick (enqueue, never call the API).

        ``freeze_gc``: after each list and every FREEZE_EVERY events, ``gc.freeze()`` moves the
        objects alive into the collector's permanent generation. The view's records and map nodes
        are acyclic (reference counting frees them when replaced), but while tracked a full
        collection walks all of them, a pause any review could hit (docs/cluster-view.md has its length
        at 100,000 Pods, from tests/benchmarks/view.py with and without ``--no-gc-freeze``).
        Frozen, a full collection only walks what was allocated since. Process-wide, so the
        composition root (function/serve/app.py) turns it on, not tests."""
        self.specs = merge_specs(specs)
        self.transport = transport
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = ViewMetrics(self.registry)
        self._clock = clock
        self._backoff = backoff
        self._watch_seconds = watch_seconds
        self._published: Mapping[str, IndexState] = {spec.index: IndexState() for spec in self.specs}
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: dict[str, Response] = {}
        self._last_event: dict[str, float] = {}
        self._lists_done: dict[str, int] = {spec.index: 0 for spec in self.specs}
        self._synced_event = threading.Event()
        self._listed = {spec.index: threading.Event() for spec in self.specs}
        self._requests = 0
        self._freeze_gc = freeze_gc
        self._listener = listener
        self._gc_freeze: Callable[[], None] = gc.freeze  # replaced by tests, which must not freeze
        self._events_since_freeze = 0
        self._started_in: int | None = None
        self._fork_lock = threading.Lock()
        self._unreadable: dict[str, dict[str, str]] = {spec.index: {} for spec in self.specs}
        """Index -> object ("namespace/name") -> why it could not be read: left out of the view
        (one object the code cannot represent never stops the watch, nor hides the others)."""
        if not self.specs:
            self._synced_event.set()
        for spec in self.specs:
            self.metrics.objects.labels(spec.index).set(0)
            self.metrics.unreadable.labels(spec.index).set(0)
            self.metrics.synced.labels(spec.index).set(0)
            self.metrics.relists.labels(spec.index)
            self.metrics.errors.labels(spec.index)
            self.metrics.since_event.labels(spec.index).set_function(self._seconds_since(spec.index))

    # -- what the rest of the process sees --------------------------------------------------------
    def snapshot(self) -> ClusterView:
        """The view for one review: a reference to the current immutable states (no copy, no lock)."""
        self._follow_fork()
        return View(self._published)

    def synced(self) -> bool:
        """Every index has been listed once (/readyz). Stays true across relists: the previous
        state is served until the new list is complete."""
        self._follow_fork()
        return self._synced_event.is_set()

    def wait_synced(self, timeout: float, indices: Iterable[str] | None = None) -> bool:
        """Block until ``indices`` (default: every index) have been listed once, or ``timeout``
        seconds have passed; whether they have. The barrier before any work that reads the view
        (controller-runtime's WaitForCacheSync): a decision over a half-listed cluster is a guess."""
        self._follow_fork()
        if indices is None:
            return self._synced_event.wait(timeout)
        deadline = time.monotonic() + timeout
        for index in indices:
            if index not in self._listed:
                raise ValueError(f"the view does not watch {index!r}: it will never have listed it")
            if not self._listed[index].wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _follow_fork(self) -> None:
        """Threads do not survive a fork: ``castslice serve`` builds the app (and starts the watches)
        in gunicorn's master, then forks the workers, whose copy of the view would never change
        again. The first call in a forked process restarts the watches there, on a new connection
        pool (the inherited sockets belong to the parent), and is not synced until it has listed."""
        if self._started_in is None or self._started_in == os.getpid():
            return
        with self._fork_lock:
            if self._started_in == os.getpid():
                return
            log.info("cluster view: restarting the watches in worker process %d", os.getpid())
            renew = getattr(self.transport, "renewed", None)
            if callable(renew):
                self.transport = renew()
            self._stop = threading.Event()
            self._threads = []
            self._open = {}
            self._synced_event = threading.Event()
            self._listed = {spec.index: threading.Event() for spec in self.specs}
            self._lists_done = {spec.index: 0 for spec in self.specs}
            with self._publish_lock:  # the parent's state, as of the fork: served, but not synced
                self._published = {
                    name: IndexState(state.records, state.groups, False, state.tallies)
                    for name, state in self._published.items()
                }
            for spec in self.specs:
                self.metrics.synced.labels(spec.index).set(0)
            self.start()

    def unreadable(self) -> dict[str, dict[str, str]]:
        """The objects left out because they could not be read, by index (at most
        UNREADABLE_NAMED named per index), for a readiness answer: {index: {object: why}}."""
        return {
            index: dict(list(objects.items())[:UNREADABLE_NAMED])
            for index, objects in self._unreadable.items()
            if objects
        }

    def _read(self, spec: WatchSpec, obj: Mapping[str, Any]) -> tuple[str, Record | None] | None:
        """The object's key and record, or None when the spec cannot read it (counted, named)."""
        named = _object_name(obj)
        unreadable = self._unreadable[spec.index]
        try:
            key, record = spec.key(obj), spec.slim(obj)
        except Exception as error:  # noqa: BLE001 - any object, any bug: skipped, never the watch
            if named not in unreadable:
                log.error(
                    "view %s: %s cannot be read and is left out (the watch goes on): %s: %s",
                    spec.index,
                    named,
                    type(error).__name__,
                    error,
                )
            unreadable[named] = f"{type(error).__name__}: {str(error)[:200]}"
            self.metrics.unreadable.labels(spec.index).set(len(unreadable))
            return None
        if unreadable.pop(named, None) is not None:
            self.metrics.unreadable.labels(spec.index).set(len(unreadable))
        return key, record

    def api_requests(self) -> int:
        """Requests made to the apiserver so far (all by the watch threads; reviews make none)."""
        return self._requests

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    def start(self) -> None:
        self._started_in = os.getpid()
        for spec in self.specs:
            thread = threading.Thread(
                target=self._run, args=(spec,), name=f"castslice-view-{spec.index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for response in list(self._open.values()):
            try:
                self.transport.interrupt(response)
            except Exception:  # already closed; the thread notices the stop flag
                log.debug("interrupting a watch failed", exc_info=True)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- the per-index loop -----------------------------------------------------------------------
    def _seconds_since(self, index: str) -> Callable[[], float]:
        def value() -> float:
            last = self._last_event.get(index)
            return -1.0 if last is None else max(0.0, self._clock() - last)

        return value

    def _run(self, spec: WatchSpec) -> None:
        version: str | None = None
        delay = self._backoff[0]
        while not self._stop.is_set():
            began = time.monotonic()
            listed = False
            try:
                if version is None:
                    version = self._list(spec)
                    listed = True
                version, events = self._watch(spec, version)
                if self._stop.is_set():
                    return  # interrupted: stopping, not a watch that closed at once
                if events or time.monotonic() - began > 1.0:
                    delay = self._backoff[0]
                    continue
                # A watch the server closed at once with nothing in it: do not spin on it.
                delay = self._pause(spec, delay, "the watch closed at once")
            except Gone:
                log.info("view %s: resourceVersion expired (410 Gone): listing again", spec.index)
                version = None
                if listed:  # even a fresh list's version is gone: something is off, slow down
                    delay = self._pause(spec, delay, "410 Gone right after a list")
            except Exception as error:  # noqa: BLE001 - any failure: back off, resume (or relist if never listed)
                if self._stop.is_set():
                    return
                self.metrics.errors.labels(spec.index).inc()
                delay = self._pause(spec, delay, str(error))

    def _pause(self, spec: WatchSpec, delay: float, why: str) -> float:
        """Wait a random time up to ``delay`` (full jitter: webhook replicas reconnecting after an
        apiserver restart spread out); return the next, doubled, delay."""
        wait = random.uniform(0, delay)
        log.warning("view %s: %s; retrying in %.1fs", spec.index, why, wait)
        self._stop.wait(wait)
        return min(delay * 2, self._backoff[1])

    def _get(self, spec: WatchSpec, verb: str, query: dict[str, str], read_timeout: float) -> Response:
        if spec.field_selector:
            query["fieldSelector"] = spec.field_selector
        if spec.label_selector:
            query["labelSelector"] = spec.label_selector
        accept = (
            (LIST_ACCEPT_METADATA if verb == "list" else WATCH_ACCEPT_METADATA)
            if spec.metadata_only
            else "application/json"
        )
        self.metrics.requests.labels(spec.index, verb).inc()
        with self._publish_lock:
            self._requests += 1
        response = self.transport.get(spec.path(), query, accept, read_timeout)
        if response.status != 200:
            # Read the (small Status) body before the connection goes back to the pool: an unread
            # body would be taken for the next response's status line.
            refused = ApiResponse.parse(response.status, response.read())
            response.release_conn()
            if response.status == 410:
                raise Gone()
            raise ApiError(f"{verb} {spec.path()}", refused)
        return response

    def _list(self, spec: WatchSpec) -> str:
        """List everything (paginated), publish it whole, return the list's resourceVersion."""
        records: dict[str, Any] = {}
        token = ""
        while True:
            query = {"limit": str(PAGE_SIZE)}
            if token:
                query["continue"] = token
            try:
                response = self._get(spec, "list", query, 60.0)
            except Gone:
                # The continue token expired mid-list (the apiserver compacted): start over.
                records, token = {}, ""
                continue
            if not token:  # a new list: what it cannot read is counted afresh
                self._unreadable[spec.index].clear()
                self.metrics.unreadable.labels(spec.index).set(0)
            try:
                page = json.loads(response.read())
            finally:
                response.release_conn()
            for item in page.get("items") or ():
                read = self._read(spec, item) if isinstance(item, Mapping) else None
                if read is not None and read[0] and read[1] is not None:
                    records[read[0]] = read[1]
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                version = str(metadata.get("resourceVersion") or "")
                break
        state = IndexState.build(records, spec)
        self._publish(spec.index, lambda _old: state)
        self._last_event[spec.index] = self._clock()
        if self._lists_done[spec.index]:
            self.metrics.relists.labels(spec.index).inc()
        self._lists_done[spec.index] += 1
        self.metrics.synced.labels(spec.index).set(1)
        self._freeze()  # before readiness: the first freeze happens while no review is answered
        self._listed[spec.index].set()
        if all(state.synced for state in self._published.values()):
            self._synced_event.set()
        self._tell(spec.index, None, None)
        log.info("view %s: listed %d objects at resourceVersion %s", spec.index, len(records), version)
        return version

    def _watch(self, spec: WatchSpec, version: str) -> tuple[str, int]:
        """Apply watch events until the server closes the stream; return the last resourceVersion
        and how many events (bookmarks included) arrived."""
        timeout = random.randint(*self._watch_seconds)
        query = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        response = self._get(spec, "watch", query, timeout + 30.0)
        self._open[spec.index] = response
        ended = False
        try:
            # stop() sets the flag before it interrupts what is in _open: checked after registering,
            # a stop that came while the request was on its way is never missed.
            events = 0
            if self._stop.is_set():
                return version, events
            for line in _lines(response):
                if self._stop.is_set():
                    break
                if line.strip():
                    version = self._apply(spec, json.loads(line), version)
                    events += 1
            else:
                ended = True  # the server closed the stream: the connection is clean
        finally:
            self._open.pop(spec.index, None)
            if not ended:
                # Left mid-stream (stopping, 410, a bad event): what is left unread would be taken
                # for the next answer on this connection, whichever request of the process's one
                # pool gets it. Closed, it is not reused.
                response.close()
            response.release_conn()
        return version, events

    def _apply(self, spec: WatchSpec, event: Mapping[str, Any], version: str) -> str:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            raise ValueError(f"watch {spec.path()}: an event without an object: {str(event)[:200]}")
        self._last_event[spec.index] = self._clock()
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiError(f"watch {spec.path()}", ApiResponse(int(obj.get("code") or 0), obj))
        new_version = str(metadata_of(obj).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return new_version
        if kind == "DELETED":
            if self._unreadable[spec.index].pop(_object_name(obj), None) is not None:
                self.metrics.unreadable.labels(spec.index).set(len(self._unreadable[spec.index]))
            key, record = _key_of(spec, obj), None
        else:
            read = self._read(spec, obj)
            # Changed into something the view cannot read: what it held of it is no longer true.
            key, record = read if read is not None else (_key_of(spec, obj), None)
        if not key:
            return new_version
        self._events_since_freeze += 1
        if self._events_since_freeze >= FREEZE_EVERY:
            self._freeze()
        if kind not in ("ADDED", "MODIFIED"):
            record = None
        before = self._published[spec.index].records.get(key)
        if record is None:  # DELETED, or an object the spec no longer keeps (a finished Pod)
            self._publish(spec.index, lambda old: old.remove(key, spec.group_by, spec.tally))
        else:
            self._publish(spec.index, lambda old: old.put(key, record, spec.group_by, spec.tally))
        if before is not None or record is not None:
            self._tell(spec.index, before, record)
        return new_version

    def _tell(self, index: str, old: Record | None, new: Record | None) -> None:
        if self._listener is None:
            return
        try:
            self._listener(index, old, new)
        except Exception:
            log.exception("view %s: the change listener failed", index)

    def _freeze(self) -> None:
        self._events_since_freeze = 0
        if self._freeze_gc:
            # Young garbage is collected first (cheap: the two young generations only), so it is
            # not frozen with the rest. A full collection here would be the very pause avoided.
            gc.collect(1)
            self._gc_freeze()

    def _publish(self, index: str, change: Callable[[IndexState], IndexState]) -> None:
        # One writer per index, but two indices publish into one top-level mapping: the lock keeps
        # one thread's publish from dropping the other's. Readers never take it (reference reads).
        with self._publish_lock:
            new = change(self._published[index])
            self._published = {**self._published, index: new}
        self.metrics.objects.labels(index).set(len(new.records))


def _key_of(spec: WatchSpec, obj: Mapping[str, Any]) -> str:
    """The object's key in the index, or its uid when the spec's key cannot be read from it."""
    try:
        return spec.key(obj)
    except Exception:  # noqa: BLE001 - what the view may hold of it is under its uid then
        uid = metadata_of(obj).get("uid")
        return uid if isinstance(uid, str) else ""


def _object_name(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name``) of an object, whatever else is wrong with it."""
    metadata = metadata_of(obj)
    name, namespace = metadata.get("name"), metadata.get("namespace")
    name = name if isinstance(name, str) else "(no name)"
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _lines(response: Response) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch stream, as they arrive."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        pending += chunk
        if b"\n" in pending:
            *complete, pending = pending.split(b"\n")
            yield from complete
    if pending:
        yield pending
