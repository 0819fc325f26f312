"""The read-only view of the cluster that mutators see: one immutable snapshot per review.

Mutators stay pure: what they know of the cluster comes in the request context as a
``ClusterView``, taken once before the fixed-point passes, so no pass sees a different cluster
than the one before it, and no Kubernetes API call happens while a review is answered. What each
plug-in needs watched is declared as ``WatchSpec``s; the edge (watches in background threads, or a
state file offline) runs them and hands out snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol


def _keep(obj: dict[str, Any]) -> Any:
    return obj


@dataclass(frozen=True)
class WatchSpec:
    """What a plug-in needs watched. The edge runs it; ``slim`` keeps only what is needed."""

    index: str
    """The index name mutators read, e.g. ``pods``, ``replicasets``, ``podmutations``."""
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    metadata_only: bool = False
    """Watch as PartialObjectMetadata (Pods: the spec and status are never needed)."""
    slim: Callable[[dict[str, Any]], Any] = field(default=_keep, compare=False)
    """Raw object -> the small immutable record kept in the index (pure; None drops the object)."""
    rbac_verbs: tuple[str, ...] = ("get", "list", "watch")


class ClusterView(Protocol):
    """What a mutator sees of the cluster: immutable for the whole review."""

    @property
    def available(self) -> bool:
        """False when there is no cluster state at all (offline without a state file)."""
        ...

    def index(self, name: str) -> Mapping[str, Any]:
        """The index ``name``: key (usually the object's uid) -> slim record; empty if unknown."""
        ...

    def synced(self, name: str) -> bool:
        """Whether the index has been listed at least once."""
        ...


_EMPTY: Mapping[str, Any] = MappingProxyType({})


class StaticView:
    """A view over fixed indices: tests, and ``castslice mutate --cluster STATE.yaml``."""

    def __init__(self, indices: Mapping[str, Mapping[str, Any]], available: bool = True) -> None:
        self._indices = {name: MappingProxyType(dict(index)) for name, index in indices.items()}
        self._available = available

    @property
    def available(self) -> bool:
        return self._available

    def index(self, name: str) -> Mapping[str, Any]:
        return self._indices.get(name, _EMPTY)

    def synced(self, name: str) -> bool:
        return self._available and name in self._indices


EMPTY_VIEW: ClusterView = StaticView({}, available=False)
"""No cluster state: mutators that need it must say so instead of guessing."""
