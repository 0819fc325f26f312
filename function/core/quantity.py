"""Kubernetes resource quantities, parsed with the apiserver's own strict grammar.

``kubernetes.utils.parse_quantity`` and ``Decimal`` accept strings the apiserver rejects (``"1e"``,
``" 1"``, ``"1.5.0"`` through Decimal, ``"0x10"``...), so the rules checker uses this instead.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

# <signedNumber><suffix>, exactly as k8s.io/apimachinery/pkg/api/resource documents it.
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    pass


def parse_quantity(raw: object) -> Fraction | int:
    """The exact value of a quantity as JSON carries it (a string, or a JSON number): an int for
    the common plain whole number (an int is a Fraction with denominator 1 for every caller)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise QuantityError(f"{raw!r} is not a quantity")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and 0 < len(raw) <= 18 and raw.isascii() and raw.isdigit():
        return int(raw)  # the fast path: "1", "8", "16" (18 digits stay far from int()'s limit)
    text = raw if isinstance(raw, str) else repr(raw)
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity")
    # Through Decimal: Fraction(str) converts the digits with int(), which refuses more than
    # 4,300 of them (sys.int_info.str_digits_check_threshold); the apiserver accepts any number.
    value = Fraction(Decimal(match["number"]))
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * Fraction(10) ** _DECIMAL[suffix]
    if suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > 1000:
            raise QuantityError(f"{text!r} has an exponent out of range")
        return value * Fraction(10) ** exponent
    return value


def times(quantity: str, count: int) -> str:
    """``count`` x a quantity, written with the quantity's own suffix ("2Gi" x 3 = "6Gi",
    "500m" x 3 = "1500m", "0.5" x 3 = "1.5"): what a slice count asks of each device capacity."""
    match = _QUANTITY.match(quantity)
    if match is None:
        raise QuantityError(f"{quantity!r} is not a quantity")
    number = Decimal(match["number"]) * count
    whole = number == number.to_integral_value()
    written = str(int(number)) if whole else format(number.normalize(), "f")
    return written + (match["suffix"] or "")
