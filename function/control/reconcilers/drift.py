"""The drift reconciler as a plug-in of ``castslice control`` (function/control/drift.py): on by
default (``drift.enabled``), a pass every ``drift.intervalSeconds``, at most ``drift.pageSize`` Pods
and about ``drift.pageBytes`` a page,
each Pod found a CloudEvent on the audit sink."""

from __future__ import annotations

import os

from cloudevents.http import CloudEvent

from function.control.drift import NAME, DriftReconciler, drift_watches
from function.control.reconciler import ReconcilerPlugin
from function.core.config import Config
from function.core.engine import Engine
from function.kube.client import Api


def build(config: Config, api: Api) -> DriftReconciler | None:
    if not config.drift.enabled:
        return None
    from function.audit.recorder import build_recorder

    sender = build_recorder(config, os.environ).sender

    def emit(event: CloudEvent) -> None:
        if sender is not None:  # audit.sink: none
            sender.submit(event)

    return DriftReconciler(
        Engine(config),
        api,
        emit,
        watches=drift_watches(config),
        interval=config.drift.intervalSeconds,
        page_size=config.drift.pageSize,
        page_bytes=config.drift.pageBytes,
    )


PLUGIN = ReconcilerPlugin(name=NAME, build=build)
