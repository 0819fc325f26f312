"""function/core/config.py: map settings merge with their defaults (presets above maxSliceRatio are
refused at load), what a bad configuration is told (line by line, naming where it came from), and the
digest every decision carries."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from function import cli
from function.core.config import Config, ConfigError, parse_config
from function.core.configmerge import merge_map
from function.core.mutators.gpu_slicing import DEFAULT_PRESETS


def presets(section: dict[str, object]) -> dict[str, int]:
    found: dict[str, int] = parse_config({"gpuSlicing": section}).section("gpuSlicing").presets
    return found


def test_one_preset_changed_keeps_the_other_defaults() -> None:
    assert presets({"presets": {"training": 8}}) == {"training": 8, "inference": 2, "batch": 2, "dev": 1}


def test_a_new_preset_is_added_and_null_removes_a_default() -> None:
    assert presets({"presets": {"dev": None, "finetune": 3}}) == {
        "training": 4,
        "inference": 2,
        "batch": 2,
        "finetune": 3,
    }


def test_replace_presets_takes_the_map_as_written() -> None:
    assert presets({"presets": {"only": 3}, "replacePresets": True}) == {"only": 3}
    assert presets({"presets": {"only": 3, "gone": None}, "replacePresets": True}) == {"only": 3}
    assert presets({"replacePresets": True}) == dict(DEFAULT_PRESETS), "no presets given: the defaults"


def test_no_presets_and_an_empty_map_mean_the_defaults() -> None:
    assert presets({}) == dict(DEFAULT_PRESETS)
    assert presets({"presets": {}}) == dict(DEFAULT_PRESETS)
    assert presets({"presets": None}) == dict(DEFAULT_PRESETS)


def test_removing_every_preset_is_refused() -> None:
    with pytest.raises(ConfigError, match="presets must name at least one workload type"):
        presets({"presets": {}, "replacePresets": True})
    with pytest.raises(ConfigError, match="presets must name at least one workload type"):
        presets({"presets": dict.fromkeys(DEFAULT_PRESETS)})


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"presets": {"training": 2000}}, "presets.training: 2000 is above maxSliceRatio (1000)"),
        ({"maxSliceRatio": 3}, "presets.training: 4 is above maxSliceRatio (3)"),
        (
            {"maxSliceRatio": 1, "presets": {"dev": None}},
            "presets.training: 4, presets.inference: 2, presets.batch: 2 are above maxSliceRatio (1)",
        ),
        ({"defaultSlices": 12, "maxSliceRatio": 10}, "defaultSlices: 12 is above maxSliceRatio (10)"),
    ],
)
def test_a_count_above_max_slice_ratio_is_refused_with_its_name(
    section: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        presets(section)
    assert message in str(raised.value)


def test_a_preset_at_max_slice_ratio_is_accepted() -> None:
    assert presets({"maxSliceRatio": 4, "presets": {"training": 4}})["training"] == 4


def test_a_bad_preset_value_is_named() -> None:
    with pytest.raises(
        ConfigError, match=r"gpuSlicing\.presets\.x: Input should be greater than or equal to 1"
    ):
        presets({"presets": {"x": 0}})
    with pytest.raises(ConfigError, match=r"gpuSlicing\.presets: Input should be a valid dictionary"):
        presets({"presets": ["training"]})


def test_merge_map_leaves_non_maps_to_validation() -> None:
    assert merge_map({"a": 1}, None, False) is None
    assert merge_map({"a": 1}, [1], True) == [1]
    assert merge_map({"a": 1, "b": 2}, {"b": None, "c": 3}, False) == {"a": 1, "c": 3}


def test_config_show_prints_the_merged_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("gpuSlicing:\n  presets: {training: 6}\n")
    assert cli.main(["config", "show", "--config", str(path)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["gpuSlicing"]["presets"] == {"training": 6, "inference": 2, "batch": 2, "dev": 1}
    assert shown["gpuSlicing"]["replacePresets"] is False
    path.write_text("gpuSlicing:\n  presets: {training: 6000}\n")
    assert cli.main(["config", "validate", str(path)]) == 1
    assert "presets.training: 6000 is above maxSliceRatio (1000)" in capsys.readouterr().err


# -- what a bad configuration is told, and the digest every decision carries -----------------------
HEADER = {"apiVersion": "config.castops.io/v1alpha1", "kind": "CastSliceConfiguration"}


def refusal(data: Any, origin: str | None = None) -> str:
    with pytest.raises(ConfigError) as raised:
        if origin is None:
            parse_config(data)
        else:
            parse_config(data, origin)
    return str(raised.value)


def test_the_digest_is_the_sha256_of_the_canonical_json_of_the_configuration() -> None:
    """Consumers recompute it from ``castslice config show -o json``: sorted keys, no spaces."""
    config = parse_config({"excludedNamespaces": ["kube-system"], "vgpu": {"enabled": True}})
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert config.digest() == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def test_the_digest_names_the_effective_configuration_not_the_file() -> None:
    spelled_out = parse_config({"invalidAnnotations": "deny", "audit": {"sink": "auto"}})
    assert spelled_out.digest() == parse_config({}).digest() == parse_config(None).digest()
    assert parse_config({"invalidAnnotations": "warn"}).digest() != parse_config({}).digest()


def test_every_problem_gets_a_line_and_maps_and_lists_are_not_echoed() -> None:
    assert refusal({"excludedNamespaces": "x", "audit": [1], "typo": 1}) == (
        "invalid CastSlice configuration in configuration:\n"
        "  excludedNamespaces: Input should be a valid list (got 'x')\n"
        "  audit: Input should be a valid dictionary or instance of AuditConfig\n"
        "  typo: unknown key"
    )


def test_a_problem_of_the_whole_file_is_named_top_level() -> None:
    message = refusal({"gpuSlicing": {"targetResource": "nvidia.com/gpumem"}, "vgpu": {"enabled": True}})
    assert message.startswith(
        "invalid CastSlice configuration in configuration:\n"
        "  (top level): Value error, gpuSlicing.targetResource 'nvidia.com/gpumem' is also vgpu."
    )
    assert "(got" not in message


def test_the_origin_is_named() -> None:
    assert refusal([1]) == "invalid CastSlice configuration in configuration: the top level must be a mapping"
    assert refusal([1], "values.yaml") == (
        "invalid CastSlice configuration in values.yaml: the top level must be a mapping"
    )


def test_a_kustomize_header_needs_metadata_as_a_map() -> None:
    assert refusal({**HEADER, "metadata": 5}) == (
        "invalid CastSlice configuration in configuration: metadata: 5 is not valid; "
        "accepted: a mapping (the kustomize object's metadata)"
    )


# -- defaults, a key named, the digest ---------------------------------------------------------
def test_defaults_are_the_seed_presets() -> None:
    config = Config()
    assert config.gpuSlicing.presets == {"training": 4, "inference": 2, "batch": 2, "dev": 1}
    assert config.gpuSlicing.targetResource == "nvidia.com/gpu-shared"
    assert config.onInternalError.value == "admit" and config.invalidAnnotations.value == "deny"
    assert "kube-system" in config.excludedNamespaces


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpuSlicing": {"sourceResources": "x"}}, "gpuSlicing.sourceResources: unknown key"),
        ({"gpuSlicing": {"targetResource": "gpu"}}, "gpuSlicing.targetResource"),
        ({"gpuSlicing": {"presets": {"training": 0}}}, "gpuSlicing.presets.training"),
        ({"gpuSlicing": {"targetResource": "nvidia.com/gpu"}}, "must differ"),
        ({"onInternalError": "panic"}, "onInternalError"),
        ({"excludedNamespaces": "kube-system"}, "excludedNamespaces"),
        ([1, 2], "top level must be a mapping"),
    ],
)
def test_bad_configuration_names_the_key(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config(data, "test.yaml")


def test_digest_identifies_the_effective_configuration() -> None:
    assert Config().digest() == parse_config({}).digest()
    assert Config().digest() != parse_config({"invalidAnnotations": "warn"}).digest()
