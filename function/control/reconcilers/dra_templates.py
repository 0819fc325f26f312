"""``dra-templates``: the dra backend's ResourceClaimTemplates, kept present in every GPU namespace
(``gpuSlicing.backend: dra`` with ``dra.templates: managed``).

One key per namespace. What to do is decided by ``function.core.dra.plan`` (pure, from the view and
the clock): create what is missing; of the templates this controller owns
(``app.kubernetes.io/managed-by: castslice``) that the configuration no longer names, mark them
stale and delete them ``staleTemplateSeconds`` later. Any other template is never touched. The
names are the webhook's (the same pure function), so a Pod admitted now finds its template.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from function.control.reconciler import DONE, Context, Emit, Permission, ReconcilerPlugin, Requeue
from function.core.dra import (
    API_GROUP,
    API_VERSION,
    GPU_NAMESPACES,
    GPU_NAMESPACES_INDEX,
    STALE_SINCE_ANNOTATION,
    TEMPLATES,
    TEMPLATES_INDEX,
    Action,
    DraConfig,
    NamespaceState,
    TemplateRecord,
    plan,
)
from function.core.view import ClusterView, Record, WatchSpec
from function.kube.client import MERGE_PATCH, Api, ApiError, collection_path, object_path

if TYPE_CHECKING:
    from function.core.config import Config

log = logging.getLogger("castslice.control.dra")

NAME = "dra-templates"
PLURAL = "resourceclaimtemplates"
RESYNC_SECONDS = 300.0


class TemplateReconciler:
    name = NAME
    watches: tuple[WatchSpec, ...] = (GPU_NAMESPACES, TEMPLATES)
    permissions: tuple[Permission, ...] = (Permission(API_GROUP, PLURAL, ("create", "delete", "patch")),)
    resync_seconds = RESYNC_SECONDS

    def __init__(self, config: DraConfig, excluded: Iterable[str], api: Api) -> None:
        self.config = config
        self.excluded = frozenset(excluded)
        self.api = api
        self._actions: Counter | None = None

    def register(self, registry: CollectorRegistry) -> None:
        self._actions = Counter(
            "castslice_control_dra_template_actions",
            "Changes made to ResourceClaimTemplates, by action (create, mark, unmark, delete).",
            ["action"],
            registry=registry,
        )
        for verb in ("create", "mark", "unmark", "delete"):
            self._actions.labels(verb)

    def triggers(self, index: str, record: Record) -> Iterable[str]:
        if index == GPU_NAMESPACES_INDEX and isinstance(record, NamespaceState):
            return (record.name,)
        if index == TEMPLATES_INDEX and isinstance(record, TemplateRecord):
            return (record.namespace,)
        return ()

    def keys(self, view: ClusterView) -> Iterable[str]:
        """Every namespace, and every namespace holding a template of ours (to clean up)."""
        names = {r.name for r in view.index(GPU_NAMESPACES_INDEX).values() if isinstance(r, NamespaceState)}
        names |= {
            r.namespace
            for r in view.index(TEMPLATES_INDEX).values()
            if isinstance(r, TemplateRecord) and r.managed
        }
        return sorted(names)

    def reconcile(self, key: str, ctx: Context) -> Requeue:
        state = ctx.view.index(GPU_NAMESPACES_INDEX).get(key)
        if not isinstance(state, NamespaceState):
            return DONE  # the namespace is gone, and its templates with it
        existing = [r for r in ctx.view.group(TEMPLATES_INDEX, key).values() if isinstance(r, TemplateRecord)]
        result = plan(self.config, self.excluded, [state], existing, ctx.now.timestamp())
        for action in result.actions:
            self._apply(action)
        return Requeue(result.recheck_after) if result.recheck_after is not None else DONE

    def _apply(self, action: Action) -> None:
        """One change; what the view has not caught up with yet (already there, already gone) is
        no error."""
        path = object_path(API_GROUP, API_VERSION, PLURAL, action.namespace, action.name)
        if action.verb == "create":
            body: Any = action.manifest
            response = self.api.request(
                "POST", collection_path(API_GROUP, API_VERSION, PLURAL, action.namespace), body=body
            )
            fine = response.ok or response.status == 409
        elif action.verb in ("mark", "unmark"):
            value = action.stamp if action.verb == "mark" else None
            patch = {"metadata": {"annotations": {STALE_SINCE_ANNOTATION: value}}}
            response = self.api.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
            fine = response.ok or response.status == 404
        else:
            response = self.api.request("DELETE", path)
            fine = response.ok or response.status == 404
        if not fine:
            raise ApiError(action.describe(), response)
        if response.ok:
            log.info("%s: %s", NAME, action.describe())
            if self._actions is not None:
                self._actions.labels(action.verb).inc()


def build(config: Config, api: Api, emit: Emit) -> TemplateReconciler | None:
    section = config.section("gpuSlicing")
    if not section.enabled or section.backend != "dra" or section.dra.templates != "managed":
        return None
    return TemplateReconciler(section.dra, config.excludedNamespaces, api)


PLUGIN = ReconcilerPlugin(name=NAME, build=build)
