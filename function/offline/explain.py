"""``castslice explain``: which PodMutations match each Pod of a manifest, their rank, the winner,
and what the winner would change; for a Pod opted into GPU slicing, GPU slicing's decision and its
reason (sliced, or left whole and why: a multi-GPU job, no node offering the shared resource);
with ``gpuSlicing.backend: dra``, for every Pod, the claim and the ResourceClaimTemplate it gets;
with ``--cluster``, the GPU lease arithmetic, and the Nodes GPU slicing checks.

Every Pod the preview finds is explained (a PyTorchJob's roles, a LeaderWorkerSet's leader and
workers, a KServe component, ...), each as the webhook will see it: owned by the controller its
owner walk ends at (``discovery.seen_owner``). Every other document gets a line too, so a kind
the preview does not know is never passed over in silence."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from function.contract import EXIT_BAD_INPUT
from function.core.config import Config, ConfigError, watches_for
from function.core.engine import Engine
from function.core.mutators.base import RequestContext
from function.core.mutators.gpu_slicing import OPTIMIZE
from function.core.podmutation.names import is_mutation_document
from function.core.view import EMPTY_VIEW, PODS, REPLICASETS, ClusterView
from function.offline.config import config_from
from function.offline.discovery import dotted, find_pods, resources_outside
from function.offline.leases import STATE_SPECS as LEASE_STATE_SPECS
from function.offline.leases import lease_lines
from function.offline.manifests import describe_name, gpu_resources, owned_pod
from function.offline.mutations import documents_from
from function.offline.podmutations import Explanation, explain, load
from function.offline.sources import manifest_sources
from function.offline.state_file import StateFileError, load_state
from function.offline.yamldoc import DocumentError


def _documents(filenames: list[str], recursive: bool) -> list[Any]:
    found: list[Any] = []
    for _, text in manifest_sources(filenames, recursive):
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
                found.extend(doc["items"])
            elif doc is not None:
                found.append(doc)
    return found


def _print_explanation(result: Explanation) -> None:
    if not result.selection.candidates:
        print("  no PodMutation matches")
        return
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


def run(args: argparse.Namespace) -> int:
    try:
        documents = _documents(args.filename, args.recursive)
        extra = documents_from(args.mutations)
        config = config_from(args.config)
        cluster = (
            load_state(args.cluster, (*(watches_for(config) or (PODS, REPLICASETS)), *LEASE_STATE_SPECS))
            if args.cluster
            else None
        )
    except OSError as error:
        print(f"castslice explain: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (yaml.YAMLError, DocumentError) as error:
        print(f"castslice explain: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except StateFileError as error:
        print(f"castslice explain: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    slicing = _slicing_teller(config, cluster)
    loaded = load([*documents, *extra])
    # As castslice mutate reports them: on stderr, the Pods explained as if they were not there
    # (the webhook ignores an invalid PodMutation; `castslice mutations validate` fails on one).
    for bad in loaded.invalid:
        print(f"podmutation/{bad.name}: invalid, ignored: {'; '.join(bad.problems)}", file=sys.stderr)
    resources = gpu_resources(config)
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict) or is_mutation_document(doc):
            continue
        head = f"{str(doc.get('kind', '?')).lower()}/{describe_name(doc)}"
        metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        namespace = str((metadata or {}).get("namespace") or args.namespace)
        sites = find_pods(doc)
        for path, resource in resources_outside(doc, sites, resources):
            where = dotted(path)
            print(f"{head}: warning: {resource} requested at {where} is in no Pod template castslice knows")
        if not sites:
            print(f"{head}: creates no Pod castslice can find: nothing to explain")
            continue
        for site in sites:
            pod = owned_pod(doc, site, index)
            where = f" {site.label}" if site.label else ""
            if cluster is not None:
                print(f"{head}{where}:")
                for line in lease_lines(config, pod, namespace, cluster):
                    print(line)
            result = explain(pod, namespace, loaded.valid)
            w = result.workload
            print(f"{head}{where}: workload {w.kind}/{w.name} in namespace {w.namespace}")
            if slicing is not None:
                line = slicing(pod, namespace)
                if line:
                    print(f"  {line}")
            _print_explanation(result)
    return 0


def _slicing_teller(config: Config, cluster: ClusterView | None) -> Any:
    """Pod, namespace -> GPU slicing's line for it, as the webhook decides it (with the cluster
    state of --cluster, if any), or "" for a Pod it has nothing to say about; None when GPU
    slicing is off. With the dra backend every Pod gets a line (the claim and template it gets,
    or why none); else only a Pod that opts in (castops.io/optimize)."""
    section = config.section("gpuSlicing")
    if not section.enabled:
        return None
    engine = Engine(config)
    every_pod = section.backend == "dra"

    def tell(pod: dict[str, Any], namespace: str) -> str:
        metadata = pod.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
        if not every_pod and not (isinstance(annotations, dict) and OPTIMIZE in annotations):
            return ""
        request = RequestContext(namespace=namespace, cluster=cluster if cluster is not None else EMPTY_VIEW)
        decision = engine.decide(pod, request)
        part = next((d for d in decision.decisions if d.mutator == "gpu-slicing"), None)
        if part is None:
            return f"gpu-slicing: {decision.outcome}: {decision.reason}"
        warnings = "".join(f"\n  warning: {warning}" for warning in part.warnings)
        return f"gpu-slicing: {part.action.value}: {part.reason}{warnings}"

    return tell
