"""The logging every CastSlice process sets up the same way (webhook, its large-review process,
controller): one handler on the ``castslice`` logger, to stderr, at ``CASTSLICE_LOG_LEVEL``."""

from __future__ import annotations

import logging
import os
import sys


def configure_logging() -> None:
    # Logs go to stderr; stdout is reserved for audit events (JSON lines) so the two never mix.
    if not logging.getLogger("castslice").handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("castslice").addHandler(handler)
        logging.getLogger("castslice").setLevel(os.environ.get("CASTSLICE_LOG_LEVEL", "INFO").upper())
