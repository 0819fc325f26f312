"""The ``castslice`` command: serve the function, mutate manifests offline, check configuration,
read the reference audit consumer's store."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import yaml

from function.contract import DEFAULT_PORT, LARGE_REVIEWS_ENV, OUTCOMES
from function.core.config import Config, ConfigError, load_config, load_config_file
from function.core.engine import Engine
from function.core.view import EMPTY_VIEW, PODS, REPLICASETS, ClusterView, StateFileError, load_state
from function.offline.manifests import ObjectResult, mutate_chunk
from function.offline.yamldoc import DocumentError, load_documents
from function.serve.watch import watches_for

TARGETS = {"mutate": "the admission webhook", "audit": "the reference audit consumer"}


def _config_from(path: str | None) -> Config:
    return load_config_file(path) if path else load_config()


# -- castslice serve ----------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    # The same app and server functions-framework's own CLI builds (`functions-framework --asgi`),
    # plus the TLS options its CLI lacks: a webhook must be served over HTTPS.
    from functions_framework._http import create_server

    if bool(args.tls_cert) != bool(args.tls_key):
        print("castslice serve: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.config:
        os.environ["CASTSLICE_CONFIG"] = args.config
    try:
        config = load_config()  # fail fast, before gunicorn forks, with the bad key named
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    from function.serve.asgi import serving_app
    from function.serve.watch import watches_for

    app = serving_app(args.target)
    # The uvicorn worker functions-framework uses, on a protocol with header size, read-time and
    # idle limits and a shutdown that answers every request received (function/serve/protocol.py).
    options: dict[str, Any] = {"worker_class": "function.serve.protocol.CastSliceWorker"}
    # Large reviews off the event loop, in a child process of the worker (function/serve/offload.py),
    # unless a mutator reads the cluster: the child has no view, and deciding such a Pod on an
    # empty view would silently skip the PodMutations or spot counts that apply to it.
    if not watches_for(config):
        os.environ.setdefault(LARGE_REVIEWS_ENV, "process")
    if args.tls_cert:
        from function.serve.tls import DEFAULT_INTERVAL_SECONDS, CertificateWatcher

        options.update(certfile=args.tls_cert, keyfile=args.tls_key)
        # cert-manager renews the files in place: reload workers when they change (see function/serve/tls.py).
        try:
            interval = float(os.environ.get("CASTSLICE_TLS_RELOAD_SECONDS", DEFAULT_INTERVAL_SECONDS))
        except ValueError:
            print("castslice serve: CASTSLICE_TLS_RELOAD_SECONDS must be seconds", file=sys.stderr)
            return 2
        CertificateWatcher(args.tls_cert, args.tls_key, interval).start()
    scheme = "https" if args.tls_cert else "http"
    print(
        f"castslice serve: {TARGETS[args.target]} listening on {scheme}://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    create_server(app, False, **options).run(args.host, args.port)  # type: ignore[no-untyped-call]
    return 0


# -- castslice mutate ---------------------------------------------------------------------------
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
"""What ``-f DIR`` reads, as kubectl does."""

EXIT_DENIED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a tool whose reader went away (``| head``)."""


