"""Offline mutation of manifests: find every Pod and Pod template in each document, run the engine.

Used by ``castslice mutate`` so a user sees what the webhook would do before deploying. Where
the Pods are is function/offline/discovery.py; the round trip that keeps comments and untouched documents
byte for byte is function/offline/yamldoc.py; the checks of YAML typing and misplaced annotations are
function/offline/manifest_checks.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from function.core.config import Config
from function.core.engine import Decision, Engine
from function.core.json_patch import Operation
from function.core.mutators.base import RequestContext
from function.core.view import EMPTY_VIEW, ClusterView
from function.offline.discovery import (
    Path,
    PodSite,
    Unmappable,
    api_group,
    dotted,
    find_pods,
    parse_pointer,
    pointer,
    resources_outside,
    seen_owner,
)
from function.offline.manifest_checks import Problem, misplaced_opt_in, object_problems
from function.offline.yamldoc import Chunk, apply_operations, to_plain

KNATIVE_KINDS = {("serving.knative.dev", "Service"), ("serving.knative.dev", "Configuration")}
KNATIVE_SCHEDULER_HINT = (
    "Knative refuses spec.template.spec.schedulerName unless its kubernetes.podspec-schedulername "
    "feature is enabled; the webhook sets it on the Pods themselves, so leave it out of the manifest"
)


def site_kind(document: dict[str, Any]) -> tuple[str, str]:
    return api_group(document), str(document.get("kind"))


def gpu_resources(config: Config) -> frozenset[str]:
    """Every resource a GPU mutator reads, enabled or not: a request for one where no Pod template
    was found is worth a warning whatever the configuration."""
    names = {config.section("gpuSlicing").sourceResource}
    for device in config.section("vgpu").devices:
        names.update(device.resources)
    return frozenset(name for name in names if name)


@dataclass(frozen=True)
class SiteResult:
    """The engine's decision on one Pod of a document."""

    site: PodSite
    label: str
    """Where the Pod sits in the document (items[0].spec.template); '' for a Pod document."""
    decision: Decision
    patch: tuple[Operation, ...] = ()
    """The decision's patch with paths relative to the whole document."""
    problem: str | None = None
    """Why the change could not be written back into the document (it is then left as is)."""


@dataclass
class ObjectResult:
    """One Kubernetes object of the input (a document, or an item of a ``kind: List``)."""

    source: str
    index: int
    """The document's position in its source (from 0)."""
    item: int | None
    kind: str
    name: str
    namespace: str
    sites: tuple[SiteResult, ...] = ()
    errors: tuple[Problem, ...] = ()
    """Bad input: the object was not judged."""
    warnings: tuple[Problem, ...] = ()
    """Unquoted dates: judged anyway (kubectl keeps them as text)."""
    hints: tuple[str, ...] = ()
    """Where users go wrong: an opt-in on the workload's own metadata."""
    unjudged: tuple[str, ...] = ()
    """GPU requests in places no Pod was found for: warned by name and path, never skipped silently."""
    note: str = ""
    """Why nothing was judged: not an object, no Pods."""
    plain: Any = field(default=None, repr=False)
    """The object after the changes, as JSON values (for -o json)."""

    @property
    def denied(self) -> bool:
        return any(not s.decision.allowed for s in self.sites)

    @property
    def internal_error(self) -> bool:
        return any(s.decision.outcome == "error" or s.problem for s in self.sites)

    def patch(self) -> list[Operation]:
        return [op for site in self.sites for op in site.patch]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def describe_name(document: dict[str, Any]) -> str:
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    name = _text((metadata or {}).get("name")) or _text((metadata or {}).get("generateName"))
    return name or "(unnamed)"


def owned_pod(document: Any, site: PodSite, index: int) -> dict[str, Any]:
    """A workload's Pod as the webhook will see it: with a controller ownerReference naming the
    controller its owner walk ends at (``discovery.seen_owner``; offline uid), and the labels that
    walk reads. PodMutation filters match a Deployment's Pods by kind Deployment and its name, a
    LeaderWorkerSet's by kind StatefulSet. The reference and those labels are in the judged Pod
    only: no patch operation writes them."""
    pod = site.pod(document)
    metadata = pod.get("metadata")
    if not isinstance(document, dict) or not isinstance(metadata, dict) or metadata.get("ownerReferences"):
        return pod
    owner = seen_owner(document, site, describe_name(document))
    if owner is None:
        return pod
    metadata["ownerReferences"] = [owner.reference(f"offline-{index}")]
    if owner.labels and isinstance(metadata.get("labels", {}), dict):
        metadata["labels"] = {**(metadata.get("labels") or {}), **dict(owner.labels)}
    return pod


