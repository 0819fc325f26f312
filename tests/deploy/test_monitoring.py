"""knative/components/monitoring: the PrometheusRule passes Prometheus's own ``promtool check rules``
and ``promtool test rules`` (tests/deploy/data/alerts-test.yaml: every alert firing and not firing),
every alert has its section in docs/operations.md, the thresholds follow the registration's timeout,
and the rules and the dashboard name only metrics the code serves at /metrics.

promtool comes from ``.ci/provision-promtool`` (built from Go modules, cached), found through
``CASTSLICE_PROMTOOL`` (CI sets it, and ``CASTSLICE_PROMTOOL_REQUIRED=1``, so a missing promtool
fails here instead of skipping), else the provisioned cache, else ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from function.core.config import parse_config
from function.core.view import PODS, REPLICASETS
from function.serve.app import build_webhook
from tests.deploy.monitoring_support import alerts, queried_names, served_names
from tests.support.manifests import KNATIVE_DIR, one, render
from tests.support.view import FakeApiServer, transport_for

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = KNATIVE_DIR / "components" / "monitoring"
ALERTS_TEST = Path(__file__).with_name("data") / "alerts-test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
REQUIRED = os.environ.get("CASTSLICE_PROMTOOL_REQUIRED") == "1"
WEBHOOK_NAME = "pods.castslice.castops.io"


def find_promtool() -> str | None:
    named = os.environ.get("CASTSLICE_PROMTOOL")
    if named:
        return named
    checked = subprocess.run(
        [str(ROOT / ".ci" / "provision-promtool"), "--check"], capture_output=True, text=True, check=False
    )
    if checked.returncode == 0:
        return str(Path(checked.stdout.strip()) / "promtool")
    return shutil.which("promtool")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = find_promtool()
    if found is None or not Path(found).is_file():
        message = "no promtool: build it with .ci/provision-promtool (CI sets CASTSLICE_PROMTOOL)"
        if REQUIRED:
            pytest.fail(f"{message} [CASTSLICE_PROMTOOL_REQUIRED=1]", pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The deployment overlay with the controller and the monitoring component, as a user adds them
    (before settings)."""
    overlay = tmp_path_factory.mktemp("overlay")
    up = os.path.relpath(KNATIVE_DIR, overlay)  # kustomize takes relative paths only
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{up}/overlays/deployment"],
                "components": [
                    f"{up}/components/controller",
                    f"{up}/components/monitoring",
                    f"{up}/components/settings",
                ],
            }
        )
    )
    return render(overlay)


