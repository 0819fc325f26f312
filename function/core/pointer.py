"""JSON Pointer (RFC 6901) reference tokens: the one place '/' and '~' in a key are escaped.

Every path the webhook writes (the patch, the PodMutation expansions) and every path it reads back
(the proof, the audit trail's redaction, ``castslice mutate``'s sites) goes through these, so
``nvidia.com/gpu`` is ``nvidia.com~1gpu`` everywhere.
"""

from __future__ import annotations

import re

_BAD_ESCAPE = re.compile(r"~(?![01])")


def escape(token: str) -> str:
    """'~' becomes '~0' and '/' becomes '~1' (so nvidia.com/gpu is nvidia.com~1gpu)."""
    if "~" not in token and "/" not in token:
        return token
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    """'~1' becomes '/' and then '~0' becomes '~' (in that order, so '~01' reads '~1')."""
    return token.replace("~1", "/").replace("~0", "~") if "~" in token else token


def escape_problem(token: str) -> str | None:
    """Why ``token`` is no reference token RFC 6901 allows (a '~' not followed by 0 or 1), or None.
    For pointers users write; the webhook's own are escaped by ``escape`` and need no check."""
    if _BAD_ESCAPE.search(token):
        return "'~' must be followed by 0 or 1 (RFC 6901 escapes ~0 and ~1)"
    return None


def tokens(pointer: str) -> tuple[str, ...]:
    """The unescaped reference tokens of a pointer ('' is the whole document: no tokens)."""
    return tuple(unescape(token) for token in pointer.split("/")[1:]) if pointer else ()
