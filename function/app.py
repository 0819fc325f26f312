"""The composition root: configuration in, a ready-to-serve webhook out.

Everything with side effects (reading the config file, logging set-up, the audit event sender)
is wired here, once per process, so the layers below stay pure and testable.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from function.admission import Admission
from function.audit.recorder import AuditRecorder, build_recorder
from function.config import Config, load_config
from function.engine import Engine
from function.http_api import WebhookHttp


def configure_logging() -> None:
    # Logs go to stderr; stdout is reserved for audit events (JSON lines) so the two never mix.
    if not logging.getLogger("castslice").handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("castslice").addHandler(handler)
        logging.getLogger("castslice").setLevel(os.environ.get("CASTSLICE_LOG_LEVEL", "INFO").upper())


def build_webhook(config: Config | None = None, environ: Mapping[str, str] | None = None) -> WebhookHttp:
    """Raises ConfigError (naming the bad key) when the configuration is invalid: start-up stops.

    ``environ`` (default os.environ) chooses the audit sink: K_SINK, DAPR_HTTP_PORT, else stdout.
    """
    return build_webhook_and_recorder(config, environ)[0]


def build_webhook_and_recorder(
    config: Config | None = None, environ: Mapping[str, str] | None = None
) -> tuple[WebhookHttp, AuditRecorder]:
    """build_webhook, plus its recorder for hosts that start and drain the audit sender
    themselves (the Knative Functions instance in func.py); ``environ`` also names the config."""
    configure_logging()
    env = os.environ if environ is None else environ
    config = load_config(dict(env)) if config is None else config
    engine = Engine(config)
    recorder = build_recorder(config, env)
    admission = Admission(engine, recorder)
    return WebhookHttp(admission, ready=recorder.ready, metrics=recorder.metrics_text), recorder
