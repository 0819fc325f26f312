"""Serving-certificate rotation for `castslice serve --tls-cert/--tls-key`.

cert-manager renews the serving certificate in place (the Secret volume's files change; the
Deployment is not restarted). The server reads the files only when a worker starts, so this
watcher polls them and, once a renewed pair loads cleanly, sends SIGHUP to gunicorn's arbiter
(this process): gunicorn starts new workers, which read the new files, and retires the old ones
gracefully. No request is dropped and no restart is needed.
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("castslice.tls")

DEFAULT_INTERVAL_SECONDS = 30.0


def _identity(path: Path) -> tuple[int, int, int]:
    # stat() follows the ..data symlink a Secret volume swaps atomically on update.
    status = path.stat()
    return status.st_ino, status.st_mtime_ns, status.st_size


def _reload_workers() -> None:
    os.kill(os.getpid(), signal.SIGHUP)


class CertificateWatcher:
    def __init__(
        self,
        cert: str | Path,
        key: str | Path,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        on_change: Callable[[], None] = _reload_workers,
    ) -> None:
        self.cert = Path(cert)
        self.key = Path(key)
        self.interval = interval
        self.on_change = on_change
        self._seen = self._snapshot()
        self._stop = threading.Event()

    def _snapshot(self) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
        try:
            return _identity(self.cert), _identity(self.key)
        except OSError:
            return None

    def pair_loads(self) -> bool:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as error:
            log.warning("TLS files changed but do not load as a pair yet: %s", error)
            return False
        return True

    def check(self) -> bool:
        """True when the files changed and the new pair was handed over (on_change called)."""
        current = self._snapshot()
        if current is None or current == self._seen:
            return False
        if not self.pair_loads():
            return False  # half-written: try again next time, keep serving the old pair
        self._seen = current
        log.info("serving certificate %s changed: reloading workers", self.cert)
        self.on_change()
        return True

    def start(self) -> threading.Thread:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.check()

        thread = threading.Thread(target=loop, name="castslice-tls-watcher", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
