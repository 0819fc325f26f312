"""The edge's ledger of recent spot decisions: TTL, bounds, what is recorded, the view wrapper."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest

from function.admission.facts import AuditFacts, audit_facts
from function.core.config import parse_config
from function.core.engine import Decision
from function.core.mutators.spot import PODS_INDEX
from function.core.placement import DECISION_ANNOTATION, LEDGER_INDEX, PLACEMENT_LABEL, LedgerEntry
from function.core.view import EMPTY_VIEW, MUTATION_GROUP_ANNOTATION, Overlay, StaticView
from function.serve.ledger import DecisionTurns, LedgerRecorder, with_ledgers
from function.serve.spot_ledger import DecisionLedger, ledger_for
from tests.support import mutation_records, pod_review
from tests.support.spot import make_pod, owner, siblings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    ledger = DecisionLedger(ttl_seconds=10, clock=clock)
    ledger.record_decision("rs", "a", "spot")
    clock.now += 5
    ledger.record_decision("rs", "b", "on-demand")
    assert ledger.snapshot() == {"rs": (LedgerEntry("a", "spot"), LedgerEntry("b", "on-demand"))}
    clock.now += 6
    assert ledger.snapshot() == {"rs": (LedgerEntry("b", "on-demand"),)}
    clock.now += 5
    assert ledger.snapshot() == {}


def test_bounded_per_owner_and_in_owners() -> None:
    ledger = DecisionLedger(max_per_key=2, max_keys=2, clock=Clock())
    for decision in "abc":
        ledger.record_decision("rs1", decision, "spot")
    ledger.record_decision("rs2", "x", "spot")
    ledger.record_decision("rs1", "d", "spot")  # rs1 becomes the most recent owner
    ledger.record_decision("rs3", "y", "spot")  # rs2 is the oldest: dropped
    snapshot = ledger.snapshot()
    assert set(snapshot) == {"rs1", "rs3"}
    assert [entry.decision for entry in snapshot["rs1"]] == ["c", "d"]


def test_nothing_without_owner_decision_or_placement() -> None:
    ledger = DecisionLedger(clock=Clock())
    ledger.record_decision("", "a", "spot")
    ledger.record_decision("rs", "", "spot")
    ledger.record_decision("rs", "a", "maybe")
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
            ledger.record_decision("rs", f"{worker}-{number}", "spot")

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ledger.snapshot()["rs"]) == 800


def test_view_with_ledger_adds_the_index_and_delegates_the_rest() -> None:
    inner = StaticView({PODS_INDEX: siblings(spot=1, owner_uid="rs")})
    view = Overlay(inner, {LEDGER_INDEX: {"rs": (LedgerEntry("a", "spot"),)}})
    assert view.available
    assert view.index(LEDGER_INDEX) == {"rs": (LedgerEntry("a", "spot"),)}
    assert len(view.index(PODS_INDEX)) == 1 and len(view.group(PODS_INDEX, "rs")) == 1
    assert view.synced(LEDGER_INDEX) and view.synced(PODS_INDEX) and not view.synced("namespaces")
    assert not Overlay(EMPTY_VIEW, {LEDGER_INDEX: {}}).available


# -- bounds and TTL edge, what an admitted Pod must carry, what the recorder hands on, the turns ---
def placed_pod(owner: str = "rs-1", decision: Any = "d-1", placement: str | None = "spot") -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "uid": owner, "controller": True}],
        "annotations": {DECISION_ANNOTATION: decision},
    }
    if placement is not None:
        metadata["labels"] = {PLACEMENT_LABEL: placement}
    return {"metadata": metadata, "spec": {"containers": []}}


# --- the ledger -------------------------------------------------------------------------------------


def test_an_entry_lives_exactly_the_default_60_seconds() -> None:
    clock = Clock()
    ledger = DecisionLedger(clock=clock)
    ledger.record_decision("rs-1", "d-1", "spot")
    clock.now += 60.0
    assert ledger.snapshot() == {"rs-1": (LedgerEntry("d-1", "spot"),)}
    clock.now += 0.001
    assert ledger.snapshot() == {}


def test_the_default_bounds_keep_1024_per_owner_and_4096_owners() -> None:
    ledger = DecisionLedger(clock=Clock())
    for n in range(1025):
        ledger.record_decision("rs-1", f"d-{n}", "spot")
    kept = ledger.snapshot()["rs-1"]
    assert len(kept) == 1024 and kept[0] == LedgerEntry("d-1", "spot")
    for n in range(4096):
        ledger.record_decision(f"other-{n}", "d", "on-demand")
    owners = ledger.snapshot()
    assert len(owners) == 4096 and "rs-1" not in owners and "other-0" in owners


@pytest.mark.parametrize(
    "pod",
    [
        placed_pod(decision=5),
        placed_pod(decision=""),
        placed_pod(placement=None),
        placed_pod(placement="somewhere"),
        {"metadata": "not a map"},
        {"metadata": {"labels": {PLACEMENT_LABEL: "spot"}, "annotations": {DECISION_ANNOTATION: "d-1"}}},
        None,
    ],
)
def test_a_pod_without_owner_placement_and_decision_is_not_remembered(pod: Any) -> None:
    ledger = DecisionLedger(clock=Clock())
    assert ledger.observe_admitted(pod) is False
    assert ledger.snapshot() == {}


def test_a_placed_pod_is_remembered_under_its_owner() -> None:
    ledger = DecisionLedger(clock=Clock())
    assert ledger.observe_admitted(placed_pod(placement="on-demand")) is True
    assert ledger.snapshot() == {"rs-1": (LedgerEntry("d-1", "on-demand"),)}


def test_the_view_with_a_ledger_serves_every_other_index_from_the_view() -> None:
    view = StaticView({"pods": [], "replicasets": []})
    ledger = {"rs-1": (LedgerEntry("d-1", "spot"),)}
    combined = Overlay(view, {LEDGER_INDEX: ledger})
    assert combined.index(LEDGER_INDEX) == ledger
    assert combined.index("pods") is view.index("pods")
    assert combined.synced(LEDGER_INDEX) and combined.available


def test_only_an_enforcing_spot_mutator_or_podmutations_get_a_ledger() -> None:
    assert ledger_for(parse_config({})) is None
    assert ledger_for(parse_config({"spot": {"enabled": True, "mode": "shadow"}})) is None
    assert ledger_for(parse_config({"podMutations": {"enabled": True, "mode": "shadow"}})) is None
    ledger = ledger_for(parse_config({"spot": {"enabled": True, "cacheTTLSeconds": 7}}))
    assert ledger is not None and ledger.ttl_seconds == 7
    ledger = ledger_for(parse_config({"podMutations": {"enabled": True}}))
    assert ledger is not None and ledger.ttl_seconds == 60


def test_a_podmutation_group_is_remembered_with_or_without_a_placement() -> None:
    ledger = DecisionLedger(clock=Clock())
    grouped = placed_pod(placement=None)
    grouped["metadata"]["annotations"][MUTATION_GROUP_ANNOTATION] = "a"
    assert ledger.observe_admitted(grouped) is True
    both = placed_pod(decision="d-2")
    both["metadata"]["annotations"][MUTATION_GROUP_ANNOTATION] = "none"
    assert ledger.observe_admitted(both) is True
    assert ledger.snapshot() == {"rs-1": (LedgerEntry("d-1", None, "a"), LedgerEntry("d-2", "spot", "none"))}


# --- issue 25: a burst under a PodMutation's distribution, in one process ------------------------------

BURST_MUTATIONS = {
    "share": {"spotConfig": {"mode": "only-spot", "distributionPercentage": 50}},
    "groups": {
        "distributionGroups": [
            {"name": "a", "percentage": 50, "configuration": {"spotMode": "only-spot"}},
            {"name": "b", "percentage": 30},
        ]
    },
}


@pytest.mark.parametrize("mutation", sorted(BURST_MUTATIONS))
def test_a_burst_under_a_podmutation_distribution_is_split_exactly_in_one_process(mutation: str) -> None:
    """20 sibling Pods decided by 8 threads at once, none of them in the view yet (the watch lags
    a burst): the ledger and the turns give the PodMutation's share exactly, as they give spot's."""
    from concurrent.futures import ThreadPoolExecutor

    from function.admission.review import Admission
    from function.admission.wire import parse_review
    from function.core.engine import Engine
    from function.core.mutators.pod_mutations_mutator import OUR_MUTATIONS
    from function.core.view import PODS, REPLICASETS

    config = parse_config({"podMutations": {"enabled": True}})
    objects = [{"apiVersion": "castops.io/v1alpha1", "kind": "PodMutation",
                "metadata": {"name": mutation, "generation": 1, "uid": "pm-uid"},
                "spec": BURST_MUTATIONS[mutation]}]  # fmt: skip
    lagging = StaticView(
        {"podmutations": mutation_records(objects), "pods": []}, specs=(PODS, REPLICASETS, OUR_MUTATIONS)
    )
    ledger = ledger_for(config)
    assert ledger is not None
    turns = DecisionTurns()
    admitted: list[Decision] = []
    recorder = Inner()
    admission = Admission(
        Engine(config),
        LedgerRecorder(recorder, [ledger], turns),
        cluster=with_ledgers(lambda: lagging, [ledger], turns),
    )

    def admit(number: int) -> None:
        request = {
            "uid": f"uid-{number}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": make_pod(owner()),
        }
        envelope = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        review = parse_review(json.dumps(envelope).encode())
        answer = admission.review(review)
        assert answer.decision is not None and answer.decision.outcome == "mutated"
        admitted.append(answer.decision)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(admit, range(20)))
    pods = [d.mutated_pod for d in admitted]
    placements = [p["metadata"].get("labels", {}).get(PLACEMENT_LABEL) for p in pods]
    assert placements.count("spot") == 10
    if mutation == "groups":
        groups = [p["metadata"]["annotations"][MUTATION_GROUP_ANNOTATION] for p in pods]
        assert (groups.count("a"), groups.count("b"), groups.count("none")) == (10, 6, 4)
    assert len({p["metadata"]["annotations"][DECISION_ANNOTATION] for p in pods}) == 20


# --- the recorder -------------------------------------------------------------------------------------


class Inner:
    def __init__(self) -> None:
        self.got: list[tuple[AuditFacts, Decision | None]] = []

    def record(self, facts: AuditFacts, decision: Decision | None) -> None:
        self.got.append((facts, decision))


def decision(outcome: Any = "mutated") -> Decision:
    return Decision(outcome, True, "r", mutated_pod=placed_pod())


@pytest.mark.parametrize(
    ("made", "dry_run", "remembered"),
    [
        (decision(), None, True),
        (decision(), False, True),
        (decision(), True, False),
        (decision("unchanged"), None, False),
        (None, None, False),
    ],
)
def test_the_recorder_remembers_only_sent_patches_and_always_hands_on(
    made: Decision | None, dry_run: bool | None, remembered: bool
) -> None:
    ledger, inner, turns = DecisionLedger(clock=Clock()), Inner(), DecisionTurns(wait_seconds=0.05)
    facts = audit_facts(pod_review(dry_run=dry_run), made)
    turns.begin()
    LedgerRecorder(inner, [ledger], turns).record(facts, made)
    assert (ledger.snapshot() != {}) is remembered
    assert inner.got == [(facts, made)]
    assert_turn_is_free(turns)


def test_the_recorder_ends_the_turn_even_when_remembering_fails() -> None:
    class Broken(DecisionLedger):
        def observe_admitted(self, pod: Any) -> bool:
            raise RuntimeError("boom")

    turns = DecisionTurns(wait_seconds=0.05)
    turns.begin()
    with pytest.raises(RuntimeError):
        LedgerRecorder(Inner(), [Broken()], turns).record(audit_facts(pod_review()), decision())
    assert_turn_is_free(turns)


# --- the turns ------------------------------------------------------------------------------------------


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def assert_turn_is_free(turns: DecisionTurns) -> None:
    """Another thread takes the turn without waiting it out (which would log a warning)."""
    warnings = Warnings()
    logger = logging.getLogger("castslice.spot")
    logger.addHandler(warnings)
    try:

        def other() -> None:
            turns.begin()
            turns.end()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(5)
    finally:
        logger.removeHandler(warnings)
    assert warnings.messages == []


def test_a_turn_is_waited_for_half_a_second_by_default_then_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    turns = DecisionTurns()
    assert turns.wait_seconds == 0.5
    quick = DecisionTurns(wait_seconds=0.01)
    quick.begin()
    caplog.set_level(logging.WARNING, logger="castslice.spot")
    thread = threading.Thread(target=quick.begin)
    thread.start()
    thread.join(5)
    assert [r.getMessage() for r in caplog.records] == [
        "spot decision without a turn: another review held it over 0.0 s"
    ]
    quick.end()
    assert_turn_is_free(quick)


def test_the_same_thread_keeps_its_turn_and_a_second_end_is_harmless(
    caplog: pytest.LogCaptureFixture,
) -> None:
    turns = DecisionTurns(wait_seconds=0.01)
    caplog.set_level(logging.WARNING, logger="castslice.spot")
    turns.begin()
    turns.begin()
    assert caplog.records == []
    turns.end()
    assert_turn_is_free(turns)
    turns.end()
    assert_turn_is_free(turns)


def test_a_view_without_cluster_state_stays_unavailable() -> None:
    assert Overlay(EMPTY_VIEW, {LEDGER_INDEX: {}}).available is False


def test_an_end_from_a_thread_without_the_turn_releases_nothing() -> None:
    turns = DecisionTurns(wait_seconds=0.01)
    turns.begin()
    errors: list[BaseException] = []

    def stranger() -> None:
        try:
            turns.end()
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    thread = threading.Thread(target=stranger)
    thread.start()
    thread.join(5)
    assert errors == []
    with pytest.raises(AssertionError):
        assert_turn_is_free(turns)  # still held by this thread
    turns.end()
    assert_turn_is_free(turns)


def test_with_ledger_adds_the_entries_and_takes_the_turn() -> None:
    view = StaticView({"pods": []})
    plain = with_ledgers(lambda: view, [])
    assert plain() is view
    ledger = DecisionLedger(clock=Clock())
    ledger.record_decision("rs-1", "d-1", "spot")
    turns = DecisionTurns(wait_seconds=0.01)
    combined = with_ledgers(lambda: view, [ledger], turns)()
    assert isinstance(combined, Overlay)
    assert combined.base is view and combined.index(LEDGER_INDEX) == {"rs-1": (LedgerEntry("d-1", "spot"),)}
    with pytest.raises(AssertionError):
        assert_turn_is_free(turns)  # the review holds it until its decision is recorded
    turns.end()
    assert_turn_is_free(turns)
    untimed = with_ledgers(lambda: view, [ledger])()
    assert isinstance(untimed, Overlay) and untimed.base is view
