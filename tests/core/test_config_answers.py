"""function/core/config.py, answer by answer: what a bad configuration is told, line by line, where it came
from, and the digest every decision carries."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from function.core.config import ConfigError, parse_config

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
