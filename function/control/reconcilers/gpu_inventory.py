"""``gpu-inventory``: the GPUs the Nodes offer per model, held against the GpuLeases of that model.

One key per GPU model (``function/core/inventory.py``'s ``base_model``: GFD's ``-SHARED`` and MIG
suffixes name the GPU they come from), made due by every lease of the model and every Node
labelled with it. Each reconcile reads the view only and writes, by Server-Side Apply under its
own field manager (so the lease reconciler's conditions and this one's never overwrite each
other), two conditions on each lease of the model, only when they change:

- ``ModelOffered``: some Node offers the lease's model (``False``, reason ``NotOffered``: no Node
  does: a lease nothing can run on, flagged as soon as it is applied);
- ``Overbooked``: within the next ``HORIZON`` the model's leases open at one moment hold more GPUs
  than the Nodes offer (reason ``Overbooked`` with the moment, the total and the leases; clears
  when a lease is shortened, deleted or the Nodes grow).

Each flip to a problem is a Warning Event on the lease; ``castslice_gpulease_overbooked`` and
``castslice_gpu_inventory_gpus`` are on the leader's /metrics (the alert
``CastSliceGpuLeaseOverbooked`` fires on the first).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from function.control.reconciler import DONE, Context, Emit, Permission, ReconcilerPlugin, Requeue
from function.control.reconcilers.gpu_leases import Subject, conditions_of, whole_seconds, write_event
from function.core.families import NO_FAMILIES, ModelFamilies, models_of
from function.core.inventory import (
    POOL_SEPARATOR,
    Overlap,
    Stock,
    gpu_node,
    model_of,
    not_offered_message,
    overbooked,
    overlap_message,
    pool_stock,
    stock_of,
)
from function.core.leases import API_VERSION, GROUP, KIND, LEASES, PLURAL, VERSION, Lease
from function.core.view import NODES, ClusterView, NodeRecord, Record, WatchSpec
from function.kube.client import APPLY_PATCH, Api, ApiError, object_path
from function.zones import ZONES

if TYPE_CHECKING:
    from function.core.config import Config
    from function.core.schedule import ZoneTable

log = logging.getLogger("castslice.control.inventory")

NAME = "gpu-inventory"
FIELD_MANAGER = "castslice-inventory"
RECHECK_SECONDS = 60.0
"""Windows move on with the clock: the model's leases are held against the Nodes again this often."""
CONDITIONS = ("ModelOffered", "Overbooked")


def lease_conditions(
    lease: Lease, model: str, stock: Stock, overlap: Overlap | None, label: str
) -> list[dict[str, Any]]:
    """The two conditions this reconciler owns, for one lease of ``model`` (pure; no times)."""
    offered = stock.offered
    over = overlap is not None and lease.key in overlap.involved
    return [
        {
            "type": "ModelOffered",
            "status": "True" if offered else "False",
            "reason": "Offered" if offered else "NotOffered",
            "message": f"the nodes offer {stock.describe()} of {model}"
            if offered
            else not_offered_message(model, label),
            "observedGeneration": lease.generation,
        },
        {
            "type": "Overbooked",
            "status": "True" if over else "False",
            "reason": "Overbooked" if over else "WithinInventory",
            "message": overlap_message(model, overlap, stock)
            if over and overlap is not None
            else f"the leases of {model} fit the {stock.describe()} the nodes offer",
            "observedGeneration": lease.generation,
        },
    ]