@pytest.fixture(scope="module")
def rules(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(rendered, "PrometheusRule", "castslice")["spec"]
    return spec


@pytest.fixture
def rule_files(rules: dict[str, Any], tmp_path: Path) -> Path:
    """The PrometheusRule's spec as the plain rules file promtool reads, beside the unit tests."""
    (tmp_path / "castslice-rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    return tmp_path


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules_accepts_the_rules(promtool: str, rule_files: Path) -> None:
    checked = run(promtool, "check", "rules", "castslice-rules.yaml", cwd=rule_files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_promtool_unit_tests_fire_and_stay_quiet_as_written(promtool: str, rule_files: Path) -> None:
    tested = run(promtool, "test", "rules", ALERTS_TEST.name, cwd=rule_files)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_unit_tests_can_fail(promtool: str, rule_files: Path) -> None:
    """The unit tests are not vacuous: with one alert's threshold moved, they fail."""
    rules_file = rule_files / "castslice-rules.yaml"
    text = rules_file.read_text()
    assert "> 0.05" in text
    rules_file.write_text(text.replace("> 0.05", "> 0.5"))
    tested = run(promtool, "test", "rules", ALERTS_TEST.name, cwd=rule_files)
    assert tested.returncode != 0 and "CastSliceAdmissionErrorRate" in tested.stdout + tested.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test(rules: dict[str, Any]) -> None:
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    assert tests["rule_files"] == ["castslice-rules.yaml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alerts(rules))
    assert names - firing == set(), "alerts no unit test makes fire"
    assert names - quiet == set(), "alerts no unit test holds quiet"
    assert (firing | quiet) - names == set(), "unit tests of alerts that do not exist"


def test_every_alert_says_what_it_means_and_links_its_section_in_docs(rules: dict[str, Any]) -> None:
    text = OPERATIONS.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }
    for name, rule in alerts(rules).items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
        assert rule["annotations"]["runbook"] == f"docs/operations.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/operations.md has no section {name}"


def test_the_thresholds_follow_the_registration_timeout(rules: dict[str, Any]) -> None:
    webhook = one(render(KNATIVE_DIR / "base"), "MutatingWebhookConfiguration")["webhooks"][0]
    assert (webhook["name"], webhook["timeoutSeconds"]) == (WEBHOOK_NAME, 5)
    by_name = alerts(rules)
    assert (
        by_name["CastSliceReviewLatencyHigh"]["expr"].rstrip().endswith(f"> {webhook['timeoutSeconds'] / 2}")
    )
    assert f'le="{webhook["timeoutSeconds"] * 0.8}"' in by_name["CastSliceReviewsNearTimeout"]["expr"]
    for name in ("CastSliceWebhookFailingOpen", "CastSliceReviewLatencyHigh"):
        assert f'name="{WEBHOOK_NAME}"' in by_name[name]["expr"]


def test_the_podmonitor_scrapes_the_webhook_over_its_tls_and_the_controller(
    rendered: list[dict[str, Any]],
) -> None:
    monitor = one(rendered, "PodMonitor", "castslice")
    certificate = one(rendered, "Certificate", "castslice-serving-cert")
    https, metrics = monitor["spec"]["podMetricsEndpoints"]
    for name, endpoint, component in (
        ("castslice", https, "webhook"),
        ("castslice-control", metrics, "controller"),
    ):
        deployment = one(rendered, "Deployment", name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"] == "castslice-system"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels[monitor["spec"]["jobLabel"]] == "castslice"  # job="castslice", as the rules say
        # app_kubernetes_io_component tells the webhook's targets from the controller's.
        assert labels[monitor["spec"]["podTargetLabels"][0]] == component
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {port["name"] for port in container["ports"]}
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics", name
        # Each endpoint scrapes one of the two: the other has no port of that name.
        assert (https if endpoint is metrics else metrics)["port"] not in ports
    assert https["scheme"] == "https" and metrics["scheme"] == "http"
    assert https["tlsConfig"]["serverName"] in certificate["spec"]["dnsNames"]
    assert https["tlsConfig"]["ca"]["secret"] == {"name": certificate["spec"]["secretName"], "key": "ca.crt"}


def test_the_dashboard_is_a_labelled_configmap_grafana_can_load(rendered: list[dict[str, Any]]) -> None:
    config_map = one(rendered, "ConfigMap", "castslice-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["castslice.json"])
    assert dashboard["uid"] == "castslice" and dashboard["panels"]
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]


# -- metric names: what the queries read is what the code serves --------------------------------
@pytest.fixture(scope="module")
def webhook_metrics() -> Iterator[str]:
    """/metrics of a webhook whose configuration watches the cluster (spot: the view's metrics)."""
    with FakeApiServer() as api:
        webhook = build_webhook(
            parse_config({"spot": {"enabled": True}}),
            {},
            transport=transport_for(api.url),
            watches=(PODS, REPLICASETS),
            freeze_gc=False,
        )
        try:
            assert webhook.watcher is not None and webhook.watcher.wait_synced(10)
            yield webhook.handle("GET", "/metrics", None).body.decode()
        finally:
            webhook.watcher.stop()


def controller_metrics() -> str:
    """What the controller process registers on its /metrics: the runner's, the lease, inventory
    and drift reconcilers' series."""
    from prometheus_client import CollectorRegistry, generate_latest

    from function.control.drift import DriftMetrics
    from function.control.reconcilers.gpu_inventory import InventoryReconciler
    from function.control.reconcilers.gpu_leases import LeaseMetrics
    from function.control.runner import ControlMetrics
    from tests.support.fake_api import FakeApi

    registry = CollectorRegistry()
    ControlMetrics(registry)
    LeaseMetrics(registry)
    InventoryReconciler(FakeApi(), "nvidia.com/gpu.product").register(registry)
    DriftMetrics(registry)
    return generate_latest(registry).decode()


def test_the_rules_and_the_dashboard_query_only_served_metrics(
    rules: dict[str, Any], rendered: list[dict[str, Any]], webhook_metrics: str
) -> None:
    dashboard = json.loads(one(rendered, "ConfigMap", "castslice-dashboard")["data"]["castslice.json"])
    queried = {name for name in queried_names(rules, dashboard) if name.startswith("castslice_")}
    served = served_names(webhook_metrics) | served_names(controller_metrics())
    assert queried - served == set()
    # The decision histogram has the bucket the "nearing the timeout" alert reads.
    assert 'castslice_admission_decision_seconds_bucket{le="4.0"}' in webhook_metrics
