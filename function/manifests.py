"""Offline mutation of manifests: find the Pod (or Pod template) in each document, run the engine.

Used by ``castslice mutate`` so a user sees what the webhook would do before deploying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def mutate_document(engine: Engine, index: int, document: Any, default_namespace: str) -> DocumentResult:
    if not isinstance(document, dict):
        return DocumentResult(index, "?", "?", document, None, "not a Kubernetes object: left as is")
    kind = str(document.get("kind", "?"))
    name = _describe_name(document)
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    namespace = str((metadata or {}).get("namespace") or default_namespace)

    if kind == "Pod":
        pod, template = document, None
    elif kind in TEMPLATE_PATHS:
        template = document
        for part in TEMPLATE_PATHS[kind]:
            template = template.get(part) if isinstance(template, dict) else None
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            return DocumentResult(index, kind, name, document, None, "no Pod template found: left as is")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": template.get("metadata") or {},
            "spec": template["spec"],
        }
    else:
        return DocumentResult(index, kind, name, document, None, f"{kind} creates no Pods: left as is")

    request = RequestContext(uid=f"offline-{index}", namespace=namespace, operation="CREATE", dry_run=True)
    decision = engine.decide(pod, request)
    result = document
    if decision.mutated_pod is not None:
        if template is None:
            result = decision.mutated_pod
        else:
            result = _replace_template(document, kind, decision.mutated_pod)
    return DocumentResult(index, kind, name, result, decision, decision.reason)


def _replace_template(document: dict[str, Any], kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = copy_json(document)
    template = result
    for part in TEMPLATE_PATHS[kind]:
        template = template[part]
    if pod.get("metadata") or "metadata" in template:
        template["metadata"] = pod.get("metadata", {})
    template["spec"] = pod["spec"]
    return result
