"""components/gpu-leases (and components/controller) added to each shipped overlay as a user adds
them (the commented lines in overlays/deployment and overlays/knative-route uncommented), rendered
with real kustomize: the GpuLease validating webhook calls the webhook where the Pod webhook does
(the Service, or the host of route.yaml), on the path the webhook serves, with nothing left of the
component's placeholders; and the stamp policy is cluster-scoped and names the controller's
account in its namespace."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from function import contract
from tests.support import asgi_client
from tests.support.manifests import KNATIVE_DIR, one, render

OVERLAYS = ("deployment", "knative-route", "deployment-eventing", "knative-route-eventing")
ADDED = "  # - ../../components/gpu-leases\n  # - ../../components/controller\n"
HOST = "gpu-webhook.team.internal"
PLACEHOLDERS = ("set-by-", "example.com")


def with_gpu_leases(tmp_path: Path) -> Path:
    """A copy of knative/ with the components added to the two overlays the others build on."""
    copy = tmp_path / "knative"
    shutil.copytree(KNATIVE_DIR, copy)
    for name in ("deployment", "knative-route"):
        kustomization = copy / "overlays" / name / "kustomization.yaml"
        text = kustomization.read_text()
        assert ADDED in text, f"overlays/{name} no longer offers components/gpu-leases"
        kustomization.write_text(text.replace(ADDED, ADDED.replace("# -", "-"), 1))
    route = copy / "overlays" / "knative-route" / "route.yaml"
    route.write_text(route.read_text().replace("host: castslice.example.com", f"host: {HOST}"))
    return copy


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    copy = with_gpu_leases(tmp_path_factory.mktemp("gpu-leases-overlays"))
    return {name: render(copy / "overlays" / name) for name in OVERLAYS}


def webhook(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (hook,) = one(objs, kind, name, "admissionregistration.k8s.io")["webhooks"]
    return hook  # type: ignore[no-any-return]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gpulease_webhook_calls_where_the_pod_webhook_does_on_the_served_path(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objs = rendered[overlay]
    config = one(
        objs, "ValidatingWebhookConfiguration", "castslice-gpuleases", "admissionregistration.k8s.io"
    )
    text = json.dumps(config)
    assert not [p for p in PLACEHOLDERS if p in text], text
    leases = webhook(objs, "ValidatingWebhookConfiguration", "castslice-gpuleases")["clientConfig"]
    pods = webhook(objs, "MutatingWebhookConfiguration", "castslice")["clientConfig"]
    if "service" in pods:
        assert "url" not in leases
        assert leases["service"] == {**pods["service"], "path": contract.VALIDATE_GPULEASES_PATH}
    else:
        url = urlsplit(leases["url"])
        assert (
            (url.scheme, url.netloc)
            == ("https", HOST)
            == (urlsplit(pods["url"]).scheme, urlsplit(pods["url"]).netloc)
        )
        assert url.path == contract.VALIDATE_GPULEASES_PATH
    annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert (
        annotation
        == one(objs, "MutatingWebhookConfiguration", "castslice")["metadata"]["annotations"][
            "cert-manager.io/inject-ca-from"
        ]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("name", ["castslice-gpulease-stamp", "castslice-gpulease-templates"])
def test_the_stamp_policies_are_cluster_scoped_and_exempt_only_the_controllers_account(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, name: str
) -> None:
    objs = rendered[overlay]
    policy = one(objs, "ValidatingAdmissionPolicy", name, "admissionregistration.k8s.io")
    binding = one(objs, "ValidatingAdmissionPolicyBinding", name, "admissionregistration.k8s.io")
    assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    (controller,) = [v for v in policy["spec"]["variables"] if v["name"] == "controller"]
    account = one(objs, "ServiceAccount", "castslice-control")["metadata"]
    assert controller["expression"] == f"'system:serviceaccount:{account['namespace']}:{account['name']}'"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_lease_policies_are_cluster_scoped(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    found = [
        o for o in rendered[overlay] if "AdmissionPolicy" in o["kind"] and "gpulease" in o["metadata"]["name"]
    ]
    assert {(o["kind"], o["metadata"]["name"]) for o in found} >= {
        ("MutatingAdmissionPolicy", "castslice-gpulease-witness"),
        ("MutatingAdmissionPolicyBinding", "castslice-gpulease-witness"),
        ("ValidatingAdmissionPolicy", "castslice-gpulease-forged"),
        ("ValidatingAdmissionPolicy", "castslice-gpulease-required"),
    }
    assert all("namespace" not in o["metadata"] for o in found)


def test_the_shipped_overlays_render_without_the_component() -> None:
    for overlay in OVERLAYS:
        objs = render(KNATIVE_DIR / "overlays" / overlay)
        kinds = ("CustomResourceDefinition", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy")
        assert not [o for o in objs if o["kind"] in kinds and "gpulease" in o["metadata"]["name"]], overlay


def test_the_rendered_path_is_served_and_judges_gpuleases(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = webhook(rendered["deployment"], "ValidatingWebhookConfiguration", "castslice-gpuleases")[
        "clientConfig"
    ]["service"]["path"]
    client = asgi_client(monkeypatch)

    def review(spec: dict[str, Any]) -> dict[str, Any]:
        lease = {
            "apiVersion": "castops.io/v1alpha1",
            "kind": "GpuLease",
            "metadata": {"name": "h100", "namespace": "team-a"},
            "spec": spec,
        }
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "lease-1",
                "kind": {"group": "castops.io", "version": "v1alpha1", "kind": "GpuLease"},
                "resource": {"group": "castops.io", "version": "v1alpha1", "resource": "gpuleases"},
                "name": "h100",
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": lease,
            },
        }
        reply = client.post(path, json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["response"]  # type: ignore[no-any-return]

    assert review({"gpuModel": "NVIDIA-H100-80GB-HBM3", "count": 8}) == {"uid": "lease-1", "allowed": True}
    refused = review({"gpuModel": "NVIDIA-H100-80GB-HBM3", "count": "0.0001"})
    assert refused["allowed"] is False and "spec.count" in refused["status"]["message"]
