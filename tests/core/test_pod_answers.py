"""function/core/pod.py, answer by answer: warnings fitted to the apiserver's 120 characters and values
quoted for messages, at their edges."""

from __future__ import annotations

import pytest

from function.core.pod import WARNING_LIMIT, fit_warning, shown


def test_a_warning_that_fits_is_kept_whole() -> None:
    head, tail = "h" * 100, "t" * 20
    assert fit_warning(head, tail) == head + tail


def test_a_long_head_is_cut_and_the_tail_kept() -> None:
    head, tail = "h" * 100, "t" * 21
    assert fit_warning(head, tail) == "h" * 96 + "..." + tail
    assert len(fit_warning(head, tail)) == WARNING_LIMIT


def test_a_long_tail_next_to_a_short_head_still_fits() -> None:
    head, tail = "h" * 10, "t" * 115
    assert fit_warning(head, tail) == "h" * 2 + "..." + tail


def test_a_tail_longer_than_the_limit_leaves_no_head() -> None:
    assert fit_warning("head", "t" * 118) == "..." + "t" * 117


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("v" * 24, '"' + "v" * 24 + '"'),
        ("v" * 25, '"' + "v" * 21 + '..."'),
        (5, '"5"'),
        (None, '"None"'),
        ("é\n", '"é\\n"'),
    ],
)
def test_shown_quotes_and_cuts_at_24_by_default(value: object, text: str) -> None:
    assert shown(value) == text


def test_shown_cuts_at_the_limit_given() -> None:
    assert shown("x" * 10, 10) == '"' + "x" * 10 + '"'
    assert shown("x" * 11, 10) == '"xxxxxxx..."'
