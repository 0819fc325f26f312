"""The ``castslice`` command: its parser and dispatch. Each program lives beside what it runs:

- ``serve``: function/serve/command.py
- ``mutate``, ``explain``, ``mutations validate``, ``config validate|show``: function/offline/
- ``audit``: function/audit/command.py
- ``control``: function/control/command.py
- ``certgen``, ``doctor``: function/admin/

A program is a module function ``run(args) -> int`` (the exit code); adding one is a function
here that declares its arguments and sets ``run`` to ``run_of("module", "function")``, and a line
in ``PROGRAMS``.

Each command imports only what it runs: this module imports no program, and the defaults its
options show come from function/contract.py. ``castslice --version`` loads no configuration
model, no cryptography, no SQLite, no cluster client (tests/offline/test_cli_startup.py holds it
to that; tests/benchmarks/cli.py measures the start-up beside ``python -c pass``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any, TypeAlias

from function.contract import (
    AUDIT_BUCKETS,
    AUDIT_DB_ENV,
    AUDIT_VIEWS,
    CERT_RENEW_BEFORE_DAYS,
    CONTROL_LEASE_NAME,
    CONTROL_PORT,
    DEFAULT_AUDIT_DB,
    DEFAULT_PORT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    FUNCTION_NAMESPACE,
    LEASE_SECONDS,
    LOCAL_HOST,
    MUTATING_CONFIGURATIONS,
    OUTCOMES,
    RENEW_DEADLINE_SECONDS,
    RETRY_SECONDS,
    SERVE_TARGETS,
    VALIDATING_CONFIGURATIONS,
    WEBHOOK_SERVICE,
    WEBHOOK_TLS_SECRET,
)

Programs: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns: each program adds its parser to it."""

CONFIG_HELP = "configuration file (default: $CASTSLICE_CONFIG, else the built-in defaults)"
NAMESPACE_HELP = "namespace of objects that name none (default: default)"


def run_of(module: str, function: str = "run") -> Callable[[argparse.Namespace], int]:
    """The program ``module.function``, imported when it runs, not when the parser is built."""

    def run(args: argparse.Namespace) -> int:
        code: int = getattr(import_module(module), function)(args)
        return code

    run.__qualname__ = f"{module}.{function}"
    return run


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from function.contract import DISTRIBUTION, ENGINE_VERSION

    try:
        package = version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        package = "unknown"
    return f"castslice {package} (engine {ENGINE_VERSION})"


# Every option's help names its default (tests/offline/test_cli.py holds every option to it).
def _serve(sub: Programs) -> None:
    program = sub.add_parser("serve", help="serve the function (functions-framework, ASGI)")
    program.add_argument(
        "--host",
        default=os.environ.get("HOST", LOCAL_HOST),
        help=f"address to listen on: 0.0.0.0 for every interface (default: $HOST, else {LOCAL_HOST}, "
        "loopback only)",
    )
    program.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT", DEFAULT_PORT)),
        help=f"port to listen on (default: $PORT, else {DEFAULT_PORT})",
    )
    program.add_argument(
        "--target",
        choices=sorted(SERVE_TARGETS),
        default="mutate",
        help="what to serve: mutate, the admission webhook; audit, the reference "
        "audit consumer (default: mutate)",
    )
    program.add_argument("--config", help=CONFIG_HELP)
    program.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS (default: none, plain HTTP)")
    program.add_argument("--tls-key", help="PEM private key for --tls-cert (default: none)")
    program.set_defaults(run=run_of("function.serve.command"))


