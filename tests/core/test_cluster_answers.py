"""function/core/view.py, answer by answer: the records the view keeps, the keys and groups it files
them under, and what the offline loader says about the file it could not read."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from function.core.pod import Owner
from function.core.view import (
    IndexState,
    ReplicaSetRecord,
    StaticView,
    by_owner,
    record_key,
    slim_replicaset,
)


class Bare(NamedTuple):
    uid: str


class OddOwner(NamedTuple):
    uid: str
    owner: str


def replicaset(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "rs", "uid": "u1", **metadata},
    }


def test_a_replicaset_being_deleted_is_marked_terminating() -> None:
    assert slim_replicaset(replicaset(deletionTimestamp="2026-11-25T00:00:00Z")) == ReplicaSetRecord(
        "", "rs", "u1", Owner(), None, terminating=True
    )
    record = slim_replicaset(replicaset())
    assert record is not None and record.terminating is False


def test_records_without_an_owner_group_under_the_empty_key() -> None:
    assert by_owner(Bare("u1")) == ""
    assert by_owner(OddOwner("u1", "not an Owner")) == ""
    assert by_owner({"metadata": {"uid": "u1"}}) == ""


def test_record_key_of_a_whole_object_is_its_metadata_uid() -> None:
    assert record_key({"metadata": {"uid": "u1"}}) == "u1"
    assert record_key(Bare("u2")) == "u2"


@pytest.mark.parametrize("record", [{"metadata": {"uid": 5}}, {"metadata": {"uid": ""}}, Bare("")])
def test_record_key_refuses_a_uid_that_is_not_a_non_empty_string(record: object) -> None:
    with pytest.raises(ValueError) as raised:
        record_key(record)
    assert str(raised.value) == f"a cluster-view record needs a non-empty str uid: {record!r}"


def test_removing_from_an_index_built_without_groups() -> None:
    state = IndexState.build([Bare("a")], None).remove("a", by_owner)
    assert dict(state.records) == {} and dict(state.groups) == {}


def test_a_static_view_can_be_unavailable_and_says_what_it_holds() -> None:
    view = StaticView({"pods": [Bare("a"), Bare("b")], "replicasets": []}, available=False)
    assert view.available is False
    assert repr(view) == "View(available=False, pods=2, replicasets=0)"
    assert repr(StaticView({})) == "View(available=True, )"
