"""The real-node suite: real Pods on a real kubelet, Knative Serving and its ingress, and
CastSlice installed as users install it (realnode.py, platform.py, installs.py). Run by
``.ci/run-cluster``; deselected from the default run (``-m "not cluster"`` in pyproject.toml),
since it needs its own provisioning (``.ci/provision-cluster``) and root.

Without the provisioned assets, the control plane or the image the fixtures skip, unless
``CASTSLICE_CLUSTER_REQUIRED=1`` (``.ci/run-cluster``), where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .installs import Installs
from .realnode import REQUIRED_ENV, Assets, RealCluster, interrupt_on_sigterm, start

HERE = Path(__file__).parent


# The modules share one cluster and build on each other's installs, in this order: the Knative
# install and what runs through it; the plain Service beside it; Knative Eventing added to it
# (its SinkBinding webhook then sits in front of every workload's creation); last, the Helm chart,
# which takes the cluster-scoped names (CRDs, webhook configurations) and so removes the
# Knative install first.
MODULE_ORDER = (
    "test_knative_route_cluster.py",
    "test_route_latency_cluster.py",
    "test_audit_eventing_cluster.py",
    "test_helm_chart_cluster.py",
)


def _module_rank(item: pytest.Item) -> int:
    name = Path(str(item.fspath)).name
    return MODULE_ORDER.index(name) if name in MODULE_ORDER else len(MODULE_ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [item for item in items if Path(str(item.fspath)).is_relative_to(HERE)]
    for item in ours:
        item.add_marker(pytest.mark.cluster)
    if ours:
        ranked = iter(sorted(ours, key=_module_rank))  # stable: file order within a module
        items[:] = [next(ranked) if Path(str(item.fspath)).is_relative_to(HERE) else item for item in items]


# The figures the suite measures (record_property), printed at the end of the run for CI's log.
FIGURES: list[tuple[str, str, object]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and Path(report.fspath).resolve().is_relative_to(HERE):
        FIGURES.extend((report.nodeid, name, value) for name, value in report.user_properties)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("real-node figures")
        for nodeid, name, value in FIGURES:
            terminalreporter.write_line(f"{nodeid.split('::')[-1]} {name}: {value}")


def _unavailable(why: str) -> None:
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{why} [{REQUIRED_ENV}=1]", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def cluster() -> Iterator[RealCluster]:
    assets, why = Assets.find()
    if assets is None:
        _unavailable(why)
        raise AssertionError(why)
    if os.geteuid() != 0:
        _unavailable("the real node needs root (containerd, the kubelet, kube-proxy's iptables rules)")
    image = os.environ.get("CASTSLICE_IMAGE", "")
    if not image:
        _unavailable('$CASTSLICE_IMAGE is unset: build it with `eval "$(.ci/build-image)"`')
    interrupt_on_sigterm()  # a stopped run still tears the node down
    node = start(assets)
    problems: list[str] = []
    try:
        node.load_project_image(image)
        yield node
    finally:
        problems = node.down()
    # Teardown is part of the suite: the host as it was found, or an error naming what is left.
    assert not problems, "the real node left the host changed:\n" + "\n".join(problems)


@pytest.fixture(scope="session")
def installs(cluster: RealCluster) -> Installs:
    """The platform (Knative Serving, Traefik) and CastSlice's installs, each made on first use."""
    return Installs(cluster)
