"""A time zone as the core reads it, written out by hand (so tests of the core need no tz database)."""

from __future__ import annotations

from datetime import UTC, datetime

from function.core.schedule import ZoneTable


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


# Central Europe in 2026: +1h, +2h from 2026-03-29T01:00Z (02:00 local jumps to 03:00), +1h again
# from 2026-10-25T01:00Z (03:00 local goes back to 02:00).
BERLIN = ZoneTable(
    "Europe/Berlin", (_epoch("2026-03-29T01:00:00"), _epoch("2026-10-25T01:00:00")), (3600, 7200, 3600)
)
