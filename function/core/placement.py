"""Spot placement of a Pod, as pure edits of a plain Pod dict (shared by the spot and PodMutation mutators).

What the source systems write (REFERENCE.md, "Keys the source systems write" and "Spot placement"):
a spot Pod tolerates the spot taint and, when it must run on spot, selects the spot node label; an
on-demand Pod does not tolerate it and, where spot nodes carry no taint, is kept off them by a
required node affinity. Which label (and taint) marks a spot node depends on who makes the nodes:
``LabelScheme`` names it, with the built-in schemes of CAST AI, Karpenter, GKE, EKS and AKS.

Every function here edits only the parts of the Pod it names, leaves malformed parts it cannot
read alone (the apiserver judges those), and is idempotent: applied to its own output it changes
nothing, which is what ``reinvocationPolicy: IfNeeded`` needs.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

# Re-exported: the mutators write the keys the view reads back; the view defines them once.
from function.core.pod import Pod
from function.core.rules import label_key_problem, label_value_problem
from function.core.view import DECISION_ANNOTATION as DECISION_ANNOTATION
from function.core.view import PLACEMENT_LABEL as PLACEMENT_LABEL

SPOT: Final = "spot"
ON_DEMAND: Final = "on-demand"
Placement = Literal["spot", "on-demand"]
PLACEMENTS: Final[tuple[Placement, ...]] = (SPOT, ON_DEMAND)

SpotMode = Literal["only-spot", "optional-spot", "preferred-spot", "on-demand"]
SPOT_MODES: Final[tuple[SpotMode, ...]] = ("only-spot", "optional-spot", "preferred-spot", "on-demand")

PREFERRED_SPOT_WEIGHT: Final = 1
"""CAST AI's preferred spot is a preferred node affinity of weight 1 (REFERENCE.md)."""


@dataclass(frozen=True)
class LabelScheme:
    """How spot nodes are marked on a cluster.

    ``key``/``spot_value``: the node label a spot node carries. ``tainted``: spot nodes also carry a
    ``NoSchedule`` taint on ``key``, so a Pod without the toleration stays off them and an
    on-demand Pod needs no node affinity. ``label_only_on_spot``: only spot nodes carry the label at
    all, so ``key Exists`` selects spot (CAST AI's own preferred-spot term); otherwise the spot
    term is ``key In [spot_value]`` (Karpenter labels on-demand nodes with the same key).
    """

    name: str
    key: str
    spot_value: str
    tainted: bool
    label_only_on_spot: bool = False

    @property
    def toleration(self) -> dict[str, Any]:
        """The toleration added to spot Pods: ``key Exists`` tolerates the taint whatever its value."""
        return {"key": self.key, "operator": "Exists"}

    @property
    def spot_expression(self) -> dict[str, Any]:
        """A node selector requirement that matches spot nodes only."""
        if self.label_only_on_spot:
            return {"key": self.key, "operator": "Exists"}
        return {"key": self.key, "operator": "In", "values": [self.spot_value]}

    @property
    def not_spot_expression(self) -> dict[str, Any]:
        """A node selector requirement that matches every node but spot ones (unlabelled nodes too)."""
        return {"key": self.key, "operator": "NotIn", "values": [self.spot_value]}

    @property
    def preferred_spot_term(self) -> dict[str, Any]:
        return {"weight": PREFERRED_SPOT_WEIGHT, "preference": {"matchExpressions": [self.spot_expression]}}


CASTAI: Final = LabelScheme(
    "castai", "scheduling.cast.ai/spot", "true", tainted=True, label_only_on_spot=True
)
KARPENTER: Final = LabelScheme("karpenter", "karpenter.sh/capacity-type", "spot", tainted=False)
GKE: Final = LabelScheme("gke", "cloud.google.com/gke-spot", "true", tainted=False)
"""GKE's spot taint is optional, so on-demand Pods get the exclusion affinity to be safe."""
EKS: Final = LabelScheme("eks", "eks.amazonaws.com/capacityType", "SPOT", tainted=False)
AKS: Final = LabelScheme("aks", "kubernetes.azure.com/scalesetpriority", "spot", tainted=True)
BUILTIN_SCHEMES: Final[Mapping[str, LabelScheme]] = {s.name: s for s in (CASTAI, KARPENTER, GKE, EKS, AKS)}


