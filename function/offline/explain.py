"""``castslice explain``: which PodMutations match each Pod of a manifest, their rank, the winner,
and what the winner would change."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from function.offline.mutations import documents_from
from function.offline.podmutations import explain, load, pod_of


def _read_documents(path: str) -> list[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def run(args: argparse.Namespace) -> int:
    try:
        documents = _read_documents(args.filename)
        extra = documents_from(args.mutations)
    except (OSError, yaml.YAMLError) as error:
        print(f"castslice explain: cannot read {args.filename}: {error}", file=sys.stderr)
        return 2
    loaded = load([*documents, *extra])
    for bad in loaded.invalid:
        print(f"podmutation/{bad.name}: invalid, ignored: {'; '.join(bad.problems)}")
    for index, doc in enumerate(documents):
        found = pod_of(doc, index) if isinstance(doc, dict) else None
        if found is None:
            continue
        metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        namespace = str((metadata or {}).get("namespace") or args.namespace)
        result = explain(found[0], namespace, loaded.valid)
        w = result.workload
        print(
            f"{str(doc.get('kind', '?')).lower()}/{(metadata or {}).get('name', '?')}: "
            f"workload {w.kind}/{w.name} in namespace {w.namespace}"
        )
        if not result.selection.candidates:
            print("  no PodMutation matches")
            continue
        for place, candidate in enumerate(result.selection.candidates, start=1):
            tied = candidate in result.selection.tied
            mark = "winner" if place == 1 else "tied, lost by name" if tied else ""
            print(
                f"  {place}. {candidate.mutation.name} (generation {candidate.mutation.generation}): "
                f"{candidate.rank.describe()}" + (f"  <- {mark}" if mark else "")
            )
        print(f"  changes: {'; '.join(result.changes) or 'none'}")
        for op in result.patch:
            print(f"    {json.dumps(op, sort_keys=True)}")
        for warning in result.warnings:
            print(f"  warning: {warning}")
    return 0
