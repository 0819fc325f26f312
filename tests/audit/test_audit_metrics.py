"""GET /metrics through the real functions-framework app: Prometheus text, admission by outcome,
decision latency, events delivered/retried/spilled, queue depth; and readiness at shutdown."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import asgi_client, load_review, served_webhook
from tests.support.audit import refused_url, wait_for


def samples(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def recorder(client: Any) -> Any:
    return served_webhook(client).admission.recorder


def not_a_pod_create() -> dict[str, Any]:
    review = copy.deepcopy(load_review("default-slice-inference"))
    review["request"]["operation"] = "UPDATE"
    review["request"]["oldObject"] = review["request"]["object"]
    return review


def test_metrics_count_answers_decisions_and_events(monkeypatch: pytest.MonkeyPatch) -> None:
    client = asgi_client(monkeypatch)  # no K_SINK: events go to stdout
    for name in (
        "default-slice-inference",
        "default-not-opted-in",
        "default-bad-ratio",
        "default-dry-run-probe",
    ):
        assert client.post("/mutate", json=load_review(name)).status_code == 200
    assert client.post("/mutate", json=not_a_pod_create()).status_code == 200
    wait_for(
        lambda: value(samples(client), "castslice_audit_events_delivered_total", sink="stdout") == 3,
        5,
        what="three events on stdout",
    )
    found = samples(client)
    requests = "castslice_admission_requests_total"
    assert value(found, requests, outcome="mutated", dry_run="false") == 1
    assert value(found, requests, outcome="unchanged", dry_run="false") == 1
    assert value(found, requests, outcome="denied", dry_run="false") == 1
    assert value(found, requests, outcome="mutated", dry_run="true") == 1, "a dry run is answered and counted"
    assert value(found, requests, outcome="ignored", dry_run="false") == 1, "not a Pod CREATE: no decision"
    assert value(found, requests, outcome="error", dry_run="false") == 0
    assert value(found, "castslice_admission_decision_seconds_count") == 4
    assert 0 < value(found, "castslice_admission_decision_seconds_sum") < 1
    assert value(found, "castslice_audit_events_emitted_total") == 3, "no event for the dry run"
    assert value(found, "castslice_audit_queue_depth") == 0
    assert value(found, "castslice_audit_queue_capacity") == 10000
    for reason in ("queue_full", "rejected", "retries_exhausted", "shutdown"):
        assert value(found, "castslice_audit_events_spilled_total", reason=reason) == 0
    assert ("process_cpu_seconds_total", ()) in found or sys.platform != "linux"
    recorder(client).close()


def test_metrics_count_retries_and_spills(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"audit": {"maxAttempts": 3, "initialBackoffSeconds": 0.005, "maxBackoffSeconds": 0.01}}
        )
    )
    client = asgi_client(monkeypatch, config, K_SINK=refused_url())
    assert client.post("/mutate", json=load_review("default-slice-inference")).status_code == 200
    wait_for(
        lambda: (
            value(samples(client), "castslice_audit_events_spilled_total", reason="retries_exhausted") == 1
        ),
        5,
        what="the spill",
    )
    found = samples(client)
    assert value(found, "castslice_audit_event_retries_total", sink="knative") == 2
    assert value(found, "castslice_audit_events_delivered_total", sink="knative") == 0
    recorder(client).close()


def test_not_ready_once_shutting_down_but_a_dead_sink_never_makes_it_unready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = asgi_client(monkeypatch, K_SINK=refused_url())
    assert client.get("/readyz").status_code == 200
    recorder(client).close(0.1)
    assert client.get("/readyz").status_code == 503
    # Answers still come while shutting down; their events go straight to stdout.
    assert client.post("/mutate", json=load_review("default-slice-inference")).status_code == 200