def custom_scheme(key: str, spot_value: str, tainted: bool, label_only_on_spot: bool = False) -> LabelScheme:
    """A user's own scheme; ValueError naming the problem when the key or value is no valid label."""
    problem = label_key_problem(key)
    if problem:
        raise ValueError(f"{key!r} is not a valid node label key: {problem}")
    problem = label_value_problem(spot_value)
    if problem or not spot_value:
        raise ValueError(f"{spot_value!r} is not a valid node label value: {problem or 'it is empty'}")
    return LabelScheme("custom", key, spot_value, tainted=tainted, label_only_on_spot=label_only_on_spot)


# --- small, shape-tolerant accessors --------------------------------------------------------------


def _spec(pod: Pod) -> dict[str, Any] | None:
    spec = pod.get("spec")
    return spec if isinstance(spec, dict) else None


def _get_or_make(parent: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``parent[key]``, created as {} when absent or null; None when it holds something else
    (a malformed Pod part is the apiserver's to reject, not ours to overwrite)."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    return value if isinstance(value, dict) else None


def _tolerations(spec: dict[str, Any], create: bool) -> list[Any] | None:
    value = spec.get("tolerations")
    if value is None and create:
        value = spec["tolerations"] = []
    return value if isinstance(value, list) else None


def tolerates_spot(pod: Pod, scheme: LabelScheme) -> bool:
    """Whether the Pod already tolerates a ``NoSchedule`` taint on the scheme's key, whatever its
    value: a toleration of ``key Exists``, or one with no key and ``Exists`` (tolerates everything)."""
    spec = _spec(pod)
    tolerations = _tolerations(spec, create=False) if spec else None
    for toleration in tolerations or ():
        if not isinstance(toleration, dict) or toleration.get("effect") not in (None, "", "NoSchedule"):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, "", scheme.key):
            return True
    return False


def _add_spot_toleration(spec: dict[str, Any], pod: Pod, scheme: LabelScheme) -> bool:
    if tolerates_spot(pod, scheme):
        return False
    tolerations = _tolerations(spec, create=True)
    if tolerations is None:
        return False
    tolerations.append(scheme.toleration)
    return True


def _remove_spot_tolerations(spec: dict[str, Any], scheme: LabelScheme) -> bool:
    tolerations = _tolerations(spec, create=False)
    if not tolerations:
        return False
    kept = [t for t in tolerations if not (isinstance(t, dict) and t.get("key") == scheme.key)]
    if len(kept) == len(tolerations):
        return False
    if kept:
        spec["tolerations"] = kept
    else:
        del spec["tolerations"]
    return True


def _node_affinity(spec: dict[str, Any]) -> dict[str, Any] | None:
    """``spec.affinity.nodeAffinity``, created when absent; None when either is not a map."""
    affinity = _get_or_make(spec, "affinity")
    return _get_or_make(affinity, "nodeAffinity") if affinity is not None else None


def _is_empty_term(term: dict[str, Any]) -> bool:
    return not term.get("matchExpressions") and not term.get("matchFields")


def and_into_required_node_affinity(pod: Pod, expression: dict[str, Any]) -> bool:
    """AND a node selector requirement into the Pod's required node affinity; True if it changed.

    The terms of ``nodeSelectorTerms`` are ORed, so the requirement is appended to *every* term
    (appending a new term would widen placement). Terms that are empty match no node, and adding
    a requirement would make them match: they are left as they are. With no required affinity,
    one term holding just the requirement is created. A term that already holds the requirement is
    untouched, so a second call changes nothing. A malformed affinity (not maps/lists) is left
    alone and False returned.
    """
    spec = _spec(pod)
    if spec is None:
        return False
    node_affinity = _node_affinity(spec)
    if node_affinity is None:
        return False
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": [copy.deepcopy(expression)]}]
        }
        return True
    if not isinstance(required, dict) or not isinstance(required.get("nodeSelectorTerms"), list):
        return False
    changed = False
    for term in required["nodeSelectorTerms"]:
        if not isinstance(term, dict) or _is_empty_term(term):
            continue
        expressions = term.get("matchExpressions")
        if expressions is None:
            expressions = term["matchExpressions"] = []
        if not isinstance(expressions, list):
            continue
        if expression not in expressions:
            # A copy per term: terms must not share a values list (a later edit of one would edit all).
            expressions.append(copy.deepcopy(expression))
            changed = True
    return changed


