"""function/core/quantity.py: Kubernetes quantities parsed exactly as the apiserver reads them,
and what a bad one says."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from function.core.quantity import QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("0", 0),
        ("+2", 2),
        ("-3", -3),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("500m", Fraction(1, 2)),
        ("3k", 3000),
        ("1Ki", 1024),
        ("2Gi", 2 * 2**30),
        ("1e3", 1000),
        ("1E-2", Fraction(1, 100)),
        ("10n", Fraction(1, 10**8)),
        (7, 7),
        (2.5, Fraction(5, 2)),
    ],
)
def test_quantities_parse_like_the_apiserver(text: Any, value: Any) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", " 1", "1 ", "1.5.0", "0x10", "1e", "1Kb", "abc", "1ki", "--1", True, None, [1]]
)
def test_quantities_the_apiserver_rejects(text: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", 1),
        ("123456789012345678", 123456789012345678),  # the longest plain number on the fast path
        ("1234567890123456789", 1234567890123456789),  # one digit more: the grammar's path
        ("1e1000", Fraction(10) ** 1000),
        ("1e-1000", Fraction(1, 10**1000)),
        ("1.5Ki", 1536),
        ("500m", Fraction(1, 2)),
        (2, 2),
    ],
)
def test_quantities_parse_exactly(raw: object, value: Fraction | int) -> None:
    assert parse_quantity(raw) == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (True, "True is not a quantity"),
        (None, "None is not a quantity"),
        ("", "'' is not a quantity"),
        ("1e", "'1e' is not a quantity"),
        (" 1", "' 1' is not a quantity"),
        ("1e1001", "'1e1001' has an exponent out of range"),
        ("1e-1001", "'1e-1001' has an exponent out of range"),
    ],
)
def test_a_bad_quantity_says_what_it_is(raw: object, message: str) -> None:
    with pytest.raises(QuantityError) as bad:
        parse_quantity(raw)
    assert str(bad.value) == message
