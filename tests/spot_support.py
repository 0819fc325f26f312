"""Builders for spot placement tests: Pods with controllers, a static view, a request context."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from function.mutators.spot import (
    LEDGER_INDEX,
    NAMESPACES_INDEX,
    PODS_INDEX,
    LedgerEntry,
    PodRecord,
    Spot,
    SpotConfig,
)
from function.placement import PLACEMENT_LABEL, Placement

RS_UID = "rs-uid-1"


def owner(kind: str = "ReplicaSet", name: str = "web-58c67d7989", uid: str = RS_UID) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def make_pod(
    owner_ref: dict[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": "web-", "namespace": namespace}
    if owner_ref is not None:
        metadata["ownerReferences"] = [owner_ref]
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "nginx"}], **spec},
    }


@dataclass(frozen=True)
class View:
    """A static cluster view (what ``function.cluster.StaticView`` gives once merged)."""

    indices: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    available: bool = True
    unsynced: frozenset[str] = frozenset()

    def index(self, name: str) -> Mapping[str, Any]:
        return self.indices.get(name, {})

    def synced(self, name: str) -> bool:
        return self.available and name not in self.unsynced


NO_VIEW = View(available=False)


@dataclass(frozen=True)
class Ctx:
    uid: str = "req-1"
    namespace: str = "default"
    operation: str = "CREATE"
    dry_run: bool = False
    cluster: View = NO_VIEW


def siblings(
    spot: int = 0,
    on_demand: int = 0,
    unplaced: int = 0,
    terminating: int = 0,
    owner_uid: str = RS_UID,
) -> dict[str, PodRecord]:
    records: dict[str, PodRecord] = {}
    kinds: list[tuple[Placement | None, bool]] = (
        [("spot", False)] * spot
        + [("on-demand", False)] * on_demand
        + [(None, False)] * unplaced
        + [("spot", True)] * terminating
    )
    for number, (placement, dying) in enumerate(kinds):
        uid = f"pod-{number}"
        records[uid] = PodRecord(uid, "default", f"web-{number}", owner_uid, placement, f"d-{number}", dying)
    return records


def view_with(
    pods: Mapping[str, PodRecord] | None = None,
    ledger: tuple[LedgerEntry, ...] = (),
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    owner_uid: str = RS_UID,
) -> View:
    return View(
        {
            PODS_INDEX: {owner_uid: dict(pods or {})},
            LEDGER_INDEX: {owner_uid: ledger} if ledger else {},
            NAMESPACES_INDEX: dict(namespaces or {}),
        }
    )


def spot_mutator(deny_invalid: bool = True, own_namespace: str = "castslice-system", **config: Any) -> Spot:
    return Spot(SpotConfig.model_validate({"enabled": True, **config}), deny_invalid, own_namespace)


def run(mutator: Spot, pod: dict[str, Any], ctx: Ctx | None = None) -> tuple[Any, dict[str, Any]]:
    """Mutate a copy; check the second pass is a no-op (reinvocation); return (result, pod)."""
    working = copy.deepcopy(pod)
    result = mutator.mutate(working, ctx or Ctx())
    if result.action.value == "mutated":
        again = copy.deepcopy(working)
        second = mutator.mutate(again, ctx or Ctx())
        assert again == working, "a second pass changed the Pod"
        assert second.action.value == "unchanged", second
    return result, working


def placement(pod: Mapping[str, Any]) -> str | None:
    labels = pod.get("metadata", {}).get("labels", {})
    value = labels.get(PLACEMENT_LABEL)
    return value if isinstance(value, str) else None
