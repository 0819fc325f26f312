"""The webhook's RBAC equals what its enabled mutators watch: no more, no less, token only then.

Rendered with real kustomize (tests/manifests_support). The shipped overlays and the overlays with
the cluster-view component are both held to ``rbac_rules(watches)`` computed from the plug-ins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from function.core.config import load_config_file, watches_for
from function.core.mutators import PLUGINS
from function.core.mutators.spot import NAMESPACES
from function.core.view import PODS, REPLICASETS, WatchSpec, merge_specs, rbac_rules
from tests.manifests_support import KNATIVE_DIR, by_kind, pod_specs, render

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


def shipped_config(objs: list[dict[str, Any]], tmp_path: Path) -> Any:
    (config_map,) = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"], encoding="utf-8")
    return load_config_file(path)


def token_mounted(objs: list[dict[str, Any]]) -> bool:
    """Whether the webhook gets its token: the ServiceAccount and the Pod template must agree."""
    (account,) = [sa for sa in by_kind(objs, "ServiceAccount", "") if sa["metadata"]["name"] == ACCOUNT]
    (spec,) = [spec for owner, spec in pod_specs(objs) if owner["metadata"]["name"] == ACCOUNT]
    assert spec["automountServiceAccountToken"] == account["automountServiceAccountToken"]
    return bool(spec["automountServiceAccountToken"])


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


def every_plugin_watch() -> tuple[WatchSpec, ...]:
    """What the plug-ins need when all are enabled (each with its section's defaults)."""
    specs = []
    for plugin in PLUGINS:
        section = plugin.config_model.model_validate({"enabled": True})
        specs.extend(plugin.watches(section))
    return merge_specs(specs)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_shipped_rules_equal_what_the_shipped_configuration_needs(overlay: Path, tmp_path: Path) -> None:
    objs = render(overlay)
    needed = rbac_rules(watches_for(shipped_config(objs, tmp_path)))
    assert granted_rules(objs) == needed, (
        "the webhook's RBAC must equal what its enabled mutators watch: include (or drop) "
        "knative/components/cluster-view in the overlays"
    )
    assert token_mounted(objs) == bool(needed)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_component_grants_list_watch_and_mounts_the_token(overlay: Path, tmp_path: Path) -> None:
    # With the GPU leases component too, whose read RBAC comes with its CRD (as PodMutations').
    objs = with_component(overlay, tmp_path, (GPU_LEASES,))
    # The components serve the mutators that watch: every plug-in's watches, and at least the
    # Pods + ReplicaSets the spot split counts (the plug-in lands on its own branch).
    needed = every_plugin_watch() or (PODS, REPLICASETS)
    assert granted_rules(objs) == rbac_rules(needed)
    assert token_mounted(objs)
    for owner, spec in pod_specs(objs):
        if owner["metadata"]["name"] != ACCOUNT:  # the audit consumer (eventing): no token
            assert spec["automountServiceAccountToken"] is False


def test_granted_rules_sees_a_missing_or_extra_grant(tmp_path: Path) -> None:
    objs = with_component(OVERLAYS[1], tmp_path)
    (role,) = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "castslice-cluster-view"
    ]
    role["rules"][0]["verbs"].append("get")
    assert granted_rules(objs) != rbac_rules((PODS, REPLICASETS))
    role["rules"][0]["verbs"].remove("get")
    role["rules"].pop()
    assert granted_rules(objs) != rbac_rules((PODS, REPLICASETS))


def namespace_selector_config(tmp_path: Path) -> Any:
    """Spot placement with a forcePodsToOnDemand term that selects namespaces by label: the one
    configuration whose view watches Namespaces."""
    path = tmp_path / "namespace-selector.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "spot": {
                    "enabled": True,
                    "forcePodsToOnDemand": [{"namespaceSelector": {"matchLabels": {"tier": "critical"}}}],
                }
            }
        ),
        encoding="utf-8",
    )
    return load_config_file(path)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_a_namespace_selector_needs_the_namespaces_component_and_it_grants_exactly_that(
    overlay: Path, tmp_path: Path
) -> None:
    needs = watches_for(namespace_selector_config(tmp_path))
    assert NAMESPACES in needs
    # The cluster-view component alone falls short: Namespaces are missing.
    without = granted_rules(with_component(overlay, tmp_path, (GPU_LEASES,)))
    assert without == rbac_rules(every_plugin_watch())
    assert without != rbac_rules((*every_plugin_watch(), *needs))
    # With it: every plug-in's watches and Namespaces, nothing more.
    both = tmp_path / "with-namespaces"  # a directory of its own: renders are cached by directory
    both.mkdir()
    objs = with_component(overlay, both, (NAMESPACES_COMPONENT, GPU_LEASES))
    assert granted_rules(objs) == rbac_rules((*every_plugin_watch(), *needs))
    assert token_mounted(objs)
