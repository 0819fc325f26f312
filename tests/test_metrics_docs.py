"""Every metric CastSlice exports is documented, and every metric the documentation names is
exported: the served /metrics against the castslice_* names in README.md and docs/."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from function.control.drift import DriftMetrics
from function.control.reconcilers.dra_templates import TemplateReconciler
from function.control.reconcilers.gpu_inventory import InventoryReconciler
from function.control.reconcilers.gpu_leases import LeaseMetrics
from function.control.runner import ControlMetrics
from function.core.dra import DraConfig
from function.kube.watch import ViewMetrics
from tests.support import ROOT, asgi_client
from tests.support.fake_api import FakeApi

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def families(text: str) -> set[str]:
    return {
        family.name for family in text_string_to_metric_families(text) if family.name.startswith("castslice_")
    }


def served(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """What the webhook's GET /metrics serves (through the real app), and the series that only
    appear with a cluster view or in the controller process, rendered from the very classes those
    processes serve /metrics from."""
    webhook = asgi_client(monkeypatch).get("/metrics")
    assert webhook.status_code == 200
    registry = CollectorRegistry()
    ViewMetrics(registry)
    ControlMetrics(registry)
    LeaseMetrics(registry)
    DriftMetrics(registry)
    TemplateReconciler(DraConfig(), (), api=None).register(registry)  # type: ignore[arg-type]
    InventoryReconciler(FakeApi(), "nvidia.com/gpu.product").register(registry)
    return families(webhook.text) | families(generate_latest(registry).decode())


def documented() -> dict[str, str]:
    """Metric name -> the document naming it (``{a,b}`` expanded; ``castslice_view_*`` refers to
    another document's table and names nothing itself)."""
    names: dict[str, str] = {}
    for path in DOCUMENTS:
        # A brace after "_" lists name parts (castslice_gpulease_{used,queued}_gpus); after a
        # name it holds labels (castslice_view_objects{index}).
        for token in re.findall(r"castslice_(?:[a-z_]*_\{[a-z_,]+\}[a-z_]*|[a-z_]*)", path.read_text()):
            match = re.fullmatch(r"([a-z_]*_)\{([a-z_,]+)\}([a-z_]*)", token)
            expanded = [match[1] + part + match[3] for part in match[2].split(",")] if match else [token]
            for name in expanded:
                if name.endswith("_") or "{" in name:
                    continue
                for suffix in SUFFIXES:
                    name = name.removesuffix(suffix)
                names.setdefault(name, path.name)
    return names


def test_every_exported_metric_is_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = sorted(served(monkeypatch) - set(documented()))
    assert not missing, f"exported but not documented in README.md or docs/: {missing}"


def test_every_documented_metric_is_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    stale = {name: doc for name, doc in documented().items() if name not in served(monkeypatch)}
    assert not stale, f"documented but not exported: {stale}"