def _document_operation(site: PodSite, document: Any, prefix: Path, op: Operation) -> tuple[str, Path, Any]:
    pod_path = parse_pointer(op["path"])
    kind = op["op"]
    if site.inherits(document, pod_path):
        # The Pod gets this field from its controller (a Volcano Job's schedulerName): the
        # template may set its own, which wins, but cannot take the controller's away.
        if kind == "remove":
            raise Unmappable(f"{op['path']} comes from the workload, not the template: it cannot be removed")
        kind = "add"
    return kind, (*prefix, *site.document_path(pod_path)), op.get("value")


def _judge(
    engine: Engine,
    obj: Any,
    prefix: Path,
    result: ObjectResult,
    operations: list[tuple[str, Path, Any]],
    cluster: ClusterView = EMPTY_VIEW,
) -> None:
    plain = to_plain(obj)
    sites = find_pods(plain)
    problems = object_problems(obj, sites)
    result.errors = tuple(p for p in problems if p.severity == "error")
    result.warnings = tuple(p for p in problems if p.severity == "warning")
    result.hints = tuple(misplaced_opt_in(plain, sites))
    outside = resources_outside(plain, sites, gpu_resources(engine.config))
    result.unjudged = tuple(
        f"{resource} requested at {dotted((*prefix, *path)) or '(top level)'} is in no Pod template "
        "castslice knows: not previewed (the webhook judges the Pods when they are created)"
        for path, resource in outside
    )
    if not sites:
        kind = result.kind
        if result.unjudged:
            result.note = f"{kind} is not a kind castslice can preview, and it asks for GPUs"
        else:
            result.note = f"{kind} creates no Pods: left as is" if kind != "?" else "not a Kubernetes object"
        return
    if result.errors:
        result.note = "not judged: fix the values above"
        return
    judged = []
    for site in sites:
        request = RequestContext(
            uid=f"offline-{result.index}",
            namespace=result.namespace,
            operation="CREATE",
            dry_run=True,
            cluster=cluster,
        )
        decision = engine.decide(owned_pod(plain, site, result.index), request)
        label = dotted((*prefix, *site.path))
        try:
            mapped = [_document_operation(site, plain, prefix, op) for op in decision.patch]
        except Unmappable as error:
            judged.append(SiteResult(site, label, decision, (), f"cannot write the change back: {error}"))
            continue
        operations.extend(mapped)
        if site_kind(plain) in KNATIVE_KINDS and any(
            path[-1:] == ("schedulerName",) for _, path, _ in mapped
        ):
            result.hints = (*result.hints, KNATIVE_SCHEDULER_HINT)
        patch = tuple(
            {"op": op, "path": pointer(path), **({"value": value} if op != "remove" else {})}
            for op, path, value in mapped
        )
        judged.append(SiteResult(site, label, decision, patch))
    result.sites = tuple(judged)


def mutate_chunk(
    engine: Engine,
    chunk: Chunk,
    source: str,
    index: int,
    default_namespace: str,
    cluster: ClusterView = EMPTY_VIEW,
) -> tuple[list[ObjectResult], str]:
    """The objects of one document with their decisions, and the document's output text.

    ``cluster``: the state from ``--cluster STATE.yaml``; EMPTY_VIEW (none) makes a mutator that
    needs the cluster say so instead of guessing."""
    if chunk.empty:
        return [], chunk.text
    tree = chunk.tree
    if isinstance(tree, dict) and tree.get("kind") == "List" and isinstance(tree.get("items"), list):
        members: Sequence[tuple[Path, Any, int | None]] = [
            (("items", i), item, i) for i, item in enumerate(tree["items"])
        ]
    else:
        members = [((), tree, None)]
    results = []
    operations: list[tuple[str, Path, Any]] = []
    for prefix, obj, item in members:
        if not isinstance(obj, dict):
            results.append(
                ObjectResult(source, index, item, "?", "?", "", note="not a Kubernetes object: left as is")
            )
            continue
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        namespace = _text((metadata or {}).get("namespace")) or default_namespace
        result = ObjectResult(source, index, item, str(obj.get("kind", "?")), describe_name(obj), namespace)
        _judge(engine, obj, prefix, result, operations, cluster)
        results.append(result)
    if operations:
        apply_operations(tree, operations)
    for result, (_, obj, _) in zip(results, members, strict=True):
        result.plain = to_plain(obj)
    return results, chunk.dump() if operations else chunk.text
