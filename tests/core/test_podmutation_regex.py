"""function/core/podmutation/regex.py: PodMutation filter regexes on RE2, Go's regexp syntax, in
linear time; its remembered answers never change an answer."""

from __future__ import annotations

import pickle

import pytest

from function.core.podmutation import regex
from function.core.podmutation.regex import RegexError, compile_linear


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("frontend-.*", "frontend-v2", True),
        ("frontend-.*", "my-frontend-v2", False),  # the whole name, as before
        (r"app-\d+", "app-12", True),
        (r"app-\d+", "app-١٢", False),  # Go's \d is ASCII only (Python's re would match)
        ("web$", "web\n", False),  # Go's $ is the end of the text (Python's matches before a newline)
        (r"web\z", "web", True),
        ("(?i)WEB", "web", True),
    ],
)
def test_patterns_mean_what_they_mean_in_go(pattern: str, text: str, matches: bool) -> None:
    assert compile_linear(pattern).fullmatch(text) is matches


def test_remembered_answers_are_the_answers_past_the_bound() -> None:
    pattern = compile_linear("a+b?")
    texts = [
        ("a" * n) + ("b" if n % 3 == 0 else "c" if n % 3 == 1 else "") for n in range(1, 3 * regex.REMEMBERED)
    ]
    first = [pattern.fullmatch(t) for t in texts]
    assert first == [pattern.fullmatch(t) for t in texts] == [not t.endswith("c") for t in texts]
    assert len(pattern._seen) <= regex.REMEMBERED
    long = "a" * (regex.REMEMBERED_TEXT + 1)
    assert pattern.fullmatch(long) and long not in pattern._seen


def test_a_lone_surrogate_is_matched_not_raised() -> None:
    assert compile_linear("we.*").fullmatch("web\ud800") is True


def test_compiled_patterns_cross_processes_as_their_text() -> None:
    copied = pickle.loads(pickle.dumps(compile_linear("x+")))
    assert copied == compile_linear("x+") and copied.fullmatch("xx")


def test_a_refusal_names_the_pattern_and_the_reason() -> None:
    with pytest.raises(RegexError, match=r"'\(a\)\\\\1' is not a valid regex \(RE2, Go's regexp syntax.*\\1"):
        compile_linear(r"(a)\1")
