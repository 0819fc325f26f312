"""knative/components/certgen on the real apiserver, without cert-manager: the component's
command, run as its Job runs it (the ServiceAccount's token and the rendered RBAC, nothing
more), creates the serving-certificate Secret and patches its CA into the webhook
configuration's caBundle; the webhook served with that certificate then answers the apiserver
through the registration (an opted-in Pod is stored sliced). A second run keeps both.

The Job itself cannot run here (kwok plays the kubelets and runs no container), so its command
runs as a process with the Job's identity."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane
from tests.e2e.identity import create, token_kubeconfig
from tests.e2e.launch import CASTSLICE, EventLog, ServedWebhook, start_event_sink
from tests.support.manifests import KNATIVE_DIR, one, render, render_overlay
from tests.support.processes import free_port

NAMESPACE = "castslice-system"
SECRET = "castslice-serving-tls"
WORKLOAD_NAMESPACE = "certgen-e2e"
CONFIGURATION = "castslice"
"""The name the component's RBAC lets certgen patch (the rendered registration's)."""
LEASES_CONFIGURATION = "castslice-gpuleases"
RBAC_KINDS = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = KNATIVE_DIR / "overlays" / "deployment"
    return render_overlay(tmp_path_factory.mktemp("certgen"), overlay, ("certgen",))


@pytest.fixture(scope="module")
def registered(control_plane: ControlPlane, rendered: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The certgen identity as rendered, and the rendered webhook configuration registered for one
    namespace, pointed at a port a webhook will serve on, with no caBundle yet."""
    from kubernetes import client

    created = []
    with control_plane.api_client() as api:
        for obj in rendered:
            ours = obj["kind"] == "Namespace" or "certgen" in obj["metadata"]["name"]
            if obj["kind"] in RBAC_KINDS and ours and create(api, obj):
                created.append(obj)
        control_plane.wait_for_service_account(NAMESPACE, "castslice-certgen")
        create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOAD_NAMESPACE}})
        control_plane.wait_for_service_account(WORKLOAD_NAMESPACE)
        [configuration] = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
        port = free_port()
        for hook in configuration["webhooks"]:
            # The loopback server instead of the Service (no kubelet runs the Deployment here);
            # only this module's namespace, as other modules' webhooks share the apiserver.
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
            hook["namespaceSelector"]["matchExpressions"].append(
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [WORKLOAD_NAMESPACE]}
            )
        create(api, configuration)
        # The GpuLease validating webhook, as components/gpu-leases ships it (failurePolicy Fail:
        # a caBundle left empty refuses every GpuLease), with no caBundle yet either.
        leases = one(render(KNATIVE_DIR / "components" / "gpu-leases"), "ValidatingWebhookConfiguration")
        for hook in leases["webhooks"]:
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate/gpuleases"}
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": WORKLOAD_NAMESPACE}}
        create(api, leases)
    yield {"port": port, "configuration": configuration}
    with control_plane.api_client() as api:
        admission, rbac, core = (
            client.AdmissionregistrationV1Api(api),
            client.RbacAuthorizationV1Api(api),
            client.CoreV1Api(api),
        )
        admission.delete_mutating_webhook_configuration(CONFIGURATION)
        admission.delete_validating_webhook_configuration(LEASES_CONFIGURATION)
        core.delete_namespaced_secret(SECRET, NAMESPACE)
        for obj in created:
            name, kind = obj["metadata"]["name"], obj["kind"]
            if kind == "ClusterRole":
                rbac.delete_cluster_role(name)
            elif kind == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(name)
            elif kind == "Role":
                rbac.delete_namespaced_role(name, NAMESPACE)
            elif kind == "RoleBinding":
                rbac.delete_namespaced_role_binding(name, NAMESPACE)
            elif kind == "ServiceAccount":
                core.delete_namespaced_service_account(name, NAMESPACE)


def certgen(kubeconfig: Path, rendered: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """The Job's command, as rendered, with the webhook's loopback address named too and the
    e2e registration to patch."""
    [job] = [o for o in rendered if o["kind"] == "Job"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["castslice"]
    command = [CASTSLICE, *container["args"], "--host", "127.0.0.1", "--mutating", CONFIGURATION]
    environment = {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE, "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)


def test_certgen_creates_the_secret_patches_the_ca_and_the_apiserver_trusts_the_webhook(
    control_plane: ControlPlane,
    rendered: list[dict[str, Any]],
    registered: dict[str, Any],
    tmp_path: Path,
) -> None:
    from kubernetes import client

    kubeconfig = token_kubeconfig(
        control_plane, NAMESPACE, "castslice-certgen", tmp_path / "certgen.kubeconfig"
    )
    first = certgen(kubeconfig, rendered)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith(
        f"secret {NAMESPACE}/{SECRET}: created (no certificate yet): CA and serving certificate"
    )
    assert f"mutatingwebhookconfiguration/{CONFIGURATION}: caBundle patched (1 of 1 webhooks)" in lines
    assert "validatingwebhookconfiguration/castslice-podmutations: not found, skipped" in lines
    assert (
        f"validatingwebhookconfiguration/{LEASES_CONFIGURATION}: caBundle patched (1 of 1 webhooks)" in lines
    )

    with control_plane.api_client() as api:
        secret = client.CoreV1Api(api).read_namespaced_secret(SECRET, NAMESPACE)
        stored = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(CONFIGURATION)
    assert secret.type == "kubernetes.io/tls"
    files = {key: base64.b64decode(value) for key, value in secret.data.items()}
    assert stored.webhooks[0].client_config.ca_bundle == base64.b64encode(files["ca.crt"]).decode()
    with control_plane.api_client() as api:
        leases = client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
            LEASES_CONFIGURATION
        )
    assert leases.webhooks[0].client_config.ca_bundle == base64.b64encode(files["ca.crt"]).decode()
    for key, value in files.items():
        (tmp_path / key).write_bytes(value)

    # The webhook served with that certificate, at the address the registration names.
    log = EventLog()
    sink, sink_server = start_event_sink(log)
    served = ServedWebhook(
        control_plane,
        "certgen",
        {},
        sink,
        tls=(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"),
        port=registered["port"],
    )
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sliced", "annotations": {"castops.io/optimize": "true"}},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ]
            },
        }
        with control_plane.api_client() as api:
            created = client.CoreV1Api(api).create_namespaced_pod(WORKLOAD_NAMESPACE, pod)
        assert created.spec.containers[0].resources.limits == {"nvidia.com/gpu-shared": "1"}, (
            served.log_tail()
        )
    finally:
        served.stop()
        sink_server.shutdown()

    # Run again, as a re-applied Job would: both kept.
    second = certgen(kubeconfig, rendered)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[0].startswith(f"secret {NAMESPACE}/{SECRET}: kept (valid until ")
    assert f"mutatingwebhookconfiguration/{CONFIGURATION}: caBundle already current" in second.stdout


def test_the_certgen_identity_may_touch_nothing_else(
    control_plane: ControlPlane, registered: dict[str, Any], tmp_path: Path
) -> None:
    """Its RBAC names its Secret and the project's two configurations: patching another one is
    forbidden, which is what certgen then reports (one line, exit 1, for the Job to retry)."""
    kubeconfig = token_kubeconfig(
        control_plane, NAMESPACE, "castslice-certgen", tmp_path / "certgen.kubeconfig"
    )
    done = subprocess.run(
        [CASTSLICE, "certgen", "--host", "127.0.0.1", "--mutating", "castslice-another"],
        env={"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("castslice certgen: 403 Forbidden: ")
    assert '"castslice-another" is forbidden' in done.stderr and len(done.stderr.splitlines()) == 1
