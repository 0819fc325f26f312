"""``castslice explain``: which PodMutations match each Pod of a manifest, their rank, the winner,
and what the winner would change; with ``gpuSlicing.backend: dra``, also the claim and the
ResourceClaimTemplate GPU slicing gives the Pod; with ``--cluster``, the GPU lease arithmetic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from function.core.config import Config, ConfigError, watches_for
from function.core.engine import Engine
from function.core.mutators.base import RequestContext
from function.core.view import PODS, REPLICASETS
from function.offline.config import config_from
from function.offline.leases import STATE_SPECS as LEASE_STATE_SPECS
from function.offline.leases import lease_lines
from function.offline.mutations import documents_from
from function.offline.podmutations import explain, load, pod_of
from function.offline.state_file import StateFileError, load_state


def _read_documents(path: str) -> list[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def run(args: argparse.Namespace) -> int:
    try:
        documents = _read_documents(args.filename)
        extra = documents_from(args.mutations)
        config = config_from(args.config)
        cluster = (
            load_state(args.cluster, (*(watches_for(config) or (PODS, REPLICASETS)), *LEASE_STATE_SPECS))
            if args.cluster
            else None
        )
    except (OSError, yaml.YAMLError) as error:
        print(f"castslice explain: cannot read {args.filename}: {error}", file=sys.stderr)
        return 2
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except StateFileError as error:
        print(f"castslice explain: {error}", file=sys.stderr)
        return 2
    claims = _claim_teller(config)
    loaded = load([*documents, *extra])
    for bad in loaded.invalid:
        print(f"podmutation/{bad.name}: invalid, ignored: {'; '.join(bad.problems)}")
    for index, doc in enumerate(documents):
        found = pod_of(doc, index) if isinstance(doc, dict) else None
        if found is None:
            continue
        metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        namespace = str((metadata or {}).get("namespace") or args.namespace)
        if cluster is not None:
            print(f"{str(doc.get('kind', '?')).lower()}/{(metadata or {}).get('name', '?')}:")
            for line in lease_lines(config, found[0], namespace, cluster):
                print(line)
        result = explain(found[0], namespace, loaded.valid)
        w = result.workload
        print(
            f"{str(doc.get('kind', '?')).lower()}/{(metadata or {}).get('name', '?')}: "
            f"workload {w.kind}/{w.name} in namespace {w.namespace}"
        )
        if claims is not None:
            print(f"  {claims(found[0], namespace)}")
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


def _claim_teller(config: Config) -> Any:
    """With the dra backend: Pod, namespace -> GPU slicing's line for it (the claim and template
    it gets, or why none), as the webhook decides it without cluster state; else None."""
    section = config.section("gpuSlicing")
    if not section.enabled or section.backend != "dra":
        return None
    engine = Engine(config)

    def tell(pod: dict[str, Any], namespace: str) -> str:
        decision = engine.decide(pod, RequestContext(namespace=namespace))
        part = next((d for d in decision.decisions if d.mutator == "gpu-slicing"), None)
        if part is None:
            return f"gpu-slicing: {decision.outcome}: {decision.reason}"
        return f"gpu-slicing: {part.action.value}: {part.reason}"

    return tell
