"""Large reviews decided in a separate process, so they never stall the event loop.

Every review runs on the worker's one event loop. A legal 3 MiB Pod made of many small objects
takes the engine 0.1-1 s, and a worker *thread* does not help: parsing, copying, comparing and
serializing such a Pod are single C calls (orjson, marshal, ==) that hold the GIL for 5-30 ms
each, so a small review or /healthz arriving meanwhile waits that long (measured: p99 46 ms with
six 3 MiB reviews in flight on a thread, against a 5 ms target). A process has its own GIL: the
event loop keeps answering small reviews while the large one is decided beside it.

``LargeReviews`` keeps one child process (spawned, so it shares no threads or loop state with the
worker) that parses and decides; it sends back the reply bytes, the decision and the request's
audit facts (function/admission/facts.py), and the worker records them (metrics, audit event)
exactly as for a small review. One child, one review at a time, in arrival order: more would
only share the same core.

Limitation: the child has no cluster view (function/core/view.py); a plug-in that reads cluster
state sees an empty one for a review larger than LARGE_BODY_BYTES.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace

import orjson

from function.admission.facts import AuditFacts
from function.admission.review import Admission
from function.admission.wire import BadReview, parse_review
from function.core.config import Config
from function.core.engine import Decision
from function.serve.http_api import problem

log = logging.getLogger("castslice.offload")

Outcome = tuple[int, bytes, AuditFacts | None, Decision | None]
"""HTTP status, reply body, the audit facts to record (None for a 400), the decision."""

_admission: Admission | None = None

CHILD_NICENESS = 10
"""CFS gives a nice-10 process about a tenth of the weight of the nice-0 worker beside it."""


def _start_child(config: Config) -> None:
    # In the child: the engine from the worker's configuration (passed, pickled), without a
    # recorder: the worker records.
    global _admission
    from function.core.engine import Engine
    from function.serve.app import configure_logging

    configure_logging()
    # Lower priority than the worker: on a shared core the scheduler then runs the worker (small
    # reviews, /healthz) as soon as it has work; the child still gets every cycle the worker leaves.
    os.nice(CHILD_NICENESS)
    _admission = Admission(Engine(config))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    # The worker dies by a re-raised SIGTERM (see function/audit/shutdown.py), so nothing shuts
    # the pool down: the child notices it was orphaned (re-parented) and ends itself.
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def decide(body: bytes) -> Outcome:
    """In the child: the reply to one body, as WebhookHttp.mutate would build it."""
    assert _admission is not None, "child not started"
    try:
        review = parse_review(body)
    except BadReview as bad:
        log.warning("bad admission request: %s", bad)
        return 400, problem(400, str(bad)).body, None, None
    answer = _admission.review(review)
    reply = orjson.dumps(answer.review(review.apiVersion))
    decision = answer.decision
    if decision is not None:
        decision = replace(decision, mutated_pod=None)  # the whole Pod: not needed, not sent back
    return 200, reply, answer.facts, decision


class LargeReviews:
    """One child process deciding large reviews with ``config``'s engine, spawned on the first
    large review, in the serving process: building a webhook starts no process."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, body: bytes) -> Future[Outcome]:
        return self._started().submit(decide, body)

    def _started(self) -> ProcessPoolExecutor:
        with self._lock:
            if self.pool is None:
                self.pool = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_child,
                    initargs=(self.config,),
                )
            return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
