"""Time zones for the core, from the system's tz database (the edge of ``function/core/schedule.py``).

The core may not read time-zone files (``tests/test_layout.py``): each process that decides with
time zones (the webhook, the controller, the offline commands) hands it ``ZoneTables``, a
read-only mapping from an IANA name to a ``ZoneTable`` (every instant the zone's UTC offset
changes from 1970 to 2200, and the offsets), built here from ``zoneinfo`` the first time a name
is asked for and kept. A name the database does not hold is absent, as the core expects. The
``tzdata`` package is the database where the system has none (zoneinfo's own fallback).
"""

from __future__ import annotations

import threading
import zoneinfo
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime

from function.core.schedule import UTC_TABLE, ZoneTable

FIRST = 0
"""1970-01-01T00:00:00Z, as epoch seconds."""
LAST = int((datetime(2200, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
STEP = 7 * 86400
"""Offsets are sampled weekly and every change found is narrowed to the second (no zone has
changed its offset twice within a week since 1970 and back again)."""
NAME_LIMIT = 64


def _offset(zone: zoneinfo.ZoneInfo, epoch: int) -> int:
    offset = datetime.fromtimestamp(epoch, zone).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def zone_table(name: str) -> ZoneTable | None:
    """The zone's table, or None when the tz database has no zone of that name."""
    if name in ("", "UTC", "Etc/UTC"):
        return UTC_TABLE
    if len(name) > NAME_LIMIT or name.startswith(("/", ".")) or ".." in name:
        return None
    try:
        zone = zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None
    instants: list[int] = []
    offsets = [_offset(zone, FIRST)]
    for moment in range(FIRST, LAST, STEP):
        following = moment + STEP
        offset = _offset(zone, following)
        if offset != offsets[-1]:
            low, high = moment, following  # the change lies in (low, high]
            while high - low > 1:
                middle = (low + high) // 2
                if _offset(zone, middle) == offsets[-1]:
                    low = middle
                else:
                    high = middle
            instants.append(high)
            offsets.append(offset)
    return ZoneTable(name, tuple(instants), tuple(offsets))


class ZoneTables(Mapping[str, ZoneTable]):
    """IANA name -> ZoneTable, each built once when first asked for (thread-safe)."""

    def __init__(self) -> None:
        self._tables: dict[str, ZoneTable | None] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> ZoneTable:
        table = self._tables.get(name)
        if table is None and name not in self._tables:
            built = zone_table(name)
            with self._lock:
                self._tables[name] = built
            table = built
        if table is None:
            raise KeyError(name)
        return table

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, table in self._tables.items() if table is not None])

    def __len__(self) -> int:
        return sum(1 for table in self._tables.values() if table is not None)


ZONES = ZoneTables()
"""The process's tables (a zone's offsets do not change while a process runs)."""
