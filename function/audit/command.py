"""``castslice audit``: summarise or list the decision events the reference audit consumer stored,
or the events it refused."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from function.audit.consumer import AuditStore, Query
from function.contract import AUDIT_VIEWS, EXIT_BAD_INPUT, OUTCOMES

VIEWS = AUDIT_VIEWS

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """'15m', '2h', '7d' (that long ago) or an ISO 8601 time (UTC unless it says otherwise)."""
    match = _DURATION.match(text.strip())
    if match:
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        problem = f"{text!r} is neither a duration (15m, 2h, 7d) nor an ISO time"
        raise argparse.ArgumentTypeError(problem) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO) -> None:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(line.rstrip(), file=out)


def _short(text: str, limit: int = 70) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json(value: Any) -> int:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _rejected(store: AuditStore, args: argparse.Namespace) -> int:
    """The events the consumer refused (schema or attribute checks), newest first, with why."""
    rows = list(reversed(store.rejected()))[: args.limit]
    if args.output == "json":
        for row in rows:
            row["event"] = json.loads(row["event"])
        return _json(rows)
    _table(
        ("RECEIVED", "ID", "TYPE", "SOURCE", "PROBLEMS"),
        [
            (r["received_at"][:19] + "Z", r["id"], r["type"], r["source"], _short("; ".join(r["problems"])))
            for r in rows
        ],
        sys.stdout,
    )
    return 0


def _listed(store: AuditStore, query: Query, args: argparse.Namespace) -> int:
    events = store.events(query)
    if args.output == "json":
        return _json(events)
    rows = [
        (
            e["time"][:19] + "Z",
            e["outcome"],
            e["podnamespace"],
            e["subject"].rsplit("/", 1)[-1],
            e["mutators"],
            _short(e["data"]["reason"]),
        )
        for e in events
    ]
    _table(("TIME", "OUTCOME", "NAMESPACE", "POD", "MUTATORS", "REASON"), rows, sys.stdout)
    return 0


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    first, last = summary["first"] or "-", summary["last"] or "-"
    print(f"{summary['total']} decision(s) from {first} to {last}", file=out)
    if summary["rejected"]:
        print(f"{summary['rejected']} event(s) rejected by the schema check (not counted)", file=out)
    print("\nby outcome", file=out)
    _table(("OUTCOME", "COUNT"), [(o, summary["byOutcome"][o]) for o in OUTCOMES], out)
    print("\nby namespace", file=out)
    _table(
        ("NAMESPACE", "TOTAL", *(o.upper() for o in OUTCOMES)),
        [(r["namespace"], r["total"], *(r[o] for o in OUTCOMES)) for r in summary["byNamespace"]],
        out,
    )
    print("\nby mutator (each mutator's own action)", file=out)
    _table(
        ("MUTATOR", "TOTAL", "MUTATED", "UNCHANGED", "DENIED"),
        [(r["mutator"], r["total"], r["mutated"], r["unchanged"], r["denied"]) for r in summary["byMutator"]],
        out,
    )
    print(f"\nby {summary['byTime']['bucket']} (UTC)", file=out)
    _table(
        ("START", "TOTAL", *(o.upper() for o in OUTCOMES)),
        [(r["start"], r["total"], *(r[o] for o in OUTCOMES)) for r in summary["byTime"]["rows"]],
        out,
    )


def run(args: argparse.Namespace) -> int:
    if args.view == "drift":  # reads a cluster state, not the consumer's store
        from function.offline import drift

        return drift.run(args)
    if args.output == "yaml":
        print(f"castslice audit {args.view}: -o yaml is for drift only; use table or json", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.db != ":memory:" and not Path(args.db).exists():
        print(
            f"castslice audit: no audit database at {args.db} (set --db or $CASTSLICE_AUDIT_DB)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    store = AuditStore(args.db)
    try:
        if args.view == "rejected":
            return _rejected(store, args)
        query = Query(
            args.since,
            args.until,
            args.namespace,
            args.outcome,
            args.mutator,
            args.limit if args.view == "list" else None,
        )
        if args.view == "list":
            return _listed(store, query, args)
        summary = store.summary(query, args.bucket)
    finally:
        store.close()
    if args.output == "json":
        return _json(summary)
    _print_summary(summary, sys.stdout)
    return 0
