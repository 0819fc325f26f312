"""knative/components/dra as a user deploys it (rendered with real kustomize): with
``gpuSlicing.backend: dra`` the webhook's RBAC equals what its enabled mutators watch, templates
included, and nothing more; without the component, a dra configuration would not be served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from function.core.config import parse_config, watches_for
from function.core.dra import TEMPLATES
from function.core.view import rbac_rules
from tests.deploy.support import OVERLAYS, granted_rules, token_mounted, with_component
from tests.manifests_support import KNATIVE_DIR, by_kind

COMPONENT = KNATIVE_DIR / "components" / "dra"


def dra_config(objs: list[dict[str, Any]]) -> Any:
    """The shipped configuration with ``gpuSlicing.backend: dra``: what a user switching writes."""
    (config_map,) = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    data = yaml.safe_load(config_map["data"]["config.yaml"])
    data["gpuSlicing"]["backend"] = "dra"
    return parse_config(data)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_component_grants_exactly_what_the_dra_backend_watches(overlay: Path, tmp_path: Path) -> None:
    objs = with_component(overlay, tmp_path, (COMPONENT,))
    needed = watches_for(dra_config(objs))
    assert TEMPLATES in needed
    assert granted_rules(objs) == rbac_rules(needed)
    assert token_mounted(objs)


def test_without_the_component_the_templates_are_not_readable(tmp_path: Path) -> None:
    objs = with_component(OVERLAYS[1], tmp_path)
    assert granted_rules(objs) != rbac_rules(watches_for(dra_config(objs)))
    assert "resourceclaimtemplates" not in str(granted_rules(objs))
