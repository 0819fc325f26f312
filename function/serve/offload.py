"""Large reviews decided in a separate process, so they never stall the event loop.

Every review runs on the worker's one event loop. A legal 3 MiB Pod made of many small objects
takes the engine a large fraction of a second, and a worker *thread* does not help: parsing,
copying, comparing and serializing such a Pod are single C calls (orjson, marshal, ==) that hold
the GIL until they return, so a small review or /healthz arriving meanwhile waits for each of them.
A process has its own GIL: the event loop keeps answering small reviews while the large one is
decided beside it (``python tests/benchmarks/webhook.py --large`` measures it; docs/serving.md has
the figures).

``LargeReviews`` keeps one child process (spawned, so it shares no threads or loop state with the
worker) that answers with the very handler the worker uses (``WebhookHttp.handle``: one decision
path), and sends back the reply bytes, the decision and the request's audit facts
(function/admission/facts.py); the worker records them (metrics, audit event, ledgers) exactly as
for a small review. One child, one review at a time, in arrival order: more would only share the
same cores. The child runs at the worker's own priority: at a lower one, any busy process on the
machine took its CPU, and a large review waited past the apiserver's timeout.

The child decides over the worker's cluster view (``RemoteView``): the worker takes the review's
snapshot when the child starts it, and answers the child's reads of it (the compiled
PodMutations, one owner's sibling group, a ReplicaSet, the ledgers) over a pipe, from a thread.
What a decision reads is small, so the worker's share of a large review stays a few small
pickles, and the child sees exactly what the review would have seen on the event loop. An index
the child has read is kept while the worker's snapshot holds the very same index object (the view
replaces an index when it changes), so the PodMutations are not sent again for every review.

Decision turns (function/serve/ledger.py ``DecisionTurns``) make one process's decisions
happen one at a time from snapshot to record, so a lease is never over-charged by one process. A
turn held across the child's decision would stop the event loop's own reviews; instead a large
review's decision is checked when it is recorded, on the event loop: the snapshot carries a mark
(``ledger_mark``), and if a ledger was written since under the key its own charge or placement
goes to (its lease, its owner), the decision may not have counted that entry, and the child
decides the review again over a fresh snapshot. So a large review is recorded as if it had held
a turn. A review not decided within LARGE_REVIEW_SECONDS of its arrival (the queue, a slow
machine, a ledger that kept changing) is refused, saying why and to create the Pod again
(``WebhookHttp.undecided``), before the apiserver's timeout, not left to its failurePolicy.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime
from itertools import count
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

from function.admission.facts import AuditFacts
from function.admission.review import Admission
from function.contract import LARGE_REVIEW_SECONDS
from function.core.config import Config
from function.core.engine import Decision, Engine
from function.core.view import EMPTY_VIEW, ClusterView
from function.serve.ledger import ledger_mark

if TYPE_CHECKING:
    from function.serve.http_api import HttpReply, WebhookHttp

log = logging.getLogger("castslice.offload")

Outcome = tuple[int, bytes, AuditFacts | None, Decision | None, int | None]
"""HTTP status, reply body, the audit facts to record (None for a 400), the decision, and the
mark of the snapshot it was decided over (None: it read none)."""


# -- in the child ---------------------------------------------------------------------------------
class _Captured:
    """The child's recorder: the worker records, so the child only keeps what it would record."""

    def __init__(self) -> None:
        self.last: tuple[AuditFacts, Decision | None] | None = None

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        self.last = (facts, decision)


_webhook: WebhookHttp | None = None
_captured = _Captured()
_view_pipe: Connection | None = None
"""In the child: the pipe to the worker's view server (None: the worker has no view)."""
_review_token = 0
"""In the child: the review being decided, as the worker numbered it."""
_review_mark: int | None = None
"""In the child: the mark of the snapshot the review being decided reads (None: none yet)."""
_indices: dict[str, tuple[int, RemoteIndex]] = {}
"""In the child: each index read, with the worker's number for the index object it came from."""


