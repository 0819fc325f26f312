"""castslice doctor against the e2e control plane: healthy (every check ok, exit 0), then with each
fault it checks injected, one at a time and undone after: no registration, a caBundle that signs
nothing the webhook serves, the webhook stopped (unreachable), a webhook whose cluster view cannot
list (not ready), a namespace the webhook skips (the dry run comes back unmutated), the PodMutation
CRD missing, its RBAC missing, and Pods admitted without the webhook (drift).

The webhook is `castslice serve` on loopback with the shipped configuration's mutators, registered
by URL (no kubelet runs its Deployment here), its watches reading the cluster with a token of the
rendered ServiceAccount and RBAC."""

from __future__ import annotations

import base64
import datetime
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from function.admin.certgen import issue
from tests.e2e.controlplane import ControlPlane
from tests.e2e.identity import create, rendered_rbac, token_kubeconfig
from tests.e2e.launch import CASTSLICE, EventLog, ServedWebhook, pointed_at, start_event_sink
from tests.e2e.support import delete_crd
from tests.support.manifests import KNATIVE_DIR, render

NAMESPACE = "castslice-system"
PROBE = "doctor-e2e"
ELSEWHERE = "doctor-elsewhere"
CONFIG = {"podMutations": {"enabled": True}}
ROUTE = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [PROBE]}
"""Only the probe namespace goes to this module's webhook (other modules share the apiserver)."""


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    work = tmp_path_factory.mktemp("doctor")
    objects = render(KNATIVE_DIR / "overlays" / "deployment")
    [crd] = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    (work / "rbac").mkdir()
    rbac = rendered_rbac(work / "rbac")
    with control_plane.api_client() as api:
        for obj in [crd, *rbac]:
            create(api, obj)
        for name in (PROBE, ELSEWHERE):
            create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            control_plane.wait_for_service_account(name)
        control_plane.wait_for_service_account(NAMESPACE, "castslice")
    kubeconfig = token_kubeconfig(control_plane, NAMESPACE, "castslice", work / "castslice.kubeconfig")
    log = EventLog()
    sink, sink_server = start_event_sink(log)
    served = ServedWebhook(control_plane, "doctor", CONFIG, sink, kubeconfig=kubeconfig)
    [base_webhook] = [o for o in render(KNATIVE_DIR / "base") if o["kind"] == "MutatingWebhookConfiguration"]
    registration = pointed_at(
        base_webhook, "castslice", served.url, control_plane.ca_cert.read_bytes(), ROUTE
    )
    with control_plane.api_client() as api:
        create(api, registration)
    state = {
        "served": served,
        "kubeconfig": kubeconfig,
        "registration": registration,
        "base": base_webhook,
        "crd": crd,
        "rbac": rbac,
        "sink": sink,
        "work": work,
    }
    yield state
    state["served"].stop()
    sink_server.shutdown()
    with control_plane.api_client() as api:
        admission, rbac_api = client.AdmissionregistrationV1Api(api), client.RbacAuthorizationV1Api(api)
        admission.delete_mutating_webhook_configuration("castslice")
        for obj in rbac:
            if obj["kind"] == "ClusterRoleBinding":
                rbac_api.delete_cluster_role_binding(obj["metadata"]["name"])
            elif obj["kind"] == "ClusterRole":
                rbac_api.delete_cluster_role(obj["metadata"]["name"])
        client.CoreV1Api(api).delete_namespaced_service_account("castslice", NAMESPACE)
        delete_crd(api, crd["metadata"]["name"])  # other modules install their own


def restart(plane: ControlPlane, setup: dict[str, Any], name: str, ready: bool = True) -> None:
    """The webhook stopped and started again (``name``: new, for its certificate) on a new port,
    and the registration pointed at it."""
    from kubernetes import client

    setup["served"].stop()
    setup["served"] = ServedWebhook(
        plane, name, CONFIG, setup["sink"], kubeconfig=setup["kubeconfig"], ready=ready
    )
    setup["registration"] = pointed_at(
        setup["base"], "castslice", setup["served"].url, plane.ca_cert.read_bytes(), ROUTE
    )
    with plane.api_client() as api:
        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("castslice")
        create(api, setup["registration"])


