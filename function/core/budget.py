"""GPU-hour budgets of GpuLeases: the periods, and what is used, read from the lease's own status.

Pure. ``status.consumed`` holds the GPU-hours of the lease's Pods while bound to a node up to
``since``, and what was bound then (``running``, accruing from then on); ``status.budget`` holds
the current period and its hours up to the same ``since``. Every reader (the webhook at
admission, the controller writing the next status, whichever replica leads) computes the budget
from these and the time alone, so the figure is the same whoever reads it and nothing of it lives
in a process. A period that ended since the status was written is closed with what ran in it
(``running`` held until the next write), each closed period a chargeback record.

Periods: ``Month``, ``Week`` (from Monday) and ``Day`` of the calendar in ``timeZone`` (UTC by
default); ``Fixed``: every ``length`` from the lease's start; ``Rolling``: the last ``length``,
kept as ROLLING_BUCKETS buckets (the oldest counted in proportion to how much of it is still in
the window, so the figure is exact to one bucket's use spread evenly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from function.core.schedule import ROLLING_BUCKETS, ZoneTable, calendar_period, fixed_period

HOURS = Decimal("0.000001")
"""GPU-hours are written to a millionth of an hour (3.6 ms of one GPU)."""
CLOSED_LIMIT = 100
"""Periods closed in one go at most (a controller down for long, with short periods): the rest
are one record from the first of them to the last."""
MICROS_PER_HOUR = Decimal(3_600_000_000)


def hours_text(value: Decimal) -> str:
    return f"{value.quantize(HOURS):f}"


def parse_hours(raw: Any) -> Decimal | None:
    """A GPU-hours amount as written in a spec or a status (``"400"``, ``0.05``, 400); None when
    not a finite amount of at least 0."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str, float)):
        return None
    if isinstance(raw, str) and (not raw or len(raw) > 24):
        return None
    try:
        value = Decimal(str(raw))
    except InvalidOperation:
        return None
    return value if value.is_finite() and value >= 0 else None


def _time(raw: Any) -> datetime | None:
    if not isinstance(raw, str) or "T" not in raw or len(raw) > 40:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None


def _milli(raw: Any) -> int | None:
    """A status amount of GPUs (``"1.5"``) in milli-GPU; None when missing or not one."""
    value = parse_hours(raw) if isinstance(raw, str) else None
    return int(value * 1000) if value is not None else None


def gpu_hours(running: int, start: datetime, end: datetime) -> Decimal:
    """GPU-hours of ``running`` milli-GPU from ``start`` to ``end`` (0 when end is not after)."""
    if end <= start or running <= 0:
        return Decimal(0)
    micros = (end - start) // timedelta(microseconds=1)
    return Decimal(running) * micros / 1000 / MICROS_PER_HOUR


