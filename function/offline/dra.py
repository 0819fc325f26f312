"""``castslice dra templates``: the ResourceClaimTemplates of the dra backend, for teams that apply
manifests through GitOps (``gpuSlicing.dra.templates: external``).

The templates are exactly those the webhook names and the controller would keep (same names,
same specs: function/core/dra.py), without the controller's ``app.kubernetes.io/managed-by``
label, so a controller running beside them never touches them.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from function.contract import EXIT_BAD_INPUT
from function.core.config import ConfigError
from function.core.dra import templates as dra_templates
from function.core.rules import is_dns_label
from function.offline.config import config_from


def templates(args: argparse.Namespace) -> int:
    try:
        config = config_from(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    namespaces = args.namespace or ["default"]
    bad = [name for name in namespaces if not is_dns_label(name)]
    if bad:
        print(f"castslice dra templates: {bad[0]!r} is not a namespace name", file=sys.stderr)
        return EXIT_BAD_INPUT
    section = config.section("gpuSlicing")
    if section.backend != "dra":
        print(
            "castslice dra templates: note: gpuSlicing.backend is extendedResource, so the webhook "
            "names no template; these are what backend: dra would use",
            file=sys.stderr,
        )
    objects = [
        t.manifest(namespace, managed=False) for namespace in namespaces for t in dra_templates(section.dra)
    ]
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0
