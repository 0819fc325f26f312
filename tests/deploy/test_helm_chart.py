"""charts/castslice, rendered with the real helm (built from Go modules: .ci/provision-helm), against
what knative/overlays/deployment renders with kustomize: the same objects, field for field, once
what only Helm writes is set aside, so the two install paths cannot drift apart. Also with
certgen instead of cert-manager (against the overlay plus knative/components/certgen), and with
CAST AI's and HAMi's values names.

CI provisions helm and sets CASTSLICE_HELM_REQUIRED=1, so a missing helm fails here instead of
skipping. Locally: export CASTSLICE_HELM="$(.ci/provision-helm)". On the e2e apiserver (a
server-side apply of the rendered objects): tests/e2e/test_helm_chart_e2e.py."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from function.config_file import load_config_file
from function.core.config import parse_config, watches_for
from function.core.view import rbac_rules
from tests.deploy.support import granted_rules
from tests.support.helm import CHART, HELM, REQUIRED, SKIP_REASON, helm_template
from tests.support.manifests import KNATIVE_DIR, render, render_overlay, render_overlay_with

pytestmark = pytest.mark.skipif(HELM is None and not REQUIRED, reason=SKIP_REASON)
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def normalized(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name), without what one of the two tools adds for its own bookkeeping:
    Helm's labels and hook annotations, the hash kustomize appends to the ConfigMap's name (Helm
    rolls the Pods with a checksum annotation instead), the configuration's kustomize-only header,
    and the dashboard's JSON read as JSON."""
    found = {}
    for obj in copy.deepcopy(objects):
        metadata = obj["metadata"]
        labels = metadata.get("labels", {})
        for label in HELM_ONLY_LABELS:
            labels.pop(label, None)
        annotations = metadata.get("annotations", {})
        for key in [k for k in annotations if k.startswith("helm.sh/hook")]:
            del annotations[key]
        if not annotations:
            metadata.pop("annotations", None)
        if not labels:
            metadata.pop("labels", None)
        if obj["kind"] == "ConfigMap" and "config.yaml" in obj["data"]:
            metadata["name"] = re.sub(r"-[a-z0-9]{10}$", "", metadata["name"])
            config = yaml.safe_load(obj["data"]["config.yaml"])
            for key in ("apiVersion", "kind", "metadata"):
                config.pop(key, None)
            obj["data"]["config.yaml"] = config
        if obj["kind"] == "ConfigMap" and "castslice.json" in obj["data"]:  # the dashboard
            obj["data"]["castslice.json"] = json.loads(obj["data"]["castslice.json"])
        if obj["kind"] == "Deployment":
            template = obj["spec"]["template"]
            template["metadata"].get("annotations", {}).pop("checksum/config", None)
            if not template["metadata"].get("annotations"):
                template["metadata"].pop("annotations", None)
            for volume in template["spec"]["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", volume["configMap"]["name"])
        found[(obj["kind"], metadata["name"])] = obj
    return found


def assert_same(chart: dict[tuple[str, str], Any], kustomize: dict[tuple[str, str], Any]) -> None:
    assert sorted(chart) == sorted(kustomize)
    different = [key for key in kustomize if chart[key] != kustomize[key]]
    assert not different, "\n".join(
        f"{kind}/{name}:\nchart: {chart[(kind, name)]}\nkustomize: {kustomize[(kind, name)]}"
        for kind, name in different
    )


def test_the_chart_renders_what_the_deployment_overlay_renders() -> None:
    chart = normalized(helm_template("namespace.create=true"))
    assert_same(chart, normalized(render(KNATIVE_DIR / "overlays" / "deployment")))


def without_certgen_job_and_annotation(
    objects: dict[tuple[str, str], dict[str, Any]], job: str
) -> dict[str, Any]:
    """The certgen Job (named ``job``), taken out; and cert-manager's annotation, which kustomize
    keeps (the settings component fills it in; it names no Certificate any more) and the chart
    writes only with cert-manager."""
    taken = objects.pop(("Job", job))
    for kind, name in (
        ("MutatingWebhookConfiguration", "castslice"),
        ("ValidatingWebhookConfiguration", "castslice-podmutations"),
    ):
        objects[(kind, name)]["metadata"].pop("annotations", None)
    return taken


