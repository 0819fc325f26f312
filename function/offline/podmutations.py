"""PodMutations offline: read them from files (``castslice mutate --mutations DIR``, ``castslice
mutations validate``) and explain which ones match a Pod (``castslice explain``)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from function.core.json_patch import diff
from function.core.podmutation.apply import apply_mutation
from function.core.podmutation.compiled import (
    CompiledMutation,
    InvalidMutation,
    compile_object,
    from_api_form,
)
from function.core.podmutation.match import Selection, Workload, select, workload_of
from function.core.podmutation.names import is_api_form, is_mutation_document
from function.core.view import ClusterView, Overlay

Record = CompiledMutation | InvalidMutation
OUR_INDEX = "podmutations"


class WithMutations(Overlay):
    """A cluster view (``--cluster STATE.yaml``) with the PodMutations given on the command line
    in place of its own ``podmutations`` index."""

    __slots__ = ("mutations",)

    def __init__(self, base: ClusterView, mutations: ClusterView) -> None:
        super().__init__(base, {OUR_INDEX: mutations.index(OUR_INDEX)})
        self.mutations = mutations

    @property
    def available(self) -> bool:
        return True

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        return self.mutations.group(name, key) if name == OUR_INDEX else self.base.group(name, key)


def compile_document(doc: Mapping[str, Any]) -> Record:
    """A PodMutation object, or a CAST AI API-form document (``enabled: false`` still compiles:
    the caller decides whether to use it)."""
    if is_api_form(doc):
        name = str(doc.get("name", ""))
        try:
            doc = from_api_form(doc)
        except ValueError as error:
            return InvalidMutation(name, "api-form", 0, (str(error),), f"api-form/{name}")
    return compile_object(doc)


def documents_in(path: Path) -> list[tuple[str, Any]]:
    """(origin, document) for a YAML/JSON file, or every *.yaml/*.yml/*.json file of a directory."""
    files = (
        sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        if path.is_dir()
        else [path]
    )
    found: list[tuple[str, Any]] = []
    for file in files:
        for number, doc in enumerate(yaml.safe_load_all(file.read_text(encoding="utf-8"))):
            if doc is not None:
                found.append((f"{file}#{number}", doc))
    return found


@dataclass
class Loaded:
    records: dict[str, Record] = field(default_factory=dict)  # uid -> record, as the view keys them
    disabled: list[str] = field(default_factory=list)  # API-form documents with enabled: false

    def add(self, doc: Mapping[str, Any]) -> Record | None:
        if is_api_form(doc) and doc.get("enabled") is False:
            self.disabled.append(str(doc.get("name", "")))
            return None
        record = compile_document(doc)
        self.records[record.uid] = record
        return record

    @property
    def valid(self) -> list[CompiledMutation]:
        return [r for r in self.records.values() if isinstance(r, CompiledMutation)]

    @property
    def invalid(self) -> list[InvalidMutation]:
        return [r for r in self.records.values() if isinstance(r, InvalidMutation)]


def load(documents: Iterable[Any]) -> Loaded:
    loaded = Loaded()
    for doc in documents:
        if is_mutation_document(doc):
            loaded.add(doc)
    return loaded


@dataclass(frozen=True)
class Explanation:
    workload: Workload
    selection: Selection
    changes: tuple[str, ...]
    patch: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]


def explain(pod: dict[str, Any], namespace: str, mutations: Iterable[CompiledMutation]) -> Explanation:
    """Which mutations match, ranked, and what the winner would change (as JSON Patch operations)."""
    workload = workload_of(pod, namespace)
    selection = select(mutations, workload, pod)
    if selection.winner is None:
        return Explanation(workload, selection, (), (), ())
    result, done = apply_mutation(copy.deepcopy(pod), selection.winner.mutation)
    return Explanation(
        workload, selection, tuple(done.changes), tuple(diff(pod, result)), tuple(done.warnings)
    )
