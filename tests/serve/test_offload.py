"""Large reviews off the event loop (function/serve/offload.py): the child's answer and the event the
worker records from the slim review are exactly those of an in-process review; served, a large
review is answered while small ones keep being answered."""

from __future__ import annotations

import http.client
import json
import os
import pickle
import threading
import time
from typing import Any

import pytest

from function.admission.review import Admission
from function.audit.metrics import AuditMetrics
from function.audit.recorder import AuditRecorder
from function.config_file import load_config_file
from function.contract import LARGE_BODY_BYTES
from function.core.config import parse_config
from function.core.engine import Engine
from function.serve import offload
from function.serve.http_api import WebhookHttp
from tests.support import REVIEWS
from tests.support.audit import Served
from tests.support.hostile import large_review, with_pod

CONFIG = parse_config({"vgpu": {"enabled": True}})
VOLATILE = ("durationSeconds", "decidedAt")


class Collect:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def submit(self, event: Any) -> None:
        # The recorder queues the wire form (events.build_wire_event); read it back as a CloudEvent.
        self.events.append(event.cloud_event())


def webhook_with(sender: Collect) -> WebhookHttp:
    recorder = AuditRecorder(CONFIG.audit, "sha256:test", AuditMetrics("test"), sender)  # type: ignore[arg-type]
    return WebhookHttp(Admission(Engine(CONFIG), recorder))


def secret_env(pod: dict[str, Any]) -> None:
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": "TOKEN", "value": "2"}]  # the slice count: redacted in the event's patch


@pytest.mark.parametrize(
    "body",
    [
        large_review(LARGE_BODY_BYTES * 2),
        json.dumps(with_pod("default-slice-inference", secret_env)).encode(),
        json.dumps(with_pod("default-vgpu-mem-cores", lambda pod: None)).encode(),
        json.dumps(with_pod("default-dry-run-probe", lambda pod: None)).encode(),
        b'{"kind": "AdmissionReview"}',
    ],
    ids=["large", "redacted-patch", "vgpu", "dry-run", "bad"],
)
def test_the_child_answers_and_the_worker_records_as_in_process(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "_webhook", offload.child_webhook(Engine(CONFIG)))
    here, there = Collect(), Collect()
    expected = webhook_with(here).handle("POST", "/mutate", body)
    outcome = pickle.loads(pickle.dumps(offload.decide("/mutate", body)))  # as it crosses from the child
    status, reply, facts, decision, mark = outcome
    assert mark is None  # no view: the decision read no snapshot
    got = webhook_with(there).recorded(status, reply, facts, decision)
    assert (got.status, got.body) == (expected.status, expected.body)
    assert len(here.events) == len(there.events)
    for ours, theirs in zip(here.events, there.events, strict=True):
        mine, other = ours.get_data(), theirs.get_data()
        for key in VOLATILE:
            mine.pop(key), other.pop(key)
        assert mine == other
        assert {k: v for k, v in ours.get_attributes().items() if k not in ("id", "time")} == {
            k: v for k, v in theirs.get_attributes().items() if k not in ("id", "time")
        }


def outcome(response: dict[str, Any]) -> Any:
    return response.get("auditAnnotations", {}).get("outcome")


