"""PodMutation filter regexes, matched in time linear in the text: RE2, the engine behind Go's
``regexp`` package, which CAST AI's pod mutator (written in Go) uses. So a filter written for CAST
AI means the same thing here, and no pattern can make a review backtrack: Python's ``re`` takes
seconds for ``(a+)+b`` against a name of 30 ``a``s, past the webhook's timeout; RE2 takes
microseconds. What RE2 cannot run (backreferences, lookaround, possessive quantifiers, Python's
``\\Z``, repetitions above 1000) is refused when the PodMutation is validated, with the pattern named.
"""

from __future__ import annotations

from typing import Any

import re2  # untyped (mypy: ignore_missing_imports); wrapped here in typed calls

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported to the user, not logged by RE2 on stderr
_OPTIONS.never_capture = True  # only "does it match" is asked: no groups to track

REMEMBERED = 256
"""Answers kept per pattern: the same names, namespaces, kinds and label keys come back review
after review, and a dict lookup costs a fraction of a call into RE2 (a C++ call through pybind11,
several times a backtracking ``re`` match of a short name). Cleared when full: bounded memory."""
REMEMBERED_TEXT = 256
"""Longer texts are matched every time (no Kubernetes name is longer than 253 characters)."""


class RegexError(ValueError):
    """A pattern RE2 cannot run; the message names it and says why."""


class LinearRegex:
    """A compiled pattern whose ``fullmatch`` runs in linear time. Pickled as its pattern (the
    compiled form lives in C), so compiled PodMutations can be handed to another process."""

    __slots__ = ("_compiled", "_seen", "pattern")

    def __init__(self, pattern: str) -> None:
        try:
            compiled = re2.compile(pattern, _OPTIONS)
        except re2.error as error:
            why = _why(error)
            raise RegexError(
                f"{pattern!r} is not a valid regex (RE2, Go's regexp syntax, linear time): {why}"
            ) from None
        self.pattern = pattern
        self._compiled = compiled
        self._seen: dict[str, bool] = {}

    def fullmatch(self, text: str) -> bool:
        seen = self._seen.get(text)
        if seen is not None:
            return seen
        try:
            found = self._compiled.fullmatch(text) is not None
        except UnicodeEncodeError:  # a lone surrogate (YAML can carry one): matched as its bytes
            found = self._compiled.fullmatch(text.encode("utf-8", "surrogatepass")) is not None
        if len(text) <= REMEMBERED_TEXT:
            if len(self._seen) >= REMEMBERED:
                self._seen.clear()  # reviews on other threads may read it meanwhile: a miss, no harm
            self._seen[text] = found
        return found

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (LinearRegex, (self.pattern,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinearRegex) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"LinearRegex({self.pattern!r})"


def _why(error: Exception) -> str:
    message = error.args[0] if error.args else ""
    return message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)


def compile_linear(pattern: str) -> LinearRegex:
    """The pattern compiled by RE2; RegexError (naming it) when RE2 cannot run it."""
    return LinearRegex(pattern)
