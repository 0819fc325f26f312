"""The configuration file as the processes find it: CASTSLICE_CONFIG, read, parsed, named in errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from function.config_file import load_config, load_config_file
from function.core.config import Config, ConfigError


def test_config_file_from_environment(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("invalidAnnotations: warn\n")
    assert load_config({"CASTSLICE_CONFIG": str(path)}).invalidAnnotations.value == "warn"
    assert load_config({}) == Config()
    with pytest.raises(ConfigError, match="cannot read"):
        load_config({"CASTSLICE_CONFIG": str(tmp_path / "missing.yaml")})
    path.write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config({"CASTSLICE_CONFIG": str(path)})


def test_a_file_is_named_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "castslice.yaml"
    path.write_text("typo: 1\n")
    with pytest.raises(ConfigError) as raised:
        load_config_file(path)
    assert str(raised.value) == f"invalid CastSlice configuration in {path}:\n  typo: unknown key"
