"""The ``castslice`` command: serve the function, mutate manifests offline, check configuration."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from function.config import Config, ConfigError, load_config, load_config_file
from function.contract import DEFAULT_PORT
from function.engine import Engine
from function.manifests import DocumentResult, mutate_document

FUNC_SOURCE = Path(__file__).with_name("func.py")
TARGETS = {"mutate": "the admission webhook"}


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
    app = create_asgi_app(args.target, str(FUNC_SOURCE))  # type: ignore[no-untyped-call]
    options: dict[str, Any] = {}
    if args.tls_cert:
        options.update(certfile=args.tls_cert, keyfile=args.tls_key)
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
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
