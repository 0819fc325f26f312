"""``castslice config validate`` and ``castslice config show``: check or print a configuration."""

from __future__ import annotations

import argparse
import sys

from function.config_file import load_config, load_config_file
from function.core.config import Config, ConfigError


def config_from(path: str | None) -> Config:
    """The configuration a program runs with: ``path`` if given, else $CASTSLICE_CONFIG or the
    built-in defaults (what the webhook would load)."""
    return load_config_file(path) if path else load_config()


def validate(args: argparse.Namespace) -> int:
    try:
        config = load_config_file(args.file)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"{args.file}: valid ({config.digest()})")
    return 0


def show(args: argparse.Namespace) -> int:
    try:
        config = config_from(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    sys.stdout.write(f"# digest: {config.digest()}\n{config.to_yaml()}")
    return 0