def child_webhook(engine: Engine) -> WebhookHttp:
    """The handler the child answers with: the worker's own (WebhookHttp), over the worker's view,
    its decisions kept for the worker to record."""
    from function.serve.http_api import WebhookHttp

    return WebhookHttp(Admission(engine, _captured, cluster=_current_view))


class ViewGone(RuntimeError):
    """The worker did not answer a read of its view."""


def _ask(*question: Any) -> Any:
    if _view_pipe is None:
        raise ViewGone("no view")
    _view_pipe.send((_review_token, *question))
    kind, answer = _view_pipe.recv()
    if kind == "error":
        raise ViewGone(answer)
    return answer


_MISSING = object()


class RemoteIndex(Mapping[str, Any]):
    """One index of the worker's snapshot, read key by key (``get``, ``in``: one record) or
    whole (iteration: the PodMutations), and remembered."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._records: dict[str, Any] = {}
        self._absent: set[str] = set()
        self._whole = False

    def __getitem__(self, key: str) -> Any:
        found = self._records.get(key, _MISSING)
        if found is _MISSING:
            if self._whole or key in self._absent:
                raise KeyError(key)
            found = _ask("get", self.name, key)
            if found is _MISSING or found is None:
                self._absent.add(key)
                raise KeyError(key)
            self._records[key] = found
        return found

    def _all(self) -> dict[str, Any]:
        if not self._whole:
            self._records = _ask("index", self.name)
            self._whole = True
        return self._records

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class RemoteView:
    """The ClusterView of one large review: the worker's snapshot, read through the pipe."""

    def __init__(self, available: bool, now: datetime | None) -> None:
        self._available = available
        self._now = now
        self._groups: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._synced: dict[str, bool] = {}

    @property
    def available(self) -> bool:
        return self._available

    def index(self, name: str) -> Mapping[str, Any]:
        number = _ask("number", name)
        known = _indices.get(name)
        if known is not None and known[0] == number:
            return known[1]  # the same index object in the worker: what was read of it holds
        fresh = RemoteIndex(name)
        _indices[name] = (number, fresh)
        return fresh

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        found = self._groups.get((name, key))
        if found is None:
            found = self._groups[(name, key)] = _ask("group", name, key)
        return found

    def synced(self, name: str) -> bool:
        found = self._synced.get(name)
        if found is None:
            found = self._synced[name] = bool(_ask("synced", name))
        return found

    def tally(self, name: str, key: str) -> tuple[int, ...]:
        answer: tuple[int, ...] = _ask("tally", name, key)
        return answer

    @property
    def now(self) -> datetime | None:
        return self._now


def _current_view() -> ClusterView:
    global _review_mark
    if _view_pipe is None:
        return EMPTY_VIEW
    available, now, mark = _ask("begin")
    _review_mark = mark
    if available is None:
        return EMPTY_VIEW  # the worker has no snapshot for this review
    return RemoteView(available, now)


def _start_child(config: Config, view_pipe: Connection | None = None) -> None:
    # In the child: the engine from the worker's configuration (passed, pickled), without a
    # recorder: the worker records.
    global _webhook, _view_pipe
    from function.logs import configure_logging

    configure_logging()
    _view_pipe = view_pipe
    _webhook = child_webhook(Engine(config))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    # The worker dies by a re-raised SIGTERM (see function/audit/shutdown.py), so nothing shuts
    # the pool down: the child notices it was orphaned (re-parented) and ends itself.
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _ready() -> bool:
    """In the child: nothing; submitted at start so that the child is spawned then."""
    return _webhook is not None


