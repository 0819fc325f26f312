"""``castslice dra templates`` (the templates for GitOps) and the dra lines of ``castslice explain``:
the CLI names the same templates the webhook puts into Pods."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from function import cli
from function.core.config import parse_config
from function.core.dra import MANAGED_BY_LABEL, templates
from function.core.engine import Engine
from function.core.mutators.base import RequestContext

DRA = {"gpuSlicing": {"backend": "dra"}}


def config_file(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_templates_are_rendered_per_namespace_unowned_by_the_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "dra", "templates", "-n", "ml", "-n", "web", "--config", config_file(tmp_path, DRA)
    )
    assert (code, err) == (0, "")
    objects = list(yaml.safe_load_all(out))
    expected = templates(parse_config(DRA).section("gpuSlicing").dra)
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects] == [
        (namespace, t.name) for namespace in ("ml", "web") for t in expected
    ]
    assert all(
        o["kind"] == "ResourceClaimTemplate" and o["apiVersion"] == "resource.k8s.io/v1" for o in objects
    )
    assert all(MANAGED_BY_LABEL not in o["metadata"]["labels"] for o in objects)
    assert objects[3]["spec"] == expected[3].spec


def test_the_rendered_names_are_those_the_webhook_puts_into_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "gpuSlicing": {
            "backend": "dra",
            "dra": {"capacity": {"cores": {"perSlice": "25", "perDevice": "100"}}},
        }
    }
    _, out, _ = run(capsys, "dra", "templates", "--config", config_file(tmp_path, config))
    rendered = {o["metadata"]["name"] for o in yaml.safe_load_all(out)}
    assert len(rendered) == 4
    pod = {
        "metadata": {"annotations": {"castops.io/optimize": "true", "castops.io/slice-ratio": "3"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    decision = Engine(parse_config(config)).decide(pod, RequestContext(namespace="default"))
    assert decision.mutated_pod is not None
    assert decision.mutated_pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] in rendered


def test_json_output_is_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "dra", "templates", "-o", "json", "--config", config_file(tmp_path, DRA))
    listed = json.loads(out)
    assert listed["kind"] == "List"
    assert len(listed["items"]) == 8
    assert {i["metadata"]["namespace"] for i in listed["items"]} == {"default"}


def test_a_bad_namespace_or_configuration_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "dra", "templates", "-n", "ML_Team", "--config", config_file(tmp_path, DRA))
    assert (code, out) == (2, "")
    assert "'ML_Team' is not a namespace name" in err
    bad = config_file(tmp_path, {"gpuSlicing": {"backend": "dra", "dra": {"claimName": "X"}}})
    code, _, err = run(capsys, "dra", "templates", "--config", bad)
    assert code == 2
    assert "gpuSlicing.dra.claimName" in err


def test_with_the_extended_resource_backend_the_templates_come_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "dra", "templates", "--config", config_file(tmp_path, {}))
    assert code == 0
    assert len(list(yaml.safe_load_all(out))) == 8
    assert "gpuSlicing.backend is extendedResource, so the webhook names no template" in err


def test_explain_shows_the_claim_and_template_a_pod_gets_with_backend_dra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "t",
                    "annotations": {"castops.io/optimize": "true", "castops.io/workload-type": "training"},
                },
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            }
        )
    )
    four = templates(parse_config(DRA).section("gpuSlicing").dra)[3].name
    code, out, _ = run(
        capsys, "explain", "-f", str(manifest), "-n", "ml", "--config", config_file(tmp_path, DRA)
    )
    assert code == 0
    assert out.splitlines()[:2] == [
        "pod/t: workload Pod/t in namespace ml",
        f"  gpu-slicing: mutated: nvidia.com/gpu -> claim castslice-gpu from ResourceClaimTemplate {four} "
        "(4 slices: shares 4; castops.io/workload-type=training preset) in containers/c; "
        "template presence not checked (no cluster view)",
    ]
    # Without the dra backend explain gives slicing's line for a Pod that opts in only.
    _, out, _ = run(capsys, "explain", "-f", str(manifest), "--config", config_file(tmp_path, {}))
    assert "  gpu-slicing: mutated: nvidia.com/gpu -> nvidia.com/gpu-shared: 4" in out
    manifest.write_text(manifest.read_text().replace("castops.io/optimize", "example.com/other"))
    _, out, _ = run(capsys, "explain", "-f", str(manifest), "--config", config_file(tmp_path, {}))
    assert "gpu-slicing" not in out
