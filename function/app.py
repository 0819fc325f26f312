"""The composition root: configuration in, a ready-to-serve webhook out.

Everything with side effects (reading the config file, logging set-up, later the event sender)
is wired here, once per process, so the layers below stay pure and testable.
"""

from __future__ import annotations

import logging
import os
import sys

from function.admission import Admission
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


def build_webhook(config: Config | None = None) -> WebhookHttp:
    """Raises ConfigError (naming the bad key) when the configuration is invalid: start-up stops."""
    configure_logging()
    config = load_config() if config is None else config
    engine = Engine(config)
    admission = Admission(engine)
    return WebhookHttp(admission)
