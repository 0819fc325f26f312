"""The preview over 25 GPU workload manifests nobody on this project wrote (tests/data/workloads/:
Kubeflow training, KubeRay, KServe, LeaderWorkerSet, a JobSet-based Kubeflow Trainer runtime,
Volcano, HAMi examples, NVIDIA device-plugin and GPU-operator samples, rendered llm-d Helm output;
each file names its source and license in its header).

Each is previewed as published and opted into slicing several ways, and the preview must hold these
promises: no silent skip (every GPU request is judged or warned about by name and path), no empty
explain (every document gets a line, every Pod its workload), no unwarned change of meaning (a
container's GPU count shrinking, HAMi resources left on a sliced Pod, another scheduler replaced),
no job broken (a container asking for several GPUs is sliced only on an explicit slice-ratio), and
mutators that compose (no Pod denied for a resource it did not ask for: one CastSlice added)."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from function import cli
from function.core.config import Config, parse_config
from function.core.engine import Engine
from function.core.quantity import parse_quantity
from function.offline.discovery import find_pods, resources_outside
from function.offline.manifests import ObjectResult, describe_name, gpu_resources, mutate_chunk, owned_pod
from function.offline.yamldoc import load_documents, to_plain
from tests.support import ROOT

WORKLOADS = ROOT / "tests" / "data" / "workloads"
MANIFESTS = sorted(WORKLOADS.glob("*.yaml"))
SOURCE = "nvidia.com/gpu"
TARGET = "nvidia.com/gpu-shared"
HAMI = ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
OPT_IN = "castops.io/optimize"

SCENARIOS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "as published": ({}, {}),
    "opted in, default count": ({OPT_IN: "true"}, {}),
    "opted in, inference preset": ({OPT_IN: "true", "castops.io/workload-type": "inference"}, {}),
    "opted in, slice-ratio 4": ({OPT_IN: "true", "castops.io/slice-ratio": "4"}, {}),
    "opted in, vgpu on": ({OPT_IN: "true"}, {"vgpu": {"enabled": True}}),
    "opted in, training preset, vgpu on": (
        {OPT_IN: "true", "castops.io/workload-type": "training"},
        {"vgpu": {"enabled": True}},
    ),
    "opted in, slice-ratio 4, vgpu on": (
        {OPT_IN: "true", "castops.io/slice-ratio": "4"},
        {"vgpu": {"enabled": True}},
    ),
    "vgpu on": ({}, {"vgpu": {"enabled": True}}),
    "spot allSpot": ({}, {"spot": {"enabled": True, "preset": "allSpot"}}),
}


def test_the_exercise_has_25_manifests_each_naming_its_source_and_license() -> None:
    assert len(MANIFESTS) == 25
    for path in MANIFESTS:
        head = path.read_text().splitlines()[:2]
        assert head[0].startswith("# Source: https://github.com/"), path.name
        assert head[1].startswith("# License: "), path.name


def opted_in(text: str, annotations: dict[str, str]) -> str:
    """The manifest with ``annotations`` on every Pod the preview finds (where its controller takes
    them from), or as published when there are none to add."""
    if not annotations:
        return text
    documents = []
    for document in yaml.safe_load_all(text):
        for site in find_pods(document) if isinstance(document, dict) else []:
            node: Any = document
            for part in site.annotations_path:
                node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
            node.update(annotations)
        documents.append(document)
    return yaml.dump_all(documents, Dumper=QuotingDumper, sort_keys=False)


class QuotingDumper(yaml.SafeDumper):
    """Writes every string double-quoted: PyYAML would leave ``y`` bare, which Kubernetes' YAML 1.1
    reads as a boolean (and the preview rightly refuses)."""


QuotingDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
)


def previewed(text: str, config: Config) -> list[tuple[Any, ObjectResult]]:
    """(the document as written, its result) for every document of ``text``."""
    engine = Engine(config)
    found = []
    for index, chunk in enumerate(load_documents(text, "manifest")):
        if chunk.empty:
            continue
        original = to_plain(chunk.tree)
        results, _ = mutate_chunk(engine, chunk, "manifest", index, "default")
        found.extend((original, result) for result in results)
    return found


def gpu_count(container: dict[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    counts = [
        parse_quantity((resources.get(section) or {}).get(resource, 0)) for section in ("limits", "requests")
    ]
    return int(max(counts))


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    return [c for kind in ("initContainers", "containers") for c in spec.get(kind) or []]


CASES = [(path, scenario) for path in MANIFESTS for scenario in SCENARIOS]


@pytest.mark.parametrize(("path", "scenario"), CASES, ids=[f"{p.stem}-{s}" for p, s in CASES])
def test_no_silent_skip_and_no_unwarned_change_of_meaning(path: Path, scenario: str) -> None:
    annotations, config_data = SCENARIOS[scenario]
    config = parse_config(config_data)
    resources = gpu_resources(config)
    for original, result in previewed(opted_in(path.read_text(), annotations), config):
        name = f"{result.kind}/{result.name}"
        # No silent skip: a GPU request anywhere is judged in a Pod or warned about by path.
        if resources_outside(original, [], resources):
            assert result.sites or result.unjudged, f"{name}: GPU requests neither judged nor warned"
            assert not result.errors, f"{name}: {result.errors}"
            assert "creates no Pods" not in result.note, name
        for site in result.sites:
            decision = site.decision
            assert decision.outcome != "error", f"{name} {site.label}: {decision.reason}"
            assert not site.problem, f"{name} {site.label}: {site.problem}"
            before = owned_pod(original, site.site, result.index)
            if decision.outcome == "denied":
                # Composition: a denial names only resources the Pod itself asked for.
                asked = {
                    r for c in containers(before) for r in (c.get("resources") or {}).get("limits") or {}
                }
                asked |= {
                    r for c in containers(before) for r in (c.get("resources") or {}).get("requests") or {}
                }
                named = set(re.findall(r"nvidia\.com/[\w.-]*\w", str(decision.denial))) & {
                    SOURCE,
                    TARGET,
                    *HAMI,
                }
                assert named <= asked, f"{name} {site.label}: denied for {named - asked}: {decision.denial}"
            if decision.mutated_pod is None:
                continue
            after = decision.mutated_pod
            warned = " ".join(decision.warnings)
            for old, new in zip(containers(before), containers(after), strict=True):
                asked, got = gpu_count(old, SOURCE), gpu_count(new, TARGET)
                if not got or gpu_count(new, SOURCE):
                    continue
                # No job broken: several GPUs are sliced (maybe onto one device) only on request.
                if asked > 1:
                    assert "castops.io/slice-ratio" in annotations, (
                        f"{name} {site.label}: {asked} GPUs sliced"
                    )
                # Sliced: what was asked is recorded, a shrinking count is warned about by number.
                recorded = after["metadata"].get("annotations", {}).get("castops.io/original-gpu-request", "")
                assert f"{SOURCE}={asked}" in recorded, f"{name} {site.label}: {recorded!r}"
                if asked > got:
                    assert f"{asked} {SOURCE}" in warned, f"{name} {site.label}: {asked} -> {got} unwarned"
                # HAMi's memory or cores left on a sliced Pod would keep it Pending.
                left = [r for r in HAMI if gpu_count(new, r)]
                assert not left, f"{name} {site.label}: sliced but still asks for {left}"
            scheduler = (before.get("spec") or {}).get("schedulerName") or "default-scheduler"
            if scheduler not in ("default-scheduler", "hami-scheduler"):
                assert (after.get("spec") or {}).get("schedulerName") == scheduler, (
                    f"{name} {site.label}: another scheduler ({scheduler}) was replaced"
                )


def explain(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert cli.main(["explain", "-f", str(path)]) == 0
    return out.getvalue()


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_explain_is_never_empty(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    lines = explain(monkeypatch, path).splitlines()
    for document in yaml.safe_load_all(path.read_text()):
        if not isinstance(document, dict):
            continue
        head = f"{str(document['kind']).lower()}/{describe_name(document)}"
        mine = [line for line in lines if line.startswith(head + " ") or line.startswith(head + ":")]
        assert mine, f"explain says nothing of {head}"
        sites = find_pods(document)
        workloads = [line for line in mine if ": workload " in line]
        assert len(workloads) == len(sites), f"{head}: {len(sites)} Pods, explained {len(workloads)}"


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_a_manifest_nothing_changes_comes_out_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, path: Path
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    assert cli.main(["mutate", "-f", str(path)]) == 0, err.getvalue()
    assert out.getvalue() == path.read_text()
