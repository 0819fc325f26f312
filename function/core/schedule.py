"""Time for GPU leases: time-zone offsets as data, cron schedules, recurring windows, budget periods.

Pure: the core reads no time-zone file and no clock. A time zone reaches it as a ``ZoneTable``
(the instants its UTC offset changes at, and the offsets), built at the edge from the system's
tz database (``function/zones.py``, zoneinfo) and handed over with the view (index
``ZONES_INDEX``); the time is given. ``UTC_TABLE`` is always known.

A recurring window is a cron schedule (the five fields of a CronJob, in the lease's time zone)
and a duration: the lease is open from each start for that long (Karpenter's disruption budgets
have the same shape). A local time a daylight-saving change skips is taken as the same time
at the change (02:30 in a gap that jumps 02:00 -> 03:00 opens at 03:00), a local time that
happens twice is the first, so a later wall-clock time is never an earlier instant.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

import immutables

ZONES_INDEX = "time-zones"
"""The view's index of time zones: name -> ZoneTable (the edge adds it to each snapshot)."""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY = 86400


class ZoneTable(NamedTuple):
    """A time zone as data: ``offsets[i]`` (seconds east of UTC) holds from ``instants[i - 1]``
    (UTC epoch seconds) until ``instants[i]``; ``offsets[0]`` before the first instant and the
    last one after the last."""

    name: str
    instants: tuple[int, ...]
    offsets: tuple[int, ...]

    def offset_at(self, epoch: int) -> int:
        return self.offsets[bisect_right(self.instants, epoch)]

    def local(self, moment: datetime) -> datetime:
        """``moment`` (aware) as a naive local wall-clock time."""
        epoch = _epoch(moment)
        return (EPOCH + timedelta(seconds=epoch + self.offset_at(epoch))).replace(tzinfo=None)

    def utc(self, local: datetime) -> datetime:
        """A naive local wall-clock time as an aware UTC time: the first of two when it happens
        twice, the moment of the change when a change skips it."""
        wall = _epoch(local.replace(tzinfo=UTC))
        before, after = self.offset_at(wall - DAY), self.offset_at(wall + DAY)
        fits = [wall - off for off in {before, after} if self.offset_at(wall - off) == off]
        # Skipped: the change itself (so a later wall-clock time never comes earlier).
        epoch = min(fits) if fits else self.instants[bisect_right(self.instants, wall - before) - 1]
        return EPOCH + timedelta(seconds=epoch)


UTC_TABLE = ZoneTable("UTC", (), (0,))


