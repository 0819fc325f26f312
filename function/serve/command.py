"""``castslice serve``: the webhook (or the reference audit consumer) behind functions-framework's
server, with the TLS options its own CLI lacks."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from function.config_file import load_config, load_config_file
from function.contract import EXIT_BAD_INPUT, KEPT_ALIVE_IDLE_SECONDS, LARGE_REVIEWS_ENV, SERVE_TARGETS
from function.core.config import ConfigError, watches_for
from function.serve.draining import drain_seconds

TARGETS = SERVE_TARGETS


def run(args: argparse.Namespace) -> int:
    # The same app and server functions-framework's own CLI builds (`functions-framework --asgi`),
    # plus the TLS options its CLI lacks: a webhook must be served over HTTPS. Imported here, not
    # at the top, so that the offline programs do not load the web stack.
    from functions_framework._http import create_server

    if bool(args.tls_cert) != bool(args.tls_key):
        print("castslice serve: --tls-cert and --tls-key go together", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        # Fail fast, before gunicorn forks, with the bad key named.
        config = load_config_file(args.config) if args.config else load_config()
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        drain = drain_seconds()  # read again by each worker at SIGTERM (function/serve/draining.py)
    except ValueError as error:
        print(f"castslice serve: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from function.kube.credentials import NoCredentials
    from function.serve.app import view_client
    from function.serve.asgi import serving_app

    if args.target == "mutate" and watches_for(config):
        # The webhook is built in the worker, after gunicorn forks, where a failure is a worker
        # that cannot boot (exit 3). Missing credentials are the user's configuration to fix: say
        # so here, with what was looked for, before forking.
        try:
            view_client(os.environ)
        except NoCredentials as error:
            print(f"castslice serve: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
    # Large reviews off the event loop, in a child process of the worker (function/serve/offload.py),
    # which reads the worker's cluster view; CASTSLICE_LARGE_REVIEWS, when set, decides instead
    # ("process": offloaded, anything else: on the event loop).
    chosen = os.environ.get(LARGE_REVIEWS_ENV)
    large_reviews = chosen is None or chosen == "process"
    # The configuration and that choice reach the worker as the app's arguments.
    app = serving_app(args.target, config, large_reviews=large_reviews)
    # The uvicorn worker functions-framework uses, on a protocol with header size, read-time and
    # idle limits and a shutdown that answers every request received (function/serve/protocol.py).
    options: dict[str, Any] = {"worker_class": "function.serve.protocol.CastSliceWorker"}
    # gunicorn kills workers still running this long after SIGTERM: the drain, the idle connections
    # left to their clients (closed by them, at the latest by the kept-alive limit), then 30 s for
    # the audit queue. The manifests' termination grace periods match (tests/deploy).
    options["graceful_timeout"] = math.ceil(drain + KEPT_ALIVE_IDLE_SECONDS) + 30  # whole seconds
    if args.tls_cert:
        from function.serve.tls import DEFAULT_INTERVAL_SECONDS, CertificateWatcher

        options.update(certfile=args.tls_cert, keyfile=args.tls_key)
        # cert-manager renews the files in place: reload workers when they change (see function/serve/tls.py).
        try:
            interval = float(os.environ.get("CASTSLICE_TLS_RELOAD_SECONDS", DEFAULT_INTERVAL_SECONDS))
        except ValueError:
            print("castslice serve: CASTSLICE_TLS_RELOAD_SECONDS must be seconds", file=sys.stderr)
            return EXIT_BAD_INPUT
        CertificateWatcher(args.tls_cert, args.tls_key, interval).start()
    scheme = "https" if args.tls_cert else "http"
    print(
        f"castslice serve: {TARGETS[args.target]} listening on {scheme}://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    create_server(app, False, **options).run(args.host, args.port)  # type: ignore[no-untyped-call]
    return 0
