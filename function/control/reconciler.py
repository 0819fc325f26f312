"""The reconciler protocol: how a control loop plugs into ``castslice control``.

Adding a reconciler is one module plus one line in ``function/control/reconcilers/__init__.py``.
The module declares a ``ReconcilerPlugin``::

    PLUGIN = ReconcilerPlugin(name="gpu-leases", build=build)

    def build(config: Config, api: Api, emit: Emit) -> Reconciler | None:
        return None if not config.section("gpuLeases").enabled else LeaseReconciler(api)

and its reconciler has four members (``Reconciler`` below):

- ``name``: stable, it labels the metrics (``castslice_control_reconcile_seconds{reconciler=...}``).
- ``watches``: the ``WatchSpec``s it reads (``function/core/view.py``). The process runs one
  list+watch per index for all reconcilers together and hands every reconcile the same kind of
  frozen ``ClusterView`` the webhook's mutators read; no reconciler lists or gets on its own.
- ``permissions``: what it *writes* (``Permission``: API group, resource, verbs). With the watches
  they are the controller's whole RBAC: ``control_rbac_rules`` derives the ClusterRole and
  ``tests/deploy/test_control_manifests.py`` holds the shipped manifests to it.
- ``triggers(index, record)``: the keys (strings, usually ``namespace/name``) a changed record
  makes due, for a record of one of its indices (called for the old and the new record of a change;
  quick and pure: no API call, it runs on a watch thread).
- ``keys(view)``: every key it is responsible for (called when leadership is gained, after a whole
  relist, and every ``resync_seconds``): level-triggered, a missed event is repaired here.
- ``reconcile(key, ctx)``: drive one key toward what it should be, from ``ctx.view`` (the
  current cluster) and ``ctx.now`` (the injected clock, so tests move time). Idempotent: it may run
  any number of times for the same state and must only write what differs. Returns a ``Requeue``
  (``after`` seconds: a timer, e.g. the next lease boundary) or ``DONE``; an exception is logged,
  counted (``castslice_control_reconcile_errors_total``) and retried with backoff.

Optional: ``register(registry)``, to put the reconciler's own metrics on the process's
``/metrics`` (called once, when the runner is built); ``forget_term()``, to drop whatever the
reconciler remembered during a term of leadership (called when the term ends: the next term, here
or in another process, starts from the objects, and a former leader exports no figure of its term).

Errors: an exception is retried with backoff, except a terminal one (``Terminal``, or an
``ApiError`` whose status a retry gets again: 400, 403, 405, 422, ...), which is logged and counted
and runs again only when what the reconciler reads changes, or at the resync. Writes go through the
``Api`` the reconciler was built with, which refuses (``TermEnded``) a write whose term has ended.

Only the leader reconciles; every replica keeps its watches running, so a new leader starts with
a warm view and does one full pass (``keys``) before anything else. No reconciler works before
the watches it declares have listed (the runner waits on the view's ``wait_synced`` for them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from function.core.view import ClusterView, Record, WatchSpec, rbac_rules

if TYPE_CHECKING:
    from function.audit.events import Event
    from function.core.config import Config
    from function.kube.client import Api
    from function.kube.elector import Term

Emit = Callable[["Event"], None]
"""Puts an event on the audit stream: the process's one recorder (``AuditRecorder.emit``), which
gives every event its id and time and counts it on the process's /metrics."""


@dataclass(frozen=True)
class Permission:
    """A write (or a read that is not a list+watch) a reconciler makes."""

    group: str
    resource: str
    """The plural, with a subresource after a slash: ``gpuleases/status``, ``pods/eviction``."""
    verbs: tuple[str, ...]


@dataclass(frozen=True)
class Requeue:
    after: float | None
    """Seconds until this key is reconciled again (a timer); None: only when a watch triggers it."""


DONE = Requeue(None)


@dataclass(frozen=True)
class Context:
    view: ClusterView
    """The cluster as the watches show it, frozen for this reconcile."""
    now: datetime
    """Wall-clock time (UTC, aware) from the runner's clock: inject it in tests."""
    term: Term | None = None
    """The term of leadership this reconcile runs in (None in tests that run it bare)."""


class Terminal(Exception):
    """A failure a retry cannot fix: the runner logs and counts it, and does not retry."""


class Reconciler(Protocol):
    name: str
    watches: tuple[WatchSpec, ...]
    permissions: tuple[Permission, ...]
    resync_seconds: float

    def triggers(self, index: str, record: Record) -> Iterable[str]: ...

    def keys(self, view: ClusterView) -> Iterable[str]: ...

    def reconcile(self, key: str, ctx: Context) -> Requeue: ...


@dataclass(frozen=True)
class ReconcilerPlugin:
    name: str
    build: Callable[[Config, Api, Emit], Reconciler | None]
    """(the configuration, the API writer, the audit stream) -> the reconciler, or None when it is
    disabled."""


LEADER_ELECTION = Permission("coordination.k8s.io", "leases", ("create", "get", "update"))
"""The controller's own Lease, in its own namespace (a Role, not the ClusterRole)."""


def control_rbac_rules(reconcilers: Sequence[Reconciler]) -> list[dict[str, list[str]]]:
    """The ClusterRole the reconcilers need: list+watch on what they watch plus what they write.

    Exact per resource: the verbs of each (group, resource) are gathered, and resources with the
    same verbs share a rule (merging by group alone would grant a watched resource the verbs of
    a written one). Sorted, so the manifests can be compared with it."""
    verbs_of: dict[tuple[str, str], set[str]] = {}
    for rule in rbac_rules(spec for reconciler in reconcilers for spec in reconciler.watches):
        for resource in rule["resources"]:
            verbs_of.setdefault((rule["apiGroups"][0], resource), set()).update(rule["verbs"])
    for reconciler in reconcilers:
        for permission in reconciler.permissions:
            verbs_of.setdefault((permission.group, permission.resource), set()).update(permission.verbs)
    return rules_of(verbs_of)


def rules_of(verbs_of: dict[tuple[str, str], set[str]]) -> list[dict[str, list[str]]]:
    """(group, resource) -> verbs as RBAC rules: one per group and verb set, everything sorted."""
    grouped: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for (group, resource), verbs in verbs_of.items():
        grouped.setdefault((group, tuple(sorted(verbs))), set()).add(resource)
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
        for (group, verbs), resources in sorted(grouped.items())
    ]