def _mutate(sub: Programs) -> None:
    program = sub.add_parser("mutate", help="apply the webhook to manifests offline")
    program.add_argument(
        "-f",
        "--filename",
        required=True,
        action="append",
        help="a YAML or JSON file (several documents allowed), a directory of them, "
        "or - for stdin; repeat it for more (required, no default)",
    )
    program.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="with a directory, read its subdirectories too (default: off)",
    )
    program.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch"),
        default="yaml",
        help="yaml: the manifests, untouched documents byte for byte; json: a v1 List "
        "of the objects; patch: the JSON patch of each object (default: yaml)",
    )
    program.add_argument("--config", help=CONFIG_HELP)
    program.add_argument("-n", "--namespace", default="default", help=NAMESPACE_HELP)
    program.add_argument(
        "--cluster",
        metavar="STATE.yaml",
        help="cluster state for mutators that need it (spot's partial split, the dra "
        "backend's templates): what kubectl get pods,replicasets,resourceclaimtemplates -A "
        "-o yaml prints (default: none)",
    )
    program.add_argument(
        "--mutations",
        metavar="PATH",
        action="append",
        help="PodMutation documents (a file or a directory) to apply; repeat it for more, as -f "
        "(default: none; PodMutations in the input count too)",
    )
    program.set_defaults(run=run_of("function.offline.mutate"))


def _mutations(sub: Programs) -> None:
    program = sub.add_parser("mutations", help="check PodMutation documents")
    actions = program.add_subparsers(dest="mutations_command", required=True)
    validate = actions.add_parser("validate", help="validate PodMutation files or directories")
    validate.add_argument(
        "files", nargs="+", metavar="FILE", help="PodMutation files or directories (required)"
    )
    validate.set_defaults(run=run_of("function.offline.mutations", "validate"))


def _explain(sub: Programs) -> None:
    program = sub.add_parser(
        "explain",
        help="which PodMutations match a Pod, their rank, the winner; with gpuSlicing.backend: dra, "
        "the claim and template it gets",
    )
    program.add_argument(
        "-f",
        "--filename",
        required=True,
        action="append",
        help="YAML with Pods/workloads (and PodMutations): a file, a directory of them, or -; "
        "repeat it for more (required)",
    )
    program.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="with a directory, read its subdirectories too (default: off)",
    )
    program.add_argument(
        "--mutations",
        metavar="PATH",
        action="append",
        help="PodMutation documents, a file or a directory; repeat it for more, as -f "
        "(default: those in -f only)",
    )
    program.add_argument("-n", "--namespace", default="default", help=NAMESPACE_HELP)
    program.add_argument(
        "--cluster",
        metavar="STATE",
        help="`kubectl get pods,gpuleases -A -o yaml` output: also show each Pod's GPU lease arithmetic "
        "(default: none)",
    )
    program.add_argument("--config", help=CONFIG_HELP)
    program.set_defaults(run=run_of("function.offline.explain"))


def _config(sub: Programs) -> None:
    program = sub.add_parser("config", help="check or show the configuration")
    actions = program.add_subparsers(dest="config_command", required=True)
    validate = actions.add_parser("validate", help="check a configuration file")
    validate.add_argument("file", help="the configuration file to check (required)")
    validate.set_defaults(run=run_of("function.offline.config", "validate"))
    show = actions.add_parser("show", help="print the effective configuration")
    show.add_argument("--config", help=CONFIG_HELP)
    show.set_defaults(run=run_of("function.offline.config", "show"))


def _dra(sub: Programs) -> None:
    program = sub.add_parser("dra", help="GPU slicing through DRA (gpuSlicing.backend: dra)")
    actions = program.add_subparsers(dest="dra_command", required=True)
    render = actions.add_parser(
        "templates", help="print the ResourceClaimTemplates the webhook names, for GitOps"
    )
    render.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="a GPU namespace to render them for; repeat for several (default: default)",
    )
    render.add_argument("--config", help=CONFIG_HELP)
    render.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default="yaml",
        help="yaml: a stream of documents; json: a v1 List (default: yaml)",
    )
    render.set_defaults(run=run_of("function.offline.dra", "templates"))