def test_with_certgen_the_chart_renders_what_the_overlay_with_the_certgen_component_renders(
    tmp_path: Path,
) -> None:
    """The Job and its RBAC as objects of the release (they run where hooks cannot): the Job is
    the component's, named for the release's revision (a Job's template cannot change on upgrade)."""
    chart = normalized(
        helm_template("namespace.create=true", "certManager.enabled=false", "certgen.enabled=true")
    )
    kustomize = normalized(render_overlay(tmp_path, KNATIVE_DIR / "overlays" / "deployment", ("certgen",)))
    job = without_certgen_job_and_annotation(kustomize, "castslice-certgen")
    ours = without_certgen_job_and_annotation(chart, "castslice-certgen-1")
    assert ours["spec"] == job["spec"] and ours["metadata"]["labels"] == job["metadata"]["labels"]
    assert_same(chart, kustomize)


def test_with_certgen_hooks_the_chart_runs_the_same_command_before_and_after_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    objects = helm_template(
        "namespace.create=true", "certManager.enabled=false", "certgen.enabled=true", "certgen.hooks=true"
    )
    hooks = [o for o in objects if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in hooks) == [
        ("ClusterRole", "castslice-certgen"),
        ("ClusterRoleBinding", "castslice-certgen"),
        ("Job", "castslice-certgen-post"),
        ("Job", "castslice-certgen-pre"),
        ("Role", "castslice-certgen"),
        ("RoleBinding", "castslice-certgen"),
        ("ServiceAccount", "castslice-certgen"),
    ]
    for hook in hooks:
        # Deleted once they succeeded: nothing of certgen stays in the cluster after an install.
        assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    rbac = [o for o in hooks if o["kind"] != "Job"]
    assert all(
        o["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade,post-install,post-upgrade"
        for o in rbac
    )
    chart = normalized(objects)
    kustomize = normalized(render_overlay(tmp_path, KNATIVE_DIR / "overlays" / "deployment", ("certgen",)))
    job = without_certgen_job_and_annotation(kustomize, "castslice-certgen")
    for when in ("pre", "post"):
        hook = without_certgen_job_and_annotation(chart, f"castslice-certgen-{when}")
        assert hook["spec"]["template"] == job["spec"]["template"]
    assert_same(chart, kustomize)


def test_every_component_file_the_chart_reads_is_the_components_byte_for_byte() -> None:
    """charts/castslice/files/<component>/<file> are copies of knative/components/: one set of
    objects, two ways to install them (edit the component, then copy it here)."""
    copies = sorted(path for path in (CHART / "files").rglob("*") if path.is_file())
    assert copies
    for path in copies:
        relative = path.relative_to(CHART / "files")
        shipped = KNATIVE_DIR / "components" / relative
        assert path.read_bytes() == shipped.read_bytes(), (
            f"{relative} differs from the component's: "
            f"cp knative/components/{relative} charts/castslice/files/{relative}"
        )


NAMESPACE_SELECTOR_TERM = {"namespaceSelector": {"matchLabels": {"tier": "critical"}}}
SHIPPED_CONFIG_PATCHES: dict[str, dict[str, Any]] = {
    "gpu-leases": {"gpuLeases": {"enabled": True}},
    "dra": {"gpuSlicing": {"backend": "dra"}},
    "pod-mutations-castai": {"podMutations": {"castaiObjects": True}},
    "cluster-view-namespaces": {"spot": {"enabled": True, "forcePodsToOnDemand": [NAMESPACE_SELECTOR_TERM]}},
}
"""What a user adding the component writes in their configuration (base/config.yaml)."""


@pytest.mark.parametrize(
    ("settings", "components"),
    [
        (("gpuLeases.enabled=true", "controller.enabled=true"), ("gpu-leases", "controller")),
        (("monitoring.enabled=true",), ("monitoring",)),
        (
            ("config.gpuSlicing.backend=dra", "controller.enabled=true"),
            ("dra", "controller", "dra-controller"),
        ),
        (
            ("gpuLeases.enabled=true", "controller.enabled=true", "monitoring.enabled=true"),
            ("gpu-leases", "controller", "monitoring"),
        ),
        (("config.podMutations.castaiObjects=true",), ("pod-mutations-castai",)),
        (
            (
                "config.spot.enabled=true",
                "config.spot.forcePodsToOnDemand[0].namespaceSelector.matchLabels.tier=critical",
            ),
            ("cluster-view-namespaces",),
        ),
    ],
    ids=["leases", "monitoring", "dra", "leases-and-monitoring", "castai-objects", "namespace-selector"],
)
def test_the_charts_values_render_what_the_overlay_with_the_components_renders(
    tmp_path: Path, settings: tuple[str, ...], components: tuple[str, ...]
) -> None:
    chart = normalized(helm_template("namespace.create=true", *settings))
    rendered = render_overlay_with(tmp_path, KNATIVE_DIR / "overlays" / "deployment", components)
    if "dra" in components:  # docs/dra.md: the dra backend watches no Nodes
        rendered = [o for o in rendered if o["metadata"]["name"] != "castslice-cluster-view-nodes"]
    kustomize = normalized(rendered)
    config = kustomize[("ConfigMap", "castslice-config")]["data"]["config.yaml"]
    for component in components:
        for section, values in SHIPPED_CONFIG_PATCHES.get(component, {}).items():
            config[section] = {**config.get(section, {}), **values}
    assert_same(chart, kustomize)


def config_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [configmap] = [o for o in objects if o["kind"] == "ConfigMap"]
    data: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return data


@pytest.mark.parametrize(
    "settings",
    [
        (),
        ("config.podMutations.castaiObjects=true",),
        ("gpuLeases.enabled=true",),
        ("config.gpuSlicing.backend=dra",),
        ("config.gpuSlicing.requireAdvertisedTarget=false",),
        ("config.spot.enabled=true", "config.spot.ignorePods[0].namespaceSelector.matchLabels.tier=batch"),
        ("staticConfig.forcePodsToOnDemand[0].namespaceSelector.matchLabels.tier=critical",),
        ("config.spot.enabled=false", "config.spot.forcePodsToSpot[0].namespaceSelector.matchLabels.tier=x"),
    ],
    ids=[
        "defaults",
        "castai-objects",
        "leases",
        "dra",
        "no-node-check",
        "spot-namespace-selector",
        "cast-ai-static-config-namespace-selector",
        "spot-off",
    ],
)
def test_the_webhooks_rbac_is_what_the_charts_configuration_watches(
    settings: tuple[str, ...], tmp_path: Path
) -> None:
    """Whatever values a user sets, the webhook is granted list and watch on exactly what its
    configuration makes it watch (function.core.view.rbac_rules of the enabled mutators'
    WatchSpecs), as the overlays are held to it: a view missing a grant never syncs, and the
    webhook would answer without it."""
    objects = helm_template("namespace.create=true", *settings)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_of(objects)), encoding="utf-8")
    assert granted_rules(objects) == rbac_rules(watches_for(load_config_file(path)))


