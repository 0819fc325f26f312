"""Builders for spot placement tests: Pods with controllers, a static view, a request context."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from function.core.mutators.base import RequestContext
from function.core.mutators.spot import NAMESPACES, NamespaceRecord, Spot, SpotConfig
from function.core.placement import LEDGER_INDEX, PLACEMENT_LABEL, LedgerEntry
from function.core.pod import Owner
from function.core.view import (
    EMPTY_VIEW,
    PODS,
    REPLICASETS,
    ClusterView,
    IndexState,
    Overlay,
    PodRecord,
    View,
)

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


NO_VIEW: ClusterView = EMPTY_VIEW


def Ctx(
    uid: str = "req-1", namespace: str = "default", operation: str = "CREATE", cluster: ClusterView = NO_VIEW
) -> RequestContext:
    return RequestContext(uid=uid, namespace=namespace, operation=operation, cluster=cluster)


def siblings(
    spot: int = 0,
    on_demand: int = 0,
    unplaced: int = 0,
    terminating: int = 0,
    owner_uid: str = RS_UID,
) -> list[PodRecord]:
    kinds = [("spot", False)] * spot + [("on-demand", False)] * on_demand + [("", False)] * unplaced
    kinds += [("spot", True)] * terminating
    owner_of = Owner(owner_uid, "ReplicaSet", "web-58c67d7989")
    return [
        PodRecord("default", f"web-{n}", f"pod-{n}", owner_of, placed, dying, f"d-{n}")
        for n, (placed, dying) in enumerate(kinds)
    ]


def view_with(
    pods: list[PodRecord] | None = None,
    ledger: tuple[LedgerEntry, ...] = (),
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    owner_uid: str = RS_UID,
    pods_synced: bool = True,
) -> ClusterView:
    """A view holding these sibling Pods and namespaces, plus ``ledger`` as this process's recent
    decisions for ``owner_uid`` (as the edge hands them in)."""
    namespace_records = [
        NamespaceRecord(f"ns-{name}", name, tuple(sorted(labels.items())))
        for name, labels in (namespaces or {}).items()
    ]
    view = View(
        {
            "pods": IndexState.build(pods or [], PODS, synced=pods_synced),
            "replicasets": IndexState.build([], REPLICASETS),
            "namespaces": IndexState.build(namespace_records, NAMESPACES),
        }
    )
    return Overlay(view, {LEDGER_INDEX: {owner_uid: ledger} if ledger else {}})


def spot_mutator(deny_invalid: bool = True, own_namespace: str = "castslice-system", **config: Any) -> Spot:
    return Spot(SpotConfig.model_validate({"enabled": True, **config}), deny_invalid, own_namespace)


def run(mutator: Spot, pod: dict[str, Any], ctx: RequestContext | None = None) -> tuple[Any, dict[str, Any]]:
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
