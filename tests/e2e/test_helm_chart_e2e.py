"""charts/castslice's rendered objects through a server-side apply on the e2e apiserver (with the
cert-manager CRDs installed as shipped): the apiserver's own validation, field ownership and
strict field checking accept every object the chart renders, with cert-manager and with certgen.
The objects are applied with dryRun=All (the CRD for real: nothing else would know its kind, and
it is deleted after the module), so no other module meets them. The chart itself is compared
with the kustomize overlay in tests/deploy/test_helm_chart.py; helm comes from
.ci/provision-helm as there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.crds import install_crds
from tests.e2e.support import delete_crd
from tests.support.helm import HELM, REQUIRED, SKIP_REASON, helm_template

pytestmark = pytest.mark.skipif(HELM is None and not REQUIRED, reason=SKIP_REASON)
FIELD_MANAGER = "castslice-helm-e2e"


@pytest.fixture(scope="module")
def api(control_plane: Any) -> Iterator[Any]:
    api = control_plane.api_client()
    install_crds(api)
    yield api
    # The chart's CRDs were created for real: gone again, so that the modules after this one
    # install the project's own as they expect.
    for obj in helm_template("namespace.create=true", "gpuLeases.enabled=true"):
        if obj["kind"] == "CustomResourceDefinition":
            delete_crd(api, obj["metadata"]["name"])


def server_side_apply(api: Any, objects: list[dict[str, Any]]) -> list[str]:
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    dyn = dynamic.DynamicClient(api)
    failures = []
    for obj in sorted(objects, key=lambda o: o["kind"] not in ("Namespace", "CustomResourceDefinition")):
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        real = obj["kind"] in ("Namespace", "CustomResourceDefinition")
        try:
            resource.server_side_apply(
                body=obj,
                name=obj["metadata"]["name"],
                namespace=obj["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                query_params=[("fieldValidation", "Strict"), *([] if real else [("dryRun", "All")])],
            )
        except ApiException as error:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.status} {error.body}")
    return failures


@pytest.mark.parametrize(
    "settings",
    [
        ("namespace.create=true",),
        ("namespace.create=true", "certManager.enabled=false", "certgen.enabled=true"),
        ("namespace.create=true", "certManager.enabled=false", "certgen.enabled=true", "certgen.hooks=true"),
        ("namespace.create=true", "gpuLeases.enabled=true", "controller.enabled=true"),
        ("namespace.create=true", "config.gpuSlicing.backend=dra", "controller.enabled=true"),
    ],
    ids=["cert-manager", "certgen", "certgen-hooks", "leases", "dra"],
)
def test_the_charts_objects_pass_a_server_side_apply(api: Any, settings: tuple[str, ...]) -> None:
    objects = helm_template(*settings)
    assert {o["kind"] for o in objects} >= {
        "Deployment",
        "MutatingWebhookConfiguration",
        "CustomResourceDefinition",
    }
    assert not server_side_apply(api, objects)
