"""The fence: a write is sent only in a term that has not ended (by its deadline or a lost lead),
with at most the time left in it, by the client of that term (whose User-Agent names it); reads
need no term; a thread bound to an old term never borrows a newer one."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from function.control.fence import Fence, term_user_agent
from function.kube.client import ApiResponse
from function.kube.elector import Term, TermEnded
from tests.support.fake_api import FakeApi


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recording(FakeApi):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.timeouts: list[float] = []

    def request(self, method: str, path: str, **kwargs: Any) -> ApiResponse:
        self.timeouts.append(kwargs.get("timeout", 10.0))
        return ApiResponse(200, {"by": self.name})


def test_a_write_outside_any_term_is_refused_and_a_read_is_not() -> None:
    base = Recording("base")
    fence = Fence(base)
    assert fence.request("GET", "/api/v1/pods").body == {"by": "base"}
    with pytest.raises(TermEnded, match="outside any term"):
        fence.request("POST", "/api/v1/namespaces/ml/events", body={})


def test_a_write_goes_through_its_terms_client_with_the_time_left() -> None:
    clock = Clock()
    clients: dict[int, Recording] = {}

    def for_term(term: Term) -> Recording:
        clients[term.number] = Recording(term_user_agent(term))
        return clients[term.number]

    fence = Fence(Recording("base"), for_term)
    term = Term("control-a", 4, 3.0, clock)
    fence.bind(term)
    answer = fence.request("PATCH", "/x", timeout=10.0)
    assert answer.body == {"by": "castslice-control/control-a term/4"}
    assert clients[4].timeouts == [3.0]
    clock.now = 3.0
    with pytest.raises(TermEnded, match="term 4 of control-a has ended"):
        fence.request("PATCH", "/x")


def test_a_revoked_term_refuses_at_once_and_an_old_thread_never_borrows_the_new_term() -> None:
    clock = Clock()
    fence = Fence(Recording("base"))
    old = Term("a", 1, 100.0, clock)
    refused: list[BaseException] = []
    bound = threading.Event()
    go = threading.Event()

    def old_worker() -> None:
        fence.bind(old)
        bound.set()
        go.wait(5)
        try:
            fence.request("DELETE", "/x")
        except TermEnded as error:
            refused.append(error)

    thread = threading.Thread(target=old_worker)
    thread.start()
    bound.wait(5)
    old.revoke()
    fence.bind(Term("b", 2, 100.0, clock))  # this thread: the new term's
    go.set()
    thread.join(5)
    assert len(refused) == 1
    assert fence.request("DELETE", "/x").status == 200