def _mapping(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


@dataclass(frozen=True)
class Consumed:
    """``status.consumed`` as the object shows it: hours up to ``since``, and the milli-GPU bound
    to nodes from then on."""

    gpu_hours: Decimal = Decimal(0)
    since: datetime | None = None
    running: int = 0

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> Consumed:
        consumed = _mapping(status.get("consumed"))
        hours = parse_hours(consumed.get("gpuHours") or "0") or Decimal(0)
        running = _milli(consumed.get("running"))
        if running is None:  # written before running was: what was used then
            running = _milli(status.get("used")) or 0
        return cls(hours, _time(consumed.get("since")), running)

    def hours_at(self, now: datetime) -> Decimal:
        if self.since is None:
            return self.gpu_hours
        return self.gpu_hours + gpu_hours(self.running, self.since, now)


class Budget(NamedTuple):
    """``spec.budget``: ``limit`` GPU-hours per period."""

    limit: Decimal
    period: str
    length: timedelta | None = None
    """Fixed and Rolling: the period's (the window's) length."""
    zone: str = ""
    """Month, Week, Day: the calendar's time zone (IANA name; "" is UTC)."""


class Period(NamedTuple):
    """One period's use: a chargeback record once it is closed."""

    start: datetime
    end: datetime
    gpu_hours: Decimal


@dataclass(frozen=True)
class BudgetNow:
    """The budget at one moment."""

    start: datetime
    end: datetime
    """The current period (Rolling: the current bucket; its window is the ``length`` before now)."""
    period_hours: Decimal
    """GPU-hours used in the current period (bucket)."""
    used: Decimal
    """Counted against the limit: the period's hours (Rolling: the window's)."""
    limit: Decimal
    exhausted_at: datetime | None
    """When ``used`` reached the limit in this period (None: it has not)."""
    closed: tuple[Period, ...]
    """Periods (Rolling: buckets) that ended since the status's own: chargeback records."""
    history: tuple[Period, ...]
    """Rolling: the closed buckets still (partly) in the window, oldest first."""
    running: int

    @property
    def left(self) -> Decimal:
        return max(self.limit - self.used, Decimal(0))

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def exhausts_at(self, now: datetime) -> datetime | None:
        """When the running Pods spend what is left, at the rate they run now (None: never in
        this period)."""
        if self.exhausted or self.running <= 0:
            return None
        micros = self.left * MICROS_PER_HOUR * 1000 / self.running
        moment = now + timedelta(microseconds=int(micros) + 1)
        return moment if moment < self.end else None


def period_of(budget: Budget, zone: ZoneTable, anchor: datetime, at: datetime) -> tuple[datetime, datetime]:
    """The period (Rolling: the bucket) that holds ``at``."""
    if budget.period in ("Month", "Week", "Day"):
        return calendar_period(budget.period, zone, at)
    length = budget.length or timedelta(hours=1)
    if budget.period == "Rolling":
        bucket = -(-int(length.total_seconds()) // ROLLING_BUCKETS)  # rounded up
        length = timedelta(seconds=max(bucket, 1))
    return fixed_period(anchor, length, at)


def _history(raw: Any) -> tuple[Period, ...]:
    kept: list[Period] = []
    for item in raw if isinstance(raw, list) else ():
        entry = _mapping(item)
        start, end = _time(entry.get("start")), _time(entry.get("end"))
        hours = parse_hours(entry.get("gpuHours"))
        if start is not None and end is not None and hours is not None and end > start:
            kept.append(Period(start, end, hours))
    return tuple(sorted(kept)[-ROLLING_BUCKETS * 2 :])


def budget_now(
    budget: Budget, status: Mapping[str, Any], zone: ZoneTable, anchor: datetime, now: datetime
) -> BudgetNow:
    """The budget at ``now``, from the lease's status (see the module's docstring)."""
    consumed = Consumed.of(status)
    shown = _mapping(status.get("budget"))
    running = consumed.running
    since = consumed.since
    start = _time(shown.get("periodStart"))
    hours = parse_hours(shown.get("gpuHours"))
    history = list(_history(shown.get("history"))) if budget.period == "Rolling" else []
    exhausted_at = _time(shown.get("exhaustedAt"))
    if start is None or hours is None or since is None or since < start or start > now:
        # No record of this budget yet (or a broken one): from what runs since the last write, and
        # never from before the lease's window (its periods begin with it).
        start, end = period_of(budget, zone, anchor, min(max(since or now, anchor), now))
        hours, exhausted_at, history = Decimal(0), None, []
        cursor = max(since or now, start)
    else:
        end = period_of(budget, zone, anchor, start)[1]
        cursor = since
    closed: list[Period] = []
    while end <= now:
        hours += gpu_hours(running, max(cursor, start), end)
        closed.append(Period(start, end, hours))
        start, end = end, period_of(budget, zone, anchor, end)[1]
        hours, exhausted_at, cursor = Decimal(0), None, start
        if len(closed) >= CLOSED_LIMIT and end <= now:
            # Whole periods nobody wrote (the controller was away): one record to the current one.
            rest_start = start
            start, end = period_of(budget, zone, anchor, now)
            closed.append(Period(rest_start, start, gpu_hours(running, rest_start, start)))
            cursor = start
            break
    period_hours = hours + gpu_hours(running, max(cursor, start), now)
    used = period_hours
    if budget.period == "Rolling":
        history = [p for p in history + closed if p.end <= start]
        used += _window_hours(history, now - (budget.length or timedelta(0)))
        history = [p for p in history if p.end > now - (budget.length or timedelta(0))]
    if used >= budget.limit and exhausted_at is None:
        exhausted_at = _reached(budget, hours, running, max(cursor, start), now, used)
    elif used < budget.limit:
        exhausted_at = None
    return BudgetNow(start, end, period_hours, used, budget.limit, exhausted_at, tuple(closed),
                     tuple(history), running)  # fmt: skip


def _window_hours(history: list[Period], window_start: datetime) -> Decimal:
    total = Decimal(0)
    for period in history:
        if period.end <= window_start:
            continue
        if period.start >= window_start:
            total += period.gpu_hours
        else:  # the oldest bucket, partly in the window: in proportion
            inside = (period.end - window_start) // timedelta(microseconds=1)
            whole = (period.end - period.start) // timedelta(microseconds=1)
            total += period.gpu_hours * inside / whole
    return total


def _reached(
    budget: Budget, hours: Decimal, running: int, segment: datetime, now: datetime, used: Decimal
) -> datetime:
    """When ``used`` reached the limit: in the segment ``hours`` grew from at ``running``."""
    before = used - gpu_hours(running, segment, now)
    if before >= budget.limit or running <= 0:
        return segment if budget.period != "Rolling" else now
    micros = (budget.limit - before) * MICROS_PER_HOUR * 1000 / running
    return min(segment + timedelta(microseconds=int(micros)), now)


def budget_status(reading: BudgetNow, rolling: bool) -> dict[str, Any]:
    """``status.budget`` for a reading taken at the moment ``consumed.since`` is written at."""
    status: dict[str, Any] = {
        "periodStart": time_text(reading.start),
        "periodEnd": time_text(reading.end),
        "gpuHours": hours_text(reading.period_hours),
        "used": hours_text(reading.used),
        "left": hours_text(reading.left),
        "limit": hours_text(reading.limit),
    }
    if reading.exhausted_at is not None:
        status["exhaustedAt"] = time_text(reading.exhausted_at)
    if rolling:
        status["history"] = [
            {"start": time_text(p.start), "end": time_text(p.end), "gpuHours": hours_text(p.gpu_hours)}
            for p in reading.history
        ]
    return status


def time_text(moment: datetime) -> str:
    """RFC 3339 in UTC, with milliseconds when there are any (``consumed.since`` is written to the
    millisecond: GPU-hours accrue from exactly there)."""
    moment = moment.astimezone(UTC)
    millis = moment.microsecond // 1000
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{millis:03d}Z" if millis else "Z")
