"""Acceptance: recorded AdmissionReviews through the real functions-framework app, events to the
reference consumer served on loopback by `castslice serve --target audit`, found in SQLite; and
the faults (sink answering 500, refusing, hanging), and SIGTERM draining a real `castslice serve`.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from function.admission.review import Admission
from function.admission.wire import parse_review
from function.audit.consumer import event_problems
from function.config_file import load_config_file
from function.core.config import Config
from function.core.engine import Engine
from tests.support import asgi_client, load_review, review_names, served_webhook
from tests.support.audit import (
    HangingSink,
    RecordingSink,
    Served,
    parse_lines,
    refused_url,
    served_consumer,
    wait_for,
)

SECRET = "s3cr3t-do-not-leak"
DRY_RUN = "default-dry-run-probe"
REVIEWS = {name: load_review(name) for name in review_names()}
DECIDED = {name: REVIEWS[name]["request"]["uid"] for name in REVIEWS if name != DRY_RUN}
"""Review name -> request uid, for every review that must produce exactly one event."""


def expected_decisions() -> dict[str, Any]:
    """Request uid -> the engine's decision, computed here independently of the served app."""
    admission = Admission(Engine(Config()))
    decisions = {}
    for name in DECIDED:
        decision = admission.review(parse_review(json.dumps(REVIEWS[name]).encode())).decision
        decisions[REVIEWS[name]["request"]["uid"]] = decision
    return decisions


def reply_patch(reply: dict[str, Any]) -> list[Any]:
    encoded = reply["response"].get("patch")
    return json.loads(base64.b64decode(encoded)) if encoded else []


def write_config(tmp_path: Path, **audit: Any) -> Path:
    path = tmp_path / "castslice.yaml"
    path.write_text(yaml.safe_dump({"audit": audit}))
    return path


def served_recorder(client: Any) -> Any:
    return served_webhook(client).admission.recorder


def stored_rows(db: Path) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as connection:
        connection.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in connection.execute("SELECT * FROM events")]
        except sqlite3.OperationalError:  # the consumer has not created its tables yet
            return []


@pytest.fixture
def consumer(tmp_path: Path) -> Iterator[Served]:
    with served_consumer(tmp_path) as served:
        yield served


def test_every_decision_reaches_the_consumer_once_with_its_exact_patch_and_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, consumer: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, initialBackoffSeconds=0.01, maxBackoffSeconds=0.05)
    client = asgi_client(monkeypatch, config, K_SINK=consumer.url)
    replies = {}
    for review in REVIEWS.values():
        answer = client.post("/mutate?timeout=10s", json=review)
        assert answer.status_code == 200
        replies[review["request"]["uid"]] = answer.json()

    db = tmp_path / "audit.sqlite3"
    wait_for(lambda: len(stored_rows(db)) >= len(DECIDED), 15, what="every event in SQLite")
    assert served_recorder(client).close(5) == 0
    rows = stored_rows(db)

    per_uid = Counter(row["request_uid"] for row in rows)
    assert per_uid == Counter(DECIDED.values()), "exactly one event per decision"
    assert REVIEWS[DRY_RUN]["request"]["uid"] not in per_uid, "a dry run produces no event"

    expected = expected_decisions()
    for row in rows:
        event = json.loads(row["event"])
        data = event["data"]
        uid = data["request"]["uid"]
        assert event_problems(event) == [], uid
        assert data["patch"] == reply_patch(replies[uid]), uid
        assert data["reason"] == expected[uid].reason, uid
        assert data["outcome"] == expected[uid].outcome == row["outcome"], uid
        assert data["mutators"] == [d.as_dict() for d in expected[uid].decisions], uid
        assert data["allowed"] == replies[uid]["response"]["allowed"], uid
        assert data["warnings"] == replies[uid]["response"].get("warnings", []), uid
        assert data["configDigest"] == load_config_file(config).digest()
    outcomes = Counter(row["outcome"] for row in rows)
    assert outcomes["mutated"] > 0 and outcomes["unchanged"] > 0 and outcomes["denied"] > 0

    with sqlite3.connect(db) as connection:
        dump = "\n".join(connection.iterdump())
    assert SECRET not in dump, "the secret env value never reaches the store"
    assert capsys.readouterr().out == "", "every event was delivered: nothing spilled to stdout"


def expected_replies() -> dict[str, Any]:
    admission = Admission(Engine(Config()))  # no recorder: the answers must not depend on the sink
    return {
        review["request"]["uid"]: admission.review(parse_review(json.dumps(review).encode())).review(
            review["apiVersion"]
        )
        for review in REVIEWS.values()
    }


