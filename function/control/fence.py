"""The fence between a term of leadership and the writes made in it.

Every reconciler writes through one ``Fence`` (it is the ``Api`` they are built with). A worker
binds its thread to the term it was started in (``bind``); each write then checks that term first
(``Term.check``: refused, never sent, once the term has ended, by its deadline or by a lost lead),
is given at most the time left in it, and carries it in its User-Agent
(``castslice-control/<identity> term/<n>``), so the apiserver's own records (its audit log) say
which term made every write. A read needs no term (it changes nothing). A worker of a term that
has ended may still be finishing a reconcile: its writes fail with TermEnded, and the next term's
workers are new threads bound to the new term, so no write can borrow a newer term.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from function.kube.client import Api, ApiResponse
from function.kube.elector import Term, TermEnded

READS = frozenset({"GET", "HEAD"})


def term_user_agent(term: Term, component: str = "castslice-control") -> str:
    return f"{component}/{term.identity} term/{term.number}"


class Fence:
    """``Api`` for reconcilers: ``base`` for reads; for writes, the Api of the calling thread's
    term (``for_term(term)``, made once per term: a client whose User-Agent names the term)."""

    def __init__(self, base: Api, for_term: Callable[[Term], Api] | None = None) -> None:
        self.base = base
        self._for_term = for_term or (lambda term: base)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._apis: dict[int, tuple[Term, Api]] = {}

    def bind(self, term: Term | None) -> None:
        """The calling thread writes in ``term`` from now on (None: it may not write)."""
        self._local.term = term

    def term(self) -> Term | None:
        return getattr(self._local, "term", None)

    def _api(self, term: Term) -> Api:
        with self._lock:
            known = self._apis.get(id(term))
            if known is None or known[0] is not term:
                # Only the newest term writes: older terms' clients go.
                self._apis = {id(term): (term, self._for_term(term))}
                known = self._apis[id(term)]
            return known[1]

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> ApiResponse:
        if method.upper() in READS:
            return self.base.request(
                method, path, body=body, content_type=content_type, query=query, timeout=timeout
            )
        term = self.term()
        what = f"{method} {path}"
        if term is None:
            raise TermEnded(f"{what}: written outside any term; not sent")
        left = term.check(what)
        return self._api(term).request(
            method, path, body=body, content_type=content_type, query=query, timeout=min(timeout, left)
        )