def doctor(plane: ControlPlane, setup: dict[str, Any]) -> tuple[int, list[str]]:
    config = setup["work"] / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    done = subprocess.run(
        [
            CASTSLICE, "doctor", "--kubeconfig", str(plane.kubeconfig), "--config", str(config),
            "--probe-namespace", PROBE, "--since-hours", "1",
        ],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines()


def line(lines: list[str], check: str) -> str:
    found = [text for text in lines if text[6:].startswith(check + ":")]
    assert found, f"no {check} line in:\n" + "\n".join(lines)
    return found[0]


def fix_of(lines: list[str], check: str) -> str:
    index = lines.index(line(lines, check))
    assert lines[index + 1].startswith("      fix: "), lines
    return lines[index + 1]


def test_a_healthy_install_passes_every_check(control_plane: ControlPlane, setup: dict[str, Any]) -> None:
    code, lines = doctor(control_plane, setup)
    print("\n".join(lines))  # pytest -s shows what a user sees
    assert code == 0, "\n".join(lines)
    for check in ("registered", "caBundle", "reachable", "ready", "dry run", "configuration", "drift"):
        assert line(lines, check).startswith("ok    "), lines
    assert line(lines, "dry run").endswith("comes back with nvidia.com/gpu-shared: 2")
    assert line(lines, "RBAC podmutations.castops.io").startswith("ok    ")


def test_no_registration(control_plane: ControlPlane, setup: dict[str, Any]) -> None:
    from kubernetes import client

    with control_plane.api_client() as api:
        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("castslice")
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 1
        assert line(lines, "registered") == "FAIL  registered: no MutatingWebhookConfiguration castslice"
        assert "kubectl apply -k knative/overlays/deployment" in fix_of(lines, "registered")
        assert line(lines, "dry run").startswith(
            "FAIL  dry run: an opted-in Pod in doctor-e2e came back unmutated"
        )
    finally:
        with control_plane.api_client() as api:
            create(api, setup["registration"])


def test_a_ca_bundle_that_signs_nothing_the_webhook_serves(
    control_plane: ControlPlane, setup: dict[str, Any]
) -> None:
    from kubernetes import client

    other = issue(["elsewhere.example.com"], datetime.datetime.now(datetime.UTC)).ca
    patch = [
        {
            "op": "replace",
            "path": "/webhooks/0/clientConfig/caBundle",
            "value": base64.b64encode(other).decode(),
        }
    ]
    with control_plane.api_client() as api:
        client.AdmissionregistrationV1Api(api).patch_mutating_webhook_configuration("castslice", patch)
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 1
        assert line(lines, "caBundle").startswith(
            "FAIL  caBundle: does not sign the certificate https://127.0.0.1:"
        )
        assert "castslice certgen" in fix_of(lines, "caBundle")
        assert line(lines, "dry run").startswith("FAIL  dry run:")
    finally:
        with control_plane.api_client() as api:
            client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("castslice")
            create(api, setup["registration"])


def test_a_namespace_the_webhook_skips_comes_back_unmutated(
    control_plane: ControlPlane, setup: dict[str, Any]
) -> None:
    from kubernetes import client

    label = {"metadata": {"labels": {"castops.io/webhook": "ignore"}}}
    with control_plane.api_client() as api:
        client.CoreV1Api(api).patch_namespace(PROBE, label)
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 1
        assert line(lines, "reachable").startswith("ok    ")
        assert line(lines, "dry run") == (
            "FAIL  dry run: an opted-in Pod in doctor-e2e came back unmutated (nvidia.com/gpu: 1)"
        )
        assert "apiserver_admission_webhook_fail_open_count" in fix_of(lines, "dry run")
    finally:
        with control_plane.api_client() as api:
            client.CoreV1Api(api).patch_namespace(
                PROBE, {"metadata": {"labels": {"castops.io/webhook": None}}}
            )


def test_pods_admitted_without_the_webhook_are_counted_as_drift(
    control_plane: ControlPlane, setup: dict[str, Any]
) -> None:
    from kubernetes import client

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "skipped", "annotations": {"castops.io/optimize": "true"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    with control_plane.api_client() as api:
        client.CoreV1Api(api).create_namespaced_pod(ELSEWHERE, pod)  # not routed to the webhook
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 0, "drift is a warning: the install itself works"
        assert line(lines, "drift").startswith("warn  drift: 1 of ")
        assert "(doctor-elsewhere/skipped)" in line(lines, "drift")
    finally:
        with control_plane.api_client() as api:
            client.CoreV1Api(api).delete_namespaced_pod("skipped", ELSEWHERE, grace_period_seconds=0)


def test_missing_rbac_and_a_webhook_that_cannot_become_ready(
    control_plane: ControlPlane, setup: dict[str, Any]
) -> None:
    from kubernetes import client

    binding = next(
        o
        for o in setup["rbac"]
        if o["kind"] == "ClusterRoleBinding" and "podmutations" in o["metadata"]["name"]
    )
    with control_plane.api_client() as api:
        client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(binding["metadata"]["name"])
    # A restarted webhook cannot list PodMutations any more: its view never syncs.
    restart(control_plane, setup, "doctor-unready", ready=False)
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 1
        assert line(lines, "RBAC podmutations.castops.io") == (
            "FAIL  RBAC podmutations.castops.io: "
            "system:serviceaccount:castslice-system:castslice may not list or watch it"
        )
        assert "knative/components/cluster-view, pod-mutations" in fix_of(
            lines, "RBAC podmutations.castops.io"
        )
        assert line(lines, "ready").startswith("FAIL  ready: /readyz: 503")
    finally:
        with control_plane.api_client() as api:
            create(api, binding)
        restart(control_plane, setup, "doctor-again")


def test_the_webhook_stopped_is_unreachable(control_plane: ControlPlane, setup: dict[str, Any]) -> None:
    setup["served"].stop()
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 1
        assert line(lines, "reachable").startswith(
            "FAIL  reachable: /healthz from where the apiserver calls it: no answer"
        )
        assert "logs deployment/castslice" in fix_of(lines, "reachable")
        assert line(lines, "ready").startswith("FAIL  ready:")
        assert line(lines, "dry run").startswith("FAIL  dry run:")
    finally:
        restart(control_plane, setup, "doctor-restarted")


def test_a_missing_crd(control_plane: ControlPlane, setup: dict[str, Any]) -> None:

    with control_plane.api_client() as api:
        delete_crd(api, setup["crd"]["metadata"]["name"])
    try:
        code, lines = doctor(control_plane, setup)
        assert code == 1
        assert line(lines, "CRD podmutations.castops.io") == (
            "FAIL  CRD podmutations.castops.io: missing (the configuration watches it)"
        )
        # Drift is not judged over a view that cannot list (the CRD line says what to fix).
        assert line(lines, "drift").startswith("warn  drift: not judged: cannot list podmutations")
    finally:
        with control_plane.api_client() as api:
            create(api, setup["crd"])  # the module's later checks read it
