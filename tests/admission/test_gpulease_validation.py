"""`POST /validate/gpuleases` through the webhook's HTTP handler: a GpuLease whose values the code
cannot compute with (a duration of 10,000 years, an end in year 9999, a grace period or priority
past what fits) is refused naming the field, and no GpuLease at all, however odd, gets a 500.
What slipped past validation (written straight to etcd) still reads as a lease with problems, never
as an exception in the watch that reads it."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from function.admission.review import Admission
from function.core.config import Config
from function.core.engine import Engine
from function.core.leases import (
    EARLIEST,
    LATEST,
    MAX_DURATION_HOURS,
    MAX_GRACE_SECONDS,
    Phase,
    lease_problems,
    slim_lease,
)
from function.serve.http_api import WebhookHttp
from function.zones import ZONES

PATH = "/validate/gpuleases"


def lease(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {
            "name": "h100",
            "namespace": "ml",
            "uid": "u-1",
            "creationTimestamp": "2026-11-25T00:00:00Z",
        },
        "spec": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "count": 8, **spec},
    }


def review(obj: Any, operation: str = "CREATE") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "r-1",
                "kind": {"group": "castops.io", "version": "v1alpha1", "kind": "GpuLease"},
                "resource": {"group": "castops.io", "version": "v1alpha1", "resource": "gpuleases"},
                "operation": operation,
                "namespace": "ml",
                "userInfo": {"username": "admin"},
                "object": obj,
            },
        }
    ).encode()


@pytest.fixture(scope="module")
def http() -> WebhookHttp:
    return WebhookHttp(Admission(Engine(Config())))


def answer(http: WebhookHttp, obj: Any, operation: str = "CREATE") -> tuple[int, dict[str, Any]]:
    reply = http.handle("POST", PATH, review(obj, operation))
    return reply.status, json.loads(reply.body)


POISON = [
    (lease(duration="87600000h"), "spec.duration"),
    (lease(duration=f"{MAX_DURATION_HOURS + 1}h"), "spec.duration"),
    (lease(duration="9" * 5000 + "h"), "spec.duration"),
    (lease(window={"end": "9999-12-31T23:59:59Z"}), "spec.window.end"),
    (lease(window={"start": "9999-12-31T00:00:00Z"}), "spec.window.start"),
    (lease(window={"start": "0001-01-01T00:00:00+01:00"}), "spec.window.start"),
    (lease(window={"start": "1969-12-31T23:59:59Z"}), "spec.window.start"),
    (lease(onExpiry={"action": "Evict", "gracePeriodSeconds": 10**18}), "spec.onExpiry.gracePeriodSeconds"),
    (lease(onExpiry={"action": "Evict", "gracePeriodSeconds": MAX_GRACE_SECONDS + 1}), "spec.onExpiry"),
    (lease(priority=2**31), "spec.priority"),
    (lease(count=10**30), "spec.count"),
    (lease(count="9" * 5000), "spec.count"),
    (lease(budget={"gpuHours": 10**12, "period": "Month"}), "spec.budget.gpuHours"),
    (lease(budget={"gpuHours": "1.0000001", "period": "Month"}), "spec.budget.gpuHours"),
    (lease(budget={"gpuHours": 5, "period": "Fixed", "length": "1s"}), "spec.budget.length"),
    (lease(budget={"gpuHours": 5, "period": "Rolling"}), "spec.budget.length"),
    (lease(budget={"gpuHours": 5, "period": "Month", "length": "1h"}), "spec.budget.length"),
    (lease(budget={"gpuHours": 5, "period": "Fortnight"}), "spec.budget.period"),
    (
        lease(budget={"gpuHours": 5, "period": "Fixed", "length": "1h", "timeZone": "UTC"}),
        "spec.budget.timeZone",
    ),
    (
        lease(window={"recurrence": {"schedule": "0 9 * * 1-5", "duration": "745h"}}),
        "spec.window.recurrence.duration",
    ),
    (
        lease(window={"recurrence": {"schedule": "0 0 30 2 *", "duration": "1h"}}),
        "spec.window.recurrence.schedule",
    ),
    (lease(window={"recurrence": {"schedule": "0 9 * * 1-5"}}), "spec.window.recurrence.duration"),
    (
        lease(window={"recurrence": {"schedule": "0 9 * * *", "duration": "1h", "timeZone": "../etc"}}),
        "spec.window.recurrence.timeZone",
    ),
    (lease(onExpiry={"noticeSeconds": MAX_GRACE_SECONDS + 1}), "spec.onExpiry.noticeSeconds"),
]


@pytest.mark.parametrize(("obj", "field"), POISON, ids=[f"{f}-{n}" for n, (_, f) in enumerate(POISON)])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_value_the_code_cannot_compute_with_is_refused_naming_its_field(
    http: WebhookHttp, obj: dict[str, Any], field: str, operation: str
) -> None:
    status, body = answer(http, obj, operation)
    assert status == 200
    response = body["response"]
    assert response["allowed"] is False
    assert field in response["status"]["message"]


def test_a_time_zone_the_tz_database_does_not_know_is_refused_at_apply(http: WebhookHttp) -> None:
    recurring = {"schedule": "0 9 * * 1-5", "duration": "9h", "timeZone": "Mars/Olympus_Mons"}
    for obj, field in (
        (lease(window={"recurrence": recurring}), "spec.window.recurrence.timeZone"),
        (
            lease(budget={"gpuHours": 400, "period": "Month", "timeZone": "Europe/Atlantis"}),
            "spec.budget.timeZone",
        ),
    ):
        status, body = answer(http, obj)
        assert status == 200 and body["response"]["allowed"] is False
        assert field in body["response"]["status"]["message"]
        record = slim_lease(obj)
        assert record is not None and record.problems == ()  # the form is right: only the edge knows
        assert record.phase(datetime(2026, 11, 25, tzinfo=UTC), ZONES) == Phase.Invalid


def test_the_edges_of_what_is_accepted_are_accepted(http: WebhookHttp) -> None:
    for obj in (
        lease(budget={"gpuHours": "0.000001", "period": "Fixed", "length": "60s"}),
        lease(budget={"gpuHours": 10**9, "period": "Rolling", "length": "8784h"}),
        lease(budget={"gpuHours": 400, "period": "Month", "timeZone": "America/Argentina/Buenos_Aires"}),
        lease(window={"recurrence": {"schedule": "@daily", "duration": "744h", "timeZone": "Europe/Berlin"}}),
        lease(onExpiry={"noticeSeconds": 0}),
        lease(duration=f"{MAX_DURATION_HOURS}h"),
        lease(window={"start": "1970-01-01T00:00:00Z", "end": "8999-12-31T23:59:59Z"}),
        lease(onExpiry={"action": "Evict", "gracePeriodSeconds": MAX_GRACE_SECONDS}),
        lease(priority=-(2**31)),
    ):
        status, body = answer(http, obj)
        assert (status, body["response"]["allowed"]) == (200, True), body


@pytest.mark.parametrize(("obj", "field"), POISON, ids=[f"{f}-{n}" for n, (_, f) in enumerate(POISON)])
def test_a_poison_lease_that_skipped_validation_reads_as_a_lease_with_problems(
    obj: dict[str, Any], field: str
) -> None:
    """What a watch does with it: no exception, the field named, and every time in it one that
    the controller and the webhook can add the grace period to and compare with now."""
    record = slim_lease(obj)
    assert record is not None
    assert any(problem.startswith(field) for problem in record.problems), record.problems
    now = datetime(2026, 11, 25, tzinfo=UTC)
    for moment in (record.start, record.end):
        if moment is not None:
            assert EARLIEST <= moment < LATEST
            moment + timedelta(seconds=record.grace_seconds)  # representable
    assert 0 <= record.grace_seconds <= MAX_GRACE_SECONDS
    assert record.phase(now) in Phase


ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=24),
    st.lists(st.integers(), max_size=2),
)
TIMES = st.one_of(
    st.datetimes().map(lambda d: d.replace(tzinfo=UTC).isoformat()),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(
        lambda d: d.isoformat() + "+05:00"
    ),
    st.from_regex(
        r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})\Z"
    ),
    ANY,
)
DURATIONS = st.one_of(
    st.from_regex(r"\A([0-9]{1,12}h)?([0-9]{1,12}m)?([0-9]{1,12}s)?\Z"), st.text(max_size=12), ANY
)
CRONS = st.one_of(
    st.from_regex(r"\A[0-9*/,-]{1,6} [0-9*/,-]{1,6} [0-9*/,-]{1,5} [0-9a-z*/,-]{1,5} [0-9a-z*/,-]{1,5}\Z"),
    st.sampled_from(["@daily", "@hourly", "0 9 * * 1-5", "* * * * *", "0 0 31 2 *"]),
    ANY,
)
ZONE_NAMES = st.one_of(
    st.sampled_from(["UTC", "Europe/Berlin", "Mars/Olympus", "Asia/Kolkata", "", "../../etc/passwd"]),
    st.text(max_size=20),
    ANY,
)
COUNTS = st.one_of(
    st.integers(), st.from_regex(r"\A[0-9]{1,20}(\.[0-9]{1,4})?m?\Z"), st.text(max_size=12), ANY
)
SPECS = st.fixed_dictionaries(
    {"gpuModel": st.one_of(st.just("NVIDIA-H100-80GB-HBM3"), ANY), "count": COUNTS},
    optional={
        "window": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "start": TIMES,
                    "end": TIMES,
                    "recurrence": st.one_of(
                        st.fixed_dictionaries(
                            {},
                            optional={"schedule": CRONS, "duration": DURATIONS, "timeZone": ZONE_NAMES},
                        ),
                        ANY,
                    ),
                },
            ),
            ANY,
        ),
        "duration": DURATIONS,
        "priority": st.one_of(st.integers(), ANY),
        "enforcement": st.one_of(st.sampled_from(["Deny", "Queue", "Audit"]), ANY),
        "budget": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "gpuHours": st.one_of(COUNTS, ANY),
                    "period": st.one_of(st.sampled_from(["Month", "Week", "Day", "Fixed", "Rolling"]), ANY),
                    "length": DURATIONS,
                    "timeZone": ZONE_NAMES,
                },
            ),
            ANY,
        ),
        "overflow": st.one_of(st.sampled_from(["None", "Preemptible"]), ANY),
        "onExpiry": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "action": st.one_of(st.sampled_from(["Evict", "StopAdmitting"]), ANY),
                    "gracePeriodSeconds": st.one_of(st.integers(), ANY),
                },
            ),
            ANY,
        ),
        "podSelector": st.one_of(
            ANY,
            st.fixed_dictionaries(
                {},
                optional={
                    "matchLabels": st.one_of(st.dictionaries(st.text(max_size=4), ANY, max_size=2), ANY),
                    "matchExpressions": st.one_of(
                        st.lists(st.dictionaries(st.sampled_from(["key", "operator", "values"]), ANY)), ANY
                    ),
                },
            ),
        ),
    },
)
OBJECTS = st.one_of(
    SPECS.map(lambda spec: {**lease(), "spec": spec}),
    st.fixed_dictionaries(
        {"metadata": st.one_of(ANY, st.just({"name": "x"})), "spec": st.one_of(SPECS, ANY)}
    ),
    ANY,
)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(OBJECTS, st.sampled_from(["CREATE", "UPDATE"]))
def test_no_gpulease_gets_a_500_and_every_refusal_names_a_field(
    http: WebhookHttp, obj: Any, operation: str
) -> None:
    logging.disable(logging.ERROR)  # an internal error logs its traceback: the status below tells
    try:
        status, body = answer(http, obj, operation)
    finally:
        logging.disable(logging.NOTSET)
    assert status == 200, body
    response = body["response"]
    if not response["allowed"]:
        message = response["status"]["message"]
        assert "spec" in message or "not an object" in message, message
    if isinstance(obj, dict):
        record = slim_lease({**obj, "metadata": {"uid": "u-1", "creationTimestamp": "2026-11-25T00:00:00Z"}})
        assert record is not None
        problems = record.problems or record.zone_problems(ZONES)
        assert bool(problems) == (not response["allowed"]), (problems, response)


def test_every_problem_names_a_field_of_the_spec() -> None:
    bad = lease(duration="87600000h", priority=2**40, onExpiry={"gracePeriodSeconds": -1})
    assert {p.split(":", 1)[0] for p in lease_problems(bad)} == {
        "spec.duration",
        "spec.priority",
        "spec.onExpiry.gracePeriodSeconds",
    }
