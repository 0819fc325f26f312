"""What the deploy tests of the webhook's RBAC share: the overlays, the cluster-view component
added as a user's kustomization would add it, and the rules and token the rendered objects give."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.support.manifests import KNATIVE_DIR, by_kind, pod_specs, render

OVERLAYS = tuple(
    KNATIVE_DIR / "overlays" / name
    for name in ("knative-route", "deployment", "knative-route-eventing", "deployment-eventing")
)
COMPONENT = KNATIVE_DIR / "components" / "cluster-view"
NAMESPACES_COMPONENT = KNATIVE_DIR / "components" / "cluster-view-namespaces"
SETTINGS = KNATIVE_DIR / "components" / "settings"
GPU_LEASES = KNATIVE_DIR / "components" / "gpu-leases"
ACCOUNT, NAMESPACE = "castslice", "castslice-system"


def granted_rules(objs: list[dict[str, Any]]) -> list[dict[str, list[str]]]:
    """The rules bound to the webhook's ServiceAccount, merged per API group as rbac_rules does."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in ("ClusterRole", "Role")}
    by_group: dict[str, tuple[set[str], set[str]]] = {}
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == ACCOUNT and s.get("namespace") == NAMESPACE
            for s in subjects
        ):
            continue
        # A RoleBinding would limit the watch to one namespace; the view watches cluster-wide.
        assert binding["kind"] == "ClusterRoleBinding", binding["metadata"]["name"]
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role.get("rules", []):
            assert set(rule) <= {"apiGroups", "resources", "verbs"}, "no resourceNames or URLs"
            for group in rule["apiGroups"]:
                resources, verbs = by_group.setdefault(group, (set(), set()))
                resources.update(rule["resources"])
                verbs.update(rule["verbs"])
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": sorted(verbs)}
        for group, (resources, verbs) in sorted(by_group.items())
    ]


def token_mounted(objs: list[dict[str, Any]]) -> bool:
    """Whether the webhook gets its token: the ServiceAccount and the Pod template must agree. A
    Knative Service leaves the template's field unset when the token is mounted (Knative Serving
    refuses ``true`` there: only ``false`` may be set), so the ServiceAccount's value holds."""
    (account,) = [sa for sa in by_kind(objs, "ServiceAccount", "") if sa["metadata"]["name"] == ACCOUNT]
    [(owner, spec)] = [
        (owner, spec) for owner, spec in pod_specs(objs) if owner["metadata"]["name"] == ACCOUNT
    ]
    if owner["apiVersion"].startswith("serving.knative.dev/"):
        assert spec.get("automountServiceAccountToken") in (None, False)
    mounted = spec.get("automountServiceAccountToken", account["automountServiceAccountToken"])
    assert mounted == account["automountServiceAccountToken"]
    return bool(mounted)


def with_component(overlay: Path, tmp_path: Path, extra: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """``overlay`` plus the cluster-view component, as a user's kustomization would include it
    (the overlay as it is when it already includes it: the shipped configuration enables
    PodMutations, which watch)."""
    shipped = render(overlay)
    if not extra and any(
        o["kind"] == "ClusterRole" and o["metadata"]["name"] == "castslice-cluster-view" for o in shipped
    ):
        return shipped
    has_view = any(
        o["kind"] == "ClusterRole" and o["metadata"]["name"] == "castslice-cluster-view" for o in shipped
    )
    components = [*(() if has_view else (COMPONENT,)), *extra, SETTINGS]
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(overlay, tmp_path)],
                # settings again, last, as an overlay lists it: the binding gets the namespace.
                "components": [os.path.relpath(component, tmp_path) for component in components],
            }
        )
    )
    return render(tmp_path)
