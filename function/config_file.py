"""The configuration as the processes find it: the file CASTSLICE_CONFIG names, read and parsed.

Reading the file and the environment is the edge's work; ``function.core.config.parse_config``
judges the data it holds, purely, so the webhook, the CLI and the tests share one validation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from function.contract import CONFIG_ENV
from function.core.config import Config, ConfigError, parse_config

__all__ = ["load_config", "load_config_file"]


def load_config_file(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read CastSlice configuration {path}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"CastSlice configuration {path} is not valid YAML: {error}") from None
    return parse_config(data, str(path))


def load_config(environ: Mapping[str, str] | None = None) -> Config:
    """The effective configuration: the file named by CASTSLICE_CONFIG, else the embedded defaults."""
    env = os.environ if environ is None else environ
    path = env.get(CONFIG_ENV, "").strip()
    return load_config_file(path) if path else Config()
