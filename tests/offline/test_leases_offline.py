"""GPU leases offline: ``castslice mutate --cluster`` decides from the GpuLeases and charged Pods of
a `kubectl get pods,gpuleases -A -o yaml` file as the webhook would, and ``castslice explain
--cluster`` shows the arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run

STATE = """\
apiVersion: v1
kind: List
items:
- apiVersion: castops.io/v1alpha1
  kind: GpuLease
  metadata: {name: h100, namespace: ml, uid: l1, creationTimestamp: "2026-11-25T00:00:00Z"}
  spec: {gpuModel: NVIDIA-H100-80GB-HBM3, count: 8, duration: 876000h}
- apiVersion: v1
  kind: Pod
  metadata:
    name: train-0
    namespace: ml
    uid: p0
    labels: {castops.io/gpu-lease: h100, castops.io/gpu-lease-state: charged}
    annotations: {castops.io/gpu-lease-charge: 6000m}
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata:
    name: done-0
    namespace: ml
    uid: p1
    labels: {castops.io/gpu-lease: h100}
    annotations: {castops.io/gpu-lease-charge: 8000m}
  status: {phase: Succeeded}
"""


def pod(gpus: int) -> str:
    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: train-1, namespace: ml}\nspec:\n  containers:\n"
        f'  - name: c\n    image: x\n    resources: {{limits: {{nvidia.com/gpu: "{gpus}"}}}}\n'
    )


@pytest.fixture
def state(tmp_path: Path) -> str:
    path = tmp_path / "state.yaml"
    path.write_text(STATE)
    return str(path)


def test_mutate_charges_within_the_lease_and_adds_the_model(
    monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    code, out, _ = run(monkeypatch, "mutate", "-f", "-", "--cluster", state, "-o", "json", stdin=pod(2))
    assert code == 0
    (item,) = json.loads(out)["items"]
    assert item["metadata"]["labels"]["castops.io/gpu-lease"] == "h100"
    assert item["metadata"]["annotations"]["castops.io/gpu-lease-charge"] == "2000m"
    assert item["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_mutate_denies_beyond_the_lease_with_the_numbers(monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    code, _, err = run(monkeypatch, "mutate", "-f", "-", "--cluster", state, stdin=pod(4))
    assert code == 1  # EXIT_DENIED
    assert (
        "LeaseExhausted" in err and "6 of 8 GPU in use, this Pod needs 4" in err
    )  # the Succeeded Pod is free


def test_explain_shows_the_lease_arithmetic(
    monkeypatch: pytest.MonkeyPatch, state: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod(4))
    code, out, _ = run(monkeypatch, "explain", "-f", str(manifest), "--cluster", state)
    assert code == 0
    assert "gpu lease: LeaseExhausted (refused)" in out
    assert "count:     8 GPU; used 6, queued 0, overflow 0 (1 Pods); free 2" in out
    assert "this Pod:  4 GPU -> 10 of 8" in out


def test_explain_charges_what_the_webhook_charges_after_slicing_into_a_claim(
    monkeypatch: pytest.MonkeyPatch, state: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("gpuSlicing: {enabled: true, backend: dra, dra: {missingTemplate: warn}}\n")
    manifest = tmp_path / "pod.yaml"
    opted_in = pod(1).replace(
        "metadata: {name: train-1, namespace: ml}",
        "metadata: {name: train-1, namespace: ml, annotations: "
        '{castops.io/optimize: "true", castops.io/slice-ratio: "4"}}',
    )
    manifest.write_text(opted_in)
    code, out, _ = run(
        monkeypatch, "explain", "-f", str(manifest), "--cluster", state, "--config", str(config)
    )
    assert code == 0, out
    assert "gpu lease: Charged (admitted)" in out
    assert "this Pod:  0.5 GPU -> 6.5 of 8" in out  # 4 of a device's 8 shares, as the webhook charges
