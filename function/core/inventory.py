"""The GPUs the cluster has, per model, from the Nodes (labels and allocatable only), and the
GpuLeases of one model whose windows overlap beyond them (pure).

A Node's model is the value of ``gpuLeases.modelLabel`` (GPU feature discovery's
``nvidia.com/gpu.product``), recognised as one model whatever GFD appends to it: the ``-SHARED``
suffix of a time-sliced GPU and the ``-MIG-<profile>`` suffix of a MIG device name the GPU they
come from (``base_model``). What a Node has of it:

- ``whole``: physical GPUs, ``nvidia.com/gpu.count`` when GFD labels it, else the allocatable
  ``nvidia.com/gpu`` (a time-sliced node advertises replicas x GPUs there: divided by
  ``nvidia.com/gpu.replicas``);
- ``slices``: the allocatable of the time-sliced resources (``nvidia.com/gpu.shared``, and
  ``nvidia.com/gpu`` on a node whose product says ``-SHARED``);
- ``mig``: the allocatable MIG devices (``nvidia.com/mig-*``).

A lease's count is GPUs of its model, so what it is checked against is ``whole`` (in milli-GPU).
Overbooked: at some moment within ``HORIZON`` the counts of the model's leases open then add up
to more than the model's whole GPUs (fixed windows as they are; recurring windows by their
occurrences, at most ``OCCURRENCES`` of each, so a day lease and a night lease of the same GPUs
do not overlap).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from function.core.families import SHARED_SUFFIX, base_model
from function.core.leases import Lease, Phase, gpus, until
from function.core.quantity import QuantityError, parse_quantity
from function.core.schedule import Recurrence, ZoneTable, next_start, span_at, zone_of
from function.core.view import NODES, ClusterView, NodeRecord

HORIZON = timedelta(days=8)
"""How far ahead overlapping windows are looked for (a week of recurring windows, and a day)."""
OCCURRENCES = 48
"""At most this many occurrences of a recurring window are looked at (each costs a cron search):
a window that recurs more often than every 4 hours is checked over fewer than 8 days."""

COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
WHOLE_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"


class GpuNode(NamedTuple):
    """What the inventory keeps of a Node: its model and what it has of it."""

    name: str
    uid: str
    model: str
    """base_model of the model label ("" without one)."""
    whole: int
    """Physical GPUs, in milli-GPU."""
    slices: int
    mig: int


def _count(raw: Any) -> int:
    """A quantity as a whole number (0 when it is none)."""
    if not isinstance(raw, str):
        return 0
    try:
        value = parse_quantity(raw)
    except QuantityError:
        return 0
    return max(int(value), 0)


def gpu_node(node: Any, label: str) -> GpuNode | None:
    """What a Node (as the view keeps it: ``NodeRecord``) has of its model; None without the
    model label."""
    if not isinstance(node, NodeRecord):
        return None
    product = node.label(label)
    if not product:
        return None
    shared_product = product.endswith(SHARED_SUFFIX)
    replicas = max(_count(node.label(REPLICAS_LABEL)), 1)
    advertised = _count(node.allocatable_of(WHOLE_RESOURCE))
    shared = _count(node.allocatable_of(SHARED_RESOURCE))
    slices = shared + (advertised if shared_product else 0)
    flat = node.allocatable
    mig = sum(_count(flat[at + 1]) for at in range(0, len(flat), 2) if flat[at].startswith(MIG_PREFIX))
    counted = _count(node.label(COUNT_LABEL))
    if counted:
        whole = counted
    elif shared_product or replicas > 1:
        whole = (advertised + shared) // replicas
    else:
        whole = advertised
    return GpuNode(node.name, node.uid, base_model(product), whole * 1000, slices, mig)


def model_of(node: Any, label: str) -> str:
    """The base model a NodeRecord's label names ("" without one)."""
    product = node.label(label) if isinstance(node, NodeRecord) else None
    return base_model(product) if product else ""


@dataclass(frozen=True)
class Stock:
    """What the cluster has of one model."""

    model: str
    whole: int = 0
    """milli-GPU."""
    slices: int = 0
    mig: int = 0
    nodes: int = 0

    @property
    def offered(self) -> bool:
        """Some Node offers the model, whole, sliced or as MIG devices."""
        return self.whole > 0 or self.slices > 0 or self.mig > 0

    def describe(self) -> str:
        parts = [f"{gpus(self.whole)} GPU on {self.nodes} node(s)"]
        if self.slices:
            parts.append(f"{self.slices} slices")
        if self.mig:
            parts.append(f"{self.mig} MIG devices")
        return ", ".join(parts)


def stock_of(model: str, nodes: Iterable[Any]) -> Stock:
    """What ``nodes`` (GpuNodes) have of ``model``."""
    whole = slices = mig = count = 0
    for node in nodes:
        if isinstance(node, GpuNode) and node.model == model:
            whole, slices, mig, count = whole + node.whole, slices + node.slices, mig + node.mig, count + 1
    return Stock(model, whole, slices, mig, count)


POOL_SEPARATOR = "+"
"""Joins the models of a lease of several models (or a family) into one inventory key."""