def test_a_served_large_review_is_answered_while_small_ones_keep_being_answered(tmp_path: Any) -> None:
    """Three 3 MiB reviews in flight at once, small ones sent one after another meanwhile: every
    large one answered within the apiserver's 5 s, the small ones answered throughout.

    One child decides the large ones in arrival order. Each answer is the decision (mutated) or,
    past LARGE_REVIEW_SECONDS, the refusal saying so (never the Pod admitted unmutated, never the
    apiserver's timeout): which of the two the second and third get depends on the CPU the
    machine leaves the child (on a busy 2-core machine the third was once refused), so only the
    first decided is held to the decision (it has the whole deadline for one decision)."""
    served = Served(tmp_path)

    def ready() -> bool:  # as a Service would: only once the large-review process is up too
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200

    deadline = time.monotonic() + 60
    while not ready():
        assert time.monotonic() < deadline, "not ready within 60 s"
        time.sleep(0.1)
    big = large_review()
    small = (REVIEWS / "default-slice-inference.json").read_bytes()
    results: list[tuple[float, int, dict[str, Any]]] = []
    """(sent at, status, response) of each large review."""

    def post_big() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        started = time.monotonic()
        connection.request("POST", "/mutate", big, {"content-type": "application/json"})
        reply = connection.getresponse()
        body = reply.read()
        results.append(
            (started, reply.status, json.loads(body)["response"] | {"took": time.monotonic() - started})
        )

    try:
        threads = [threading.Thread(target=post_big) for _ in range(3)]
        for thread in threads:
            thread.start()
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        small_answers = 0
        while any(thread.is_alive() for thread in threads):
            connection.request("POST", "/mutate", small, {"content-type": "application/json"})
            reply = connection.getresponse()
            reply.read()
            assert reply.status == 200
            small_answers += 1
        for thread in threads:
            thread.join()

        def events() -> list[Any]:
            return [line for line in served.stdout_lines() if line.get("castslice") == "audit-event"]

        # Events are written by the audit sender thread after the reply: give the last ones time
        # to reach stdout before the server is killed (a count, not a sleep: no slack hides a loss).
        deadline = time.monotonic() + 10
        while len(events()) < 3 + small_answers and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        served.kill()
    assert [status for _, status, _ in results] == [200, 200, 200]
    responses = [response for _, _, response in sorted(results, key=lambda result: result[0])]
    assert all(response["took"] < 5 for response in responses), responses  # the registration's timeout
    for response in responses:
        if outcome(response) != "mutated":  # refused in time, saying why
            message = response["status"]["message"]
            assert response["allowed"] is False and "patch" not in response, response
            assert "large review not decided within" in message and "create the Pod again" in message
    assert any(outcome(response) == "mutated" for response in responses), responses
    assert small_answers >= 5  # the loop kept answering while the large reviews were decided
    assert len(events()) == 3 + small_answers  # the large ones are recorded by the worker too


@pytest.mark.parametrize(
    ("config", "chosen", "offloaded"),
    [
        ("{}", None, True),
        ("podMutations: {enabled: true}", None, True),
        ("podMutations: {enabled: true}", "process", True),
        ("podMutations: {enabled: true}", "event-loop", False),
        ("{}", "event-loop", False),
    ],
)
def test_serve_offloads_large_reviews_unless_told_otherwise(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, config: str, chosen: str | None, offloaded: bool
) -> None:
    """Large reviews go to the child process (which reads the worker's cluster view), with
    PodMutations on too, unless CASTSLICE_LARGE_REVIEWS says otherwise. The choice and the
    configuration reach the app as arguments; the environment is left as it was."""
    import functions_framework._http

    import function.serve.asgi
    from function import cli
    from function.contract import LARGE_REVIEWS_ENV

    class NoServer:
        def run(self, host: str, port: int) -> None:
            return None

    built: list[tuple[str, Any, bool]] = []

    def serving_app(target: str, config: Any = None, *, large_reviews: bool = False) -> Any:
        built.append((target, config, large_reviews))
        return object()

    monkeypatch.setattr(functions_framework._http, "create_server", lambda *a, **k: NoServer())
    monkeypatch.setattr(function.serve.asgi, "serving_app", serving_app)
    import function.serve.app

    # The credentials a mutator that reads the cluster needs are checked before forking.
    monkeypatch.setattr(function.serve.app, "view_client", lambda environ: None)
    if chosen is None:
        monkeypatch.delenv(LARGE_REVIEWS_ENV, raising=False)
    else:
        monkeypatch.setenv(LARGE_REVIEWS_ENV, chosen)
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    path = tmp_path / "config.yaml"
    path.write_text(config)
    assert cli.main(["serve", "--config", str(path), "--port", "0"]) == 0
    [(target, given, large_reviews)] = built
    assert (target, large_reviews) == ("mutate", offloaded)
    assert given == load_config_file(path)  # the configuration itself, not a path in the environment
    assert os.environ.get(LARGE_REVIEWS_ENV) == chosen and "CASTSLICE_CONFIG" not in os.environ


# -- the large-review process reads the worker's cluster view ------------------------------------
def routed_large_review(route: str) -> bytes:
    """A large review of a ReplicaSet's Pod (its siblings are in tests/support/hostile.py's view) routed to
    one of the PodMutations there."""
    from tests.support.hostile import ROUTE_LABEL

    review = json.loads(large_review(LARGE_BODY_BYTES * 2, base="default-inference-fleet-64d4bcc9b8"))
    review["request"]["object"]["metadata"]["labels"][ROUTE_LABEL] = route
    return json.dumps(review).encode()


