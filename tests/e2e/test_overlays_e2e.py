"""Every knative/ overlay, with and without the eventing component, through a server-side dry
run on the e2e apiserver, with the Knative and cert-manager CRDs installed: the apiserver's own
validation (schemas, CRD openAPI types, defaulting) accepts every object an overlay renders.

Self-contained (its own CRD installation tolerates CRDs another test module installed), so it
runs alone: python -m pytest tests/e2e/test_overlays_e2e.py
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.crds import apply_dry_run, crd_documents
from tests.manifests_support import KNATIVE_DIR, kustomization_dirs, render

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = [d for d in kustomization_dirs() if d.parent.name == "overlays"]
EXPECTED = {"knative-route", "deployment", "knative-route-eventing", "deployment-eventing"}


def install_crds_once(api: Any, timeout: float = 60) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(api)
    names = []
    for crd in crd_documents():
        try:
            extensions.create_custom_resource_definition(crd)
        except ApiException as error:
            if error.status != 409:  # already installed by another module
                raise
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            conditions = {
                c.type: c.status
                for c in extensions.read_custom_resource_definition(name).status.conditions or []
            }
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not established: {conditions}")
            time.sleep(0.2)
    time.sleep(1)  # discovery of the new groups is asynchronous in the apiserver


@pytest.fixture(scope="module")
def api(control_plane: Any) -> Any:
    api = control_plane.api_client()
    install_crds_once(api)
    return api


def test_the_overlays_are_the_four_documented_ones() -> None:
    assert {d.name for d in OVERLAYS} == EXPECTED


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[d.name for d in OVERLAYS])
def test_overlay_passes_a_server_side_dry_run(api: Any, overlay: Path) -> None:
    objects = render(overlay)
    assert objects
    apply_dry_run(api, objects, str(overlay.relative_to(ROOT)))


def test_base_passes_a_server_side_dry_run(api: Any) -> None:
    apply_dry_run(api, render(KNATIVE_DIR / "base"), "knative/base")
