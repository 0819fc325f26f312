"""knative/components/dra and dra-controller as a user deploys them (rendered with real kustomize):
with ``gpuSlicing.backend: dra`` the webhook's RBAC equals what its enabled mutators watch,
templates included, and the controller's what its reconcilers watch and write, templates included,
and nothing more; without the components, a dra configuration would not be served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from function.control.process import build_reconcilers
from function.control.reconciler import control_rbac_rules, rules_of
from function.core.config import parse_config, watches_for
from function.core.dra import TEMPLATES
from function.core.view import rbac_rules
from tests.deploy.support import OVERLAYS, granted_rules, token_mounted, with_component
from tests.support.fake_api import FakeApi
from tests.support.manifests import KNATIVE_DIR, by_kind

COMPONENT = KNATIVE_DIR / "components" / "dra"
CONTROLLER = KNATIVE_DIR / "components" / "controller"
DRA_CONTROLLER = KNATIVE_DIR / "components" / "dra-controller"
CONTROL_ACCOUNT, NAMESPACE = "castslice-control", "castslice-system"


def dra_config(objs: list[dict[str, Any]]) -> Any:
    """The shipped configuration with ``gpuSlicing.backend: dra``: what a user switching writes."""
    (config_map,) = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    data = yaml.safe_load(config_map["data"]["config.yaml"])
    data["gpuSlicing"]["backend"] = "dra"
    return parse_config(data)


NODES_COMPONENT_OBJECTS = "castslice-cluster-view-nodes"


def without_nodes_component(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of components/cluster-view-nodes left out, as docs/dra.md says a dra overlay
    does (the dra backend never looks at Nodes: its claims are checked against the templates)."""
    return [o for o in objs if o["metadata"]["name"] != NODES_COMPONENT_OBJECTS]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_component_grants_exactly_what_the_dra_backend_watches(overlay: Path, tmp_path: Path) -> None:
    objs = without_nodes_component(with_component(overlay, tmp_path, (COMPONENT,)))
    needed = watches_for(dra_config(objs))
    assert TEMPLATES in needed
    assert granted_rules(objs) == rbac_rules(needed)
    assert token_mounted(objs)


def test_without_the_component_the_templates_are_not_readable(tmp_path: Path) -> None:
    objs = with_component(OVERLAYS[1], tmp_path)
    assert granted_rules(objs) != rbac_rules(watches_for(dra_config(objs)))
    assert "resourceclaimtemplates" not in str(granted_rules(objs))


def controller_rules(objs: list[dict[str, Any]]) -> list[dict[str, list[str]]]:
    """The cluster-wide rules bound to the controller's ServiceAccount, exact per resource."""
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, "ClusterRole")}
    verbs_of: dict[tuple[str, str], set[str]] = {}
    for binding in by_kind(objs, "ClusterRoleBinding"):
        if not any(
            s.get("kind") == "ServiceAccount"
            and s["name"] == CONTROL_ACCOUNT
            and s.get("namespace") == NAMESPACE
            for s in binding.get("subjects", [])
        ):
            continue
        for rule in roles[binding["roleRef"]["name"]].get("rules") or []:
            assert set(rule) <= {"apiGroups", "resources", "verbs"}, "no resourceNames or URLs"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    verbs_of.setdefault((group, resource), set()).update(rule["verbs"])
    return rules_of(verbs_of)


def test_the_controller_is_granted_exactly_what_its_reconcilers_watch_and_write(tmp_path: Path) -> None:
    objs = with_component(OVERLAYS[1], tmp_path, (COMPONENT, CONTROLLER, DRA_CONTROLLER))
    config = dra_config(objs)
    # components/controller grants the lease reconciler's RBAC: the configuration it serves.
    config = config.model_copy(
        update={"gpuLeases": config.section("gpuLeases").model_copy(update={"enabled": True})}
    )
    reconcilers = build_reconcilers(config, FakeApi())
    assert [r.name for r in reconcilers] == ["gpu-leases", "gpu-inventory", "dra-templates", "drift"]
    # The Nodes are watched whatever the backend: by the inventory reconciler (the GPUs per model),
    # and by the drift reconciler for GPU slicing's requireAdvertisedTarget.
    assert controller_rules(objs) == control_rbac_rules(reconcilers)


def test_without_dra_controller_the_controller_cannot_touch_templates(tmp_path: Path) -> None:
    objs = with_component(OVERLAYS[1], tmp_path, (COMPONENT, CONTROLLER))
    assert "resourceclaimtemplates" not in str(controller_rules(objs))
