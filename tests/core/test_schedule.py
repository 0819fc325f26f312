"""core/schedule.py: cron schedules as CronJob reads them, recurring windows (open and closed spans,
overlapping occurrences as one span), daylight-saving changes read from a zone table, and the
calendar and fixed budget periods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from function.core.schedule import (
    UTC_TABLE,
    Cron,
    Recurrence,
    calendar_period,
    fixed_period,
    last_start,
    next_start,
    occurrences,
    parse_cron,
    span_at,
    zone_of,
)
from tests.support.zones import BERLIN


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def cron(text: str) -> Cron:
    parsed = parse_cron(text)
    assert isinstance(parsed, Cron), parsed
    return parsed


def epoch(text: str) -> int:
    return int(at(text).timestamp())


@pytest.mark.parametrize(
    ("text", "field", "values"),
    [
        ("0 9 * * 1-5", "weekdays", {1, 2, 3, 4, 5}),
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("5/20 * * * *", "minutes", (5, 25, 45)),
        ("0 9-17/4 * * *", "hours", (9, 13, 17)),
        ("0 0 * jan,jul *", "months", {1, 7}),
        ("0 0 * * mon-fri", "weekdays", {1, 2, 3, 4, 5}),
        ("0 0 * * 7", "weekdays", {0}),
        ("@hourly", "minutes", (0,)),
        ("@weekly", "weekdays", {0}),
    ],
)
def test_cron_fields_read_as_cronjob_reads_them(text: str, field: str, values: object) -> None:
    got = getattr(cron(text), field)
    assert (set(got) if isinstance(values, set) else got) == values


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0 9 * *", "4 fields"),
        ("60 * * * *", "minute: 60 is outside 0-59"),
        ("0 0 30 2 *", "matches no day"),
        ("0 0 * * funday", "'funday' is not a number or a name"),
        ("0 0 5-1 * *", "runs backwards"),
        ("*/0 * * * *", "step '0'"),
        ("", "not a cron schedule"),
    ],
)
def test_a_schedule_that_is_not_one_says_why(text: str, words: str) -> None:
    problem = parse_cron(text)
    assert isinstance(problem, str) and words in problem


def test_day_of_month_and_day_of_week_both_restricted_match_either() -> None:
    both = cron("0 0 13 * 5")  # the 13th, or any Friday (cron's rule)
    assert both.day_matches(at("2026-11-13T00:00:00").date())  # a Friday the 13th
    assert both.day_matches(at("2026-11-20T00:00:00").date())  # a Friday
    assert both.day_matches(at("2026-10-13T00:00:00").date())  # a Tuesday the 13th
    assert not both.day_matches(at("2026-11-19T00:00:00").date())


def test_weekdays_nine_to_six_is_open_inside_and_closed_until_monday_outside() -> None:
    weekdays = Recurrence(cron("0 9 * * 1-5"), timedelta(hours=9), "")
    friday = span_at(weekdays, UTC_TABLE, at("2026-11-27T12:00:00"))
    assert friday == (True, at("2026-11-27T09:00:00"), at("2026-11-27T18:00:00"))
    saturday = span_at(weekdays, UTC_TABLE, at("2026-11-28T12:00:00"))
    assert saturday == (False, at("2026-11-27T18:00:00"), at("2026-11-30T09:00:00"))
    assert span_at(weekdays, UTC_TABLE, at("2026-11-27T18:00:00")).open is False  # the end is out


def test_overlapping_occurrences_are_one_open_span() -> None:
    every_minute_for_90s = Recurrence(cron("* 9 * * *"), timedelta(seconds=90), "")
    span = span_at(every_minute_for_90s, UTC_TABLE, at("2026-11-27T09:30:10"))
    assert span == (True, at("2026-11-27T09:00:00"), at("2026-11-27T10:00:30"))


def test_a_skipped_local_time_opens_at_the_change_and_a_repeated_one_at_its_first() -> None:
    half_past_two = cron("30 2 * * *")
    spring = next_start(half_past_two, BERLIN, at("2026-03-28T12:00:00"))
    assert spring == at("2026-03-29T01:00:00")  # 03:00 local, the change itself
    autumn = next_start(half_past_two, BERLIN, at("2026-10-24T12:00:00"))
    assert autumn == at("2026-10-25T00:30:00")  # 02:30 CEST, the first of the two
    assert BERLIN.local(at("2026-07-01T07:00:00")) == datetime(2026, 7, 1, 9, 0)
    assert BERLIN.utc(datetime(2026, 1, 5, 9, 0)) == at("2026-01-05T08:00:00")


def test_a_schedule_is_read_in_its_zone_across_a_change() -> None:
    nine = Recurrence(cron("0 9 * * *"), timedelta(hours=1), "Europe/Berlin")
    assert span_at(nine, BERLIN, at("2026-03-28T08:30:00")).open  # 09:30 CET
    assert span_at(nine, BERLIN, at("2026-03-30T07:30:00")).open  # 09:30 CEST
    assert not span_at(nine, BERLIN, at("2026-03-30T08:30:00")).open  # 10:30 CEST


def test_unknown_zones_are_none_and_utc_is_always_known() -> None:
    assert zone_of({}, "") is UTC_TABLE and zone_of({}, "UTC") is UTC_TABLE
    assert zone_of({}, "Europe/Berlin") is None
    assert zone_of({"Europe/Berlin": BERLIN}, "Europe/Berlin") is BERLIN


def test_occurrences_in_a_range_are_merged_spans() -> None:
    half_minutes = Recurrence(cron("* * * * *"), timedelta(seconds=20), "")
    spans = occurrences(half_minutes, UTC_TABLE, at("2026-11-27T09:00:30"), at("2026-11-27T09:03:00"))
    assert spans == [(at(f"2026-11-27T09:0{m}:00"), at(f"2026-11-27T09:0{m}:20")) for m in (1, 2)]


def test_calendar_periods_are_read_in_the_zone() -> None:
    assert calendar_period("Month", BERLIN, at("2026-11-30T23:30:00")) == (
        at("2026-11-30T23:00:00"),  # December 1st, 00:00 CET
        at("2026-12-31T23:00:00"),
    )
    week = calendar_period("Week", UTC_TABLE, at("2026-11-27T12:00:00"))  # a Friday
    assert week == (at("2026-11-23T00:00:00"), at("2026-11-30T00:00:00"))
    day = calendar_period("Day", BERLIN, at("2026-03-29T12:00:00"))  # 23 hours long
    assert day == (at("2026-03-28T23:00:00"), at("2026-03-29T22:00:00"))
    assert calendar_period("Month", UTC_TABLE, at("2026-12-15T00:00:00"))[1] == at("2027-01-01T00:00:00")


def test_fixed_periods_count_from_the_anchor() -> None:
    anchor = at("2026-11-27T09:00:00")
    assert fixed_period(anchor, timedelta(minutes=2), at("2026-11-27T09:05:00")) == (
        at("2026-11-27T09:04:00"),
        at("2026-11-27T09:06:00"),
    )


@settings(max_examples=150, deadline=None)
@given(
    minutes=st.sets(st.integers(0, 59), min_size=1, max_size=4),
    hours=st.sets(st.integers(0, 23), min_size=1, max_size=3),
    weekdays=st.sets(st.integers(0, 6), min_size=1, max_size=7),
    duration=st.integers(1, 6 * 3600),
    offset=st.integers(0, 14 * 86400),
)
def test_open_exactly_when_some_occurrence_holds_the_moment(
    minutes: set[int], hours: set[int], weekdays: set[int], duration: int, offset: int
) -> None:
    text = f"{','.join(map(str, sorted(minutes)))} {','.join(map(str, sorted(hours)))} * * " + ",".join(
        map(str, sorted(weekdays))
    )
    recurrence = Recurrence(cron(text), timedelta(seconds=duration), "")
    moment = at("2026-11-01T00:00:00") + timedelta(seconds=offset)
    # Every start within the duration before the moment, by brute force over the minutes.
    first = (moment - timedelta(seconds=duration)).replace(second=0)
    starts = []
    probe = first
    while probe <= moment:
        if probe.minute in minutes and probe.hour in hours and probe.isoweekday() % 7 in weekdays:
            starts.append(probe)
        probe += timedelta(minutes=1)
    holds = any(s <= moment < s + timedelta(seconds=duration) for s in starts)
    span = span_at(recurrence, UTC_TABLE, moment)
    assert span.open == holds
    if span.open:
        assert span.start is not None and span.end is not None and span.start <= moment < span.end
    else:
        assert span.end is None or span.end > moment
        assert span.end is None or span_at(recurrence, UTC_TABLE, span.end).open
        after = next_start(recurrence.cron, UTC_TABLE, moment)
        assert after == span.end
    last = last_start(recurrence.cron, UTC_TABLE, moment, moment - timedelta(days=8))
    assert last is None or last <= moment
