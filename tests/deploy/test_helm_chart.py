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
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from function.core.config import parse_config
from tests.support.helm import CHART, HELM, REQUIRED, SKIP_REASON, helm_template
from tests.support.manifests import KNATIVE_DIR, render, render_overlay

pytestmark = pytest.mark.skipif(HELM is None and not REQUIRED, reason=SKIP_REASON)
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def normalized(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name), without what one of the two tools adds for its own bookkeeping:
    Helm's labels and hook annotations, the hash kustomize appends to the ConfigMap's name (Helm
    rolls the Pods with a checksum annotation instead), the configuration's kustomize-only header,
    and the CRD's part-of label (kustomize labels it; a chart's crds/ are installed as written)."""
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
        if obj["kind"] == "CustomResourceDefinition":
            labels.pop("app.kubernetes.io/part-of", None)
        if not labels:
            metadata.pop("labels", None)
        if obj["kind"] == "ConfigMap":
            metadata["name"] = re.sub(r"-[a-z0-9]{10}$", "", metadata["name"])
            config = yaml.safe_load(obj["data"]["config.yaml"])
            for key in ("apiVersion", "kind", "metadata"):
                config.pop(key, None)
            obj["data"]["config.yaml"] = config
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


def test_with_certgen_the_chart_renders_what_the_overlay_with_the_certgen_component_renders(
    tmp_path: Path,
) -> None:
    chart = normalized(
        helm_template("namespace.create=true", "certManager.enabled=false", "certgen.enabled=true")
    )
    kustomize = normalized(render_overlay(tmp_path, KNATIVE_DIR / "overlays" / "deployment", ("certgen",)))
    # The component's Job runs once per apply; the chart runs the same command as two hooks, before
    # (the Secret for the Deployment) and after (the configurations to patch) an install or upgrade.
    job = kustomize.pop(("Job", "castslice-certgen"))
    for when in ("pre", "post"):
        hook = chart.pop(("Job", f"castslice-certgen-{when}"))
        assert hook["spec"]["template"]["spec"]["containers"] == job["spec"]["template"]["spec"]["containers"]
        assert hook["spec"]["template"]["spec"]["serviceAccountName"] == "castslice-certgen"
    # kustomize keeps cert-manager's annotation (the settings component fills it in; it names no
    # Certificate any more); the chart writes it only with cert-manager.
    for kind, name in (
        ("MutatingWebhookConfiguration", "castslice"),
        ("ValidatingWebhookConfiguration", "castslice-podmutations"),
    ):
        kustomize[(kind, name)]["metadata"].pop("annotations")
    assert_same(chart, kustomize)


def test_the_crd_the_chart_installs_is_the_components_byte_for_byte() -> None:
    shipped = KNATIVE_DIR / "components" / "pod-mutations" / "podmutation-crd.yaml"
    assert (CHART / "crds" / "podmutation-crd.yaml").read_text() == shipped.read_text()


def config_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [configmap] = [o for o in objects if o["kind"] == "ConfigMap"]
    data: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return data


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
