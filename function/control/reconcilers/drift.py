"""The drift reconciler as a plug-in of ``castslice control`` (function/control/drift.py): on by
default (``drift.enabled``), a pass every ``drift.intervalSeconds``, at most ``drift.pageSize`` Pods
and about ``drift.pageBytes`` a page,
each Pod found an event on the audit stream."""

from __future__ import annotations

from function.control.drift import NAME, DriftReconciler, drift_watches
from function.control.reconciler import Emit, ReconcilerPlugin
from function.core.config import Config
from function.core.engine import Engine
from function.kube.client import Api


def build(config: Config, api: Api, emit: Emit) -> DriftReconciler | None:
    if not config.drift.enabled:
        return None
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
