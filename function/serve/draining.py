"""Draining: the time between SIGTERM and the moment the server stops accepting connections.

A rolling update sends SIGTERM to a replica while the Service still routes new connections to it:
the endpoint change takes a moment to reach every node (kube-proxy), and a connection refused
meanwhile is, under ``failurePolicy: Ignore``, a Pod admitted unmutated. So for
``SHUTDOWN_DRAIN_SECONDS`` after SIGTERM the worker keeps accepting and answering, says it is not
ready (``/readyz`` 503, so probes and load balancers stop picking it), and answers every request
with ``connection: close`` (so clients open their next connection to a replica that stays); then
uvicorn's own graceful shutdown runs (function/serve/protocol.py: in-flight and later requests
answered with ``connection: close``, idle connections left to their clients to close, then the
audit queue drained).

The flag is per process: the worker sets it, the app's readiness reads it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from function.contract import DRAIN_SECONDS_ENV, SHUTDOWN_DRAIN_SECONDS

log = logging.getLogger("castslice.server")

DRAINING = threading.Event()
"""Set at SIGTERM in a serving worker; never cleared (the process is on its way out)."""


def drain_seconds(environ: Mapping[str, str] | None = None) -> float:
    """``CASTSLICE_DRAIN_SECONDS`` (seconds, 0 to stop accepting at once), else the default. A
    value that is not a non-negative number is refused by name (``castslice serve`` checks it
    before starting)."""
    raw = (os.environ if environ is None else environ).get(DRAIN_SECONDS_ENV)
    if raw is None or raw.strip() == "":
        return SHUTDOWN_DRAIN_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 300:
        raise ValueError(f"{DRAIN_SECONDS_ENV}={raw!r}: expected seconds from 0 to 300")
    return seconds
