"""The ``castslice`` command: serve the function, mutate manifests offline, check configuration,
read the reference audit consumer's store."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import yaml

from function.config import Config, ConfigError, load_config, load_config_file
from function.contract import DEFAULT_PORT, OUTCOMES
from function.engine import Engine
from function.manifests import DocumentResult, mutate_document

FUNC_SOURCE = Path(__file__).with_name("func.py")
TARGETS = {"mutate": "the admission webhook", "audit": "the reference audit consumer"}


def _config_from(path: str | None) -> Config:
    return load_config_file(path) if path else load_config()


# -- castslice serve ----------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    # The same app and server functions-framework's own CLI builds (`functions-framework --asgi`),
    # plus the TLS options its CLI lacks: a webhook must be served over HTTPS.
    from functions_framework._http import create_server
    from functions_framework.aio import create_asgi_app

    if bool(args.tls_cert) != bool(args.tls_key):
        print("castslice serve: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.config:
        os.environ["CASTSLICE_CONFIG"] = args.config
    try:
        load_config()  # fail fast, before gunicorn forks, with the bad key named
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    from function.audit.shutdown import drain_on_shutdown

    # Audit events still queued at SIGTERM are drained (bounded) before the worker dies.
    app = drain_on_shutdown(create_asgi_app(args.target, str(FUNC_SOURCE)))  # type: ignore[no-untyped-call]
    # The uvicorn worker functions-framework uses, on a protocol with header size, read-time and
    # idle limits and a shutdown that answers every request received (function/server.py).
    options: dict[str, Any] = {"worker_class": "function.server.CastSliceWorker"}
    if args.tls_cert:
        from function.tls import DEFAULT_INTERVAL_SECONDS, CertificateWatcher

        options.update(certfile=args.tls_cert, keyfile=args.tls_key)
        # cert-manager renews the files in place: reload workers when they change (see function/tls.py).
        try:
            interval = float(os.environ.get("CASTSLICE_TLS_RELOAD_SECONDS", DEFAULT_INTERVAL_SECONDS))
        except ValueError:
            print("castslice serve: CASTSLICE_TLS_RELOAD_SECONDS must be seconds", file=sys.stderr)
            return 2
        CertificateWatcher(args.tls_cert, args.tls_key, interval).start()
    create_server(app, False, **options).run(args.host, args.port)  # type: ignore[no-untyped-call]
    return 0


# -- castslice mutate ---------------------------------------------------------------------------
def _read_documents(path: str) -> list[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _report(result: DocumentResult, out: TextIO) -> None:
    label = f"{result.kind.lower()}/{result.name}"
    if result.decision is None:
        print(f"{label}: skipped: {result.note}", file=out)
        return
    decision = result.decision
    # The per-mutator lines carry the reasons; the summary adds one only when no mutator spoke.
    summary = f"{label}: {decision.outcome}"
    if not decision.decisions or decision.outcome == "error":
        summary += f": {decision.reason}"
    print(summary, file=out)
    for part in decision.decisions:
        print(f"  {part.mutator}: {part.action.value}: {part.reason}", file=out)
    for warning in decision.warnings:
        print(f"  warning: {warning}", file=out)


def cmd_mutate(args: argparse.Namespace) -> int:
    try:
        engine = Engine(_config_from(args.config))
        documents = _read_documents(args.filename)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError) as error:
        print(f"castslice mutate: cannot read {args.filename}: {error}", file=sys.stderr)
        return 2

    results = [mutate_document(engine, i, doc, args.namespace) for i, doc in enumerate(documents)]
    for result in results:
        _report(result, sys.stderr)

    if args.output == "patch":
        patches = [
            {"index": r.index, "kind": r.kind, "name": r.name, "patch": r.patch()}
            for r in results
            if r.decision is not None
        ]
        json.dump(patches, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "json":
        mutated = [r.document for r in results]
        json.dump(mutated[0] if len(mutated) == 1 else mutated, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump_all([r.document for r in results], sys.stdout, sort_keys=False)

    return 1 if any(r.denied for r in results) else 0


# -- castslice config ---------------------------------------------------------------------------
def cmd_config_validate(args: argparse.Namespace) -> int:
    try:
        config = load_config_file(args.file)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"{args.file}: valid ({config.digest()})")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    try:
        config = _config_from(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    sys.stdout.write(f"# digest: {config.digest()}\n{config.to_yaml()}")
    return 0


# -- castslice audit ----------------------------------------------------------------------------
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


def cmd_audit(args: argparse.Namespace) -> int:
    from function.audit.consumer import AuditStore, Query

    if args.db != ":memory:" and not Path(args.db).exists():
        print(
            f"castslice audit: no audit database at {args.db} (set --db or $CASTSLICE_AUDIT_DB)",
            file=sys.stderr,
        )
        return 2
    store = AuditStore(args.db)
    try:
        query = Query(
            args.since,
            args.until,
            args.namespace,
            args.outcome,
            args.mutator,
            args.limit if args.view == "list" else None,
        )
        if args.view == "list":
            events = store.events(query)
            if args.output == "json":
                json.dump(events, sys.stdout, indent=2)
                sys.stdout.write("\n")
                return 0
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
        summary = store.summary(query, args.bucket)
    finally:
        store.close()
    if args.output == "json":
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    out = sys.stdout
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
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="castslice", description="GPU and spot admission webhook: serve it, or see what it would do."
    )
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the function (functions-framework, ASGI)")
    serve.add_argument("--host", default=os.environ.get("HOST", "0.0.0.0"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("PORT", DEFAULT_PORT)))
    serve.add_argument("--target", choices=sorted(TARGETS), default="mutate")
    serve.add_argument("--config", help="configuration file (default: $CASTSLICE_CONFIG, else built-in)")
    serve.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS")
    serve.add_argument("--tls-key", help="PEM private key for --tls-cert")
    serve.set_defaults(run=cmd_serve)

    mutate = sub.add_parser("mutate", help="apply the webhook to manifests offline")
    mutate.add_argument("-f", "--filename", required=True, help="YAML file (several documents allowed), or -")
    mutate.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml")
    mutate.add_argument("--config", help="configuration file (default: $CASTSLICE_CONFIG, else built-in)")
    mutate.add_argument("-n", "--namespace", default="default", help="namespace of objects that name none")
    mutate.set_defaults(run=cmd_mutate)

    config = sub.add_parser("config", help="check or show the configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    validate = config_sub.add_parser("validate", help="check a configuration file")
    validate.add_argument("file")
    validate.set_defaults(run=cmd_config_validate)
    show = config_sub.add_parser("show", help="print the effective configuration")
    show.add_argument("--config", help="configuration file (default: $CASTSLICE_CONFIG, else built-in)")
    show.set_defaults(run=cmd_config_show)

    from function.audit.consumer import AUDIT_DB_ENV, BUCKETS, DEFAULT_AUDIT_DB

    audit = sub.add_parser(
        "audit", help="list or summarise the decision events the reference audit consumer stored"
    )
    audit.add_argument(
        "view",
        nargs="?",
        choices=("summary", "list"),
        default="summary",
        help="summary (default): counts by outcome, namespace, mutator, time; list: the events",
    )
    audit.add_argument(
        "--db",
        default=os.environ.get(AUDIT_DB_ENV, DEFAULT_AUDIT_DB),
        help=f"SQLite file (default: ${AUDIT_DB_ENV}, else ./{DEFAULT_AUDIT_DB})",
    )
    audit.add_argument("--since", type=parse_when, help="from this time: 15m, 2h, 7d ago, or an ISO time")
    audit.add_argument("--until", type=parse_when, help="before this time (same forms as --since)")
    audit.add_argument("-n", "--namespace", help="only Pods in this namespace")
    audit.add_argument("--outcome", choices=OUTCOMES, help="only this outcome")
    audit.add_argument("--mutator", help="only decisions where this mutator acted (mutated or denied)")
    audit.add_argument("--bucket", choices=sorted(BUCKETS), default="hour", help="summary time bucket")
    audit.add_argument("--limit", type=int, default=100, help="list at most this many, newest first")
    audit.add_argument("-o", "--output", choices=("table", "json"), default="table")
    audit.set_defaults(run=cmd_audit)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
