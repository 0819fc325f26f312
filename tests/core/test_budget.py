"""core/budget.py: the budget read from the lease's own status at any moment: hours accrue from
``consumed.since`` at ``running``, a period that ended is closed with exactly what ran in it (a
chargeback record), the time the budget is spent, and a rolling window's buckets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from function.core.budget import (
    CLOSED_LIMIT,
    Budget,
    Consumed,
    budget_now,
    budget_status,
    gpu_hours,
    hours_text,
    time_text,
)
from function.core.leases import gpus
from function.core.schedule import UTC_TABLE

ANCHOR = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
MINUTE = Budget(Decimal("0.05"), "Fixed", timedelta(minutes=2))  # 3 GPU-minutes every 2 minutes


def status(
    since: datetime, running: str, period_start: datetime | None = None, hours: str = "0"
) -> dict[str, Any]:
    shown: dict[str, Any] = {"consumed": {"gpuHours": "1", "since": time_text(since), "running": running}}
    if period_start is not None:
        shown["budget"] = {"periodStart": time_text(period_start), "gpuHours": hours}
    return shown


def test_hours_accrue_from_since_at_what_was_running() -> None:
    reading = budget_now(
        MINUTE, status(ANCHOR, "2", ANCHOR), UTC_TABLE, ANCHOR, ANCHOR + timedelta(seconds=45)
    )
    assert reading.used == Decimal("0.025")  # 2 GPUs for 45 s
    assert reading.left == Decimal("0.025")
    assert (reading.start, reading.end) == (ANCHOR, ANCHOR + timedelta(minutes=2))
    assert reading.closed == () and not reading.exhausted
    assert reading.exhausts_at(ANCHOR + timedelta(seconds=45)) == ANCHOR + timedelta(
        seconds=90, microseconds=1
    )


def test_a_spent_budget_says_when_it_was_spent_exactly() -> None:
    now = ANCHOR + timedelta(seconds=100)
    reading = budget_now(MINUTE, status(ANCHOR + timedelta(seconds=30), "2", ANCHOR, "0.0166666"), UTC_TABLE,
                         ANCHOR, now)  # fmt: skip
    assert reading.exhausted and reading.left == 0
    # 0.0166666 h at 30 s, then 2 GPUs: 0.05 h reached 60 s later (to the microsecond).
    assert abs((reading.exhausted_at - (ANCHOR + timedelta(seconds=90))).total_seconds()) < 0.01


def test_a_period_that_ended_is_closed_with_what_ran_in_it_and_the_next_begins() -> None:
    shown = status(ANCHOR + timedelta(seconds=100), "1", ANCHOR, "0.01")
    now = ANCHOR + timedelta(minutes=2, seconds=30)
    reading = budget_now(MINUTE, shown, UTC_TABLE, ANCHOR, now)
    (closed,) = reading.closed
    assert (closed.start, closed.end) == (ANCHOR, ANCHOR + timedelta(minutes=2))
    assert closed.gpu_hours == Decimal("0.01") + gpu_hours(1000, ANCHOR + timedelta(seconds=100), closed.end)
    assert reading.start == ANCHOR + timedelta(minutes=2)
    assert reading.used == gpu_hours(1000, reading.start, now)  # 30 s of one GPU
    assert reading.exhausted_at is None


def test_a_long_absence_closes_each_period_and_at_most_a_bounded_number() -> None:
    shown = status(ANCHOR, "1", ANCHOR)
    few = budget_now(MINUTE, shown, UTC_TABLE, ANCHOR, ANCHOR + timedelta(minutes=7))
    assert [p.gpu_hours for p in few.closed] == [Decimal(2) / 60] * 3
    many = budget_now(MINUTE, shown, UTC_TABLE, ANCHOR, ANCHOR + timedelta(days=2))
    assert len(many.closed) == CLOSED_LIMIT + 1
    # Nothing is lost: the closed records and the current period add up to what ran.
    total = sum((p.gpu_hours for p in many.closed), many.period_hours)
    assert abs(total - gpu_hours(1000, ANCHOR, ANCHOR + timedelta(days=2))) < Decimal("1e-20")


def test_a_status_without_a_budget_starts_from_the_last_write() -> None:
    shown = {
        "consumed": {"gpuHours": "3", "since": time_text(ANCHOR + timedelta(seconds=10)), "running": "1"}
    }
    reading = budget_now(MINUTE, shown, UTC_TABLE, ANCHOR, ANCHOR + timedelta(seconds=70))
    assert reading.used == gpu_hours(1000, ANCHOR + timedelta(seconds=10), ANCHOR + timedelta(seconds=70))


def test_a_rolling_window_counts_its_buckets_and_the_oldest_in_proportion() -> None:
    rolling = Budget(Decimal(10), "Rolling", timedelta(hours=24))  # buckets of one hour
    shown = status(ANCHOR, "0", ANCHOR)
    shown["budget"]["history"] = [
        {
            "start": time_text(ANCHOR - timedelta(hours=25)),
            "end": time_text(ANCHOR - timedelta(hours=24)),
            "gpuHours": "100",
        },
        {
            "start": time_text(ANCHOR - timedelta(hours=24)),
            "end": time_text(ANCHOR - timedelta(hours=23)),
            "gpuHours": "4",
        },
        {
            "start": time_text(ANCHOR - timedelta(hours=2)),
            "end": time_text(ANCHOR - timedelta(hours=1)),
            "gpuHours": "3",
        },
    ]
    reading = budget_now(
        rolling, shown, UTC_TABLE, ANCHOR - timedelta(days=5), ANCHOR + timedelta(minutes=30)
    )
    # The window is the last 24 h: half of the 4 GPU-hour bucket is still in it, the 100 is not.
    assert reading.used == Decimal(2) + Decimal(3)
    assert [p.gpu_hours for p in reading.history] == [Decimal(4), Decimal(3)]
    written = budget_status(reading, rolling=True)
    assert [item["gpuHours"] for item in written["history"]] == ["4.000000", "3.000000"]


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(st.tuples(st.integers(1, 400_000), st.integers(0, 8000)), min_size=1, max_size=12),
    length=st.integers(60, 3600),
)
def test_periods_closed_across_writes_add_up_to_what_ran(writes: list[tuple[int, int]], length: int) -> None:
    """The status as the controller writes it, one write after another (each adding running x
    elapsed): every period's record plus the current period equal the lifetime GPU-hours."""
    budget = Budget(Decimal(1000), "Fixed", timedelta(seconds=length))
    shown: dict[str, Any] = {}
    moment = ANCHOR
    running = 0
    records: list[Decimal] = []
    for step_millis, now_running in writes:
        moment += timedelta(milliseconds=step_millis)
        reading = budget_now(budget, shown, UTC_TABLE, ANCHOR, moment)
        records += [p.gpu_hours for p in reading.closed]
        hours = Consumed.of(shown).hours_at(moment) if shown else Decimal(0)
        running = now_running
        shown = {
            "consumed": {"gpuHours": hours_text(hours), "since": time_text(moment), "running": gpus(running)},
            "budget": budget_status(reading, rolling=False),
        }
    lifetime = Decimal(shown["consumed"]["gpuHours"])
    # Each write rounds both figures to a millionth of an hour: they may part by that much a write.
    assert abs(sum(records, Decimal(shown["budget"]["gpuHours"])) - lifetime) <= Decimal("0.000001") * len(
        writes
    )


def test_the_first_period_begins_with_the_lease_not_with_a_write_before_it() -> None:
    """The controller wrote the status while the lease was Pending (``since`` before the start):
    the first period is the one the start opens, never one before it."""
    before = time_text(ANCHOR - timedelta(seconds=30))
    shown = {"consumed": {"gpuHours": "0", "since": before, "running": "0"}}
    reading = budget_now(MINUTE, shown, UTC_TABLE, ANCHOR, ANCHOR + timedelta(seconds=10))
    assert (reading.start, reading.closed) == (ANCHOR, ())
