"""The webhook's RBAC equals what its enabled mutators watch: no more, no less, token only then.

Rendered with real kustomize (tests/support/manifests.py). The shipped overlays and the overlays with
the cluster-view component are both held to ``rbac_rules(watches)`` computed from the plug-ins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from function.config_file import load_config_file
from function.core.config import watches_for
from function.core.mutators import PLUGINS
from function.core.mutators.spot import NAMESPACES
from function.core.view import PODS, REPLICASETS, WatchSpec, merge_specs, rbac_rules
from tests.deploy.support import (
    ACCOUNT,
    GPU_LEASES,
    NAMESPACES_COMPONENT,
    OVERLAYS,
    granted_rules,
    token_mounted,
    with_component,
)
from tests.support.manifests import by_kind, pod_specs, render


def shipped_config(objs: list[dict[str, Any]], tmp_path: Path) -> Any:
    (config_map,) = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"], encoding="utf-8")
    return load_config_file(path)


SWITCHED_ON = {"gpuSlicing": {"requireAdvertisedTarget": True}}
"""Watches a plug-in declares only when a setting asks (on in the shipped configuration)."""


def every_plugin_watch(but: str = "") -> tuple[WatchSpec, ...]:
    """What the plug-ins need when all are enabled (each with its section's defaults, and every
    setting that adds a watch on), but the plug-in named ``but``."""
    specs = []
    for plugin in PLUGINS:
        if plugin.name == but:
            continue
        section = plugin.config_model.model_validate(
            {"enabled": True, **SWITCHED_ON.get(plugin.config_key, {})}
        )
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
    # The cluster-view component alone falls short: Namespaces are missing (the GPU leases
    # component grants them for its lease-required namespaces: left out here).
    without = granted_rules(with_component(overlay, tmp_path))
    assert without == rbac_rules(every_plugin_watch(but="gpu-leases"))
    assert without != rbac_rules((*every_plugin_watch(but="gpu-leases"), *needs))
    # With it: every plug-in's watches and Namespaces, nothing more.
    both = tmp_path / "with-namespaces"  # a directory of its own: renders are cached by directory
    both.mkdir()
    objs = with_component(overlay, both, (NAMESPACES_COMPONENT, GPU_LEASES))
    assert granted_rules(objs) == rbac_rules((*every_plugin_watch(), *needs))
    assert token_mounted(objs)
