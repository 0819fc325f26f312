"""function/offline/podmutations.py: PodMutations read from files and API-form
documents, the view that puts them in place of the cluster's, what ``explain`` reports, and the Pod
each workload kind makes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from function.core.podmutation.compiled import CompiledMutation, InvalidMutation
from function.core.podmutation.match import Workload
from function.offline.podmutations import (
    Loaded,
    WithMutations,
    compile_document,
    documents_in,
    explain,
    is_mutation_document,
    load,
)
from tests.support.cli import run


def pm(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "PodMutation",
        "metadata": {"name": name},
        "spec": spec,
    }


API_FORM = {"name": "from-console", "objectFilter": {"names": ["web"]}, "labels": {"a": "1"}}


# --- the view ---------------------------------------------------------------------------------------


class NamedView:
    """A view whose every index and group answers with its own name, so the test sees who answered."""

    def __init__(self, name: str, synced: bool) -> None:
        self.name, self.is_synced = name, synced

    available = False

    def index(self, name: str) -> Mapping[str, Any]:
        return {"from": self.name, "index": name}

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        return {"from": self.name, "index": name, "key": key}

    def synced(self, name: str) -> bool:
        return self.is_synced


def test_the_given_mutations_replace_the_clusters_own() -> None:
    view = WithMutations(NamedView("cluster", synced=False), NamedView("files", synced=False))
    assert view.available is True
    assert view.index("podmutations") == {"from": "files", "index": "podmutations"}
    assert view.index("pods") == {"from": "cluster", "index": "pods"}
    assert view.group("podmutations", "k") == {"from": "files", "index": "podmutations", "key": "k"}
    assert view.group("pods", "k") == {"from": "cluster", "index": "pods", "key": "k"}
    assert view.synced("podmutations") is True and view.synced("pods") is False


# --- documents --------------------------------------------------------------------------------------


def test_mutation_documents_are_podmutations_or_the_api_form() -> None:
    assert is_mutation_document(pm("m", {}))
    assert is_mutation_document(API_FORM)
    assert not is_mutation_document({"apiVersion": "v1", "kind": "Pod"})


def test_an_api_form_document_compiles_under_its_name() -> None:
    compiled = compile_document(API_FORM)
    assert isinstance(compiled, CompiledMutation) and compiled.name == "from-console"
    assert compiled.spec.labels == {"a": "1"}


def test_a_bad_api_form_document_is_recorded_with_the_reason() -> None:
    bad = {"name": "broken", "objectFilter": {"zones": []}}
    assert compile_document(bad) == InvalidMutation(
        "broken",
        "api-form",
        0,
        ("objectFilter: unknown field(s) zones (accepted: names, namespaces, kinds, labels)",),
        "api-form/broken",
    )


def test_documents_in_a_directory_are_read_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("kind: B\n---\n---\nkind: C\n")
    (tmp_path / "a.json").write_text(json.dumps({"kind": "A"}))
    (tmp_path / "c.yml").write_text("kind: D\n")
    (tmp_path / "notes.txt").write_text("kind: Ignored\n")
    assert documents_in(tmp_path) == [
        (f"{tmp_path / 'a.json'}#0", {"kind": "A"}),
        (f"{tmp_path / 'b.yaml'}#0", {"kind": "B"}),
        (f"{tmp_path / 'b.yaml'}#2", {"kind": "C"}),
        (f"{tmp_path / 'c.yml'}#0", {"kind": "D"}),
    ]
    assert documents_in(tmp_path / "notes.txt") == [(f"{tmp_path / 'notes.txt'}#0", {"kind": "Ignored"})]


def test_loading_keeps_valid_invalid_and_disabled_apart() -> None:
    loaded = load(
        [
            pm("ok", {"labels": {"a": "1"}}),
            pm("broken", {"bogus": 1}),
            {**API_FORM, "name": "off", "enabled": False},
            {"apiVersion": "v1", "kind": "ConfigMap"},
        ]
    )
    assert [m.name for m in loaded.valid] == ["ok"]
    assert [m.name for m in loaded.invalid] == ["broken"]
    assert loaded.disabled == ["off"]
    assert set(loaded.records) == {"castops.io/ok", "castops.io/broken"}


def test_adding_returns_the_record_or_nothing_for_a_disabled_one() -> None:
    loaded = Loaded()
    record = loaded.add(pm("m", {}))
    assert isinstance(record, CompiledMutation) and loaded.records == {"castops.io/m": record}
    assert loaded.add({**API_FORM, "enabled": False}) is None
    assert loaded.disabled == ["from-console"]
    enabled = loaded.add({**API_FORM, "enabled": True})
    assert isinstance(enabled, CompiledMutation)


# --- explain ----------------------------------------------------------------------------------------


def a_pod(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "labels": labels or {}},
        "spec": {},
    }


def test_explain_without_a_match_says_only_whose_pod_it_is() -> None:
    explanation = explain(
        a_pod(), "prod", load([pm("m", {"filter": {"workload": {"names": ["api"]}}})]).valid
    )
    assert explanation.workload == Workload("prod", "Pod", "web")
    assert explanation.selection.winner is None
    assert (explanation.changes, explanation.patch, explanation.warnings) == ((), (), ())


def test_explain_reports_the_winners_changes_patch_and_warnings_without_touching_the_pod() -> None:
    target = a_pod({"old": "1"})
    spec = {"labels": {"a": "1"}, "patches": [{"op": "remove", "path": "/spec/nothing"}]}
    explanation = explain(target, "prod", load([pm("m", spec)]).valid)
    assert explanation.changes == ("labels a",)
    assert explanation.patch == (
        {"op": "add", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/metadata/annotations", "value": {"castops.io/pod-mutation": "m/0"}},
    )
    assert len(explanation.warnings) == 1 and explanation.warnings[0].startswith("patches not applied: ")
    assert target == a_pod({"old": "1"})


# -- --mutations as -f: repeated, it adds; an invalid one reported alike by mutate and explain -----
POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers: [{name: c, image: nginx}]
"""


def mutation(name: str, spec: str) -> str:
    return f"apiVersion: castops.io/v1alpha1\nkind: PodMutation\nmetadata: {{name: {name}}}\nspec: {spec}\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    paths = {
        "pod": POD,
        "labels": mutation("labels", "{labels: {team: ml}}"),
        "tolerations": mutation("tolerations", "{tolerations: [{key: gpu, operator: Exists}]}"),
        "broken": mutation("broken", "{nodeselector: {a: b}}"),
    }
    for name, text in paths.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return {name: str(tmp_path / f"{name}.yaml") for name in paths}


@pytest.mark.parametrize("command", ["mutate", "explain"])
def test_repeated_mutations_add_up_as_repeated_f_does(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, str], command: str
) -> None:
    code, out, err = run(
        monkeypatch,
        command,
        "-f",
        files["pod"],
        "--mutations",
        files["labels"],
        "--mutations",
        files["tolerations"],
    )
    assert code == 0, err
    report = out if command == "explain" else err
    assert "labels" in report and "tolerations" in report


@pytest.mark.parametrize("command", ["mutate", "explain"])
def test_an_invalid_mutation_is_reported_on_stderr_and_ignored_alike(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, str], command: str
) -> None:
    code, out, err = run(monkeypatch, command, "-f", files["pod"], "--mutations", files["broken"])
    line = "podmutation/broken: invalid, ignored: spec.nodeselector: unknown field"
    assert (code, line in err.splitlines(), line in out) == (0, True, False)
