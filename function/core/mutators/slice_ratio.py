"""``castops.io/slice-ratio``: the one place that says which values are accepted and reads them.

The rule: decimal digits 0-9, optionally led by one ``+`` and by zeros, denoting a whole number
from 1 to ``maxSliceRatio``. So ``"8"``, ``"08"`` and ``"+8"`` all mean 8. Upstream CastSlice is
written in Go and most likely reads the annotation with ``strconv.Atoi``, which takes those forms
too: a Pod that upstream slices is sliced here the same. ``"0"``, ``"-8"``, ``"8.0"``, ``"1e3"``,
``" 8"``, ``"8\\n"``, non-ASCII digits (``int()`` would take ``"٨"``) and ``"8_0"`` are refused.

The value is compared as a string before ``int()`` sees it: a ratio of thousands of digits (an
annotation may hold up to 256 KiB) is refused by its length, never handed to ``int()``, which
raises on more than 4,300 digits and is quadratic below that.
"""

from __future__ import annotations

import re

_SLICE_RATIO_FORM = re.compile(r"\+?[0-9]+")
"""Used with fullmatch (so "8\\n" is no match); [0-9] is ASCII only, unlike \\d or int()."""


def accepted(limit: int) -> str:
    """What the denial says is accepted: it must agree with parse_slice_ratio in every case."""
    return f"a whole number from 1 to {limit} in digits 0-9 (a leading + or leading zeros are allowed)"


def accepted_short(limit: int) -> str:
    """The same rule in few words, for a warning that must fit in 120 characters."""
    return f"digits 0-9 for a whole number 1-{limit}"


def parse_slice_ratio(raw: object, limit: int) -> int | None:
    """The slice count ``raw`` denotes, or None when it is not accepted (see the module)."""
    if not isinstance(raw, str) or not _SLICE_RATIO_FORM.fullmatch(raw):
        return None
    digits = raw.removeprefix("+").lstrip("0")
    # More digits than the limit has (leading zeros gone) is always above it: refused unread.
    if not digits or len(digits) > len(str(limit)):
        return None
    value = int(digits)
    return value if value <= limit else None
