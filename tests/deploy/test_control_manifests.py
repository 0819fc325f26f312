"""The controller component (knative/components/controller) as a user deploys it: an overlay plus
the component plus settings, rendered with real kustomize. Two replicas of the webhook's image,
the elector's timings, probes on the process's paths, and RBAC that equals what the enabled
reconcilers watch and write (``control_rbac_rules``), with the Lease limited to its namespace."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from function import contract
from function.control.process import DEFAULT_LEASE_NAME, build_reconcilers
from function.control.reconciler import LEADER_ELECTION, control_rbac_rules
from function.core.config import parse_config
from function.kube.elector import LEASE_SECONDS, RENEW_DEADLINE, RETRY_SECONDS
from tests.support.fake_api import FakeApi
from tests.support.manifests import (
    KNATIVE_DIR,
    by_kind,
    command_line,
    env_of,
    flag,
    mount_source,
    one,
    render,
    validate,
    volume_file,
)

OVERLAY = KNATIVE_DIR / "overlays" / "deployment"
COMPONENT = KNATIVE_DIR / "components" / "controller"
SETTINGS = KNATIVE_DIR / "components" / "settings"
ACCOUNT, NAMESPACE = "castslice-control", "castslice-system"


@pytest.fixture(scope="module")
def objs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    where = tmp_path_factory.mktemp("with-controller")
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(OVERLAY, where)],
                "components": [os.path.relpath(c, where) for c in (COMPONENT, SETTINGS)],
            }
        )
    )
    return render(where)


def controller(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = one(objs, "Deployment", "castslice-control", "apps")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_every_object_is_valid(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        validate(obj)


def test_two_replicas_of_the_webhooks_image_run_castslice_control(objs: list[dict[str, Any]]) -> None:
    deployment, container = controller(objs)
    webhook = one(objs, "Deployment", "castslice", "apps")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert container["image"] == webhook["spec"]["template"]["spec"]["containers"][0]["image"]
    argv = command_line(container)
    assert argv[:2] == ["castslice", "control"]
    assert flag(argv, "--lease-name") == DEFAULT_LEASE_NAME
    assert float(flag(argv, "--lease-duration") or 0) == LEASE_SECONDS
    assert float(flag(argv, "--renew-deadline") or 0) == RENEW_DEADLINE
    assert float(flag(argv, "--retry-period") or 0) == RETRY_SECONDS
    # Long enough for the reconcile in flight and the release after SIGTERM.
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= RENEW_DEADLINE


def test_the_identity_comes_from_the_downward_api(objs: list[dict[str, Any]]) -> None:
    _, container = controller(objs)
    fields = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]
    }
    assert fields["POD_NAME"] == "metadata.name"
    assert fields["POD_NAMESPACE"] == "metadata.namespace"


def test_probes_and_metrics_are_on_the_processs_paths(objs: list[dict[str, Any]]) -> None:
    _, container = controller(objs)
    port = int(flag(command_line(container), "--port") or 0)
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["readinessProbe"]["httpGet"]["path"] == contract.READYZ_PATH
    assert container["livenessProbe"]["httpGet"]["path"] == contract.HEALTHZ_PATH


def test_the_configuration_is_the_webhooks(objs: list[dict[str, Any]]) -> None:
    deployment, container = controller(objs)
    spec = deployment["spec"]["template"]["spec"]
    (config_map,) = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    assert env_of(container)[contract.CONFIG_ENV] == contract.CONFIG_MOUNT_PATH
    volume, relative = mount_source(spec, container, contract.CONFIG_MOUNT_PATH)
    assert volume_file(volume, relative) == ("configMap", config_map["metadata"]["name"], "config.yaml")


def bound_rules(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rules of the ``kind`` bindings whose subject is the controller's ServiceAccount."""
    role_kind = "ClusterRole" if kind == "ClusterRoleBinding" else "Role"
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, role_kind)}
    rules = []
    for binding in by_kind(objs, kind):
        if any(
            s.get("kind") == "ServiceAccount" and s["name"] == ACCOUNT and s.get("namespace") == NAMESPACE
            for s in binding.get("subjects", [])
        ):
            assert binding["roleRef"]["kind"] == role_kind
            rules.extend(roles[binding["roleRef"]["name"]].get("rules") or [])
    return rules


def served_config(objs: list[dict[str, Any]]) -> Any:
    """The shipped configuration with what the controller serves switched on (gpuLeases)."""
    (config_map,) = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    data = yaml.safe_load(config_map["data"]["config.yaml"])
    data["gpuLeases"] = {**(data.get("gpuLeases") or {}), "enabled": True}
    return parse_config(data)


def test_cluster_rules_equal_what_the_reconcilers_watch_and_write(objs: list[dict[str, Any]]) -> None:
    reconcilers = build_reconcilers(served_config(objs), FakeApi())
    assert [r.name for r in reconcilers] == ["gpu-leases", "gpu-inventory", "drift"]
    assert bound_rules(objs, "ClusterRoleBinding") == control_rbac_rules(reconcilers), (
        "knative/components/controller/rbac.yaml must grant exactly control_rbac_rules of the "
        "reconcilers it runs"
    )


def test_the_leader_election_lease_is_the_only_namespaced_grant(objs: list[dict[str, Any]]) -> None:
    rules = bound_rules(objs, "RoleBinding")
    assert rules == [
        {"apiGroups": [LEADER_ELECTION.group], "resources": [LEADER_ELECTION.resource], "verbs": ["create"]},
        {
            "apiGroups": [LEADER_ELECTION.group],
            "resources": [LEADER_ELECTION.resource],
            "resourceNames": [DEFAULT_LEASE_NAME],
            "verbs": ["get", "update"],
        },
    ]
    assert sorted(verb for rule in rules for verb in rule["verbs"]) == sorted(LEADER_ELECTION.verbs)
    role_binding = one(objs, "RoleBinding", "castslice-control-leader-election")
    assert role_binding["metadata"]["namespace"] == NAMESPACE


def test_the_controller_has_its_own_account_with_its_token(objs: list[dict[str, Any]]) -> None:
    deployment, _ = controller(objs)
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == ACCOUNT
    assert spec["automountServiceAccountToken"] is True
    webhook = one(objs, "Deployment", "castslice", "apps")
    assert webhook["spec"]["template"]["spec"]["serviceAccountName"] != ACCOUNT