def _slim(pod: Any) -> Any:
    """What the worker's ledgers read of an admitted Pod (function/serve/spot_ledger.py,
    lease_ledger.py): its metadata's owners, labels, annotations and namespace; not the whole
    Pod, which would cost the worker as much to unpickle as the review cost to parse."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(metadata, dict):
        return None
    kept = ("namespace", "ownerReferences", "labels", "annotations")
    return {"metadata": {key: metadata[key] for key in kept if key in metadata}}


def decide(path: str, body: bytes, token: int = 0) -> Outcome:
    """In the child: the worker's handler's answer to one review (``WebhookHttp.handle``), with
    what it would record; ``token`` names the worker's snapshot for this review."""
    global _review_token, _review_mark
    assert _webhook is not None, "child not started"
    _review_token, _review_mark = token, None
    _captured.last = None
    reply = _webhook.handle("POST", path, body)
    facts, decision = _captured.last if _captured.last is not None else (None, None)
    _captured.last = None
    if decision is not None:
        decision = replace(decision, mutated_pod=_slim(decision.mutated_pod))
    return reply.status, reply.body, facts, decision, _review_mark


# -- in the worker --------------------------------------------------------------------------------
class Ledgers(Protocol):
    """What a ledger tells a large review's check (function/serve/ledger.py)."""

    def written_since(self, pod: Mapping[str, Any] | None, mark: int) -> bool: ...


