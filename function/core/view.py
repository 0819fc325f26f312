"""The cluster view: what a mutator may know about the cluster, read-only and frozen per review.

Mutators stay pure functions. The edge (``function/kube/watch.py``) keeps the state current from
list+watch streams; a mutator only ever sees a ``ClusterView`` snapshot taken once per review,
before the fixed-point passes, so every pass judges against the same cluster and no Kubernetes API
call happens while a review is answered. Offline (``castslice mutate --cluster STATE.yaml``) and in
tests the same view comes from a file or from records (``StaticView``; the file is read by
``function/offline/state_file.py``).

What is kept is decided by ``WatchSpec``s that plug-ins declare (``MutatorPlugin.watches``): a
plug-in that needs nothing declares nothing, and then nothing is watched and no RBAC is granted.

Layout of one index (``IndexState``):

- ``records``: key (the object's uid) -> slim record, for lookups such as "the ReplicaSet that owns
  this Pod";
- ``groups``: group key -> {uid -> record}, when the spec has ``group_by`` (Pods by controller uid),
  so counting a Pod's siblings costs O(siblings), never O(all Pods). A record may belong to
  several groups (a Node to one per extended resource it advertises), so "does any node offer
  this resource?" is one lookup, never a walk of the Nodes.

Both are ``immutables.Map`` (a hash array mapped trie, the structure behind ``contextvars``): an
update makes a new map sharing all but O(log n) nodes with the old one, so the watch thread
publishes a new state per event and a snapshot is a reference copy (O(1)); a plain dict would
need a copy of every entry per event to stay immutable.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import immutables

from function.core.pod import NO_OWNER, NOTHING, Owner, controller_of, metadata_of
from function.core.quantity import QuantityError, parse_quantity

Record = Any
"""A slim record (an immutable tuple such as ``PodRecord``); the spec's ``slim`` decides its type."""

# The keys the webhook writes on the Pods it places and reads back through the view. They are
# defined here, once, and imported by the mutators that write them (placement, pod mutations), so a
# Pod's part in a split costs a few short strings in the view, not its whole label map.
PLACEMENT_LABEL = "castops.io/placement"
"""The label the spot placement mutator writes on a Pod it placed (``spot`` / ``on-demand``)."""
DECISION_ANNOTATION = "castops.io/placement-decision"
"""The admission uid of the decision that placed a Pod (the edge matches its recent decisions by it)."""
MUTATION_GROUP_ANNOTATION = "castops.io/pod-mutation-group"
"""The PodMutation distribution group chosen for a Pod (its siblings are counted by it)."""


# -- slim records ---------------------------------------------------------------------------------
class PodRecord(NamedTuple):
    """What the view keeps of a Pod: a few short strings, not the whole object (the memory per Pod
    is measured by tests/benchmarks/view.py; docs/cluster-view.md has the figures)."""

    namespace: str
    name: str
    uid: str
    owner: Owner
    placement: str
    """The value of PLACEMENT_LABEL ("" when the webhook did not place the Pod)."""
    terminating: bool
    """metadata.deletionTimestamp is set: the Pod is on its way out (graceful deletion) and should
    not count as a running sibling."""
    decision: str = ""
    """The value of DECISION_ANNOTATION: the admission uid of the spot decision that placed the Pod,
    so the spot mutator can tell which of its process's recent decisions the view already shows."""
    group: str = ""
    """The value of MUTATION_GROUP_ANNOTATION: the PodMutation distribution group it was given."""


class ReplicaSetRecord(NamedTuple):
    namespace: str
    name: str
    uid: str
    owner: Owner
    """The Deployment that controls the ReplicaSet (empty for a bare ReplicaSet)."""
    replicas: int | None
    """spec.replicas: the desired count (None when the state did not carry the spec)."""
    terminating: bool


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _interned(value: object) -> str:
    # Namespaces and placements repeat across thousands of Pods: one string each.
    return sys.intern(value) if isinstance(value, str) else ""


FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
"""Pods that finished (an evicted Pod stays ``Failed`` until deleted) are no running siblings. The
watch filters them out on the server (a Pod leaving the selector arrives as DELETED), and ``slim_pod``
drops them when a whole Pod (from a state file) shows its phase."""


def slim_pod(obj: Mapping[str, Any]) -> PodRecord | None:
    """A Pod (full or PartialObjectMetadata) -> PodRecord; None for a finished Pod or no uid."""
    status = obj.get("status")
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return None
    metadata = metadata_of(obj)
    uid = _text(metadata.get("uid"))
    if not uid:
        return None
    labels = metadata.get("labels")
    placement = labels.get(PLACEMENT_LABEL) if isinstance(labels, Mapping) else None
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping):
        annotations = {}
    return PodRecord(
        namespace=_interned(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        uid=uid,
        owner=controller_of(metadata),
        placement=_interned(placement),
        terminating=metadata.get("deletionTimestamp") is not None,
        decision=_text(annotations.get(DECISION_ANNOTATION)),
        group=_interned(annotations.get(MUTATION_GROUP_ANNOTATION)),
    )


def slim_replicaset(obj: Mapping[str, Any]) -> ReplicaSetRecord | None:
    metadata = metadata_of(obj)
    uid = _text(metadata.get("uid"))
    if not uid:
        return None
    spec = obj.get("spec")
    replicas = spec.get("replicas") if isinstance(spec, Mapping) else None
    return ReplicaSetRecord(
        namespace=_interned(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        uid=uid,
        owner=controller_of(metadata),
        # The apiserver defaults spec.replicas to 1; a bool is no count.
        replicas=replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None,
        terminating=metadata.get("deletionTimestamp") is not None,
    )


class NodeRecord(NamedTuple):
    """What the view keeps of a Node: its name, uid, labels and ``status.allocatable``, nothing
    else (no conditions, images or addresses, which are most of a Node's bytes).

    Labels and allocatable are flat tuples, ``(key, value, key, value, ...)`` sorted by key, every
    string interned: the nodes of one pool share nearly all their label keys and values, so a
    Node costs a tuple of references rather than a dict of its own (docs/cluster-view.md has the
    bytes per Node, from tests/benchmark_view.py --nodes). Read them with ``label`` and
    ``allocatable_of`` (or ``pairs``)."""

    name: str
    uid: str
    labels: tuple[str, ...]
    allocatable: tuple[str, ...]

    def label(self, key: str) -> str | None:
        return _pair_value(self.labels, key)

    def allocatable_of(self, resource: str) -> str | None:
        """The quantity the Node advertises of ``resource``, as the kubelet wrote it."""
        return _pair_value(self.allocatable, resource)

    def advertised(self) -> tuple[str, ...]:
        """The extended resources (domain-prefixed names: ``nvidia.com/gpu``) the Node offers
        more than 0 of: the groups of the Nodes index."""
        flat = self.allocatable
        return tuple(flat[at] for at in range(0, len(flat), 2) if "/" in flat[at] and _positive(flat[at + 1]))


def pairs(flat: tuple[str, ...]) -> dict[str, str]:
    """A NodeRecord's flat ``labels`` or ``allocatable`` as a dict (for reports, not reviews)."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _pair_value(flat: tuple[str, ...], key: str) -> str | None:
    for at in range(0, len(flat), 2):
        if flat[at] == key:
            return flat[at + 1]
    return None


def _positive(quantity: str) -> bool:
    try:
        return parse_quantity(quantity) > 0
    except QuantityError:
        return False  # the kubelet writes valid quantities; anything else offers nothing


def _flat(values: object) -> tuple[str, ...]:
    """A map of strings as a sorted flat tuple of interned strings (entries that are not
    strings, which no apiserver serves, are left out)."""
    if not isinstance(values, Mapping):
        return ()
    flat: list[str] = []
    for key in sorted(k for k, v in values.items() if isinstance(k, str) and isinstance(v, str)):
        flat += (sys.intern(key), sys.intern(values[key]))
    return tuple(flat)


def slim_node(obj: Mapping[str, Any]) -> NodeRecord | None:
    """A Node -> NodeRecord; None without a name."""
    metadata = metadata_of(obj)
    name = _text(metadata.get("name"))
    if not name:
        return None
    status = obj.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    return NodeRecord(name, _text(metadata.get("uid")), _flat(metadata.get("labels")), _flat(allocatable))


def by_advertised(record: Record) -> tuple[str, ...]:
    """Group keys of a Node: every extended resource it advertises (``View.group("nodes",
    "nvidia.com/gpu-shared")`` holds the Nodes that offer it)."""
    return record.advertised() if isinstance(record, NodeRecord) else ()


def by_owner(record: Record) -> str:
    """Group key: the controller's uid ("" for Pods no controller owns)."""
    owner = getattr(record, "owner", NO_OWNER)
    return owner.uid if isinstance(owner, Owner) else ""


# -- what a plug-in declares ----------------------------------------------------------------------
def _keep(obj: Mapping[str, Any]) -> Record:
    return obj


def uid_of(obj: Mapping[str, Any]) -> str:
    return _text(metadata_of(obj).get("uid"))


def name_of(obj: Mapping[str, Any]) -> str:
    """The key of a cluster-scoped object looked up by name (a Namespace)."""
    return _text(metadata_of(obj).get("name"))


@dataclass(frozen=True)
class WatchSpec:
    """One list+watch the edge runs for the enabled plug-ins, and the index it feeds.

    Two plug-ins that need the same objects return the same spec (the module constants below);
    the edge runs each index once and refuses two different specs under one index name.
    """

    index: str
    """Name of the index, e.g. "pods", "replicasets"."""
    group: str
    """API group ("" for the core group)."""
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    metadata_only: bool = False
    """Watch PartialObjectMetadata (labels, owners, deletion timestamp only): a fraction of the
    bytes and JSON parsing of whole Pods."""
    slim: Callable[[Mapping[str, Any]], Record | None] = field(default=_keep)
    """Raw object -> small immutable record kept in the index (pure); None: not kept (the object
    is dropped from the index, e.g. a Pod that finished). The default keeps the object itself."""
    key: Callable[[Mapping[str, Any]], str] = uid_of
    """Raw object -> its key in the index: the uid (default), or ``name_of`` for an index that
    mutators look up by name (Namespaces by their name)."""
    group_by: Callable[[Record], str | tuple[str, ...]] | None = None
    """A second layout of the index, group key -> {uid -> record}, for O(siblings) lookups: one
    key per record, or a tuple of keys for a record in several groups (never with ``tally``)."""
    field_selector: str = ""
    """A server-side filter for the list and the watch (objects leaving it arrive as DELETED)."""
    label_selector: str = ""
    """A server-side label filter (``castops.io/gpu-lease``: only charged Pods), same semantics."""
    tally: Callable[[Record], tuple[int, ...]] | None = None
    """With ``group_by``: numbers per record the index keeps summed per group (``View.tally``), so
    a group's total is O(1) to read and O(log n) to keep (GPU lease use, not a walk of its Pods)."""
    rbac_verbs: tuple[str, ...] = ("list", "watch")
    """What the edge does with this resource: list, then watch. No ``get``: nothing reads one
    object by name, and the manifests grant exactly what is used."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self) -> str:
        """The cluster-wide collection URL (all namespaces)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{prefix}/{self.plural}"

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """An object of this spec's kind and group (any version), as listed by kubectl."""
        api_version = obj.get("apiVersion")
        if obj.get("kind") != self.kind or not isinstance(api_version, str):
            return False
        group = api_version.rpartition("/")[0]
        return group == self.group


PODS = WatchSpec(
    index="pods",
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    slim=slim_pod,
    metadata_only=True,
    group_by=by_owner,
    field_selector=POD_FIELD_SELECTOR,
)
"""Pods that have not finished, as PodRecords, grouped by controller uid (a ReplicaSet's Pods)."""

REPLICASETS = WatchSpec(
    index="replicasets",
    group="apps",
    version="v1",
    plural="replicasets",
    kind="ReplicaSet",
    slim=slim_replicaset,
    # Whole objects: spec.replicas (the desired count a split is computed over) is not in the
    # metadata, and ReplicaSets are few next to their Pods.
    metadata_only=False,
)
"""ReplicaSets, as ReplicaSetRecords keyed by uid: Pod -> ReplicaSet -> Deployment."""


NODES = WatchSpec(
    index="nodes",
    group="",
    version="v1",
    plural="nodes",
    kind="Node",
    namespaced=False,
    slim=slim_node,
    # Whole objects: status.allocatable is not in the metadata. The view keeps the NodeRecord only.
    metadata_only=False,
    key=name_of,
    group_by=by_advertised,
)
"""Nodes, as NodeRecords keyed by name, grouped by every extended resource they advertise: which
resources some node offers (GPU slicing's target), and a per-node inventory of labels and
allocatable for whatever needs one."""


def merge_specs(specs: Iterable[WatchSpec]) -> tuple[WatchSpec, ...]:
    """One spec per index, in first-seen order. ValueError when two specs claim one index name."""
    seen: dict[str, WatchSpec] = {}
    for spec in specs:
        known = seen.get(spec.index)
        if known is None:
            seen[spec.index] = spec
        elif known != spec:
            raise ValueError(
                f"two different watches for the cluster-view index {spec.index!r}: "
                f"{known.api_version} {known.plural} and {spec.api_version} {spec.plural}"
            )
    return tuple(seen.values())


def rbac_rules(specs: Iterable[WatchSpec]) -> list[dict[str, list[str]]]:
    """The ClusterRole rules the watches need: one rule per API group, resources and verbs sorted."""
    by_group: dict[str, tuple[set[str], set[str]]] = {}
    for spec in merge_specs(specs):
        resources, verbs = by_group.setdefault(spec.group, (set(), set()))
        resources.add(spec.plural)
        verbs.update(spec.rbac_verbs)
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": sorted(verbs)}
        for group, (resources, verbs) in sorted(by_group.items())
    ]


# -- the view a mutator reads ---------------------------------------------------------------------
EMPTY_MAP: immutables.Map[str, Any] = immutables.Map()


class ClusterView(Protocol):
    """What a mutator sees: immutable for the whole review."""

    @property
    def available(self) -> bool:
        """False: no cluster state at all (offline without --cluster): say so, don't guess."""
        ...

    def index(self, name: str) -> Mapping[str, Record]:
        """key (uid) -> slim record; empty when the index is unknown."""
        ...

    def group(self, name: str, key: str) -> Mapping[str, Record]:
        """uid -> record of the index's group ``key`` (e.g. the Pods a ReplicaSet controls)."""
        ...

    def synced(self, name: str) -> bool:
        """The index has been listed completely at least once (its state is whole)."""
        ...

    def tally(self, name: str, key: str) -> tuple[int, ...]:
        """The sums the index keeps for group ``key`` (its spec's ``tally``), kept as the watch
        delivers, so a decision never walks the group; () when the index keeps none."""
        ...

    @property
    def now(self) -> datetime | None:
        """The snapshot's wall-clock time, when the edge (or the offline command) gives it one:
        the core reads no clock. None: not given."""
        ...


@dataclass(frozen=True)
class IndexState:
    """One index at one moment. Immutable: the watch thread replaces it, never edits it."""

    records: immutables.Map[str, Record] = EMPTY_MAP
    groups: immutables.Map[str, immutables.Map[str, Record]] = EMPTY_MAP
    synced: bool = False
    tallies: immutables.Map[str, tuple[int, ...]] = EMPTY_MAP
    """group key -> the element-wise sum of the spec's ``tally`` over the group's records."""

    @classmethod
    def build(
        cls, records: Iterable[Record] | Mapping[str, Record], spec: WatchSpec | None, *, synced: bool = True
    ) -> IndexState:
        """An index from records (keyed by each record's uid, or by the keys of a mapping),
        grouped as the spec says."""
        by_uid: dict[str, Record] = {}
        grouped: dict[str, dict[str, Record]] = {}
        group_by = spec.group_by if spec is not None else None
        tally = spec.tally if spec is not None else None
        pairs = records.items() if isinstance(records, Mapping) else ((record_key(r), r) for r in records)
        for uid, record in pairs:
            by_uid[uid] = record
            if group_by is not None:
                for key in _group_keys(group_by(record)):
                    grouped.setdefault(key, {})[uid] = record
        sums: dict[str, tuple[int, ...]] = {}
        if tally is not None:
            for key, members in grouped.items():
                for record in members.values():
                    sums[key] = _added(sums.get(key, ()), tally(record), 1)
        return cls(
            immutables.Map(by_uid),
            immutables.Map({key: immutables.Map(members) for key, members in grouped.items()}),
            synced,
            immutables.Map(sums),
        )

    def put(
        self,
        uid: str,
        record: Record,
        group_by: Callable[[Record], str | tuple[str, ...]] | None,
        tally: Callable[[Record], tuple[int, ...]] | None = None,
    ) -> IndexState:
        """This index with ``record`` added or replaced under ``uid``: O(log n), sharing the rest."""
        state = self._without(uid, group_by, tally) if uid in self.records else self
        groups, tallies = state.groups, state.tallies
        if group_by is not None:
            for key in _group_keys(group_by(record)):
                groups = groups.set(key, groups.get(key, EMPTY_MAP).set(uid, record))
                if tally is not None:
                    tallies = tallies.set(key, _added(tallies.get(key, ()), tally(record), 1))
        return IndexState(state.records.set(uid, record), groups, self.synced, tallies)

    def remove(
        self,
        uid: str,
        group_by: Callable[[Record], str | tuple[str, ...]] | None,
        tally: Callable[[Record], tuple[int, ...]] | None = None,
    ) -> IndexState:
        return self._without(uid, group_by, tally) if uid in self.records else self

    def _without(
        self,
        uid: str,
        group_by: Callable[[Record], str | tuple[str, ...]] | None,
        tally: Callable[[Record], tuple[int, ...]] | None = None,
    ) -> IndexState:
        old = self.records[uid]
        groups, tallies = self.groups, self.tallies
        if group_by is not None:
            for key in _group_keys(group_by(old)):
                members = groups.get(key, EMPTY_MAP)
                if uid not in members:
                    continue
                members = members.delete(uid)
                groups = groups.set(key, members) if members else groups.delete(key)
                if tally is not None:
                    left = _added(tallies.get(key, ()), tally(old), -1)
                    tallies = tallies.set(key, left) if members else tallies.delete(key)
        return IndexState(self.records.delete(uid), groups, self.synced, tallies)


def _group_keys(keys: str | tuple[str, ...]) -> tuple[str, ...]:
    """The groups a record is in: ``group_by`` gives one key (a str) or several (a tuple)."""
    return (keys,) if isinstance(keys, str) else keys


def _added(total: tuple[int, ...], values: tuple[int, ...], sign: int) -> tuple[int, ...]:
    """``total + sign * values`` element-wise (the shorter padded with zeros)."""
    width = max(len(total), len(values))
    padded = total + (0,) * (width - len(total))
    return tuple(a + sign * (values[i] if i < len(values) else 0) for i, a in enumerate(padded))


def record_key(record: Record) -> str:
    """A record's key: its ``uid`` attribute, or ``metadata.uid`` of a whole object."""
    uid = metadata_of(record).get("uid") if isinstance(record, Mapping) else getattr(record, "uid", None)
    if not isinstance(uid, str) or not uid:
        raise ValueError(f"a cluster-view record needs a non-empty str uid: {record!r}")
    return uid


class View:
    """A ClusterView over a fixed mapping of index states: building one is O(number of indices)."""

    __slots__ = ("_available", "_indices")

    def __init__(self, indices: Mapping[str, IndexState], *, available: bool = True) -> None:
        self._indices = indices
        self._available = available

    @property
    def available(self) -> bool:
        return self._available

    def index(self, name: str) -> Mapping[str, Record]:
        state = self._indices.get(name)
        return state.records if state is not None and state.records else NOTHING

    def group(self, name: str, key: str) -> Mapping[str, Record]:
        state = self._indices.get(name)
        members: Mapping[str, Record] | None = state.groups.get(key) if state is not None else None
        return members if members else NOTHING

    def synced(self, name: str) -> bool:
        state = self._indices.get(name)
        return state is not None and state.synced

    def tally(self, name: str, key: str) -> tuple[int, ...]:
        """The sums the index's spec keeps for group ``key`` (() when none)."""
        state = self._indices.get(name)
        sums = state.tallies.get(key) if state is not None else None
        return sums if sums else ()

    @property
    def now(self) -> datetime | None:
        return None  # the watches' state has no time of its own: the edge adds it (Overlay)

    def names(self) -> tuple[str, ...]:
        return tuple(self._indices)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={len(state.records)}" for name, state in self._indices.items())
        return f"View(available={self._available}, {sizes})"


EMPTY_VIEW: ClusterView = View({}, available=False)
"""No cluster state: every index empty, nothing synced, ``available`` False."""


class Overlay:
    """The one delegating view: ``base`` as it is, but for the indices given here (this process's
    in-flight ledgers, the PodMutations named on the command line), which read as synced, and
    the snapshot's time when given. A view that hides part of its base derives from it
    (function/core/drift.py's WithoutPod)."""

    __slots__ = ("_now", "base", "indices")

    def __init__(
        self,
        base: ClusterView,
        indices: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        now: datetime | None = None,
    ) -> None:
        self.base = base
        self.indices: Mapping[str, Mapping[str, Any]] = indices or {}
        self._now = now

    @property
    def available(self) -> bool:
        return self.base.available

    def index(self, name: str) -> Mapping[str, Any]:
        given = self.indices.get(name)
        return given if given is not None else self.base.index(name)

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        return self.base.group(name, key)

    def synced(self, name: str) -> bool:
        return name in self.indices or self.base.synced(name)

    def tally(self, name: str, key: str) -> tuple[int, ...]:
        return self.base.tally(name, key)

    @property
    def now(self) -> datetime | None:
        return self._now if self._now is not None else self.base.now

    def __repr__(self) -> str:
        return f"Overlay({self.base!r}, indices={sorted(self.indices)}, now={self._now})"


class StaticView(View):
    """A fixed view for tests and ``castslice mutate --cluster``: every given index counts as synced.

    ``indices`` maps an index name to records (an iterable of records with a ``uid``, or a
    {key: record} mapping); ``specs`` tell which indices are grouped and how (``PODS`` groups by
    owner).
    """

    def __init__(
        self,
        indices: Mapping[str, Iterable[Record] | Mapping[str, Record]],
        specs: Iterable[WatchSpec] = (PODS, REPLICASETS),
        available: bool = True,
    ) -> None:
        by_name = {spec.index: spec for spec in specs}
        states = {name: IndexState.build(records, by_name.get(name)) for name, records in indices.items()}
        super().__init__(states, available=available)
