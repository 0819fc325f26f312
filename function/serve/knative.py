"""The webhook as a Knative Functions instance (what function/func.py's ``new()`` returns).

func-python's middleware imports the ``function`` package, calls ``new()`` and serves the
returned object's ASGI ``handle`` on its own server (hypercorn), calling ``start(cfg)`` at
start-up, ``stop()`` at shutdown and ``ready()`` / ``alive()`` for /health/readiness and
/health/liveness.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from function.audit.recorder import AuditRecorder
from function.audit.shutdown import Receive, Scope, Send
from function.serve.app import build_webhook_and_recorder
from function.serve.asgi import send_reply, serve_http
from function.serve.http_api import WebhookHttp, problem

NOT_STARTED = problem(503, "not started")


class KnativeFunction:
    """Built in ``start``, not at construction: func-python hands ``start`` the environment as a
    dict (``cfg``), which is where the configuration file (CASTSLICE_CONFIG) and the audit sink
    (K_SINK from a SinkBinding, DAPR_HTTP_PORT) are read from. Every review is decided on the
    event loop (no large-review process)."""

    def __init__(self) -> None:
        self._webhook: WebhookHttp | None = None
        self._recorder: AuditRecorder | None = None

    def start(self, cfg: Mapping[str, str]) -> None:
        # A bad configuration raises here, naming the key: the middleware does not start serving.
        self._webhook, self._recorder = build_webhook_and_recorder(environ=dict(cfg))
        if self._recorder.sender is not None:
            # Now, in the serving process: the sender's threads must not be started before a fork.
            self._recorder.sender.start()

    def stop(self) -> None:
        # The drain: queued audit events get audit.drainSeconds to reach the sink, the rest is
        # written to stdout. The middleware calls this on lifespan shutdown (SIGTERM).
        if self._recorder is not None:
            left = self._recorder.close()
            if left:
                logging.getLogger("castslice.audit").warning("%d audit event(s) went to stdout at stop", left)

    def ready(self) -> tuple[bool, str]:
        if self._webhook is None:
            return False, "not started"
        return (True, "ready") if self._webhook.ready() else (False, "shutting down")

    def alive(self) -> tuple[bool, str]:
        return True, "alive"

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._webhook is None:  # start() was not called: no configuration, no sink
            await send_reply(send, NOT_STARTED)
        else:
            await serve_http(self._webhook, scope, receive, send)