class LargeReviews:
    """One child process deciding large reviews with ``config``'s engine, spawned on the first
    large review, in the serving process: building a webhook starts no process. ``cluster``
    gives a review's snapshot (as Admission's ``cluster``, without decision turns); the child
    reads it through ``ViewServer``. ``ledgers``: the worker's ledgers, checked when a large
    review's decision is recorded (see the module's doc)."""

    def __init__(
        self,
        config: Config,
        cluster: Callable[[], ClusterView] | None = None,
        ledgers: tuple[Ledgers, ...] = (),
        seconds: float = LARGE_REVIEW_SECONDS,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.ledgers = ledgers
        self.seconds = seconds
        self.pool: ProcessPoolExecutor | None = None
        self._closed = False
        self.views: ViewServer | None = None
        self._lock = threading.Lock()
        self._starting: Future[bool] | None = None

    async def answer(self, webhook: WebhookHttp, path: str, body: bytes) -> HttpReply:
        """The reply to one large review, decided in the child and recorded by ``webhook`` (the
        worker's handler); decided again while a ledger was written under its key since its
        snapshot; undecided (``WebhookHttp.undecided``) once LARGE_REVIEW_SECONDS have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        attempts = 0
        while True:
            attempts += 1
            future = self.submit(path, body)
            try:
                left = max(0.0, deadline - loop.time())
                outcome = await asyncio.wait_for(asyncio.wrap_future(future), left)
            except TimeoutError:
                future.cancel()  # still queued: never decided (a running one cannot be stopped)
                return webhook.undecided(body, f"large review not decided within {self.seconds:g} s")
            status, reply, facts, decision, mark = outcome
            # From here to the record nothing awaits: no other review is decided in between.
            if not self._stale(facts, decision, mark):
                return webhook.recorded(status, reply, facts, decision)
            log.info("large review decided again: a ledger was written under its key meanwhile")
            if loop.time() >= deadline:
                why = f"large review not decided within {self.seconds:g} s ({attempts} attempts)"
                return webhook.undecided(body, why)

    def _stale(self, facts: AuditFacts | None, decision: Decision | None, mark: int | None) -> bool:
        """Whether the decision would write a ledger entry (a mutation that reached the
        apiserver) under a key written since its snapshot's ``mark``."""
        if mark is None or decision is None or facts is None or facts.dry_run:
            return False
        if decision.outcome != "mutated":
            return False
        return any(ledger.written_since(decision.mutated_pod, mark) for ledger in self.ledgers)

    def submit(self, path: str, body: bytes) -> Future[Outcome]:
        pool = self._started()
        if self.views is None or self.cluster is None:
            return pool.submit(decide, path, body)
        views = self.views
        token = views.hold(self.cluster)
        try:
            future = pool.submit(decide, path, body, token)
        except BaseException:  # a broken pool: the review is decided in-process, the snapshot let go
            views.release(token)
            raise
        future.add_done_callback(lambda _: views.release(token))
        return future

    def start(self) -> Future[bool]:
        """Spawn the child now (the serving process calls this when it starts serving; ``ready``
        says when the child is up), so the first large review does not wait for a Python process
        to start and import the engine."""
        self._starting = self._started().submit(_ready)
        return self._starting

    def ready(self) -> bool:
        """False while the child started by ``start`` is still starting."""
        return self._starting is None or self._starting.done()

    def _started(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:  # as a shut-down pool answers: no child started while stopping
                raise RuntimeError("the large-review process is stopped")
            if self.pool is None:
                child_end: Connection | None = None
                if self.cluster is not None:
                    worker_end, child_end = multiprocessing.get_context("spawn").Pipe()
                    self.views = ViewServer(worker_end)
                self.pool = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_child,
                    initargs=(self.config, child_end),
                )
            return self.pool

    def close(self) -> None:
        """The child ended now, whatever it is doing (it holds nothing to save: the worker records):
        a process exiting waits for its pool's children, and one still starting would hold it."""
        with self._lock:
            self._closed = True
        if self.pool is not None:
            children = list(getattr(self.pool, "_processes", None) or {})
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # Its child gone, the pool's manager thread ends at once and is joined here, and the pool
            # let go: its queues' semaphores are released now. The worker exits without atexit hooks,
            # and the resource tracker would otherwise report them as leaked at every stop.
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
            gc.collect()
        if self.views is not None:
            self.views.close()


class ViewServer:
    """In the worker: answers the child's reads of the snapshots of the reviews it decides, on a
    thread of its own (each answer is a dict lookup and a small pickle). A review's snapshot is
    taken when the child begins it, after a ledger mark."""

    def __init__(self, pipe: Connection) -> None:
        self.pipe = pipe
        self._sources: dict[int, Callable[[], ClusterView]] = {}
        self._snapshots: dict[int, ClusterView] = {}
        self._numbers = count(1)
        self._index_numbers: dict[str, tuple[object, int]] = {}
        """Each index last numbered, held (so no other object takes its place) with its number."""
        threading.Thread(target=self._serve, name="castslice-large-review-view", daemon=True).start()

    def hold(self, source: Callable[[], ClusterView]) -> int:
        token = next(self._numbers)
        self._sources[token] = source
        return token

    def release(self, token: int) -> None:
        self._sources.pop(token, None)
        self._snapshots.pop(token, None)

    def close(self) -> None:
        self.pipe.close()

    def _serve(self) -> None:
        while True:
            try:
                token, question, *args = self.pipe.recv()
            except (EOFError, OSError):
                return  # the child (or the worker's pool) is gone
            try:
                if question == "begin":
                    answer: tuple[str, Any] = ("ok", self.begin(token))
                else:
                    answer = ("ok", self.answer(self._snapshots.get(token), question, *args))
            except Exception as error:  # the child raises it as ViewGone: an internal error, logged
                log.exception("answering the large-review process's %s read", question)
                answer = ("error", f"{question}: {error!r}")
            try:
                self.pipe.send(answer)
            except (OSError, ValueError):
                return

    def begin(self, token: int) -> tuple[bool | None, datetime | None, int | None]:
        """(available, the snapshot's time, its ledger mark) of the snapshot taken now for review
        ``token``; (None, None, None) when it has none."""
        source = self._sources.get(token)
        if source is None:
            return None, None, None
        mark = ledger_mark()  # before the snapshot: a write it misses is numbered after the mark
        view = self._snapshots[token] = source()
        return view.available, view.now, mark

    def answer(self, view: ClusterView | None, question: str, *args: Any) -> Any:
        if view is None:
            raise LookupError("no snapshot for this review")
        if question == "number":
            (name,) = args
            index = view.index(name)
            known = self._index_numbers.get(name)
            if known is None or known[0] is not index:
                known = self._index_numbers[name] = (index, next(self._numbers))
            return known[1]
        if question == "get":
            name, key = args
            return view.index(name).get(key)
        if question == "index":
            (name,) = args
            return dict(view.index(name))
        if question == "group":
            name, key = args
            return dict(view.group(name, key))
        if question == "synced":
            (name,) = args
            return view.synced(name)
        if question == "tally":
            name, key = args
            return view.tally(name, key)
        raise LookupError(f"unknown question {question!r}")
