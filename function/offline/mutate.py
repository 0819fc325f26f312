"""``castslice mutate``: apply the webhook to manifests offline, kubectl-style (``-f FILE|DIR|-``,
``-R``, ``-o yaml|json|patch``), with the cluster state and PodMutations the webhook would see."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from function.contract import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_INTERNAL
from function.core.config import Config, ConfigError, watches_for
from function.core.engine import Engine
from function.core.podmutation.names import is_mutation_document
from function.core.view import (
    EMPTY_VIEW,
    PODS,
    REPLICASETS,
    ClusterView,
    StaticView,
)
from function.offline.config import config_from
from function.offline.leases import STATE_SPECS as LEASE_STATE_SPECS
from function.offline.leases import with_gpu_leases
from function.offline.manifests import ObjectResult, mutate_chunk
from function.offline.sources import manifest_sources, several
from function.offline.state_file import StateFileError, load_state
from function.offline.yamldoc import DocumentError, load_documents


def _report(result: ObjectResult, out: TextIO, prefix: str) -> None:
    head = f"{prefix}{result.kind.lower()}/{result.name}"
    for problem in result.errors:
        print(f"{head}: invalid: {problem}", file=out)
    if not result.sites:
        print(f"{head}: skipped: {result.note}", file=out)
    for site in result.sites:
        where = f" {site.label}" if site.label else ""
        if site.site.found_by == "walk":
            where += " (found by the general walk)"
        decision = site.decision
        # The per-mutator lines carry the reasons; the summary adds one only when no mutator spoke.
        summary = f"{head}{where}: {decision.outcome}"
        if not decision.decisions or decision.outcome == "error":
            summary += f": {decision.reason}"
        print(summary, file=out)
        for part in decision.decisions:
            print(f"  {part.mutator}: {part.action.value}: {part.reason}", file=out)
        for warning in decision.warnings:
            print(f"  warning: {warning}", file=out)
        if site.problem:
            print(f"  error: {site.problem}", file=out)
    for problem in result.warnings:
        print(f"  warning: {problem}", file=out)
    for unjudged in result.unjudged:
        print(f"  warning: {unjudged}", file=out)
    for hint in result.hints:
        print(f"  hint: {hint}", file=out)


def _stream(sources: list[list[str]]) -> Iterator[str]:
    """One YAML stream of several files: a ``---`` between them, each file's text untouched.

    Yielded document by document: written in pieces, a reader that goes away (``| head``) is
    noticed at the next write, where one huge write could end silently short."""
    previous = ""
    for pieces in sources:
        for number, piece in enumerate(pieces):
            if number == 0 and previous:
                if not previous.endswith("\n"):
                    yield "\n"
                if not piece.startswith("---"):
                    yield "---\n"
            if piece:
                yield piece
                previous = piece


def _cluster_from(path: str | None, config: Config) -> ClusterView:
    """The cluster state a decision may read offline: what ``kubectl get pods,replicasets -A -o
    yaml`` printed, read as the webhook's watches would keep it. None: no state (EMPTY_VIEW)."""
    if path is None:
        return EMPTY_VIEW
    return load_state(path, (*(watches_for(config) or (PODS, REPLICASETS)), *LEASE_STATE_SPECS))


def _with_podmutations(
    config: Config, documents: list[Any], out: TextIO, cluster: ClusterView = EMPTY_VIEW
) -> tuple[Config, ClusterView]:
    """PodMutation documents among ``documents`` as the cluster view the webhook would have; with
    any, the podMutations mutator is switched on (naming them is asking for them). PodMutations are
    compiled only when there are some: a manifest without one does not load their machinery."""
    if not any(is_mutation_document(document) for document in documents):
        return config, cluster
    from function.offline.podmutations import WithMutations, load

    loaded = load(documents)
    if not loaded.records:
        return config, cluster
    for record in loaded.valid:
        print(f"podmutation/{record.name}: loaded (generation {record.generation})", file=out)
        for warning in record.warnings:
            print(f"  warning: {warning}", file=out)
    for bad in loaded.invalid:
        print(f"podmutation/{bad.name}: invalid, ignored: {'; '.join(bad.problems)}", file=out)
    for name in loaded.disabled:
        print(f"podmutation/{name}: enabled: false, ignored", file=out)
    section = config.section("podMutations")
    if not section.enabled:
        config = config.model_copy(update={"podMutations": section.model_copy(update={"enabled": True})})
    mutations = StaticView({"podmutations": loaded.records}, specs=())
    return config, WithMutations(cluster, mutations) if cluster.available else mutations


def _mutation_documents(paths: list[str] | None) -> list[Any]:
    """The documents of every ``--mutations`` (none without it)."""
    if not paths:
        return []
    from function.offline.mutations import documents_from

    return documents_from(paths)


def _write_patches(results: list[ObjectResult]) -> None:
    patches = [
        {
            "source": r.source,
            "index": r.index,
            "item": r.item,
            "kind": r.kind,
            "name": r.name,
            "namespace": r.namespace,
            "patch": r.patch(),
        }
        for r in results
        if r.sites
    ]
    json.dump(patches, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _write_list(results: list[ObjectResult]) -> bool:
    # Always a List (what `kubectl get -o json` prints for several objects), whatever the
    # number of objects: scripts read one shape, and kubectl apply -f - takes it as is.
    items = [r.plain for r in results if isinstance(r.plain, dict)]
    try:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2, allow_nan=False)
    except ValueError:  # YAML's .inf and .nan: kubectl cannot send them either
        print("castslice mutate: a value is .inf or .nan, which JSON cannot carry", file=sys.stderr)
        return False
    sys.stdout.write(text + "\n")
    return True


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from(args.config)
        sources = manifest_sources(args.filename, args.recursive)
        loaded = [(label, load_documents(text, label)) for label, text in sources]
        cluster = _cluster_from(args.cluster, config)
        extra = _mutation_documents(args.mutations)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except StateFileError as error:
        print(f"castslice mutate: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:
        print(f"castslice mutate: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DocumentError as error:
        print(f"castslice mutate: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # PodMutation documents in the input or in --mutations: the view the webhook would have.
    documents = [chunk.tree for _, chunks in loaded for chunk in chunks if not chunk.empty]
    config, cluster = _with_podmutations(config, [*documents, *extra], sys.stderr, cluster)
    config, cluster = with_gpu_leases(config, cluster)
    engine = Engine(config)
    named = several(args.filename)
    results: list[ObjectResult] = []
    texts: list[list[str]] = []
    for label, chunks in loaded:
        pieces = []
        for index, chunk in enumerate(chunks):
            objects, text = mutate_chunk(engine, chunk, label, index, args.namespace, cluster)
            results.extend(objects)
            pieces.append(text)
        texts.append(pieces)

    for result in results:
        if is_mutation_document(result.plain):
            continue  # reported when loaded
        _report(result, sys.stderr, f"{result.source}: " if named else "")

    if args.output == "patch":
        _write_patches(results)
    elif args.output == "json":
        if not _write_list(results):
            return EXIT_BAD_INPUT
    else:
        for piece in _stream(texts):
            sys.stdout.write(piece)

    if any(r.internal_error for r in results):
        return EXIT_INTERNAL
    if any(r.errors for r in results):
        return EXIT_BAD_INPUT
    return EXIT_DENIED if any(r.denied for r in results) else 0
