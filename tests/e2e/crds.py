"""Install the Knative and cert-manager CRDs (the project's copies) into the e2e apiserver, and
apply rendered manifests with a server-side dry run.

The CRDs go in exactly as shipped, CEL rules (``x-kubernetes-validations``) and defaults included:
the e2e apiserver is a current Kubernetes, which compiles and enforces them. The rendered objects
are sent as they are too (``policy/v1`` PodDisruptionBudgets included).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def crd_documents() -> list[dict[str, Any]]:
    documents = []
    for path in sorted(SCHEMAS.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                documents.append(document)
    return documents


def install_crds(api: Any, timeout: float = 60) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(api)
    names = []
    for crd in crd_documents():
        try:
            extensions.create_custom_resource_definition(crd)
        except ApiException as error:
            if error.status != 409:  # already installed by another module (test_overlays_e2e.py)
                raise
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


def apply_dry_run(api: Any, objects: list[dict[str, Any]], origin: str) -> None:
    """Create every object with dryRun=All (Namespaces for real first: namespaced dry runs need them)."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    dyn = dynamic.DynamicClient(api)
    failures = []
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
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
