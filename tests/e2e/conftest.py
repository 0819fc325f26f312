"""End-to-end tests against a real kube-apiserver (see controlplane.py)."""

from __future__ import annotations

import pytest

from .controlplane import control_plane  # noqa: F401  (the session fixture)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end test against a real etcd + kube-apiserver + kube-controller-manager + "
        "kube-scheduler + kwok (skipped without binaries, see .ci/provision-k8s)",
    )