class InventoryReconciler:
    name: str = NAME
    permissions: tuple[Permission, ...] = (
        Permission(GROUP, f"{PLURAL}/status", ("patch",)),
        Permission("", "events", ("create",)),
    )
    resync_seconds: float = 600.0

    def __init__(
        self,
        api: Api,
        label: str,
        zones: Mapping[str, ZoneTable] = ZONES,
        families: ModelFamilies = NO_FAMILIES,
    ) -> None:
        self.api = api
        self.label = label
        self.zones = zones
        self.families = families
        self._pools: dict[str, set[str]] = {}
        """model -> the keys of leases of several models it is one of (a Node of it makes them due)."""
        self.watches: tuple[WatchSpec, ...] = (LEASES, NODES)
        self._gpus: Gauge | None = None
        self._overbooked: Gauge | None = None

    def register(self, registry: CollectorRegistry) -> None:
        self._gpus = Gauge(
            "castslice_gpu_inventory_gpus",
            "GPUs the Nodes offer, by model (GFD's -SHARED and MIG suffixes name their GPU).",
            ["model"],
            registry=registry,
        )
        self._overbooked = Gauge(
            "castslice_gpulease_overbooked",
            "1 while a GpuLease's model is overbooked: the model's leases open at one moment hold "
            "more GPUs than the Nodes offer.",
            ["namespace", "lease", "model"],
            registry=registry,
        )

    def forget_term(self) -> None:
        for gauge in (self._gpus, self._overbooked):
            if gauge is not None:
                gauge.clear()

    def pool_of(self, lease: Lease) -> str:
        """The key of a lease: its model, or its models joined with ``+`` (a family's GPUs are
        the sum of its models')."""
        models = models_of(lease, self.families)
        pool = POOL_SEPARATOR.join(models)
        if len(models) > 1:
            for model in models:
                self._pools.setdefault(model, set()).add(pool)
        return pool

    def triggers(self, index: str, record: Record) -> Iterable[str]:
        if isinstance(record, Lease) and record.models:
            return (self.pool_of(record),)
        if isinstance(record, NodeRecord):
            model = model_of(record, self.label)
            return (model, *sorted(self._pools.get(model, ()))) if model else ()
        return ()

    def keys(self, view: ClusterView) -> Iterable[str]:
        models = {self.pool_of(r) for r in view.index(LEASES.index).values() if isinstance(r, Lease)}
        models |= {model_of(r, self.label) for r in view.index(NODES.index).values()}
        return sorted(model for model in models if model)

    def reconcile(self, key: str, ctx: Context) -> Requeue:
        if not all(ctx.view.synced(spec.index) for spec in self.watches):
            return Requeue(1.0)  # no node listed yet reads as no GPU at all
        model = key
        members = set(key.split(POOL_SEPARATOR))
        # The Nodes are few next to Pods: each reconcile reads them all (the view groups them by
        # the resources they advertise, not by model).
        nodes = [gpu_node(node, self.label) for node in ctx.view.index(NODES.index).values()]
        stock = pool_stock(key, [stock_of(member, nodes) for member in sorted(members)])
        # A lease of several models is held against their GPUs together, with every lease of
        # those models (a lease of one of them competes for the same GPUs); conditions are
        # written on the leases of this key only (a lease of one model by its model's key).
        competing = [
            lease
            for lease in ctx.view.index(LEASES.index).values()
            if isinstance(lease, Lease)
            and not lease.deleting
            and lease.models
            and set(models_of(lease, self.families)) <= members
        ]
        leases = [lease for lease in competing if self.pool_of(lease) == key]
        overlap = overbooked(competing, stock, ctx.now, self.zones)
        if self._gpus is not None and len(members) == 1:
            if stock.whole or leases:
                self._gpus.labels(model).set(stock.whole / 1000)
            else:
                self._remove(self._gpus, model)
        for lease in leases:
            wanted = lease_conditions(lease, model, stock, overlap, self.label)
            if self._overbooked is not None:
                self._overbooked.labels(lease.namespace, lease.name, model).set(
                    1 if wanted[1]["status"] == "True" else 0
                )
            self._keep(lease, wanted, ctx.now)
        return Requeue(RECHECK_SECONDS) if leases else DONE

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)

    def _keep(self, lease: Lease, wanted: list[dict[str, Any]], now: datetime) -> None:
        shown = conditions_of(lease.status)
        changed = [
            c
            for c in wanted
            if any((shown.get(c["type"]) or {}).get(k) != c[k] for k in ("status", "reason", "message"))
        ]
        if not changed:
            return
        conditions = []
        for condition in wanted:
            before = shown.get(condition["type"]) or {}
            moved = before.get("status") != condition["status"] or not before.get("lastTransitionTime")
            stamp = whole_seconds(now) if moved else before["lastTransitionTime"]
            conditions.append({**condition, "lastTransitionTime": stamp})
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": lease.name, "namespace": lease.namespace},
            "status": {"conditions": conditions},
        }
        path = object_path(GROUP, VERSION, PLURAL, lease.namespace, lease.name, "status")
        response = self.api.request(
            "PATCH",
            path,
            body=body,
            content_type=APPLY_PATCH,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        if response.status == 404:
            return
        if not response.ok:
            raise ApiError(f"apply inventory conditions of gpulease {lease.key}", response)
        for condition in changed:
            problem = (condition["type"] == "Overbooked") == (condition["status"] == "True")
            if problem:
                reason = "Overbooked" if condition["type"] == "Overbooked" else "ModelNotOffered"
                write_event(self.api, Subject.of_lease(lease), reason, condition["message"], "Warning")


def build(config: Config, api: Api, emit: Emit) -> InventoryReconciler | None:
    section = config.section("gpuLeases")
    if not section.enabled:
        return None
    return InventoryReconciler(api, section.modelLabel, families=section.families())


PLUGIN = ReconcilerPlugin(name=NAME, build=build)