def _manifest_sources(filename: str, recursive: bool) -> list[tuple[str, str]]:
    """(label, text) of every input: stdin, one file, or the manifests of a directory."""
    # Bytes decoded as they are: text mode would turn CRLF into LF, and an untouched document
    # must come out byte for byte.
    if filename == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        return [("-", _text("-", stdin.read()) if stdin is not None else sys.stdin.read())]
    path = Path(filename)
    if not path.is_dir():
        return [(filename, _text(filename, path.read_bytes()))]
    found = path.rglob("*") if recursive else path.iterdir()
    files = sorted(p for p in found if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    return [(str(p.relative_to(path)), _text(str(p), p.read_bytes())) for p in files]


def _text(label: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DocumentError(f"{label}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def _report(result: ObjectResult, out: TextIO, prefix: str) -> None:
    head = f"{prefix}{result.kind.lower()}/{result.name}"
    for problem in result.errors:
        print(f"{head}: invalid: {problem}", file=out)
    if not result.sites:
        print(f"{head}: skipped: {result.note}", file=out)
    for site in result.sites:
        where = f" {site.label}" if site.label else ""
        if site.site.found_by == "walk":
            where += " (found by the general walk)"
        decision = site.decision
        # The per-mutator lines carry the reasons; the summary adds one only when no mutator spoke.
        summary = f"{head}{where}: {decision.outcome}"
        if not decision.decisions or decision.outcome == "error":
            summary += f": {decision.reason}"
        print(summary, file=out)
        for part in decision.decisions:
            print(f"  {part.mutator}: {part.action.value}: {part.reason}", file=out)
        for warning in decision.warnings:
            print(f"  warning: {warning}", file=out)
        if site.problem:
            print(f"  error: {site.problem}", file=out)
    for problem in result.warnings:
        print(f"  warning: {problem}", file=out)
    for hint in result.hints:
        print(f"  hint: {hint}", file=out)


def _stream(sources: list[list[str]]) -> Iterator[str]:
    """One YAML stream of several files: a ``---`` between them, each file's text untouched.

    Yielded document by document: written in pieces, a reader that goes away (``| head``) is
    noticed at the next write, where one huge write could end silently short."""
    previous = ""
    for pieces in sources:
        for number, piece in enumerate(pieces):
            if number == 0 and previous:
                if not previous.endswith("\n"):
                    yield "\n"
                if not piece.startswith("---"):
                    yield "---\n"
            if piece:
                yield piece
                previous = piece


def _cluster_from(path: str | None, config: Config) -> ClusterView:
    """The cluster state a decision may read offline: what ``kubectl get pods,replicasets -A -o
    yaml`` printed, read as the webhook's watches would keep it. None: no state (EMPTY_VIEW)."""
    if path is None:
        return EMPTY_VIEW
    return load_state(path, watches_for(config) or (PODS, REPLICASETS))


def cmd_mutate(args: argparse.Namespace) -> int:
    try:
        config = _config_from(args.config)
        sources = _manifest_sources(args.filename, args.recursive)
        loaded = [(label, load_documents(text, label)) for label, text in sources]
        cluster = _cluster_from(args.cluster, config)
        extra = _mutation_documents(args.mutations)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except StateFileError as error:
        print(f"castslice mutate: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:
        print(f"castslice mutate: cannot read {args.filename}: {error.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DocumentError as error:
        print(f"castslice mutate: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # PodMutation documents in the input or in --mutations: the view the webhook would have.
    documents = [chunk.tree for _, chunks in loaded for chunk in chunks if not chunk.empty]
    config, cluster = _with_podmutations(config, [*documents, *extra], sys.stderr, cluster)
    engine = Engine(config)
    several = Path(args.filename).is_dir() if args.filename != "-" else False
    results: list[ObjectResult] = []
    texts: list[list[str]] = []
    for label, chunks in loaded:
        pieces = []
        for index, chunk in enumerate(chunks):
            objects, text = mutate_chunk(engine, chunk, label, index, args.namespace, cluster)
            results.extend(objects)
            pieces.append(text)
        texts.append(pieces)
    from function.offline.podmutations import is_mutation_document

    for result in results:
        if is_mutation_document(result.plain):
            continue  # reported when loaded
        _report(result, sys.stderr, f"{result.source}: " if several else "")

    if args.output == "patch":
        patches = [
            {
                "source": r.source,
                "index": r.index,
                "item": r.item,
                "kind": r.kind,
                "name": r.name,
                "namespace": r.namespace,
                "patch": r.patch(),
            }
            for r in results
            if r.sites
        ]
        json.dump(patches, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "json":
        # Always a List (what `kubectl get -o json` prints for several objects), whatever the
        # number of objects: scripts read one shape, and kubectl apply -f - takes it as is.
        items = [r.plain for r in results if isinstance(r.plain, dict)]
        try:
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2, allow_nan=False)
        except ValueError:  # YAML's .inf and .nan: kubectl cannot send them either
            print("castslice mutate: a value is .inf or .nan, which JSON cannot carry", file=sys.stderr)
            return EXIT_BAD_INPUT
        sys.stdout.write(text + "\n")
    else:
        for piece in _stream(texts):
            sys.stdout.write(piece)

    if any(r.internal_error for r in results):
        return EXIT_INTERNAL
    if any(r.errors for r in results):
        return EXIT_BAD_INPUT
    return EXIT_DENIED if any(r.denied for r in results) else 0


# -- PodMutations offline ----------------------------------------------------------------------
def _read_documents(path: str) -> list[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _mutation_documents(directory: str | None) -> list[Any]:
    from function.offline.podmutations import documents_in

    if not directory:
        return []
    return [doc for _, doc in documents_in(Path(directory))]


def _with_podmutations(
    config: Config, documents: list[Any], out: TextIO, cluster: ClusterView = EMPTY_VIEW
) -> tuple[Config, ClusterView]:
    """PodMutation documents among ``documents`` as the cluster view the webhook would have; with
    any, the podMutations mutator is switched on (naming them is asking for them)."""
    from function.core.view import StaticView
    from function.offline.podmutations import WithMutations, load

    loaded = load(documents)
    if not loaded.records:
        return config, cluster
    for record in loaded.valid:
        print(f"podmutation/{record.name}: loaded (generation {record.generation})", file=out)
        for warning in record.warnings:
            print(f"  warning: {warning}", file=out)
    for bad in loaded.invalid:
        print(f"podmutation/{bad.name}: invalid, ignored: {'; '.join(bad.problems)}", file=out)
    for name in loaded.disabled:
        print(f"podmutation/{name}: enabled: false, ignored", file=out)
    section = config.section("podMutations")
    if not section.enabled:
        config = config.model_copy(update={"podMutations": section.model_copy(update={"enabled": True})})
    mutations = StaticView({"podmutations": loaded.records}, specs=())
    return config, WithMutations(cluster, mutations) if cluster.available else mutations


def cmd_mutations_validate(args: argparse.Namespace) -> int:
    from function.admission.podmutations import check
    from function.offline.podmutations import documents_in, is_mutation_document

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


def cmd_explain(args: argparse.Namespace) -> int:
    from function.offline.podmutations import explain, load, pod_of

    try:
        documents = _read_documents(args.filename)
        extra = _mutation_documents(args.mutations)
    except (OSError, yaml.YAMLError) as error:
        print(f"castslice explain: cannot read {args.filename}: {error}", file=sys.stderr)
        return 2
    loaded = load([*documents, *extra])
    for bad in loaded.invalid:
        print(f"podmutation/{bad.name}: invalid, ignored: {'; '.join(bad.problems)}")
    for index, doc in enumerate(documents):
        found = pod_of(doc, index) if isinstance(doc, dict) else None
        if found is None:
            continue
        metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        namespace = str((metadata or {}).get("namespace") or args.namespace)
        result = explain(found[0], namespace, loaded.valid)
        w = result.workload
        print(
            f"{str(doc.get('kind', '?')).lower()}/{(metadata or {}).get('name', '?')}: "
            f"workload {w.kind}/{w.name} in namespace {w.namespace}"
        )
        if not result.selection.candidates:
            print("  no PodMutation matches")
            continue
        for place, candidate in enumerate(result.selection.candidates, start=1):
            tied = candidate in result.selection.tied
            mark = "winner" if place == 1 else "tied, lost by name" if tied else ""
            print(
                f"  {place}. {candidate.mutation.name} (generation {candidate.mutation.generation}): "
                f"{candidate.rank.describe()}" + (f"  <- {mark}" if mark else "")
            )
        print(f"  changes: {'; '.join(result.changes) or 'none'}")
        for op in result.patch:
            print(f"    {json.dumps(op, sort_keys=True)}")
        for warning in result.warnings:
            print(f"  warning: {warning}")
    return 0


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


AUDIT_VIEWS = ("summary", "list", "rejected")


def _rejected(store: Any, args: argparse.Namespace) -> int:
    """The events the consumer refused (schema or attribute checks), newest first, with why."""
    rows = list(reversed(store.rejected()))[: args.limit]
    if args.output == "json":
        for row in rows:
            row["event"] = json.loads(row["event"])
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _table(
        ("RECEIVED", "ID", "TYPE", "SOURCE", "PROBLEMS"),
        [
            (r["received_at"][:19] + "Z", r["id"], r["type"], r["source"], _short("; ".join(r["problems"])))
            for r in rows
        ],
        sys.stdout,
    )
    return 0


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


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from function.contract import DISTRIBUTION
    from function.core.engine import ENGINE_VERSION

    try:
        package = version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        package = "unknown"
    return f"castslice {package} (engine {ENGINE_VERSION})"


CONFIG_HELP = "configuration file (default: $CASTSLICE_CONFIG, else the built-in defaults)"


def parser() -> argparse.ArgumentParser:
    # Every option's help names its default (a test holds every option to it).
    top = argparse.ArgumentParser(
        prog="castslice", description="GPU and spot admission webhook: serve it, or see what it would do."
    )
    top.add_argument(
        "--version",
        action="version",
        version=version_text(),
        help="print the version and exit (default: off)",
    )
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the function (functions-framework, ASGI)")
    serve.add_argument(
        "--host",
        default=os.environ.get("HOST", "0.0.0.0"),
        help="address to listen on (default: $HOST, else 0.0.0.0)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT", DEFAULT_PORT)),
        help=f"port to listen on (default: $PORT, else {DEFAULT_PORT})",
    )
    serve.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default="mutate",
        help="what to serve: mutate, the admission webhook; audit, the reference "
        "audit consumer (default: mutate)",
    )
    serve.add_argument("--config", help=CONFIG_HELP)
    serve.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS (default: none, plain HTTP)")
    serve.add_argument("--tls-key", help="PEM private key for --tls-cert (default: none)")
    serve.set_defaults(run=cmd_serve)

    mutate = sub.add_parser("mutate", help="apply the webhook to manifests offline")
    mutate.add_argument(
        "-f",
        "--filename",
        required=True,
        help="a YAML or JSON file (several documents allowed), a directory of them, "
        "or - for stdin (required, no default)",
    )
    mutate.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="with a directory, read its subdirectories too (default: off)",
    )
    mutate.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch"),
        default="yaml",
        help="yaml: the manifests, untouched documents byte for byte; json: a v1 List "
        "of the objects; patch: the JSON patch of each object (default: yaml)",
    )
    mutate.add_argument("--config", help=CONFIG_HELP)
    mutate.add_argument(
        "-n", "--namespace", default="default", help="namespace of objects that name none (default: default)"
    )
    mutate.add_argument(
        "--cluster",
        metavar="STATE.yaml",
        help="cluster state for mutators that need it (spot's partial split): what "
        "kubectl get pods,replicasets -A -o yaml prints (default: none)",
    )
    mutate.set_defaults(run=cmd_mutate)

    mutate.add_argument(
        "--mutations",
        metavar="DIR",
        help="PodMutation documents (a file or a directory) to apply (default: none; "
        "PodMutations in the input count too)",
    )
    mutate.set_defaults(run=cmd_mutate)

    mutations = sub.add_parser("mutations", help="check PodMutation documents")
    mutations_sub = mutations.add_subparsers(dest="mutations_command", required=True)
    mutations_validate = mutations_sub.add_parser(
        "validate", help="validate PodMutation files or directories"
    )
    mutations_validate.add_argument(
        "files", nargs="+", metavar="FILE", help="PodMutation files or directories (required)"
    )
    mutations_validate.set_defaults(run=cmd_mutations_validate)

    explain = sub.add_parser("explain", help="which PodMutations match a Pod, their rank, the winner")
    explain.add_argument(
        "-f", "--filename", required=True, help="YAML with Pods/workloads (and PodMutations), or - (required)"
    )
    explain.add_argument(
        "--mutations",
        metavar="DIR",
        help="PodMutation documents, a file or a directory (default: those in -f only)",
    )
    explain.add_argument(
        "-n", "--namespace", default="default", help="namespace of objects that name none (default: default)"
    )
    explain.set_defaults(run=cmd_explain)

    config = sub.add_parser("config", help="check or show the configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    validate = config_sub.add_parser("validate", help="check a configuration file")
    validate.add_argument("file", help="the configuration file to check (required)")
    validate.set_defaults(run=cmd_config_validate)
    show = config_sub.add_parser("show", help="print the effective configuration")
    show.add_argument("--config", help=CONFIG_HELP)
    show.set_defaults(run=cmd_config_show)

    from function.audit.consumer import AUDIT_DB_ENV, BUCKETS, DEFAULT_AUDIT_DB

    audit = sub.add_parser(
        "audit", help="list or summarise the decision events the reference audit consumer stored"
    )
    audit.add_argument(
        "view",
        nargs="?",
        choices=AUDIT_VIEWS,
        default="summary",
        help="summary: counts by outcome, namespace, mutator, time; list: the events; "
        "rejected: the events the consumer refused, with why (default: summary)",
    )
    audit.add_argument(
        "--db",
        default=os.environ.get(AUDIT_DB_ENV, DEFAULT_AUDIT_DB),
        help=f"SQLite file (default: ${AUDIT_DB_ENV}, else ./{DEFAULT_AUDIT_DB})",
    )
    audit.add_argument(
        "--since",
        type=parse_when,
        help="from this time: 15m, 2h, 7d ago, or an ISO time (default: the first event)",
    )
    audit.add_argument(
        "--until", type=parse_when, help="before this time, same forms as --since (default: no end)"
    )
    audit.add_argument("-n", "--namespace", help="only Pods in this namespace (default: every namespace)")
    audit.add_argument("--outcome", choices=OUTCOMES, help="only this outcome (default: every outcome)")
    audit.add_argument(
        "--mutator", help="only decisions where this mutator acted, mutated or denied (default: any)"
    )
    audit.add_argument(
        "--bucket", choices=sorted(BUCKETS), default="hour", help="summary time bucket (default: hour)"
    )
    audit.add_argument(
        "--limit",
        type=int,
        default=100,
        help="list or rejected: at most this many, newest first (default: 100)",
    )
    audit.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="table or json (default: table)"
    )
    audit.set_defaults(run=cmd_audit)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`castslice mutate ... | head`): no traceback. Point stdout at
        # /dev/null so the interpreter's own flush at exit cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 - a bug: one line, a non-zero exit, traceback on request
        print(
            f"castslice: internal error: {type(error).__name__}: {error} (a bug: please report it; "
            "CASTSLICE_DEBUG=1 prints the traceback)",
            file=sys.stderr,
        )
        if os.environ.get("CASTSLICE_DEBUG") == "1":
            traceback.print_exc()
        return EXIT_INTERNAL
    return code


if __name__ == "__main__":
    sys.exit(main())
