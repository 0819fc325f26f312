"""Install the Knative and cert-manager CRDs (the project's copies) into the e2e apiserver, and
apply rendered manifests with a server-side dry run.

The e2e apiserver is Kubernetes 1.20; the CRD copies are newer. What 1.20 rejects is stripped from
the copies here, in memory, and only that:
- ``x-kubernetes-validations`` (CEL rules, Kubernetes 1.25+), which 1.20 does not know;
- ``default: ""`` (cert-manager's imagePullSecrets names): 1.20 reads an empty-string default as
  null and refuses the CRD ("Invalid value: null: must be of type string"); those names are the
  keys of a ``map`` list, which then needs a default, so such lists become plain (atomic) lists.
The openAPI types stay and are enforced.
Objects rendered for newer clusters are converted the same way, only where 1.20 lacks the API:
- ``policy/v1`` PodDisruptionBudget (1.21+) is sent as ``policy/v1beta1`` (same fields we use).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def _empty_default_keys(node: dict[str, Any]) -> bool:
    properties = (node.get("items") or {}).get("properties") or {}
    keys = node.get("x-kubernetes-list-map-keys") or []
    return any((properties.get(key) or {}).get("default") == "" for key in keys)


def _strip(node: Any) -> Any:
    if isinstance(node, dict) and _empty_default_keys(node):
        dropped = ("x-kubernetes-list-map-keys", "x-kubernetes-list-type")
        node = {k: v for k, v in node.items() if k not in dropped}
    if isinstance(node, dict):
        return {
            k: _strip(v)
            for k, v in node.items()
            if k != "x-kubernetes-validations" and not (k == "default" and v == "")
        }
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def crd_documents() -> list[dict[str, Any]]:
    documents = []
    for path in sorted(SCHEMAS.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                documents.append(_strip(document))
    return documents


def install_crds(api: Any, timeout: float = 60) -> None:
    from kubernetes import client

    extensions = client.ApiextensionsV1Api(api)
    names = []
    for crd in crd_documents():
        extensions.create_custom_resource_definition(crd)
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            status = extensions.read_custom_resource_definition(name).status
            conditions = {c.type: c.status for c in (status.conditions or [])}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not established: {conditions}")
            time.sleep(0.2)
    time.sleep(1)  # discovery of the new groups is asynchronous in the apiserver


def for_kubernetes_1_20(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["apiVersion"] == "policy/v1" and obj["kind"] == "PodDisruptionBudget":
        return {**obj, "apiVersion": "policy/v1beta1"}
    return obj


def apply_dry_run(api: Any, objects: list[dict[str, Any]], origin: str) -> None:
    """Create every object with dryRun=All (Namespaces for real first: namespaced dry runs need them)."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    dyn = dynamic.DynamicClient(api)
    failures = []
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
        obj = for_kubernetes_1_20(obj)
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace")
        try:
            if obj["kind"] == "Namespace":
                try:
                    resource.create(body=obj)
                except ApiException as error:
                    if error.status != 409:
                        raise
                continue
            resource.create(body=obj, namespace=namespace, query_params=[("dryRun", "All")])
        except ApiException as error:
            failures.append(f"{origin}: {obj['kind']}/{obj['metadata']['name']}: {error.status} {error.body}")
    assert not failures, "\n".join(failures)
