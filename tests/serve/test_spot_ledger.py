"""The edge's ledger of recent spot decisions: TTL, bounds, what is recorded, the view wrapper."""

from __future__ import annotations

import threading

from function.core.mutators.spot import LEDGER_INDEX, PODS_INDEX, LedgerEntry
from function.core.placement import DECISION_ANNOTATION, PLACEMENT_LABEL
from function.core.view import EMPTY_VIEW, StaticView
from function.serve.spot_ledger import DecisionLedger, ViewWithLedger
from tests.spot_support import make_pod, owner, siblings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    ledger = DecisionLedger(ttl_seconds=10, clock=clock)
    ledger.record("rs", "a", "spot")
    clock.now += 5
    ledger.record("rs", "b", "on-demand")
    assert ledger.snapshot() == {"rs": (LedgerEntry("a", "spot"), LedgerEntry("b", "on-demand"))}
    clock.now += 6
    assert ledger.snapshot() == {"rs": (LedgerEntry("b", "on-demand"),)}
    clock.now += 5
    assert ledger.snapshot() == {}


def test_bounded_per_owner_and_in_owners() -> None:
    ledger = DecisionLedger(max_per_owner=2, max_owners=2, clock=Clock())
    for decision in "abc":
        ledger.record("rs1", decision, "spot")
    ledger.record("rs2", "x", "spot")
    ledger.record("rs1", "d", "spot")  # rs1 becomes the most recent owner
    ledger.record("rs3", "y", "spot")  # rs2 is the oldest: dropped
    snapshot = ledger.snapshot()
    assert set(snapshot) == {"rs1", "rs3"}
    assert [entry.decision for entry in snapshot["rs1"]] == ["c", "d"]


def test_nothing_without_owner_decision_or_placement() -> None:
    ledger = DecisionLedger(clock=Clock())
    ledger.record("", "a", "spot")
    ledger.record("rs", "", "spot")
    ledger.record("rs", "a", "maybe")
    assert ledger.snapshot() == {}


def test_observe_admitted_records_a_placed_pod_only() -> None:
    ledger = DecisionLedger(clock=Clock())
    placed = make_pod(
        owner(uid="rs"), labels={PLACEMENT_LABEL: "spot"}, annotations={DECISION_ANNOTATION: "u1"}
    )
    assert ledger.observe_admitted(placed)
    assert not ledger.observe_admitted(make_pod(owner(uid="rs"), labels={PLACEMENT_LABEL: "spot"}))
    assert not ledger.observe_admitted(
        make_pod(labels={PLACEMENT_LABEL: "spot"}, annotations={DECISION_ANNOTATION: "u2"})
    )
    assert not ledger.observe_admitted(None)
    assert ledger.snapshot() == {"rs": (LedgerEntry("u1", "spot"),)}


def test_concurrent_records_are_all_kept() -> None:
    ledger = DecisionLedger(clock=Clock())

    def work(worker: int) -> None:
        for number in range(200):
            ledger.record("rs", f"{worker}-{number}", "spot")

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ledger.snapshot()["rs"]) == 800


def test_view_with_ledger_adds_the_index_and_delegates_the_rest() -> None:
    inner = StaticView({PODS_INDEX: siblings(spot=1, owner_uid="rs")})
    view = ViewWithLedger(inner, {"rs": (LedgerEntry("a", "spot"),)})
    assert view.available
    assert view.index(LEDGER_INDEX) == {"rs": (LedgerEntry("a", "spot"),)}
    assert len(view.index(PODS_INDEX)) == 1 and len(view.group(PODS_INDEX, "rs")) == 1
    assert view.synced(LEDGER_INDEX) and view.synced(PODS_INDEX) and not view.synced("namespaces")
    assert not ViewWithLedger(EMPTY_VIEW, {}).available
