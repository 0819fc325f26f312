"""castslice certgen's decisions (what it issues, when it renews, the caBundle it writes) and the
kustomize component that runs it: no cert-manager object left, RBAC limited to what it touches.
On a real apiserver: tests/e2e/test_certgen_e2e.py."""

from __future__ import annotations

import datetime
import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from function.admin import certgen
from function.admin.certgen import (
    CA_DAYS,
    CERT_DAYS,
    Issued,
    ca_bundle,
    issue,
    renewal_reason,
    service_names,
)
from tests.support.fake_api import FakeApi
from tests.support.manifests import KNATIVE_DIR, render_overlay

NOW = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)
HOSTS = [*service_names("castslice", "castslice-system"), "127.0.0.1"]


@pytest.fixture(scope="module")
def issued() -> Issued:
    return issue(HOSTS, NOW)


def data(issued: Issued) -> dict[str, bytes]:
    return {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": issued.ca}


def test_the_serving_certificate_names_the_service_and_extra_hosts_and_is_signed_by_the_ca(
    issued: Issued,
) -> None:
    cert = x509.load_pem_x509_certificate(issued.cert)
    ca = x509.load_pem_x509_certificate(issued.ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "castslice.castslice-system.svc",
        "castslice.castslice-system.svc.cluster.local",
    ]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.not_valid_after_utc == NOW + datetime.timedelta(days=CERT_DAYS)
    assert ca.not_valid_after_utc == NOW + datetime.timedelta(days=CA_DAYS)
    assert b"PRIVATE KEY" in issued.key and b"PRIVATE KEY" not in issued.ca


def test_a_valid_certificate_naming_every_host_is_kept(issued: Issued) -> None:
    assert renewal_reason(data(issued), HOSTS, NOW, 30) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: None, "no certificate yet"),
        (lambda d: {**d, "ca.crt": b""}, "no certificate yet"),
        (lambda d: {**d, "tls.crt": b"not pem"}, "the certificate in it is not PEM"),
    ],
    ids=["absent", "no ca", "not pem"],
)
def test_a_missing_or_broken_secret_gets_a_new_certificate(issued: Issued, change: Any, reason: str) -> None:
    assert renewal_reason(change(data(issued)), HOSTS, NOW, 30) == reason


def test_a_certificate_for_other_hosts_or_another_ca_or_near_its_end_is_replaced(issued: Issued) -> None:
    assert renewal_reason(data(issued), [*HOSTS, "castslice.example.com"], NOW, 30) == (
        "its certificate does not name castslice.example.com"
    )
    other = issue(HOSTS, NOW)
    assert renewal_reason({**data(issued), "ca.crt": other.ca}, HOSTS, NOW, 30) == (
        "its certificate is not issued by its ca.crt"
    )
    late = NOW + datetime.timedelta(days=CERT_DAYS - 29)
    assert renewal_reason(data(issued), HOSTS, late, 30) == (
        f"its certificate expires {NOW + datetime.timedelta(days=CERT_DAYS):%Y-%m-%d}, within 30 days"
    )


def test_a_renewed_ca_bundle_keeps_the_previous_ca_until_the_webhook_serves_the_new_certificate(
    issued: Issued,
) -> None:
    newer = issue(HOSTS, NOW)
    bundle = ca_bundle(newer.ca, issued.ca)
    assert x509.load_pem_x509_certificates(bundle) == [
        x509.load_pem_x509_certificate(newer.ca),
        x509.load_pem_x509_certificate(issued.ca),
    ]
    assert ca_bundle(issued.ca, issued.ca) == issued.ca
    assert ca_bundle(issued.ca, None) == issued.ca


# -- the component -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = KNATIVE_DIR / "overlays" / "deployment"
    return render_overlay(tmp_path_factory.mktemp("certgen"), overlay, ("certgen",))


def test_the_component_leaves_no_cert_manager_object(rendered: list[dict[str, Any]]) -> None:
    assert not [o for o in rendered if o["apiVersion"].startswith("cert-manager.io/")]
    [deployment] = [o for o in rendered if o["kind"] == "Deployment"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "castslice-serving-tls"}} in volumes


def test_the_job_runs_certgen_in_the_webhooks_namespace_for_the_secret_the_deployment_mounts(
    rendered: list[dict[str, Any]],
) -> None:
    [job] = [o for o in rendered if o["kind"] == "Job"]
    assert job["metadata"]["namespace"] == "castslice-system"
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("ghcr.io/castops/castslice:")
    assert container["command"] + container["args"] == [
        "castslice", "certgen", "--secret", "castslice-serving-tls", "--service", "castslice",
        "--owner-service-account", "castslice",
    ]  # fmt: skip
    [service] = [o for o in rendered if o["kind"] == "Service"]
    assert service["metadata"]["name"] == "castslice"


