"""A kubeconfig file: the one writer for every test and benchmark that hands one to a program."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def write_kubeconfig(
    path: Path, server: str, user: str, credentials: Mapping[str, str], ca: Path | None = None
) -> Path:
    """One cluster, one user (``credentials``: a ``token``, or ``client-certificate`` and
    ``client-key`` paths), one context. JSON is YAML: no dependency needed to write it."""
    cluster = {"server": server, **({"certificate-authority": str(ca)} if ca is not None else {})}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "e2e", "cluster": cluster}],
                "users": [{"name": user, "user": dict(credentials)}],
                "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
                "current-context": "e2e",
            },
            indent=2,
        )
    )
    return path
