"""Every knative/ overlay, with and without the eventing component, through a server-side dry
run on the e2e apiserver, with the Knative and cert-manager CRDs installed: the apiserver's own
validation (schemas, CRD openAPI types, defaulting) accepts every object an overlay renders.

Self-contained (its own CRD installation tolerates CRDs another test module installed), so it
runs alone: python -m pytest tests/e2e/test_overlays_e2e.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.crds import install_crds
from tests.support.manifests import KNATIVE_DIR, kustomization_dirs, render

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = [d for d in kustomization_dirs() if d.parent.name == "overlays"]
EXPECTED = {
    "knative-route",
    "knative-route-host",
    "deployment",
    "knative-route-eventing",
    "deployment-eventing",
}


def strict_dry_run(api: Any, objects: list[dict[str, Any]], origin: str) -> None:
    """Create every object with dryRun=All and fieldValidation=Strict, so that a field the
    apiserver (or a CRD's schema) does not know fails instead of being dropped with a warning.
    Namespaces are created for real first: namespaced dry runs need them."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    dyn = dynamic.DynamicClient(api)
    failures = []
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
        try:
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        except ResourceNotFoundError:
            if (obj["apiVersion"], obj["kind"]) != ("policy/v1", "PodDisruptionBudget"):
                raise
            obj = {**obj, "apiVersion": "policy/v1beta1"}  # Kubernetes before 1.21, same fields
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        try:
            if obj["kind"] == "Namespace":
                try:
                    resource.create(body=obj)
                except ApiException as error:
                    if error.status != 409:
                        raise
                continue
            resource.create(
                body=obj,
                namespace=obj["metadata"].get("namespace"),
                query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
            )
        except ApiException as error:
            failures.append(f"{origin}: {obj['kind']}/{obj['metadata']['name']}: {error.status} {error.body}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def api(control_plane: Any) -> Any:
    api = control_plane.api_client()
    install_crds(api)
    return api


def test_the_overlays_are_the_documented_ones() -> None:
    assert {d.name for d in OVERLAYS} == EXPECTED
    documented = (ROOT / "docs" / "deploy.md").read_text()
    assert all(f"overlays/{name}" in documented for name in EXPECTED)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[d.name for d in OVERLAYS])
def test_overlay_passes_a_server_side_dry_run(api: Any, overlay: Path) -> None:
    objects = render(overlay)
    assert objects
    strict_dry_run(api, objects, str(overlay.relative_to(ROOT)))


def test_base_passes_a_server_side_dry_run(api: Any) -> None:
    strict_dry_run(api, render(KNATIVE_DIR / "base"), "knative/base")


def test_the_dry_run_refuses_an_unknown_field(api: Any) -> None:
    objects = render(KNATIVE_DIR / "overlays" / "deployment")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    deployment["spec"]["strategy"]["rollingUpdate"]["bogusField"] = 3
    with pytest.raises(AssertionError, match="bogusField"):
        strict_dry_run(api, objects, "mutated deployment overlay")