def _audit(sub: Programs) -> None:
    program = sub.add_parser(
        "audit",
        help="list or summarise the decision events the reference audit consumer stored, or find "
        "stored Pods the webhook would change today (drift)",
    )
    program.add_argument(
        "view",
        nargs="?",
        choices=AUDIT_VIEWS,
        default="summary",
        help="summary: counts by outcome, namespace, mutator, time; list: the events; "
        "rejected: the events the consumer refused, with why; drift: the stored Pods of --cluster "
        "the webhook would change today (default: summary)",
    )
    program.add_argument(
        "--cluster",
        metavar="STATE.yaml",
        help="drift: what kubectl get pods,replicasets,namespaces -A -o yaml printed, or - for stdin "
        "(default: none)",
    )
    program.add_argument("--config", help="drift: " + CONFIG_HELP)
    program.add_argument(
        "--db",
        default=os.environ.get(AUDIT_DB_ENV, DEFAULT_AUDIT_DB),
        help=f"SQLite file (default: ${AUDIT_DB_ENV}, else ./{DEFAULT_AUDIT_DB})",
    )
    program.add_argument(
        "--since",
        type=_when,
        help="from this time: 15m, 2h, 7d ago, or an ISO time (default: the first event)",
    )
    program.add_argument(
        "--until", type=_when, help="before this time, same forms as --since (default: no end)"
    )
    program.add_argument("-n", "--namespace", help="only Pods in this namespace (default: every namespace)")
    program.add_argument("--outcome", choices=OUTCOMES, help="only this outcome (default: every outcome)")
    program.add_argument(
        "--mutator", help="only decisions where this mutator acted, mutated or denied (default: any)"
    )
    program.add_argument(
        "--bucket", choices=sorted(AUDIT_BUCKETS), default="hour", help="summary time bucket (default: hour)"
    )
    program.add_argument(
        "--limit",
        type=int,
        default=100,
        help="list or rejected: at most this many, newest first (default: 100)",
    )
    program.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="table or json; drift also yaml (default: table)",
    )
    program.set_defaults(run=run_of("function.audit.command"))


def _control(sub: Programs) -> None:
    program = sub.add_parser(
        "control",
        help="run the controller (leader-elected reconcilers: GPU leases, ...)",
        description="The controller process: every replica watches, one leader (a coordination.k8s.io "
        "Lease) reconciles. Serves /healthz, /readyz and /metrics over plain HTTP.",
    )
    program.add_argument("--config", help=CONFIG_HELP)
    program.add_argument(
        "--host",
        default=LOCAL_HOST,
        help=f"address of /healthz, /readyz, /metrics: 0.0.0.0 for every interface (default: {LOCAL_HOST}, "
        "loopback only)",
    )
    program.add_argument(
        "--port",
        type=int,
        default=CONTROL_PORT,
        help=f"port of /healthz, /readyz, /metrics (default: {CONTROL_PORT}, beside castslice serve's "
        f"{DEFAULT_PORT})",
    )
    program.add_argument(
        "--lease-name",
        default=CONTROL_LEASE_NAME,
        help=f"the leader-election Lease (default: {CONTROL_LEASE_NAME})",
    )
    program.add_argument(
        "--lease-namespace",
        default="",
        help="its namespace (default: $POD_NAMESPACE, else the ServiceAccount's, else default)",
    )
    program.add_argument(
        "--identity", default="", help="this candidate's name (default: $POD_NAME, else host_pid)"
    )
    program.add_argument(
        "--lease-duration",
        type=float,
        default=LEASE_SECONDS,
        help=f"seconds a leader's lease lasts unrenewed (default: {LEASE_SECONDS})",
    )
    program.add_argument(
        "--renew-deadline",
        type=float,
        default=RENEW_DEADLINE_SECONDS,
        help=f"seconds the leader tries to renew before it stops leading (default: {RENEW_DEADLINE_SECONDS})",
    )
    program.add_argument(
        "--retry-period",
        type=float,
        default=RETRY_SECONDS,
        help=f"seconds between two tries to acquire or renew (default: {RETRY_SECONDS})",
    )
    program.set_defaults(run=run_of("function.control.command"))


