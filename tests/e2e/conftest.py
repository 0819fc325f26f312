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


# The figures end-to-end tests measure (record_property: counts, losses, durations) are printed at
# the end of the run, so CI's log carries them without -s or a JUnit file.
FIGURES: list[tuple[str, str, object]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        FIGURES.extend((report.nodeid, name, value) for name, value in report.user_properties)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("end-to-end figures")
        for nodeid, name, value in FIGURES:
            terminalreporter.write_line(f"{nodeid.split('::')[-1]} {name}: {value}")
