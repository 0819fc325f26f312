"""RFC 6901 reference tokens: escaped and unescaped in one place, for every path the webhook writes
or reads back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from function.core.pointer import escape, escape_problem, tokens, unescape


@given(st.text(alphabet="ab~/01", max_size=12))
def test_unescape_undoes_escape(token: str) -> None:
    assert unescape(escape(token)) == token
    assert "/" not in escape(token) and escape_problem(escape(token)) is None


def test_unescape_reads_tilde_one_before_tilde_zero() -> None:
    assert unescape("~01") == "~1"  # not "/": RFC 6901 section 4
    assert unescape("nvidia.com~1gpu") == "nvidia.com/gpu"
    assert unescape("plain") == "plain"


@pytest.mark.parametrize("token", ["~", "a~2", "~x", "end~"])
def test_a_tilde_not_followed_by_zero_or_one_is_named(token: str) -> None:
    assert escape_problem(token) == "'~' must be followed by 0 or 1 (RFC 6901 escapes ~0 and ~1)"


def test_tokens_of_a_pointer() -> None:
    assert tokens("") == ()
    assert tokens("/") == ("",)
    assert tokens("/metadata/annotations/castops.io~1placement") == (
        "metadata",
        "annotations",
        "castops.io/placement",
    )


def test_escape_follows_rfc_6901() -> None:
    assert escape("nvidia.com/gpu") == "nvidia.com~1gpu"
    assert escape("a~b/c") == "a~0b~1c"
