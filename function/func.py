"""The entry points: functions-framework targets and the Knative Functions constructor.

``mutate`` is the webhook as an ASGI HTTP function, for ``functions-framework --source
function/func.py --target mutate --asgi``; its webhook is built from the environment
(CASTSLICE_CONFIG, the audit sink's variables) on the first request it serves, in the serving
process. ``castslice serve`` runs the same webhook through function/serve/asgi.py instead.

``new()`` is the webhook for Knative Functions (``func build`` / ``func deploy``): see
function/serve/knative.py.

``audit`` is the reference audit consumer (an ASGI CloudEvent function, ``castslice serve
--target audit``): it receives the webhook's decision events from a Trigger, checks them against
the shipped JSON Schema and stores them in SQLite at $CASTSLICE_AUDIT_DB (``castslice audit``).

Importing this module builds no webhook, starts no thread and opens no database.
"""

from __future__ import annotations

import asyncio
import os
import threading

from cloudevents.http import CloudEvent
from functions_framework import aio
from starlette.exceptions import HTTPException
from starlette.requests import Request

from function.audit.consumer import AuditStore, InvalidEvent
from function.contract import AUDIT_DB_ENV, DEFAULT_AUDIT_DB, LARGE_REVIEWS_ENV
from function.serve.app import WebhookOnDemand, build_webhook
from function.serve.asgi import Reply, answer_request
from function.serve.http_api import WebhookHttp
from function.serve.knative import KnativeFunction


def _webhook_from_environment() -> WebhookHttp:
    return build_webhook(large_reviews=os.environ.get(LARGE_REVIEWS_ENV) == "process")


_webhook = WebhookOnDemand(_webhook_from_environment)


# functions-framework hands back any reply that is not a str, dict or tuple as the ASGI response
# itself; its type hints name only Starlette's Response.
@aio.http  # type: ignore[arg-type]
async def mutate(request: Request) -> Reply:
    return await answer_request(_webhook, request)


def new() -> KnativeFunction:
    """The Knative Functions constructor (func-python's ``serve(new)``)."""
    return KnativeFunction()


_audit_store: AuditStore | None = None
_audit_store_lock = threading.Lock()


def audit_store() -> AuditStore:
    # Opened on first use, in the worker process: a SQLite connection must not cross a fork.
    global _audit_store
    with _audit_store_lock:
        if _audit_store is None:
            _audit_store = AuditStore(os.environ.get(AUDIT_DB_ENV, DEFAULT_AUDIT_DB))
        return _audit_store


@aio.cloud_event
async def audit(event: CloudEvent) -> None:
    try:
        await asyncio.to_thread(audit_store().accept, event)
    except InvalidEvent as invalid:
        # 400, not 500: a broker does not retry it (retrying cannot fix it); it goes to the
        # Trigger's dead-letter sink if any, and the rejected table keeps it here.
        raise HTTPException(400, detail=f"not a valid CastSlice decision event: {invalid}") from None