def _epoch(moment: datetime) -> int:
    return int((moment - EPOCH).total_seconds() // 1)


def zone_of(zones: Mapping[str, Any], name: str) -> ZoneTable | None:
    """The table of ``name`` ("" and UTC always known); None when the edge does not know it."""
    if not name or name in ("UTC", "Etc/UTC"):
        return UTC_TABLE
    table = zones.get(name)
    return table if isinstance(table, ZoneTable) else None


NO_ZONES: Mapping[str, ZoneTable] = immutables.Map()


# -- cron -----------------------------------------------------------------------------------------
_MONTHS = {
    name: n
    for n, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_DAYS = {name: n for n, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NO_NAMES: dict[str, int] = {}
_FIELDS: tuple[tuple[str, int, int, Mapping[str, int]], ...] = (
    ("minute", 0, 59, _NO_NAMES),
    ("hour", 0, 23, _NO_NAMES),
    ("day of month", 1, 31, _NO_NAMES),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
SEARCH_DAYS = 366 * 5 + 2
"""How far a schedule is searched for its next or last start (a schedule with no start in five
years, such as February 30th, is refused at validation)."""


@dataclass(frozen=True)
class Cron:
    """A five-field cron schedule (CronJob's: minute hour day-of-month month day-of-week, names
    and ``@daily``-style macros accepted), each field the set of values it matches."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 = Sunday .. 6 = Saturday (7 is read as 0)."""
    any_day: bool
    any_weekday: bool

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week  # one of them is "*": the other decides
        return in_month or in_week  # both restricted: either matches (cron's rule)

    def can_match(self) -> bool:
        """Whether some day of some year matches (``0 0 30 2 *`` never does)."""
        if not self.any_day and not self.any_weekday:
            return True  # any weekday of any month matches
        if self.any_weekday or not self.any_day:
            return any(d <= _DAYS_IN_MONTH[m - 1] for m in self.months for d in self.days)
        return True


def _field(text: str, name: str, low: int, high: int, names: Mapping[str, int]) -> set[int] | str:
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or not 0 < int(step_text) <= high:
                return f"{name}: step {step_text!r} is not a whole number from 1 to {high}"
            step = int(step_text)
        if base == "*":
            first, last = low, high
        else:
            head, dash, tail = base.partition("-")
            bounds = []
            for token in (head, tail) if dash else (head,):
                value = names.get(token.lower()) if token.isalpha() else None
                if value is None:
                    if not token.isdigit() or len(token) > 2:
                        return f"{name}: {token!r} is not a number or a name"
                    value = int(token)
                if not low <= value <= high:
                    return f"{name}: {value} is outside {low}-{high}"
                bounds.append(value)
            first, last = bounds[0], bounds[-1]
            if slash and not dash:
                last = high  # "5/15": from 5 on, every 15
            if first > last:
                return f"{name}: range {base!r} runs backwards"
        values.update(range(first, last + 1, step))
    return values


def parse_cron(text: Any) -> Cron | str:
    """A Cron, or why ``text`` is not one."""
    if not isinstance(text, str) or not text.strip() or len(text) > 128:
        return "not a cron schedule (five fields: minute hour day-of-month month day-of-week)"
    spec = _MACROS.get(text.strip().lower(), text)
    fields = spec.split()
    if len(fields) != 5:
        return f"{text!r} has {len(fields)} fields, a cron schedule has 5 (minute hour day month weekday)"
    parsed: list[set[int]] = []
    for raw, (name, low, high, names) in zip(fields, _FIELDS, strict=True):
        values = _field(raw, name, low, high, names)
        if isinstance(values, str):
            return values
        parsed.append(values)
    minutes, hours, days, months, weekdays = parsed
    weekdays = {d % 7 for d in weekdays}
    cron = Cron(
        text=text,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        any_day=fields[2].startswith("*"),
        any_weekday=fields[4].startswith("*"),
    )
    if not cron.can_match():
        return f"{text!r} matches no day of any year"
    return cron


def _wall(cron: Cron, day: date, at: int) -> datetime:
    hour, minute = divmod(at, len(cron.minutes))
    return datetime(day.year, day.month, day.day, cron.hours[hour], cron.minutes[minute])


def _first_after(cron: Cron, zone: ZoneTable, day: date, after: datetime) -> datetime | None:
    """The day's first start after ``after``: the day's starts rise with the wall clock (ZoneTable.utc),
    so a binary search finds it."""
    low, high = 0, len(cron.hours) * len(cron.minutes)
    while low < high:
        middle = (low + high) // 2
        if zone.utc(_wall(cron, day, middle)) > after:
            high = middle
        else:
            low = middle + 1
    return zone.utc(_wall(cron, day, low)) if low < len(cron.hours) * len(cron.minutes) else None


def _last_at(cron: Cron, zone: ZoneTable, day: date, at: datetime) -> datetime | None:
    """The day's last start at or before ``at``."""
    low, high = 0, len(cron.hours) * len(cron.minutes)
    while low < high:
        middle = (low + high) // 2
        if zone.utc(_wall(cron, day, middle)) <= at:
            low = middle + 1
        else:
            high = middle
    return zone.utc(_wall(cron, day, low - 1)) if low else None


def next_start(cron: Cron, zone: ZoneTable, after: datetime) -> datetime | None:
    """The first start of the schedule strictly after ``after`` (within SEARCH_DAYS)."""
    day = zone.local(after).date() - timedelta(days=1)  # a change may move a start across midnight
    for _ in range(SEARCH_DAYS):
        if cron.day_matches(day):
            found = _first_after(cron, zone, day, after)
            if found is not None:
                return found
        day += timedelta(days=1)
    return None


def last_start(cron: Cron, zone: ZoneTable, at: datetime, since: datetime) -> datetime | None:
    """The last start of the schedule at or before ``at`` and after ``since`` (None: none)."""
    day = zone.local(at).date() + timedelta(days=1)
    stop = zone.local(since).date() - timedelta(days=1)
    while day >= stop:
        if cron.day_matches(day):
            found = _last_at(cron, zone, day, at)
            if found is not None:
                return found if found > since else None
        day -= timedelta(days=1)
    return None


# -- recurring windows ----------------------------------------------------------------------------
MAX_OCCURRENCE = timedelta(days=31)
"""A recurring window's duration at most (its schedule is searched this far back)."""
CHAIN_LIMIT = 64
"""Occurrences that overlap are one open span; it is followed this far (a schedule whose
duration outlasts its interval is open for good: the span then ends 'at least' there)."""


class Recurrence(NamedTuple):
    cron: Cron
    duration: timedelta
    zone: str
    """The IANA name ("" or UTC: UTC)."""


class Span(NamedTuple):
    """Where ``at`` lies in a recurring window: ``open`` from ``start`` to ``end`` (the run of
    overlapping occurrences that holds it), or closed from ``start`` (the last end) to ``end``
    (the next start; None: no start within SEARCH_DAYS)."""

    open: bool
    start: datetime | None
    end: datetime | None


def span_at(recurrence: Recurrence, zone: ZoneTable, at: datetime) -> Span:
    cron, duration = recurrence.cron, recurrence.duration
    last = last_start(cron, zone, at, at - duration)
    if last is not None and last + duration > at:
        start, end = last, last + duration
        for _ in range(CHAIN_LIMIT):  # the run's start: earlier occurrences reaching it
            second = timedelta(seconds=1)
            before = last_start(cron, zone, start - second, start - duration - second)
            if before is None or before + duration < start:
                break
            start = before
        following = next_start(cron, zone, last)
        for _ in range(CHAIN_LIMIT):  # and its end: later ones starting before it ends
            if following is None or following > end:
                break
            end = following + duration
            following = next_start(cron, zone, following)
        return Span(True, start, end)
    previous = last_start(cron, zone, at, at - MAX_OCCURRENCE - duration)
    return Span(False, previous + duration if previous is not None else None, next_start(cron, zone, at))


def occurrences(
    recurrence: Recurrence, zone: ZoneTable, begin: datetime, finish: datetime, limit: int = 2000
) -> list[tuple[datetime, datetime]]:
    """The open spans that meet [begin, finish), merged, at most ``limit`` of them."""
    spans: list[tuple[datetime, datetime]] = []
    first = span_at(recurrence, zone, begin)
    cursor: datetime | None
    if first.open and first.start is not None and first.end is not None:
        spans.append((first.start, first.end))
        cursor = first.end
    else:
        cursor = first.end
    while cursor is not None and cursor < finish and len(spans) < limit:
        span = span_at(recurrence, zone, cursor)
        if not span.open or span.start is None or span.end is None:
            cursor = span.end
            continue
        if spans and span.start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], span.end))
        else:
            spans.append((span.start, span.end))
        cursor = span.end
    return spans


# -- budget periods -------------------------------------------------------------------------------
PERIODS = ("Month", "Week", "Day", "Fixed", "Rolling")
ROLLING_BUCKETS = 24
"""A rolling budget keeps what was used in this many buckets of its length (the oldest counted
in proportion to how much of it is still inside the window)."""


def calendar_period(kind: str, zone: ZoneTable, at: datetime) -> tuple[datetime, datetime]:
    """The calendar period (Month, Week from Monday, Day) in the zone that holds ``at``."""
    local = zone.local(at)
    if kind == "Month":
        first = datetime(local.year, local.month, 1)
        following = datetime(local.year + local.month // 12, local.month % 12 + 1, 1)
    elif kind == "Week":
        first = datetime(local.year, local.month, local.day) - timedelta(days=local.weekday())
        following = first + timedelta(days=7)
    else:
        first = datetime(local.year, local.month, local.day)
        following = first + timedelta(days=1)
    start, end = zone.utc(first), zone.utc(following)
    if start > at:  # a change that moved local midnight: the period before
        return calendar_period(kind, zone, start - timedelta(seconds=1))
    return start, end


def fixed_period(anchor: datetime, length: timedelta, at: datetime) -> tuple[datetime, datetime]:
    """The period of ``length`` counted from ``anchor`` that holds ``at``."""
    seconds = int(length.total_seconds())
    index = _epoch(at) - _epoch(anchor)
    start = anchor + timedelta(seconds=(index // seconds) * seconds)
    return start, start + length