def test_a_large_review_is_decided_over_the_workers_view_as_on_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped configuration (PodMutations on, here with spot): the child decides a large Pod
    over the worker's snapshot (PodMutations, siblings, the ledger), exactly as the worker would;
    an index the child has read is not sent again while it is the same object."""
    from tests.support.fuzz import CONFIGS
    from tests.support.hostile import podmutation_view

    config = CONFIGS["podmutations-spot"]
    view = podmutation_view(castai=True)
    questions: list[tuple[str, tuple[Any, ...]]] = []
    answer = offload.ViewServer.answer

    def counted(self: offload.ViewServer, snapshot: Any, question: str, *args: Any) -> Any:
        questions.append((question, args))
        return answer(self, snapshot, question, *args)

    monkeypatch.setattr(offload.ViewServer, "answer", counted)
    here = WebhookHttp(Admission(Engine(config), cluster=lambda: view))
    there = offload.LargeReviews(config, cluster=lambda: view)
    try:
        for route in ("pm01", "pm06", "pm11", "unrouted"):  # affinity, a share, CAST AI's, none
            body = routed_large_review(route)
            expected = here.handle("POST", "/mutate", body)
            status, reply, _facts, decision, mark = there.submit("/mutate", body).result(timeout=120)
            assert mark is not None  # the snapshot read was marked
            assert (status, json.loads(reply)) == (expected.status, json.loads(expected.body)), route
            assert decision is not None and decision.outcome == "mutated", decision
            if route != "unrouted":
                mutators = json.loads(reply)["response"]["auditAnnotations"]["mutators"]
                assert "pod-mutations" in mutators.split(","), route  # the view was read
    finally:
        there.close()
    whole = [args for question, args in questions if question == "index"]
    assert whole.count(("podmutations",)) == 1, questions  # read once, kept while unchanged


def test_an_offloaded_decision_feeds_the_workers_ledger() -> None:
    """What the worker's ledgers read of an admitted Pod comes back from the child (its metadata),
    not the whole Pod: a large Pod's placement joins the ledger as a small one's does."""
    from function.serve.spot_ledger import DecisionLedger
    from tests.support.fuzz import CONFIGS
    from tests.support.hostile import podmutation_view

    view = podmutation_view(castai=True)
    there = offload.LargeReviews(CONFIGS["podmutations-spot"], cluster=lambda: view)
    try:
        outcome = there.submit("/mutate", routed_large_review("pm06")).result(timeout=120)
        decision = outcome[3]
    finally:
        there.close()
    assert decision is not None and set(decision.mutated_pod) == {"metadata"}
    ledger = DecisionLedger()
    assert ledger.observe_admitted(decision.mutated_pod)


# -- a large review's decision, checked when it is recorded ----------------------------------------
class Written:
    """A ledger that says, for each check in turn, whether its key was written since the mark."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    def written_since(self, pod: Any, mark: int) -> bool:
        self.asked.append(mark)
        return self.answers.pop(0)


class Scripted(offload.LargeReviews):
    """LargeReviews whose child is a script: each submit gets the next prepared outcome (a future
    never resolved for None)."""

    def __init__(
        self, outcomes: list[offload.Outcome | None], ledgers: tuple[Any, ...], seconds: float
    ) -> None:
        super().__init__(CONFIG, None, ledgers, seconds)
        self.outcomes = outcomes
        self.submitted = 0

    def submit(self, path: str, body: bytes) -> Any:
        from concurrent.futures import Future

        self.submitted += 1
        future: Future[offload.Outcome] = Future()
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            future.set_result(outcome)
        return future


def decided_in_child(body: bytes, mark: int | None) -> offload.Outcome:
    here = Collect()
    webhook = webhook_with(here)
    captured = offload._Captured()
    webhook.admission.recorder = captured
    reply = webhook.handle("POST", "/mutate", body)
    assert captured.last is not None
    return reply.status, reply.body, *captured.last, mark