def pool_stock(key: str, members: Iterable[Stock]) -> Stock:
    """What several models' stocks are together (a family's GPUs are the sum of its models')."""
    whole = slices = mig = nodes = 0
    for stock in members:
        whole, slices, mig, nodes = (
            whole + stock.whole,
            slices + stock.slices,
            mig + stock.mig,
            nodes + stock.nodes,
        )
    return Stock(key, whole, slices, mig, nodes)


def not_offered_message(model: str, label: str) -> str:
    """What a lease of ``model`` (a key of several models joined with POOL_SEPARATOR) is told
    when no Node offers it: its condition, Event and the warning at apply say the same."""
    return f"no node offers {model} (node label {label}): nothing can run on this lease"


def offered_any(models: Iterable[str], view: ClusterView, label: str) -> bool | None:
    """Whether some Node of ``view`` offers one of ``models`` (each read as ``base_model``; a
    lease of several models, or a family, runs on any of them, as the inventory holds it against
    their GPUs together); None when the view cannot tell (no Nodes watched, or not listed yet): a
    guess would warn about a model the cluster has. Walks the Nodes once (few next to Pods)."""
    if not view.available or not view.synced(NODES.index):
        return None
    wanted = {base_model(model) for model in models if model}
    if not wanted:
        return None
    found = [gpu_node(node, label) for node in view.index(NODES.index).values()]
    return any(stock_of(model, found).offered for model in wanted)


def stocks(nodes: Iterable[Any]) -> dict[str, Stock]:
    """Every model the Nodes offer."""
    by_model: dict[str, list[GpuNode]] = {}
    for node in nodes:
        if isinstance(node, GpuNode) and node.model:
            by_model.setdefault(node.model, []).append(node)
    return {model: stock_of(model, members) for model, members in by_model.items()}


@dataclass(frozen=True)
class Overlap:
    """The model's leases at the moment their counts add up most, when beyond the stock."""

    at: datetime
    total: int
    """milli-GPU the leases open at ``at`` hold together."""
    leases: tuple[str, ...]
    """Their keys (namespace/name), sorted."""
    involved: frozenset[str]
    """Every lease open at some moment the model is overbooked (``leases`` and the others)."""


def spans_of(lease: Lease, now: datetime, zones: Mapping[str, ZoneTable]) -> list[tuple[datetime, datetime]]:
    """When the lease holds its GPUs from ``now`` until ``now + HORIZON`` (none for a lease that
    ended, was deleted or is invalid)."""
    if lease.phase(now, zones) in (Phase.Expired, Phase.Released, Phase.Invalid) or lease.count <= 0:
        return []
    # A window already open keeps its real start, so what is said of it does not move with the clock.
    finish = now + HORIZON
    begin = lease.start or lease.created or now
    end = min(lease.end or finish, finish)
    if max(begin, now) >= end:
        return []
    if lease.recurrence is None:
        return [(begin, end)]
    zone = zone_of(zones, lease.recurrence.zone)
    if zone is None:
        return []
    found = _occurrences(lease.recurrence, zone, max(begin, now), end)
    return [(max(s, begin), min(e, end)) for s, e in found if s < end]


def _occurrences(
    recurrence: Recurrence, zone: ZoneTable, begin: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """The open spans from ``begin`` to ``end``, overlapping occurrences merged (a lease counts
    once while open), at most OCCURRENCES: one cron search per occurrence."""
    first = span_at(recurrence, zone, begin)
    spans: list[tuple[datetime, datetime]] = []
    cursor = begin
    if first.open and first.start is not None and first.end is not None:
        spans.append((first.start, first.end))
        cursor = first.end
    for _ in range(OCCURRENCES):
        start = next_start(recurrence.cron, zone, cursor)
        if start is None or start >= end:
            break
        finish = start + recurrence.duration
        if spans and start < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], finish))
        else:
            spans.append((start, finish))
        cursor = start
    return spans


def overbooked(
    leases: Iterable[Lease], stock: Stock, now: datetime, zones: Mapping[str, ZoneTable]
) -> Overlap | None:
    """The worst moment the model's leases hold more than ``stock`` (None: they never do). A
    model no node offers is not overbooked here: its leases are told the model is not offered."""
    if stock.whole <= 0:
        return None
    moments: list[tuple[datetime, int, str, int]] = []
    for lease in leases:
        for start, end in spans_of(lease, now, zones):
            if start < end:
                moments += [(start, 1, lease.key, lease.count), (end, 0, lease.key, lease.count)]
    moments.sort()  # ends (0) before starts (1) at one instant: back-to-back windows do not overlap
    open_now: dict[str, int] = {}
    worst: tuple[datetime, int, tuple[str, ...]] | None = None
    involved: set[str] = set()
    for at, starts, key, count in moments:
        if starts:
            open_now[key] = open_now.get(key, 0) + count
        else:
            open_now[key] -= count
            if open_now[key] <= 0:
                del open_now[key]
            continue
        total = sum(open_now.values())
        if total > stock.whole:
            involved.update(open_now)
            if worst is None or total > worst[1]:
                worst = (at, total, tuple(sorted(open_now)))
    if worst is None:
        return None
    return Overlap(worst[0], worst[1], worst[2], frozenset(involved))


def overlap_message(model: str, overlap: Overlap, stock: Stock) -> str:
    return (
        f"leases of {model} hold {gpus(overlap.total)} GPU together from {until(overlap.at)} "
        f"({', '.join(overlap.leases)}); the nodes offer {stock.describe()}"
    )
