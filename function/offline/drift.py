"""``castslice audit drift --cluster STATE.yaml``: stored Pods the webhook would change today.

The state is what ``kubectl get pods,replicasets,namespaces -A -o yaml`` prints (``pods -A`` alone
is enough for the mutators that need no cluster; spot's split wants the ReplicaSets, namespace
opt-outs the Namespaces, PodMutations their objects). Every Pod in it is judged by
``function.core.drift`` over the view the webhook's watches would keep of the same file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from function.contract import EXIT_BAD_INPUT
from function.core.config import Config, ConfigError, watches_for
from function.core.drift import Finding, Tally, findings, opted_out_namespaces
from function.core.engine import Engine
from function.core.mutators.gpu_leases import NAME as GPU_LEASES
from function.core.schedule import ZONES_INDEX
from function.core.view import PODS, REPLICASETS, Overlay
from function.offline import state_file
from function.zones import ZONES

EXIT_CLEAN = 0
EXIT_DRIFT = 1
"""As ``kubectl diff`` and ``diff``: 1 means differences were found."""
EXIT_NOT_JUDGED = 3
"""An internal error kept some Pod from being judged (as for ``castslice mutate``)."""
STATE_HINT = (
    "kubectl get pods,replicasets,namespaces -A -o yaml > STATE.yaml; add gpuleases with GPU leases on"
)


WOULD = {"mutated": "change", "denied": "deny"}


def _kind(obj: Mapping[str, Any], kind: str) -> bool:
    return obj.get("kind") == kind and obj.get("apiVersion") == "v1"


def report(
    config: Config,
    objects: Iterable[Mapping[str, Any]],
    namespace: str | None = None,
    now: datetime | None = None,
) -> tuple[list[Finding], Tally]:
    """The findings over the objects of a state file (only ``namespace``'s Pods when given), at
    ``now`` (default: the clock; GpuLease windows are judged at it)."""
    now = now or datetime.now(UTC)
    objects = list(objects)
    view = state_file.view_of(objects, watches_for(config) or (PODS, REPLICASETS))
    pods = [
        obj
        for obj in objects
        if _kind(obj, "Pod")
        and (namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace)
    ]
    opted_out = opted_out_namespaces(obj for obj in objects if _kind(obj, "Namespace"))
    tally = Tally()
    # Recurring windows and budget periods are read in their time zones.
    zoned = Overlay(view, {ZONES_INDEX: ZONES})
    found = list(findings(Engine(config), pods, zoned, tally, opted_out, now))
    return found, tally


def _owner(finding: Finding) -> str:
    return f"{finding.owner.kind}/{finding.owner.name}" if finding.owner.uid else "-"


def write(found: list[Finding], tally: Tally, output: str, out: TextIO) -> None:
    if output in ("json", "yaml"):
        document = {
            "judged": tally.judged,
            "drifted": tally.drifted,
            "notJudged": tally.errors,
            "pods": [finding.as_dict() for finding in found],
        }
        if output == "json":
            json.dump(document, out, indent=2)
            out.write("\n")
        else:
            yaml.safe_dump(document, out, sort_keys=False, width=120)
        return
    rows = [("NAMESPACE", "POD", "OWNER", "MUTATOR", "WOULD")]
    for finding in found:
        if not finding.changes:
            rows.append((finding.namespace, finding.name, _owner(finding), "-", finding.reason))
        for change in finding.changes:
            would = (
                change.reason  # uncharged: what the lease would decide
                if change.mutator == GPU_LEASES
                else f"{WOULD.get(change.action, change.action)}: {change.reason}"
            )
            rows.append((finding.namespace, finding.name, _owner(finding), change.mutator, would))
    if len(rows) == 1:
        return
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[4]]) + "\n")


def exit_code(tally: Tally) -> int:
    if tally.errors:
        return EXIT_NOT_JUDGED
    return EXIT_DRIFT if tally.drifted else EXIT_CLEAN


def read_objects(path: str) -> list[Mapping[str, Any]]:
    """Every object of a state file (``-`` for stdin), the items of its Lists in order."""
    return state_file.read_objects(sys.stdin if path == "-" else path, path)


def run(args: argparse.Namespace) -> int:
    """``castslice audit drift``: the stored Pods of ``--cluster`` the webhook would change today."""
    from function.offline.config import config_from

    if args.cluster is None:
        print(f"castslice audit drift: --cluster STATE.yaml is required ({STATE_HINT})", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        config = config_from(args.config)
        objects = read_objects(args.cluster)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except state_file.StateFileError as error:
        print(f"castslice audit drift: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    found, tally = report(config, objects, args.namespace)
    write(found, tally, args.output, sys.stdout)
    print(tally.summary(), file=sys.stderr)
    return exit_code(tally)
