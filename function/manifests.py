"""Offline mutation of manifests: find the Pod (or Pod template) in each document, run the engine.

Used by ``castslice mutate`` so a user sees what the webhook would do before deploying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from function.cluster import EMPTY_VIEW, ClusterView
from function.engine import Decision, Engine
from function.mutators.base import RequestContext
from function.patch import Operation, copy_json, escape

# Where the Pod template sits in each workload kind the apiserver turns into Pods.
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(frozen=True)
class DocumentResult:
    index: int
    kind: str
    name: str
    document: Any
    decision: Decision | None
    note: str
    """Why the document was not judged (no Pod template), or the decision's reason."""

    @property
    def denied(self) -> bool:
        return self.decision is not None and not self.decision.allowed

    def patch(self) -> list[Operation]:
        """The decision's patch, with paths relative to the whole document (not just the Pod)."""
        if self.decision is None or not self.decision.patch:
            return []
        prefix = "".join("/" + escape(part) for part in TEMPLATE_PATHS.get(self.kind, ()))
        return [{**op, "path": prefix + op["path"]} for op in self.decision.patch]


def _describe_name(document: dict[str, Any]) -> str:
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    name = (metadata or {}).get("name") or (metadata or {}).get("generateName") or "(unnamed)"
    return str(name)


def pod_of(document: dict[str, Any], index: int = 0) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(the Pod the document makes, its template or None for a Pod), or None if it makes no Pod.

    A workload's Pod carries a controller ownerReference naming the workload (offline uid), as the
    apiserver's Pods carry one: what the Pod belongs to is part of its identity (PodMutation
    filters match a Deployment's Pods by kind Deployment and its name). ``_replace_template``
    drops that reference again."""
    kind = str(document.get("kind", "?"))
    if kind == "Pod":
        return document, None
    if kind not in TEMPLATE_PATHS:
        return None
    template: Any = document
    for part in TEMPLATE_PATHS[kind]:
        template = template.get(part) if isinstance(template, dict) else None
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        return None
    metadata: dict[str, Any] = template["metadata"] if isinstance(template.get("metadata"), dict) else {}
    if not metadata.get("ownerReferences"):
        owner = {
            "apiVersion": str(document.get("apiVersion", "")),
            "kind": kind,
            "name": _describe_name(document),
            "uid": f"offline-{index}",
            "controller": True,
        }
        metadata = {**metadata, "ownerReferences": [owner]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}
    return pod, template


def mutate_document(
    engine: Engine, index: int, document: Any, default_namespace: str, cluster: ClusterView = EMPTY_VIEW
) -> DocumentResult:
    """``cluster``: the state from ``--cluster STATE.yaml``; EMPTY_VIEW (none) makes a mutator that
    needs the cluster say so instead of guessing."""
    if not isinstance(document, dict):
        return DocumentResult(index, "?", "?", document, None, "not a Kubernetes object: left as is")
    kind = str(document.get("kind", "?"))
    name = _describe_name(document)
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    namespace = str((metadata or {}).get("namespace") or default_namespace)

    found = pod_of(document, index)
    if found is None:
        if kind in TEMPLATE_PATHS:
            return DocumentResult(index, kind, name, document, None, "no Pod template found: left as is")
        return DocumentResult(index, kind, name, document, None, f"{kind} creates no Pods: left as is")
    pod, template = found

    request = RequestContext(
        uid=f"offline-{index}", namespace=namespace, operation="CREATE", dry_run=True, cluster=cluster
    )
    decision = engine.decide(pod, request)
    result = document
    if decision.mutated_pod is not None:
        if template is None:
            result = decision.mutated_pod
        else:
            result = _replace_template(document, kind, decision.mutated_pod, template)
    return DocumentResult(index, kind, name, result, decision, decision.reason)


def _replace_template(
    document: dict[str, Any], kind: str, pod: dict[str, Any], original: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = copy_json(document)
    template = result
    for part in TEMPLATE_PATHS[kind]:
        template = template[part]
    original_metadata = original.get("metadata") if isinstance(original.get("metadata"), dict) else {}
    if "ownerReferences" not in (original_metadata or {}) and isinstance(pod.get("metadata"), dict):
        pod = {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k != "ownerReferences"}}
    if pod.get("metadata") or "metadata" in template:
        template["metadata"] = pod.get("metadata", {})
    template["spec"] = pod["spec"]
    return result