def test_a_large_decision_whose_ledger_key_was_written_meanwhile_is_decided_again() -> None:
    """Recorded as if it had held a decision turn: a decision over a snapshot older than a write
    under its own key (its lease, its owner) may not have counted that entry, so the child decides
    the review again, and only a decision no write came after is recorded."""
    import asyncio

    body = (REVIEWS / "default-slice-inference.json").read_bytes()
    written = Written(True, False)
    there = Collect()
    scripted = Scripted([decided_in_child(body, 7), decided_in_child(body, 9)], (written,), 30)
    reply = asyncio.run(scripted.answer(webhook_with(there), "/mutate", body))
    assert scripted.submitted == 2 and written.asked == [7, 9]
    assert reply.status == 200 and json.loads(reply.body)["response"]["patch"]
    assert [event.get_data()["outcome"] for event in there.events] == ["mutated"]  # recorded once


def test_a_large_decision_that_writes_no_ledger_entry_is_not_checked() -> None:
    """A dry run (or any decision that is no mutation sent) charges nothing: nothing to check."""
    import asyncio

    body = (REVIEWS / "default-dry-run-probe.json").read_bytes()
    written = Written()
    scripted = Scripted([decided_in_child(body, 7)], (written,), 30)
    reply = asyncio.run(scripted.answer(webhook_with(Collect()), "/mutate", body))
    assert reply.status == 200 and scripted.submitted == 1 and written.asked == []


@pytest.mark.parametrize("on_internal_error", ["admit", "deny"])
def test_a_large_review_not_decided_in_time_is_refused_saying_why(on_internal_error: str) -> None:
    """Before the apiserver's timeout, whatever the child is doing, and whatever onInternalError
    says: refused with the reason and what to do, recorded as an error, never admitted past every
    policy by failurePolicy."""
    import asyncio

    config = parse_config({"onInternalError": on_internal_error})
    body = (REVIEWS / "default-slice-inference.json").read_bytes()
    there = Collect()
    recorder = AuditRecorder(config.audit, "sha256:test", AuditMetrics("test"), there)  # type: ignore[arg-type]
    webhook = WebhookHttp(Admission(Engine(config), recorder))
    scripted = Scripted([None], (), 0.3)
    started = time.monotonic()
    reply = asyncio.run(scripted.answer(webhook, "/mutate", body))
    assert time.monotonic() - started < 3
    response = json.loads(reply.body)["response"]
    assert reply.status == 200 and response["allowed"] is False and "patch" not in response
    message = response["status"]["message"]
    assert "not decided within 0.3 s" in message and "create the Pod again" in message
    assert [event.get_data()["outcome"] for event in there.events] == ["error"]


def test_the_ledgers_know_which_keys_were_written_after_a_mark_even_once_the_entry_left() -> None:
    from function.core.mutators.gpu_leases import LedgerCharge
    from function.serve.lease_ledger import LeaseLedger
    from function.serve.ledger import ledger_mark
    from function.serve.spot_ledger import DecisionLedger

    def charged(lease: str) -> dict[str, Any]:
        from function.core.leases import CHARGE_ANNOTATION, DECISION_ANNOTATION, LEASE_LABEL

        annotations = {DECISION_ANNOTATION: f"uid-{lease}", CHARGE_ANNOTATION: "1"}
        return {"metadata": {"namespace": "ml", "labels": {LEASE_LABEL: lease}, "annotations": annotations}}

    leases = LeaseLedger()
    before = ledger_mark()
    leases.add("ml/a100", LedgerCharge("uid-a100", 1, "charged"))  # type: ignore[arg-type]
    after = ledger_mark()
    assert leases.written_since(charged("a100"), before)
    assert not leases.written_since(charged("a100"), after)
    assert not leases.written_since(charged("h100"), before)  # another lease: no conflict
    leases.forget("uid-a100")  # the view shows the Pod now; the write still came after the mark
    assert leases.written_since(charged("a100"), before)
    assert not leases.written_since({"metadata": {}}, before)  # charges nothing: nothing to check

    owners = DecisionLedger()
    mark = ledger_mark()
    pod = {"metadata": {"ownerReferences": [{"controller": True, "uid": "rs-1", "kind": "ReplicaSet"}]}}
    assert not owners.written_since(pod, mark)
    owners.record_decision("rs-1", "decision-1", "spot")
    assert owners.written_since(pod, mark)