def _drop_empty_affinity(spec: dict[str, Any]) -> None:
    """Remove the ``affinity``/``nodeAffinity`` maps this module created and left empty."""
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        if affinity.get("nodeAffinity") == {}:
            del affinity["nodeAffinity"]
        if affinity == {}:
            del spec["affinity"]


def _add_preferred_spot(spec: dict[str, Any], scheme: LabelScheme) -> bool:
    node_affinity = _node_affinity(spec)
    if node_affinity is None:
        return False
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    if preferred is None:
        preferred = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = []
    if not isinstance(preferred, list):
        _drop_empty_affinity(spec)
        return False
    if scheme.preferred_spot_term in preferred:
        return False
    preferred.append(scheme.preferred_spot_term)
    return True


def _remove_preferred_spot(spec: dict[str, Any], scheme: LabelScheme) -> bool:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    preferred = (
        node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, dict)
        else None
    )
    if not isinstance(preferred, list) or scheme.preferred_spot_term not in preferred:
        return False
    kept = [term for term in preferred if term != scheme.preferred_spot_term]
    assert isinstance(node_affinity, dict)
    if kept:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = kept
    else:
        del node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    _drop_empty_affinity(spec)
    return True


def _select_spot(spec: dict[str, Any], scheme: LabelScheme) -> bool:
    selector = _get_or_make(spec, "nodeSelector")
    if selector is None or selector.get(scheme.key) == scheme.spot_value:
        return False
    selector[scheme.key] = scheme.spot_value
    return True


def _unselect_spot(spec: dict[str, Any], scheme: LabelScheme) -> bool:
    selector = spec.get("nodeSelector")
    if not isinstance(selector, dict) or selector.get(scheme.key) != scheme.spot_value:
        return False
    del selector[scheme.key]
    if not selector:
        del spec["nodeSelector"]
    return True


def apply_spot_mode(pod: Pod, mode: SpotMode, scheme: LabelScheme) -> str | None:
    """Put the Pod into ``mode`` for ``scheme``; a short account of what changed, or None if nothing did.

    - ``only-spot``: the spot toleration (unless one already tolerates the taint) and
      ``nodeSelector[key] = spot_value``;
    - ``optional-spot``: the spot toleration only (the Pod may run on spot or on-demand);
    - ``preferred-spot``: the toleration and a preferred node affinity (weight 1) on the spot term;
    - ``on-demand``: tolerations on the spot key, a spot ``nodeSelector`` entry and the preferred
      spot term are removed; if the scheme does not taint spot nodes, or the Pod still tolerates
      every taint (a key-less ``Exists`` toleration), the required node affinity ``key NotIn
      [spot_value]`` is ANDed into every ``nodeSelectorTerms`` entry.

    The modes only add what they need: moving a Pod from one spot mode to another never removes
    what the previous one added, only ``on-demand`` removes spot marks. Idempotent: a second call
    with the same arguments returns None and changes nothing.
    """
    spec = _spec(pod)
    if spec is None:
        return None
    done: list[str] = []
    if mode == "on-demand":
        if _remove_spot_tolerations(spec, scheme):
            done.append(f"removed toleration {scheme.key}")
        if _unselect_spot(spec, scheme):
            done.append(f"removed nodeSelector {scheme.key}")
        if _remove_preferred_spot(spec, scheme):
            done.append("removed preferred spot affinity")
        if not scheme.tainted or tolerates_spot(pod, scheme):
            if and_into_required_node_affinity(pod, scheme.not_spot_expression):
                done.append(f"required affinity {scheme.key} NotIn [{scheme.spot_value}]")
            _drop_empty_affinity(spec)
    else:
        if _add_spot_toleration(spec, pod, scheme):
            done.append(f"toleration {scheme.key} Exists")
        if mode == "only-spot" and _select_spot(spec, scheme):
            done.append(f"nodeSelector {scheme.key}={scheme.spot_value}")
        if mode == "preferred-spot" and _add_preferred_spot(spec, scheme):
            done.append(f"preferred affinity {scheme.key} (weight {PREFERRED_SPOT_WEIGHT})")
    return ", ".join(done) or None


