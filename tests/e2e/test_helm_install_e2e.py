"""`helm install` and `helm uninstall` of charts/castslice on the e2e control plane leave no object
behind: every object of every listable resource (core, every API group, the CRDs' kinds) is listed
before the install and after the uninstall, and the two lists are the same.

Installed without cert-manager (none runs here), with certgen, GPU leases and the controller, once
with certgen's Job an object of the release (the default: it runs where hooks cannot) and once as
Helm hooks. kwok runs no container, so the certgen Job's work is done by the test, as the Job does
it: `castslice certgen` with the Job's arguments and a token of its ServiceAccount; the Secret it
writes is owned by the webhook's ServiceAccount, so the garbage collector removes it with the
release. Events are left out of the comparison (records the apiserver expires on its own), and
the release's namespace is made by the test (Helm never deletes a namespace it did not make).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART, HELM, REQUIRED, SKIP_REASON

from .controlplane import ControlPlane
from .identity import token_kubeconfig
from .launch import CASTSLICE
from .workloads import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(HELM is None and not REQUIRED, reason=SKIP_REASON)]

NAMESPACE = "castslice-helm-e2e"
SETTINGS = (
    "certManager.enabled=false",
    "certgen.enabled=true",
    "gpuLeases.enabled=true",
    "controller.enabled=true",
)
SKIPPED = {("", "events"), ("events.k8s.io", "events")}
"""Records the apiserver expires on its own (one hour), not objects anyone installed."""

Key = tuple[str, str, str, str]
"""(API group, resource, namespace, name)."""


def listable(plane: ControlPlane) -> list[tuple[str, str, str]]:
    """(group, group/version path, resource) of every resource that can be listed, preferred
    versions only (one version's list holds every object of the resource)."""
    found = [("", "/api/v1", r["name"]) for r in plane.get_json("/api/v1")["resources"] if _lists(r)]
    for group in plane.get_json("/apis")["groups"]:
        version = group["preferredVersion"]["groupVersion"]
        for resource in plane.get_json(f"/apis/{version}")["resources"]:
            if _lists(resource):
                found.append((group["name"], f"/apis/{version}", resource["name"]))
    return found


def _lists(resource: dict[str, Any]) -> bool:
    return "/" not in resource["name"] and "list" in resource.get("verbs", [])


def every_object(plane: ControlPlane) -> set[Key]:
    """Every object that is not on its way out: an object being deleted, or any object of a
    namespace being deleted (an earlier test module's teardown still finishing in the shared
    control plane), is neither the release's nor something the release removed."""
    objects: set[Key] = set()
    terminating = {
        item["metadata"]["name"]
        for item in plane.get_json("/api/v1/namespaces").get("items") or []
        if item["metadata"].get("deletionTimestamp")
    }
    for group, path, resource in listable(plane):
        if (group, resource) in SKIPPED:
            continue
        status, body = plane.get(f"{path}/{resource}")
        for _ in range(30):  # a CRD just created: its storage is initializing (429, retry after 1 s)
            if status != 429:
                break
            time.sleep(1)
            status, body = plane.get(f"{path}/{resource}")
        if status == 404:  # a CRD deleted between discovery and the list
            continue
        assert status == 200, f"{path}/{resource}: {status} {body[:300]!r}"
        for item in json.loads(body).get("items") or []:
            metadata = item["metadata"]
            if metadata.get("deletionTimestamp") or metadata.get("namespace") in terminating:
                continue
            if resource == "namespaces" and metadata["name"] in terminating:
                continue
            objects.add((group, resource, metadata.get("namespace", ""), metadata["name"]))
    return objects


def helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run(
        [HELM, "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    control_plane.create_namespace(NAMESPACE)
    yield NAMESPACE
    with control_plane.api_client() as api:
        from kubernetes import client

        client.CoreV1Api(api).delete_namespace(NAMESPACE)


def run_certgen_as_its_job(plane: ControlPlane, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """What the certgen Job's container does, with the rendered arguments and its account's token."""
    kubeconfig = token_kubeconfig(plane, NAMESPACE, "castslice-certgen", tmp_path / "certgen.kubeconfig")
    args = ["certgen", "--secret", "castslice-serving-tls", "--service", "castslice"]
    args += ["--owner-service-account", "castslice"]
    environment = {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [CASTSLICE, *args], env=environment, capture_output=True, text=True, timeout=120, check=False
    )


def left_behind(plane: ControlPlane, before: set[Key]) -> tuple[set[Key], set[Key]]:
    now = every_object(plane)
    return now - before, before - now


@pytest.mark.parametrize("hooks", [False, True], ids=["certgen-job", "certgen-hooks"])
def test_helm_install_and_uninstall_leave_no_object_behind(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, hooks: bool
) -> None:
    before = every_object(control_plane)
    settings = [*SETTINGS, f"certgen.hooks={str(hooks).lower()}"]
    install = helm(
        control_plane,
        "install", "castslice", str(CHART), "--namespace", namespace,
        *[flag for setting in settings for flag in ("--set", setting)],
        "--wait", "--wait-for-jobs", "--timeout", "180s",
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    assert f"castslice doctor -n {namespace}" in install.stdout  # NOTES.txt: the next commands

    installed = every_object(control_plane)
    ours = {key for key in installed - before}
    assert ("apiextensions.k8s.io", "customresourcedefinitions", "", "gpuleases.castops.io") in ours
    assert ("apps", "deployments", namespace, "castslice-control") in ours
    certgen_rbac = ("rbac.authorization.k8s.io", "clusterroles", "", "castslice-certgen")
    # A hook is deleted once it succeeded; the Job and its RBAC of the default stay until uninstall.
    assert (certgen_rbac in ours) is not hooks

    if not hooks:
        done = run_certgen_as_its_job(control_plane, tmp_path)
        assert done.returncode == 0, done.stderr
        secret = control_plane.get_json(f"/api/v1/namespaces/{namespace}/secrets/castslice-serving-tls")
        [owner] = secret["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("ServiceAccount", "castslice")

    uninstall = helm(control_plane, "uninstall", "castslice", "--namespace", namespace, "--wait")
    assert uninstall.returncode == 0, uninstall.stderr

    # The garbage collector removes what the release's objects owned (Pods, ReplicaSets, the
    # Secret certgen wrote) and the CRDs' deletion finishes asynchronously: compare until equal.
    def nothing_left() -> bool:
        added, removed = left_behind(control_plane, before)
        return not added and not removed

    try:
        eventually(nothing_left, 120, "every object of the release to be gone")
    except AssertionError:
        added, removed = left_behind(control_plane, before)
        raise AssertionError(
            f"left behind: {sorted(added)}; gone that was there: {sorted(removed)}"
        ) from None
