"""``castslice mutations validate``: check PodMutation files as the validating webhook would; and
the PodMutation documents ``--mutations`` names, for mutate and explain."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from function.admission.podmutations import check
from function.core.podmutation.names import is_mutation_document
from function.offline.podmutations import documents_in


def documents_from(paths: list[str] | None) -> list[Any]:
    """The documents of every ``--mutations`` (files or directories, in the order given; none
    without it): repeated, the option adds, as ``-f`` does."""
    return [doc for path in paths or () for _, doc in documents_in(Path(path))]


def validate(args: argparse.Namespace) -> int:
    failed = False
    for name in args.files:
        try:
            documents = documents_in(Path(name))
        except (OSError, yaml.YAMLError) as error:
            print(f"{name}: cannot read: {error}", file=sys.stderr)
            failed = True
            continue
        for origin, doc in documents:
            if not is_mutation_document(doc):
                print(f"{origin}: not a PodMutation, skipped", file=sys.stderr)
                continue
            verdict = check(doc)
            if verdict.valid:
                print(f"{origin}: podmutation/{verdict.name}: valid")
            else:
                failed = True
                print(f"{origin}: podmutation/{verdict.name}: invalid", file=sys.stderr)
            for problem in verdict.problems:
                print(f"  {problem}", file=sys.stderr)
            for warning in verdict.warnings:
                print(f"  warning: {warning}", file=sys.stderr)
    return 1 if failed else 0