def test_certgen_and_doctor_know_every_webhook_configuration_the_manifests_install() -> None:
    """castslice-gpuleases (failurePolicy Fail) was once left out: every GpuLease create then failed
    with x509 while doctor said all was well."""
    import re

    from function import contract

    found: dict[str, set[str]] = {
        "MutatingWebhookConfiguration": set(),
        "ValidatingWebhookConfiguration": set(),
    }
    for path in sorted(KNATIVE_DIR.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") in found:
                found[document["kind"]].add(document["metadata"]["name"])
    chart = (KNATIVE_DIR.parent / "charts" / "castslice" / "templates").glob("*.yaml")
    for path in chart:
        for kind, name in re.findall(
            r"kind: (\w+WebhookConfiguration)\nmetadata:\n  name: ([\w-]+)", path.read_text()
        ):
            found[kind].add(name)
    assert found["MutatingWebhookConfiguration"] == set(contract.MUTATING_CONFIGURATIONS)
    assert found["ValidatingWebhookConfiguration"] == set(contract.VALIDATING_CONFIGURATIONS)
    assert certgen.DEFAULT_MUTATING == contract.MUTATING_CONFIGURATIONS
    assert certgen.DEFAULT_VALIDATING == contract.VALIDATING_CONFIGURATIONS


def test_the_certgen_rbac_reaches_only_its_secret_and_the_webhook_configurations(
    rendered: list[dict[str, Any]],
) -> None:
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in rendered}
    role = by_name[("Role", "castslice-certgen")]
    assert role["metadata"]["namespace"] == "castslice-system"
    secret = {"apiGroups": [""], "resources": ["secrets"]}
    assert role["rules"] == [
        {**secret, "resourceNames": ["castslice-serving-tls"], "verbs": ["get", "update"]},
        {**secret, "verbs": ["create"]},
        # The webhook's own account, which owns the Secret: deleting the webhook deletes it.
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts"],
            "resourceNames": ["castslice"],
            "verbs": ["get"],
        },
    ]
    names = {
        rule["resources"][0]: rule["resourceNames"]
        for rule in by_name[("ClusterRole", "castslice-certgen")]["rules"]
    }
    from function import contract

    # Every configuration the manifests install, by name (a component not installed: not found,
    # skipped): the overlay's own among them.
    assert names == {
        "mutatingwebhookconfigurations": list(contract.MUTATING_CONFIGURATIONS),
        "validatingwebhookconfigurations": list(contract.VALIDATING_CONFIGURATIONS),
    }
    for o in rendered:
        if o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert o["metadata"]["name"] in names[o["kind"].lower() + "s"]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        [subject] = by_name[(kind, "castslice-certgen")]["subjects"]
        assert subject == {
            "kind": "ServiceAccount",
            "name": "castslice-certgen",
            "namespace": "castslice-system",
        }


def test_the_component_is_listed_where_users_read_about_installing(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    assert "components/certgen" in text


# -- who owns the Secret: the webhook's ServiceAccount, so removing the webhook removes it ----------
def run_certgen(monkeypatch: pytest.MonkeyPatch, api: Any, *extra: str) -> tuple[int, str]:
    from function.cli import parser

    monkeypatch.setattr(certgen, "kube_client", lambda **_: api)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    args = parser().parse_args(["certgen", "-n", "ns", *extra])
    return certgen.run(args), out.getvalue()


SECRET_PATH = "/api/v1/namespaces/ns/secrets/castslice-serving-tls"
ACCOUNT_PATH = "/api/v1/namespaces/ns/serviceaccounts/castslice"


def test_the_secret_is_owned_by_the_named_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi()
    api.objects[ACCOUNT_PATH] = {"metadata": {"name": "castslice", "uid": "sa-uid"}}
    code, _ = run_certgen(monkeypatch, api, "--owner-service-account", "castslice")
    assert code == 0
    assert api.objects[SECRET_PATH]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "ServiceAccount", "name": "castslice", "uid": "sa-uid"}
    ]


def test_an_owner_not_there_yet_is_added_by_the_next_run_which_keeps_the_certificate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pre-install hook runs before the release's ServiceAccount exists; the post-install run
    (or the next Job) makes it the owner of the certificate it keeps."""
    api = FakeApi()
    code, _ = run_certgen(monkeypatch, api, "--owner-service-account", "castslice")
    assert code == 0 and "ownerReferences" not in api.objects[SECRET_PATH]["metadata"]
    certificate = api.objects[SECRET_PATH]["data"]["tls.crt"]
    api.objects[ACCOUNT_PATH] = {"metadata": {"name": "castslice", "uid": "sa-uid"}}
    code, out = run_certgen(monkeypatch, api, "--owner-service-account", "castslice")
    assert code == 0
    assert "secret ns/castslice-serving-tls: now owned by serviceaccount castslice" in out.splitlines()
    assert api.objects[SECRET_PATH]["data"]["tls.crt"] == certificate
    assert api.objects[SECRET_PATH]["metadata"]["ownerReferences"][0]["uid"] == "sa-uid"
    _, out = run_certgen(monkeypatch, api, "--owner-service-account", "castslice")
    assert "now owned" not in out


def test_without_an_owner_the_secret_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi()
    api.objects[ACCOUNT_PATH] = {"metadata": {"name": "castslice", "uid": "sa-uid"}}
    assert run_certgen(monkeypatch, api)[0] == 0
    assert "ownerReferences" not in api.objects[SECRET_PATH]["metadata"]
    assert not [path for _, path, _, _ in api.requests if "serviceaccounts" in path]
