"""What several end-to-end modules do to the control plane beside starting servers (launch.py):
kubectl against it, a restart of its apiserver, and a CRD deleted for the next module."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from tests.support.manifests import kubectl_path

from .controlplane import ControlPlane

APISERVER_RESTART_SECONDS = 90.0
"""How long the restarted apiserver may take to answer /readyz (a bound against hanging)."""


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_path(), f"--kubeconfig={plane.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def restart_apiserver(plane: ControlPlane) -> None:
    """Stop and start kube-apiserver (etcd keeps the state); back when /readyz answers 200."""
    apiserver = plane.process("kube-apiserver")
    apiserver.stop()
    apiserver.start()
    deadline = time.monotonic() + APISERVER_RESTART_SECONDS
    while True:
        try:
            if plane.get("/readyz")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the apiserver back")
        time.sleep(0.05)


def delete_crd(api: Any, name: str, timeout: float = 60) -> None:
    """Deletes a CustomResourceDefinition and waits until it is gone (its deletion finishes
    asynchronously): a later module creating the same CRD would otherwise meet a 409."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(api)
    try:
        extensions.delete_custom_resource_definition(name)
    except ApiException as error:
        if error.status != 404:
            raise
    deadline = time.monotonic() + timeout
    while True:
        try:
            extensions.read_custom_resource_definition(name)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError(f"CRD {name} still there {timeout:g} s after its deletion")
        time.sleep(0.2)