def test_cast_ais_static_config_becomes_the_spot_section_and_enables_it() -> None:
    objects = helm_template(
        "staticConfig.preset=partialSpot", "staticConfig.IgnorePodsWithNodeSelectorsAffinities=true"
    )
    config = config_of(objects)
    assert config["spot"] == {
        "enabled": True,
        "preset": "partialSpot",
        "ignorePodsWithNodeSelectorsAffinities": True,
    }
    parse_config(config)  # what the webhook will accept at start-up


def test_hamis_values_names_become_the_vgpu_section_and_enable_it() -> None:
    config = config_of(
        helm_template(
            "resourceName=hami.nvidia.com/gpu",
            "resourceMem=hami.nvidia.com/gpumem",
            "schedulerName=vgpu-scheduler",
            "scheduler.defaultGPUNum=2",
            "scheduler.forceOverwriteDefaultScheduler=false",
        )
    )
    vgpu = config["vgpu"]
    assert vgpu["enabled"] is True and vgpu["schedulerName"] == "vgpu-scheduler" and vgpu["defaultCount"] == 2
    assert vgpu["forceOverwriteDefaultScheduler"] is False
    device = vgpu["devices"][0]
    assert (device["countResource"], device["memoryResource"]) == (
        "hami.nvidia.com/gpu",
        "hami.nvidia.com/gpumem",
    )
    assert device["coresResource"] == "nvidia.com/gpucores"  # not set: the default stays
    parse_config(config)


def test_another_release_namespace_is_the_first_excluded_namespace_and_the_webhook_skips_it() -> None:
    assert HELM is not None
    done = subprocess.run(
        [HELM, "template", "gpu", str(CHART), "--namespace", "gpu-platform"],
        capture_output=True,
        text=True,
        check=True,
    )
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    excluded = config_of(objects)["excludedNamespaces"]
    assert excluded[0] == "gpu-platform" and "castslice-system" not in excluded
    [webhook] = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    selector = webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]
    assert selector["values"] == excluded
    assert (
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "gpu-platform/castslice-serving-cert"
    )


def test_cert_manager_and_certgen_together_are_refused_by_name() -> None:
    assert HELM is not None
    done = subprocess.run(
        [HELM, "template", "castslice", str(CHART), "--set", "certgen.enabled=true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "set certManager.enabled=false" in done.stderr
