"""A configuration file may carry a Kubernetes-object header (apiVersion, kind, metadata) so that
kustomize can read it as a local-config object: knative/base/config.yaml is the one source of
excludedNamespaces. The function checks the header and ignores it."""

from __future__ import annotations

from pathlib import Path

import pytest

from function.config_file import load_config_file
from function.core.config import KUSTOMIZE_HEADER, ConfigError, parse_config

HEADER = {**KUSTOMIZE_HEADER, "metadata": {"name": "castslice-config"}}


def test_header_is_ignored_and_changes_nothing() -> None:
    plain = parse_config({"invalidAnnotations": "warn"})
    with_header = parse_config({**HEADER, "invalidAnnotations": "warn"})
    assert with_header == plain
    assert with_header.digest() == plain.digest()
    assert "apiVersion" not in with_header.to_yaml() and "metadata" not in with_header.to_yaml()


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({**HEADER, "apiVersion": "v1"}, "apiVersion: 'v1'"),
        ({**HEADER, "kind": "ConfigMap"}, "kind: 'ConfigMap'"),
        ({"kind": KUSTOMIZE_HEADER["kind"], "metadata": {}}, "apiVersion: None"),
        ({"metadata": {"name": "x"}}, "apiVersion: None"),
        ({**HEADER, "metadata": "castslice"}, "metadata: 'castslice'"),
    ],
)
def test_a_wrong_or_partial_header_is_refused_with_the_field_named(
    data: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError, match="accepted") as refused:
        parse_config(data, "my.yaml")
    assert named in str(refused.value) and "my.yaml" in str(refused.value)


def test_the_shipped_configuration_carries_the_header() -> None:
    path = Path(__file__).resolve().parents[2] / "knative" / "base" / "config.yaml"
    assert "kind: CastSliceConfiguration" in path.read_text(encoding="utf-8")
    # and spells out the defaults, but for PodMutations and GPU slicing's node check: off embedded
    # (running locally needs no cluster), on in the shipped manifests
    assert load_config_file(path) == parse_config(
        {"podMutations": {"enabled": True}, "gpuSlicing": {"requireAdvertisedTarget": True}}
    )