def _certgen(sub: Programs) -> None:
    program = sub.add_parser(
        "certgen",
        help="write the webhook's serving certificate and patch its CA into the webhook "
        "configurations, without cert-manager (what components/certgen's Job runs)",
        description="Idempotent: a valid certificate that names every host is kept, and a current "
        "caBundle left alone. Uses the kubeconfig, or the Pod's ServiceAccount inside a cluster.",
    )
    program.add_argument(
        "-n",
        "--namespace",
        default="",
        help=f"the webhook's namespace (default: $POD_NAMESPACE, else {FUNCTION_NAMESPACE})",
    )
    program.add_argument(
        "--secret", default=WEBHOOK_TLS_SECRET, help=f"the TLS Secret (default: {WEBHOOK_TLS_SECRET})"
    )
    program.add_argument(
        "--service",
        default=WEBHOOK_SERVICE,
        help=f"the Service the apiserver calls, <service>.<namespace>.svc (default: {WEBHOOK_SERVICE})",
    )
    program.add_argument(
        "--host",
        action="append",
        default=[],
        help="another DNS name or IP address the certificate must name; repeat for more (default: none)",
    )
    program.add_argument(
        "--mutating",
        action="append",
        default=None,
        help="a MutatingWebhookConfiguration to patch; repeat for more "
        f"(default: {', '.join(MUTATING_CONFIGURATIONS)})",
    )
    program.add_argument(
        "--validating",
        action="append",
        default=None,
        help="a ValidatingWebhookConfiguration to patch, skipped if absent; repeat for more "
        f"(default: {', '.join(VALIDATING_CONFIGURATIONS)})",
    )
    program.add_argument(
        "--owner-service-account",
        metavar="NAME",
        help="a ServiceAccount of the namespace that owns the Secret, so deleting it (helm uninstall, "
        "kubectl delete -k) deletes the Secret; not yet there, the next run adds it (default: none)",
    )
    program.add_argument(
        "--renew-before-days",
        type=int,
        default=CERT_RENEW_BEFORE_DAYS,
        help=f"replace a certificate expiring within this many days (default: {CERT_RENEW_BEFORE_DAYS})",
    )
    program.set_defaults(run=run_of("function.admin.certgen"))


def _doctor(sub: Programs) -> None:
    program = sub.add_parser(
        "doctor",
        help="check CastSlice on the cluster of the current kubeconfig: one line per check, each "
        "failure with its fix; exit 1 if a check failed",
    )
    program.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    program.add_argument(
        "-n",
        "--namespace",
        default=FUNCTION_NAMESPACE,
        help=f"the webhook's namespace (default: {FUNCTION_NAMESPACE})",
    )
    program.add_argument(
        "--webhook", default="castslice", help="its MutatingWebhookConfiguration (default: castslice)"
    )
    program.add_argument(
        "--secret",
        default=WEBHOOK_TLS_SECRET,
        help=f"its serving-certificate Secret (default: {WEBHOOK_TLS_SECRET})",
    )
    program.add_argument(
        "--service-account",
        default="castslice",
        help="its ServiceAccount, for the RBAC check (default: castslice)",
    )
    program.add_argument(
        "--config",
        help="its configuration file (default: the ConfigMap its Deployment mounts, else the defaults)",
    )
    program.add_argument(
        "--probe-namespace",
        default="default",
        help="where the opted-in Pod is dry-run created (default: default)",
    )
    program.add_argument(
        "--since-hours",
        type=float,
        default=0,
        help="drift: only Pods created within this many hours (default: 0, every stored Pod, as the "
        "controller's drift reconciler judges them)",
    )
    program.set_defaults(run=run_of("function.admin.doctor"))


PROGRAMS: tuple[Callable[[Programs], None], ...] = (
    _serve,
    _mutate,
    _mutations,
    _explain,
    _config,
    _dra,
    _audit,
    _control,
    _certgen,
    _doctor,
)
"""In the order ``castslice --help`` lists them."""


class _Version(argparse.Action):
    """``--version``, worked out only when asked for (argparse's own action takes the text when the
    parser is built, for every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        sys.stdout.write(version_text() + "\n")
        parser.exit()


def _when(text: str) -> Any:
    """``--since``/``--until``: the audit program's time parser, imported when an option uses it."""
    from function.audit.command import parse_when

    return parse_when(text)


_when.__name__ = "time"  # argparse names it in its error: "invalid time value: 'soon'"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="castslice", description="GPU and spot admission webhook: serve it, or see what it would do."
    )
    top.add_argument("--version", action=_Version, nargs=0, help="print the version and exit (default: off)")
    sub = top.add_subparsers(dest="command", required=True)
    for add_program in PROGRAMS:
        add_program(sub)
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
            import traceback

            traceback.print_exc()
        return EXIT_INTERNAL
    return code


if __name__ == "__main__":
    sys.exit(main())