def placement_mode(placement: Placement) -> SpotMode:
    """The spot mode that enforces a placement: spot Pods must run on spot (CAST AI's spot-only)."""
    return "only-spot" if placement == SPOT else "on-demand"


# --- the placement a Pod carries -----------------------------------------------------------------


def placement_of(pod: Pod) -> Placement | None:
    """The placement the Pod already carries in ``PLACEMENT_LABEL``, or None (absent or not a placement)."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    value = labels.get(PLACEMENT_LABEL) if isinstance(labels, dict) else None
    return SPOT if value == SPOT else ON_DEMAND if value == ON_DEMAND else None


# --- the partial split ----------------------------------------------------------------------------


LEDGER_INDEX: Final = "spot-ledger"
"""The edge's recent decisions (``function/serve/spot_ledger.py``), by owner uid, handed in with the
view: spot placement and PodMutation distribution count them until the view shows their Pods."""


@dataclass(frozen=True)
class LedgerEntry:
    """One of this process's own recent decisions: its ``castops.io/placement-decision`` (the
    admission uid), the placement it gave (None: none, a group only) and the PodMutation
    distribution group (``castops.io/pod-mutation-group``; "" for none)."""

    decision: str
    placement: Placement | None
    group: str = ""


def pending_entries(view: Any, owner_uid: str, seen: set[str]) -> list[LedgerEntry]:
    """The ledger's entries for ``owner_uid`` whose decision no Pod in the view carries (``seen``)."""
    ledger = view.index(LEDGER_INDEX).get(owner_uid)
    if not isinstance(ledger, tuple | list):
        return []
    return [e for e in ledger if isinstance(e, LedgerEntry) and e.decision not in seen]


@dataclass(frozen=True)
class SiblingCounts:
    """Live (not terminating, not finished) Pods of one controller, by placement, *excluding* the Pod
    being admitted. ``unplaced`` are siblings without a placement label (created before the
    webhook, or ignored): they count towards the total but towards neither side."""

    spot: int = 0
    on_demand: int = 0
    unplaced: int = 0

    @property
    def total_with_new(self) -> int:
        """n: the siblings plus the Pod being admitted."""
        return self.spot + self.on_demand + self.unplaced + 1

    def __str__(self) -> str:
        return f"{self.spot} spot, {self.on_demand} on-demand, {self.unplaced} unplaced"


def spot_target(counts: SiblingCounts, percentage: int) -> int:
    """floor(n x p / 100), the number of spot Pods a controller of n Pods keeps (integer arithmetic)."""
    return counts.total_with_new * percentage // 100


def partial_split(counts: SiblingCounts, percentage: int) -> Placement:
    """Spot while the siblings on spot are fewer than floor(n x p / 100), else on-demand.

    Guarantee: if every Pod of a controller is admitted through this rule with exact counts, the
    spot Pods never exceed floor(n x p / 100) for the n live Pods at any time (a Pod going spot
    means spot < floor(n x p / 100) before it, so spot + 1 <= floor(n x p / 100) after), and after
    sequential scale-up from 0 they are exactly that. A single Pod at 100 % is n = 1 -> floor(1)
    = 1 spot; at 99 % or less a single Pod goes on-demand. ``percentage`` outside 0-100 is clamped.
    """
    bounded = min(max(percentage, 0), 100)
    return SPOT if counts.spot < spot_target(counts, bounded) else ON_DEMAND


def hash_split(key: str, percentage: int) -> Placement:
    """The fallback when no sibling counts can be trusted: spot iff a stable hash of ``key`` (e.g.
    the admission request uid) falls in the lowest ``percentage`` of 0-9999 (basis points, so 40 %
    is 4000 of 10000). Deterministic for a key, uniform over keys, so over many Pods the spot share
    approaches ``percentage``; for a handful of Pods it can deviate either way (no floor guarantee)."""
    bounded = min(max(percentage, 0), 100)
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 10_000
    return SPOT if bucket < bounded * 100 else ON_DEMAND
