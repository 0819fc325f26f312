"""The cluster state file: ``kubectl get ... -o yaml`` output read into the view the watches would build."""

from __future__ import annotations

import io
from pathlib import Path
from typing import NamedTuple

import pytest

from function.core.view import PODS, WatchSpec, by_owner, name_of
from function.offline.state_file import StateFileError, load_state, read_objects

STATE = Path(__file__).parents[1] / "data" / "cluster" / "state.yaml"
RS_UID = "22222222-0000-0000-0000-000000000001"


class Bare(NamedTuple):
    uid: str


def test_load_state_reads_kubectl_get_output() -> None:
    view = load_state(STATE)
    assert view.available and view.synced("pods") and view.synced("replicasets")
    siblings = view.group("pods", RS_UID)
    # The evicted (Failed) Pod is no sibling; the terminating one is kept and marked.
    assert sorted(record.name for record in siblings.values()) == [
        "web-7d4b9c-aaaaa",
        "web-7d4b9c-bbbbb",
        "web-7d4b9c-ccccc",
    ]
    assert sorted((r.placement, r.terminating) for r in siblings.values()) == [
        ("on-demand", False),
        ("spot", False),
        ("spot", True),
    ]
    assert set(view.group("pods", "")) == {"11111111-0000-0000-0000-000000000005"}
    rs = view.index("replicasets")[RS_UID]
    assert (rs.name, rs.replicas, rs.owner.kind, rs.owner.name) == ("web-7d4b9c", 3, "Deployment", "web")
    assert len(view.index("pods")) == 4


def test_load_state_accepts_streams_of_objects_and_only_wanted_specs() -> None:
    text = "---\n".join(
        [
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: n, uid: ua}\n",
            "kind: PodList\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: b, uid: ub}}\n",
            "",
        ]
    )
    view = load_state(io.StringIO(text), [PODS])
    assert set(view.index("pods")) == {"ua", "ub"}
    assert view.names() == ("pods",)
    assert not view.synced("replicasets")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- just\n- a list\n", "document 0: expected a Kubernetes object or List, got list"),
        ("kind: List\nitems: {a: 1}\n", "'items' of a List must be a list"),
        ("kind: List\nitems: [3]\n", "items\\[0\\]: expected a Kubernetes object or List, got int"),
        ("a: [unclosed\n", "not YAML"),
    ],
)
def test_load_state_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(StateFileError, match=message):
        load_state(io.StringIO(text))


def test_an_index_keyed_by_name_holds_any_record() -> None:
    namespaces = WatchSpec(
        "namespaces",
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        key=name_of,
        slim=lambda obj: dict(obj["metadata"].get("labels") or {}),
    )
    text = (
        "kind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: shop, labels: {team: a}}}\n"
    )
    view = load_state(io.StringIO(text), [namespaces])
    assert view.index("namespaces")["shop"] == {"team": "a"}


def test_load_state_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="cannot read it"):
        load_state(tmp_path / "missing.yaml")


def test_load_state_groups_an_index_as_its_own_spec_says() -> None:
    jobs = WatchSpec(
        "jobs", "batch", "v1", "jobs", "Job", group_by=by_owner, slim=lambda obj: Bare(obj["metadata"]["uid"])
    )
    text = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j, uid: j1}\n"
    view = load_state(io.StringIO(text), [jobs])
    assert dict(view.group("jobs", "")) == {"j1": Bare("j1")}


def test_an_object_with_an_items_field_that_is_no_list_kind_is_an_object() -> None:
    text = "apiVersion: v1\nkind: Pod\nitems: 3\nmetadata: {name: p, uid: p1}\n"
    assert set(load_state(io.StringIO(text)).index("pods")) == {"p1"}


def test_load_state_names_where_the_state_came_from(tmp_path: Path) -> None:
    with pytest.raises(StateFileError) as raised:
        load_state(io.StringIO("a: [unclosed\n"))
    assert str(raised.value).startswith("cluster state <stream>: not YAML: ")
    path = tmp_path / "state.yaml"
    path.write_text("a: [unclosed\n")
    with pytest.raises(StateFileError) as raised:
        load_state(path)
    assert str(raised.value).startswith(f"cluster state {path}: not YAML: ")
    with pytest.raises(StateFileError) as raised, path.open() as stream:
        load_state(stream)
    assert str(raised.value).startswith(f"cluster state {path}: not YAML: ")


def test_read_objects_keeps_every_object_in_order_and_names_the_source_as_told() -> None:
    text = "kind: List\nitems:\n- {kind: Namespace, metadata: {name: a}}\n- {kind: Pod, metadata: {uid: p}}\n"
    assert [obj["kind"] for obj in read_objects(io.StringIO(text))] == ["Namespace", "Pod"]
    with pytest.raises(StateFileError, match=r"^cluster state -: not YAML"):
        read_objects(io.StringIO("a: [unclosed\n"), "-")
