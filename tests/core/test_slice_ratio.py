"""castops.io/slice-ratio: the documented rule, value by value, and a message that never contradicts it."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from function.core.mutators.slice_ratio import accepted, accepted_short, parse_slice_ratio

LIMIT = 1000


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("8", 8),
        # As Go's strconv.Atoi (upstream CastSlice): leading zeros and one leading + are the number.
        ("08", 8),
        ("+8", 8),
        ("+08", 8),
        ("0008", 8),
        ("1", 1),
        ("1000", 1000),
        ("01000", 1000),
        ("+1000", 1000),
    ],
)
def test_accepted_forms_are_the_number_they_denote(raw: str, expected: int) -> None:
    assert parse_slice_ratio(raw, LIMIT) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "0",
        "00",
        "+0",
        "-0",
        "-8",
        "-08",
        "1001",
        "01001",
        "9999",
        "",
        "+",
        "++8",
        "+-8",
        "8.0",
        "1.5",
        "1e3",
        " 8",
        "8 ",
        "8\n",
        "8_0",
        "0x10",
        "abc",
        "٨",  # Arabic-Indic eight: int() takes it, the rule says digits 0-9
        "８",  # fullwidth eight
    ],
)
def test_refused_forms(raw: str) -> None:
    assert parse_slice_ratio(raw, LIMIT) is None


@pytest.mark.parametrize("raw", [8, 8.0, None, True, ["8"]])
def test_only_strings_are_read(raw: object) -> None:
    assert parse_slice_ratio(raw, LIMIT) is None


def test_the_limit_is_the_configured_one() -> None:
    assert parse_slice_ratio("12", 12) == 12
    assert parse_slice_ratio("13", 12) is None
    assert parse_slice_ratio("10", 9) is None  # more digits than the limit has
    assert parse_slice_ratio("0000000009", 9) == 9


def test_huge_digit_strings_are_refused_without_reading_them() -> None:
    """int() raises on more than 4,300 digits (and is slow below): such values must not reach it."""
    started = time.perf_counter()
    cases = [
        ("9" * 5000, None),
        ("1" + "0" * 300_000, None),
        ("+" + "7" * 4301, None),
        ("0" * 200_000 + "8", 8),
    ]
    for raw, expected in cases:
        assert parse_slice_ratio(raw, LIMIT) == expected
    assert time.perf_counter() - started < 1.0


def test_the_message_states_the_rule() -> None:
    assert (
        accepted(LIMIT)
        == "a whole number from 1 to 1000 in digits 0-9 (a leading + or leading zeros are allowed)"
    )
    assert accepted_short(7) == "digits 0-9 for a whole number 1-7"


_MESSAGE_RULE = re.compile(r"\+?0*[0-9]+")
"""The message, read literally: digits 0-9, optionally a leading + and leading zeros."""


@given(st.text(alphabet="+-0123456789.e _\n٨", max_size=8))
def test_the_parser_agrees_with_the_message(raw: str) -> None:
    """Accepted exactly when the message's rule says so: its form, and a value from 1 to the limit."""
    by_message = _MESSAGE_RULE.fullmatch(raw) is not None and 1 <= int(raw.lstrip("+")) <= LIMIT
    assert (parse_slice_ratio(raw, LIMIT) is not None) is by_message
    if by_message:
        assert parse_slice_ratio(raw, LIMIT) == int(raw.lstrip("+"))
