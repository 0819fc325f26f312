"""The reconciler plug-ins of ``castslice control``, in one list: adding a reconciler means one
module (declaring a ``ReconcilerPlugin``, see ``function/control/reconciler.py``) and one entry
here. Each plug-in decides from the configuration whether it runs."""

from __future__ import annotations

from function.control.reconciler import ReconcilerPlugin
from function.control.reconcilers import dra_templates, drift, gpu_inventory, gpu_leases

PLUGINS: tuple[ReconcilerPlugin, ...] = (
    gpu_leases.PLUGIN,
    gpu_inventory.PLUGIN,
    dra_templates.PLUGIN,
    drift.PLUGIN,
)
