"""What the adapter adds around the pure engine: the time each decision took (from the clock it is
given) and the log lines an operator needs (an internal error's traceback, a withheld patch)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from function.admission.review import Admission, request_context
from function.core.config import parse_config
from function.core.engine import Decision, Engine
from tests.support import pod_review

OPTED_IN = {"name": "p", "annotations": {"castops.io/optimize": "true"}}


def ticking(*readings: float) -> Any:
    """A clock that reads the given values in turn."""
    values: Iterator[float] = iter(readings)
    return lambda: next(values)


def test_the_audit_facts_carry_the_time_the_adapter_measured() -> None:
    subject = Admission(Engine(parse_config({})), clock=ticking(10.0, 10.25))
    answer = subject.review(pod_review(OPTED_IN))
    assert answer.facts is not None and answer.facts.duration_seconds == 0.25


def test_an_internal_error_is_timed_and_logged_with_its_traceback_and_uid(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(self: Engine, pod: Any, request: Any) -> Decision:
        raise RuntimeError("boom")

    monkeypatch.setattr(Engine, "decide_or_raise", explode)
    subject = Admission(Engine(parse_config({})), clock=ticking(1.0, 3.5))
    with caplog.at_level(logging.ERROR, logger="castslice.admission"):
        answer = subject.review(pod_review(OPTED_IN))
    assert answer.decision is not None
    assert (answer.decision.outcome, answer.decision.allowed) == ("error", True)
    assert answer.facts is not None and answer.facts.duration_seconds == 2.5
    [record] = caplog.records
    assert "u-1" in record.getMessage() and record.exc_info is not None
    assert "boom" in caplog.text


def test_a_withheld_patch_is_logged_with_its_reason_and_uid(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    withheld = Decision("error", True, "patch withheld: simulated")
    monkeypatch.setattr(Engine, "decide_or_raise", lambda self, pod, request: withheld)
    with caplog.at_level(logging.ERROR, logger="castslice.admission"):
        Admission(Engine(parse_config({}))).review(pod_review(OPTED_IN))
    assert [r.getMessage() for r in caplog.records] == ["request uid u-1: patch withheld: simulated"]


def test_the_engine_alone_never_raises_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    class Exploding:
        name = "exploding"

        def mutate(self, pod: Any, request: Any) -> Any:
            raise RuntimeError("boom")

    engine = Engine(parse_config({}), [Exploding()], [])  # type: ignore[list-item]
    with caplog.at_level(logging.DEBUG):
        decision = engine.decide({"metadata": {}}, _context())
    assert decision.outcome == "error" and decision.reason == "internal error: RuntimeError: boom"
    assert caplog.records == []
    with pytest.raises(RuntimeError, match="boom"):
        engine.decide_or_raise({"metadata": {}}, _context())


def _context() -> Any:
    return request_context(pod_review(OPTED_IN))
