"""function/zones.py, the edge that hands the pure core its time zones: every table agrees with the
tz database (zoneinfo) at any instant and in both directions, and a name it does not hold is
absent, never an error."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from function.core.schedule import UTC_TABLE
from function.zones import ZONES, ZoneTables, zone_table

NAMES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "America/Sao_Paulo")


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(NAMES), seconds=st.integers(0, 4_000_000_000))
def test_a_table_agrees_with_the_tz_database_at_any_instant(name: str, seconds: int) -> None:
    table = ZONES[name]
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    local = moment.astimezone(zoneinfo.ZoneInfo(name))
    assert table.local(moment) == local.replace(tzinfo=None)
    # Back again: the first instant showing that wall-clock time (a repeated one: the earlier).
    back = table.utc(local.replace(tzinfo=None))
    assert back <= moment and back.astimezone(zoneinfo.ZoneInfo(name)).replace(tzinfo=None) == local.replace(
        tzinfo=None
    )


def test_utc_and_unknown_names() -> None:
    assert zone_table("UTC") is UTC_TABLE and zone_table("") is UTC_TABLE
    tables = ZoneTables()
    for name in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime", "x" * 100):
        assert zone_table(name) is None
        assert name not in tables
        with pytest.raises(KeyError):
            tables[name]
    assert "Europe/Berlin" in tables and list(tables) == ["Europe/Berlin"] and len(tables) == 1
