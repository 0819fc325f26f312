"""The webhook's identity on the e2e cluster, as a user deploys it: the ServiceAccount, ClusterRole
and ClusterRoleBinding the manifests render (the deployment overlay, whose shipped configuration
enables mutators that watch, so it includes the cluster-view component), created with the API."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.manifests_support import KNATIVE_DIR, kubectl_path

SA_NAMESPACE, SA_NAME = "castslice-system", "castslice"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


def rendered_rbac(tmp_path: Path, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Namespace, the webhook's ServiceAccount, ClusterRole and ClusterRoleBinding as rendered;
    ``components`` (names under knative/components) are added as a user adds them, before settings."""
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
    return [o for o in objects if o["kind"] != "ServiceAccount" or o["metadata"]["name"] == SA_NAME]


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
