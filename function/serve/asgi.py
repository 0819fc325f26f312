"""The ASGI app ``castslice serve`` runs, built in one place so the tests serve the same app."""

from __future__ import annotations

import sys
from pathlib import Path

from function.audit.shutdown import ASGIApp, drain_on_shutdown

FUNC_SOURCE = Path(__file__).parent.parent / "func.py"


def serving_app(target: str) -> ASGIApp:
    """functions-framework's app for ``target`` (what ``functions-framework --asgi`` serves), with
    the audit drain at lifespan shutdown and, for the webhook, admission reviews answered by the
    bare endpoint in function/func.py (``with_review_endpoint``: same answers, less overhead)."""
    from functions_framework.aio import create_asgi_app

    app: ASGIApp = create_asgi_app(target, str(FUNC_SOURCE))  # type: ignore[no-untyped-call]
    if target == "mutate":
        # The module functions-framework just loaded from FUNC_SOURCE (it registers it under its
        # file's stem), so the endpoint shares its webhook: one engine, one cluster view.
        loaded = sys.modules[FUNC_SOURCE.stem]
        if Path(loaded.__file__ or "").resolve() != FUNC_SOURCE.resolve():
            raise RuntimeError(f"module {FUNC_SOURCE.stem!r} is not {FUNC_SOURCE}")
        app = loaded.with_review_endpoint(app)
        # Under CastSliceWorker, small reviews skip ASGI altogether (function/serve/protocol.py).
        from function.serve.protocol import DIRECT_REVIEWS

        DIRECT_REVIEWS[:] = [loaded.direct_review]
    # Audit events still queued at SIGTERM are drained (bounded) before the worker dies.
    return drain_on_shutdown(app)
