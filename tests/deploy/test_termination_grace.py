"""The webhook's termination grace period in every shipped way to run it covers what ``castslice
serve`` does after SIGTERM: the drain, the idle connections it leaves to their clients (closing
them itself only after KEPT_ALIVE_IDLE_SECONDS), and the audit queue. A shorter one kills the
process while a client may still send a review on a connection it holds (function/serve/protocol.py
``shutdown``), or before queued audit events are written."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from function.contract import KEPT_ALIVE_IDLE_SECONDS, SHUTDOWN_DRAIN_SECONDS
from tests.support.helm import HELM, REQUIRED, SKIP_REASON, helm_template
from tests.support.manifests import KNATIVE_DIR, one, render

CONFIG = yaml.safe_load((KNATIVE_DIR / "base" / "config.yaml").read_text())
AUDIT_DRAIN = float(CONFIG["audit"]["drainSeconds"])
NEEDED = SHUTDOWN_DRAIN_SECONDS + KEPT_ALIVE_IDLE_SECONDS + AUDIT_DRAIN
KNATIVE_PRESTOP = 30
"""Knative's queue-proxy holds a scaled-down Pod about this long before the container's SIGTERM."""


def _webhook_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objs, "Deployment", "castslice")["spec"]["template"]["spec"]
    return spec


def test_the_deployment_overlay_waits_for_the_drain_idle_connections_and_audit_queue() -> None:
    spec = _webhook_spec(render(KNATIVE_DIR / "overlays" / "deployment"))
    assert spec["terminationGracePeriodSeconds"] >= NEEDED


def test_the_knative_route_waits_for_the_queue_proxy_then_as_long_as_the_deployment() -> None:
    service = one(render(KNATIVE_DIR / "overlays" / "knative-route"), "Service", "castslice")
    assert service["spec"]["template"]["spec"]["timeoutSeconds"] >= KNATIVE_PRESTOP + NEEDED


@pytest.mark.skipif(HELM is None and not REQUIRED, reason=SKIP_REASON)
def test_the_chart_waits_as_long_as_the_deployment_overlay() -> None:
    chart = _webhook_spec(helm_template())["terminationGracePeriodSeconds"]
    overlay = _webhook_spec(render(KNATIVE_DIR / "overlays" / "deployment"))["terminationGracePeriodSeconds"]
    assert chart == overlay >= NEEDED