@pytest.mark.parametrize("fault", ["answers 500", "refuses connections", "hangs"])
def test_a_failing_sink_changes_no_answer_loses_no_event_and_keeps_the_queue_bounded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    server: Any = None
    if fault == "answers 500":
        server = RecordingSink([500])
        url = server.url
    elif fault == "hangs":
        server = HangingSink()
        url = server.url
    else:
        url = refused_url()
    queue_size = 4
    config = write_config(
        tmp_path,
        queueSize=queue_size,
        maxAttempts=2,
        initialBackoffSeconds=0.01,
        maxBackoffSeconds=0.02,
        # A hung attempt ends at requestTimeoutSeconds: an answer that waited for the sink would
        # take that long, one that did not is answered in milliseconds. Seconds apart, so the machine's
        # load cannot blur the two (0.3 s against a 0.25 s bound did, at load 15).
        requestTimeoutSeconds=5.0,
        drainSeconds=0.5,
    )
    try:
        client = asgi_client(monkeypatch, config, K_SINK=url)
        recorder = served_recorder(client)
        expected = expected_replies()
        slowest = 0.0
        for review in REVIEWS.values():
            started = time.perf_counter()
            answer = client.post("/mutate", json=review)
            slowest = max(slowest, time.perf_counter() - started)
            assert answer.status_code == 200
            assert answer.json() == expected[review["request"]["uid"]], (
                "the answer does not depend on the sink"
            )
            assert recorder.sender.depth() <= queue_size
        assert slowest < 2.5, f"an answer waited for the sink ({slowest:.3f}s)"
        started = time.monotonic()
        recorder.close()
        # The drain bound, not the hung attempt's timeout, ends the close (plus stdout's flush).
        assert time.monotonic() - started < 0.5 + 0.5, "the drain is bounded"
    finally:
        if server is not None:
            server.close()

    lines = parse_lines(capsys.readouterr().out)
    assert all(line["castslice"] == "audit-event" and line["delivered"] is False for line in lines)
    spilled_uids = {line["event"]["data"]["request"]["uid"] for line in lines}
    assert spilled_uids == set(DECIDED.values()), "every event is on stdout (none was acknowledged)"
    ids = [line["event"]["id"] for line in lines]
    assert len(set(ids)) == len(DECIDED), "one event id per decision"
    reasons = Counter(line["reason"] for line in lines)
    assert set(reasons) <= {"queue full", "retries exhausted", "shutdown"}
    if fault == "hangs":
        assert reasons["queue full"] > 0, "a hanging sink fills the queue: the rest goes to stdout at once"
    found = recorder.metrics.registry.get_sample_value
    assert found("castslice_audit_events_emitted_total") == len(DECIDED)
    assert found("castslice_audit_events_delivered_total", {"sink": "knative"}) == 0
    spilled = sum(
        found("castslice_audit_events_spilled_total", {"reason": reason}) or 0
        for reason in ("queue_full", "rejected", "retries_exhausted", "shutdown")
    )
    assert spilled == len(lines) == len(DECIDED)
    if fault == "answers 500":
        assert set(server.ids()) <= set(ids)


def post_all(url: str) -> float:
    """Post every recorded review; the slowest answer's time."""
    slowest = 0.0
    with httpx.Client(base_url=url, timeout=10) as client:
        for review in REVIEWS.values():
            started = time.perf_counter()
            answer = client.post("/mutate", json=review)
            slowest = max(slowest, time.perf_counter() - started)
            assert answer.status_code == 200
    return slowest


def test_served_webhook_delivers_to_the_served_consumer(tmp_path: Path, consumer: Served) -> None:
    # The real process layout: app built in gunicorn's master, sender started in the forked worker.
    webhook = Served(tmp_path, "mutate", env={"K_SINK": consumer.url})
    try:
        post_all(webhook.url)
        db = tmp_path / "audit.sqlite3"
        wait_for(lambda: len(stored_rows(db)) == len(DECIDED), 15, what="every event in SQLite")
        metrics = httpx.get(webhook.url + "/metrics").text
        assert f'castslice_audit_events_delivered_total{{sink="knative"}} {float(len(DECIDED))}' in metrics
        assert webhook.terminate() < 5
        assert webhook.stdout_lines() == [], "all delivered: nothing on stdout"
    finally:
        webhook.kill()


def test_sigterm_drains_within_the_bound_and_leaves_the_rest_on_stdout(tmp_path: Path) -> None:
    drain_seconds = 1.0
    with_hanging = HangingSink()
    webhook = Served(
        tmp_path,
        "mutate",
        env={"K_SINK": with_hanging.url},
        # An attempt hangs longer than the drain bound: only the bound can end the drain.
        config={"audit": {"drainSeconds": drain_seconds, "requestTimeoutSeconds": 30}},
    )
    try:
        slowest = post_all(webhook.url)
        # The sink never answers and an attempt waits 30 s for it: an answer that waited would take
        # that long. 10 s keeps the two apart on a loaded machine (0.5 s did not, at load 15).
        assert slowest < 10, f"an answer waited for the hanging sink ({slowest:.3f}s)"
        wait_for(lambda: with_hanging.accepted >= 1, 5, what="the sender to reach the sink")
        took = webhook.terminate()
        assert drain_seconds - 0.1 <= took < drain_seconds + 4, f"SIGTERM to exit took {took:.2f}s"
        lines = webhook.stdout_lines()
        assert {line["event"]["data"]["request"]["uid"] for line in lines} == set(DECIDED.values())
        assert len({line["event"]["id"] for line in lines}) == len(lines) == len(DECIDED)
        assert {(line["delivered"], line["reason"]) for line in lines} == {(False, "shutdown")}
        assert all(event_problems(line["event"]) == [] for line in lines)
    finally:
        webhook.kill()
        with_hanging.close()
