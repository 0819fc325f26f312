"""The webhook's identity on the e2e cluster, as a user deploys it: the ServiceAccount, ClusterRole
and ClusterRoleBinding the manifests render (the deployment overlay, whose shipped configuration
enables mutators that watch, so it includes the cluster-view component, plus the components a test
names), created with the API, and a token kubeconfig for a server to run as it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.kubeconfig import write_kubeconfig
from tests.support.manifests import KNATIVE_DIR, kubectl_path

from .controlplane import ControlPlane

SA_NAMESPACE, SA_NAME = "castslice-system", "castslice"
CONTROL_SA_NAME = "castslice-control"
"""The controller's ServiceAccount (knative/components/controller)."""
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def rendered_rbac(
    tmp_path: Path, components: tuple[str, ...] = (), account: str = SA_NAME
) -> list[dict[str, Any]]:
    """Namespace, the ServiceAccount ``account`` (the webhook's by default), the roles and bindings
    as rendered; ``components`` (names under knative/components) are added as a user adds them,
    before settings."""
    overlay = KNATIVE_DIR / "overlays" / "deployment"
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(overlay, tmp_path)],
                # settings again, last, as overlays list it: the binding's subject gets its namespace.
                "components": [
                    os.path.relpath(KNATIVE_DIR / "components" / name, tmp_path)
                    for name in (*components, "settings")
                ],
            }
        )
    )
    out = subprocess.run(
        [kubectl_path(), "kustomize", str(tmp_path)], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    objects = [o for o in yaml.safe_load_all(out) if o and o["kind"] in RBAC_KINDS]
    return [o for o in objects if o["kind"] != "ServiceAccount" or o["metadata"]["name"] == account]


def create(api: Any, obj: dict[str, Any]) -> bool:
    """Create ``obj``; False when it already existed (another test module made it)."""
    from kubernetes import client, utils

    try:
        utils.create_from_dict(api, obj)
    except utils.FailToCreateError as error:
        if not all(isinstance(e, client.ApiException) and e.status == 409 for e in error.api_exceptions):
            raise
        return False
    return True


def delete_created(plane: ControlPlane, created: list[dict[str, Any]]) -> None:
    """Remove what a module created (a later module's dry run of the manifests must not find it)."""
    from kubernetes import client

    with plane.api_client() as api:
        rbac, core = client.RbacAuthorizationV1Api(api), client.CoreV1Api(api)
        for obj in reversed(created):
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(name)
            elif kind == "ClusterRole":
                rbac.delete_cluster_role(name)
            elif kind == "RoleBinding":
                rbac.delete_namespaced_role_binding(name, obj["metadata"]["namespace"])
            elif kind == "Role":
                rbac.delete_namespaced_role(name, obj["metadata"]["namespace"])
            elif kind == "ServiceAccount":
                core.delete_namespaced_service_account(name, obj["metadata"]["namespace"])
            elif kind == "Namespace":
                core.delete_namespace(name)
                deadline = time.monotonic() + 120
                while plane.get(f"/api/v1/namespaces/{name}")[0] != 404:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"namespace {name} not gone after 120s")
                    time.sleep(0.2)


def token_kubeconfig(plane: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig holding only an hour's token of the ServiceAccount ``namespace/account`` (no
    client certificate): what a Pod running as that account gets."""
    from kubernetes import client

    with plane.api_client() as api:
        token = (
            client.CoreV1Api(api)
            .create_namespaced_service_account_token(
                account, namespace, client.AuthenticationV1TokenRequest(spec={"expirationSeconds": 3600})
            )
            .status.token
        )
    return write_kubeconfig(path, plane.host, account, {"token": token}, plane.ca_cert)


def service_account_kubeconfig(
    plane: ControlPlane,
    directory: Path,
    created: list[dict[str, Any]],
    components: tuple[str, ...] = (),
    account: str = SA_NAME,
) -> Path:
    """Apply the rendered RBAC with ``components`` (what was new is appended to ``created``); a
    kubeconfig with a token of the ServiceAccount ``account`` (the webhook's by default)."""
    with plane.api_client() as api:
        for obj in rendered_rbac(directory, components, account):
            if create(api, obj):
                created.append(obj)
    plane.wait_for_service_account(SA_NAMESPACE, account)
    return token_kubeconfig(plane, SA_NAMESPACE, account, directory / f"{account}.kubeconfig")
