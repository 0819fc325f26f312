"""``castslice audit drift --cluster STATE.yaml``: the stored Pods the webhook would change today,
which mutator would change what, and exit codes as ``kubectl diff``'s (0 none, 1 found)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run

RS_UID = "0b6c0d5e-rs"
SPOT_CONFIG = {"spot": {"enabled": True, "spotPercentageOfReplicaSet": 50}}


def pod(name: str, namespace: str, *, gpu: str = "nvidia.com/gpu", **metadata: Any) -> dict[str, Any]:
    """A Pod as ``kubectl get pods -o yaml`` prints it: bound, running, with a uid."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **metadata},
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {"name": "app", "image": "x", "resources": {"limits": {gpu: "1"}, "requests": {gpu: "1"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


OPTED_IN = {"annotations": {"castops.io/optimize": "true"}}
OWNED = {
    "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d", "uid": RS_UID, "controller": True}
    ]
}


def placed(side: str) -> dict[str, Any]:
    return {
        **OWNED,
        "labels": {"castops.io/placement": side},
        "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-100" if side == "spot" else "100"},
    }


def spot_spec(p: dict[str, Any], side: str) -> dict[str, Any]:
    """What the spot mutator writes for a side (CAST AI's tainted spot Nodes: on-demand needs nothing)."""
    if side == "spot":
        p["spec"]["tolerations"] = [{"key": "scheduling.cast.ai/spot", "operator": "Exists"}]
        p["spec"]["nodeSelector"] = {"scheduling.cast.ai/spot": "true"}
    return p


def state() -> dict[str, Any]:
    sliced = pod("sliced", "ml", gpu="nvidia.com/gpu-shared", **OPTED_IN)
    sliced["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu-shared": "1"},
        "requests": {"nvidia.com/gpu-shared": "1"},
    }
    items = [
        pod("missed", "ml", **OPTED_IN),
        sliced,
        pod("plain", "ml"),
        pod("quiet", "quiet", **OPTED_IN),
        spot_spec(pod("web-7d-a", "web", gpu="cpu", **placed("spot")), "spot"),
        spot_spec(pod("web-7d-b", "web", gpu="cpu", **placed("on-demand")), "on-demand"),
        pod("web-7d-c", "web", gpu="cpu", **OWNED),
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web-7d", "namespace": "web", "uid": RS_UID},
            "spec": {"replicas": 3},
        },
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "quiet", "labels": {"castops.io/webhook": "ignore"}},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    cluster, config = tmp_path / "state.yaml", tmp_path / "config.yaml"
    cluster.write_text(yaml.safe_dump(state()))
    config.write_text(yaml.safe_dump(SPOT_CONFIG))
    return cluster, config


def test_names_each_pod_the_webhook_would_change_and_which_mutator(
    monkeypatch: pytest.MonkeyPatch, files: tuple[Path, Path]
) -> None:
    cluster, config = files
    code, out, err = run(monkeypatch, "audit", "drift", "--cluster", str(cluster), "--config", str(config))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "POD", "OWNER", "MUTATOR", "WOULD"]
    rows = [line.split(None, 4) for line in lines[1:]]
    assert [row[:4] for row in rows] == [
        ["ml", "missed", "-", "gpu-slicing"],
        ["web", "web-7d-c", "ReplicaSet/web-7d", "spot"],
    ]
    assert rows[0][4].startswith(
        "change: nvidia.com/gpu -> nvidia.com/gpu-shared: 1 (default) in containers/app"
    )
    # One spot and one on-demand sibling, itself left out: n = 3, floor(1.5) = 1 spot: on-demand.
    assert rows[1][4].startswith(
        "change: on-demand: rule spotPercentageOfReplicaSet=50 for ReplicaSet web-7d"
    )
    assert "siblings 1 spot, 1 on-demand, 0 unplaced" in rows[1][4]
    assert (
        err == "drift: 6 Pod(s) judged, 2 the webhook would change (gpu-slicing in ml: 1, spot in web: 1)\n"
    )


def test_json_and_yaml_carry_the_patch(monkeypatch: pytest.MonkeyPatch, files: tuple[Path, Path]) -> None:
    cluster, config = files
    code, out, _ = run(
        monkeypatch, "audit", "drift", "--cluster", str(cluster), "--config", str(config), "-o", "json"
    )
    report = json.loads(out)
    assert code == 1 and (report["judged"], report["drifted"], report["notJudged"]) == (6, 2, 0)
    missed = report["pods"][0]
    assert (missed["namespace"], missed["name"], missed["uid"], missed["owner"]) == (
        "ml",
        "missed",
        "uid-missed",
        None,
    )
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu-shared",
        "value": "1",
    } in missed["patch"]
    assert report["pods"][1]["owner"] == {"kind": "ReplicaSet", "name": "web-7d"}
    code, text, _ = run(
        monkeypatch, "audit", "drift", "--cluster", str(cluster), "--config", str(config), "-o", "yaml"
    )
    assert yaml.safe_load(text) == report


def test_stdin_a_namespace_and_nothing_found(
    monkeypatch: pytest.MonkeyPatch, files: tuple[Path, Path]
) -> None:
    cluster, config = files
    code, out, err = run(
        monkeypatch,
        "audit",
        "drift",
        "--cluster",
        "-",
        "--config",
        str(config),
        "-n",
        "quiet",
        stdin=cluster.read_text(),
    )
    assert (code, out) == (0, "")
    assert err == "drift: 0 Pod(s) judged, none the webhook would change\n"


def test_bad_input_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, _, err = run(monkeypatch, "audit", "drift")
    assert code == 2 and "--cluster STATE.yaml is required" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: List\nitems: 3\n")
    code, _, err = run(monkeypatch, "audit", "drift", "--cluster", str(bad))
    assert code == 2 and "'items' of a List must be a list" in err
    code, _, err = run(monkeypatch, "audit", "summary", "-o", "yaml", "--db", ":memory:")
    assert code == 2 and "-o yaml is for drift only" in err


def test_with_gpu_leases_exactly_the_uncharged_pods_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A charged Pod (the stamp the webhook writes, with its decision uid) is not drift; a GPU Pod
    of the leased namespace without one is, opted out of the webhook or not, with what the lease
    would decide."""
    lease = {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {
            "name": "h100",
            "namespace": "ml",
            "uid": "lease-1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"gpuModel": "H100", "count": 4},
    }
    stamp = {
        "labels": {"castops.io/gpu-lease": "h100", "castops.io/gpu-lease-state": "charged"},
        "annotations": {"castops.io/gpu-lease-charge": "1000m", "castops.io/gpu-lease-decision": "a-1"},
    }
    items = [
        lease,
        pod("charged", "ml", **stamp),
        pod("skipped", "ml"),
        pod("opted-out", "ml", labels={"castops.io/webhook": "ignore"}),
        pod("elsewhere", "lab"),
    ]
    cluster, config = tmp_path / "state.yaml", tmp_path / "config.yaml"
    cluster.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    config.write_text(yaml.safe_dump({"gpuSlicing": {"enabled": False}, "gpuLeases": {"enabled": True}}))
    code, out, err = run(
        monkeypatch, "audit", "drift", "--cluster", str(cluster), "--config", str(config), "-o", "json"
    )
    assert code == 1, err
    document = json.loads(out)
    assert sorted(p["name"] for p in document["pods"]) == ["opted-out", "skipped"]
    assert all(p["uncharged"] and p["mutators"][0]["mutator"] == "gpu-leases" for p in document["pods"])
    assert "2 uncharged by their namespace's GPU lease" in err
