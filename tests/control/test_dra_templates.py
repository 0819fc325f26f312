"""The dra-templates reconciler over a static view, an injected clock and a fake apiserver: a new GPU
namespace gets every template, a configuration change marks the old ones and deletes them after the
grace, templates it does not own are never touched, and what the view has not caught up with (a
409 on create, a 404 on delete) is no error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from function.control.process import build_reconcilers
from function.control.reconciler import DONE, Context, Requeue, control_rbac_rules
from function.control.reconcilers.dra_templates import TemplateReconciler
from function.core.config import parse_config
from function.core.dra import (
    GPU_NAMESPACES,
    MANAGED_BY_LABEL,
    STALE_SINCE_ANNOTATION,
    TEMPLATES,
    DraConfig,
    slim_namespace_state,
    slim_template,
    templates,
)
from function.core.view import StaticView
from function.kube.client import MERGE_PATCH, ApiError, ApiResponse
from tests.support.fake_api import FakeApi

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
OLD = DraConfig()
NEW = DraConfig(deviceClassName="gpu.example.com")
COLLECTION = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates"


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}}


def template_obj(ns: str, name: str, managed: bool = True, stale: str = "") -> dict[str, Any]:
    labels = {MANAGED_BY_LABEL: "castslice"} if managed else {}
    annotations = {STALE_SINCE_ANNOTATION: stale} if stale else {}
    return {"metadata": {"namespace": ns, "name": name, "labels": labels, "annotations": annotations}}


def view(namespaces: list[dict[str, Any]], objects: list[dict[str, Any]]) -> StaticView:
    return StaticView(
        {
            "gpu-namespaces": {n["metadata"]["name"]: slim_namespace_state(n) for n in namespaces},
            "resourceclaimtemplates": {
                f"{o['metadata']['namespace']}/{o['metadata']['name']}": slim_template(o) for o in objects
            },
        },
        specs=(GPU_NAMESPACES, TEMPLATES),
    )


def accepting(api: FakeApi, method: str, path: str, status: int = 200) -> None:
    api.handlers[(method, path)] = lambda body, query: ApiResponse(status, {})


def reconciler(config: DraConfig = OLD, api: FakeApi | None = None) -> TemplateReconciler:
    return TemplateReconciler(config, ["kube-system"], api or FakeApi())


def test_a_new_gpu_namespace_gets_every_template_as_the_controllers_own() -> None:
    api = FakeApi()
    result = reconciler(api=api).reconcile("ml", Context(view([namespace("ml")], []), NOW))
    assert result == DONE
    posted = [(m, p, b) for m, p, b, _ in api.requests]
    assert [(m, p) for m, p, _ in posted] == [("POST", COLLECTION.format("ml"))] * 8
    assert [b["metadata"]["name"] for _, _, b in posted] == [t.name for t in templates(OLD)]
    assert all(b["metadata"]["labels"][MANAGED_BY_LABEL] == "castslice" for _, _, b in posted)
    # Present now: nothing more to do.
    present = [template_obj("ml", t.name) for t in templates(OLD)]
    again = FakeApi()
    reconciler(api=again).reconcile("ml", Context(view([namespace("ml")], present), NOW))
    assert again.requests == []


def test_a_template_created_meanwhile_is_no_error() -> None:
    api = FakeApi()
    for t in templates(OLD)[:3]:
        api.objects[f"{COLLECTION.format('ml')}/{t.name}"] = template_obj("ml", t.name, managed=False)
    reconciler(api=api).reconcile("ml", Context(view([namespace("ml")], []), NOW))
    assert len(api.requests) == 8


def test_excluded_and_vanished_namespaces_get_nothing() -> None:
    api = FakeApi()
    reconcile = reconciler(api=api).reconcile
    assert reconcile("kube-system", Context(view([namespace("kube-system")], []), NOW)) == DONE
    assert reconcile("gone", Context(view([], [template_obj("gone", "castslice-gpu-1-x")]), NOW)) == DONE
    assert api.requests == []


def test_a_configuration_change_marks_the_old_templates_then_deletes_them_after_the_grace() -> None:
    old = [template_obj("ml", t.name) for t in templates(OLD)]
    new = [template_obj("ml", t.name) for t in templates(NEW)]
    api = FakeApi()
    for t in templates(OLD):
        accepting(api, "PATCH", f"{COLLECTION.format('ml')}/{t.name}")
    result = reconciler(NEW, api).reconcile("ml", Context(view([namespace("ml")], old), NOW))
    assert result == Requeue(300.0)
    methods = [(m, c) for m, _, _, c in api.requests]
    assert methods[:8] == [("POST", "application/json")] * 8
    assert methods[8:] == [("PATCH", MERGE_PATCH)] * 8
    assert api.requests[8][2] == {
        "metadata": {"annotations": {STALE_SINCE_ANNOTATION: str(int(NOW.timestamp()))}}
    }

    marked = [template_obj("ml", t.name, stale=str(int(NOW.timestamp()))) for t in templates(OLD)]
    later = FakeApi()
    for t in templates(OLD):
        accepting(later, "DELETE", f"{COLLECTION.format('ml')}/{t.name}")
    early = reconciler(NEW, later).reconcile(
        "ml", Context(view([namespace("ml")], new + marked), NOW + timedelta(seconds=100))
    )
    assert early == Requeue(200.0)
    assert later.requests == []
    done = reconciler(NEW, later).reconcile(
        "ml", Context(view([namespace("ml")], new + marked), NOW + timedelta(seconds=300))
    )
    assert done == DONE
    assert sorted(p for m, p, _, _ in later.requests if m == "DELETE") == sorted(
        f"{COLLECTION.format('ml')}/{t.name}" for t in templates(OLD)
    )


def test_templates_it_does_not_own_are_never_touched() -> None:
    foreign = [template_obj("ml", t.name, managed=False) for t in templates(OLD)]
    foreign.append(template_obj("ml", "castslice-gpu-3-deadbeef", managed=False))
    api = FakeApi()
    reconciler(NEW, api).reconcile("ml", Context(view([namespace("ml")], foreign), NOW))
    assert {m for m, _, _, _ in api.requests} == {"POST"}
    assert {b["metadata"]["name"] for _, _, b, _ in api.requests} == {t.name for t in templates(NEW)}


def test_a_refused_write_raises_for_the_runner_to_retry() -> None:
    api = FakeApi()
    api.handlers[("POST", COLLECTION.format("ml"))] = lambda body, query: ApiResponse(
        403, {"message": "forbidden"}
    )
    with pytest.raises(
        ApiError, match=r"create ResourceClaimTemplate ml/castslice-gpu-1-.*: HTTP 403: forbidden"
    ):
        reconciler(api=api).reconcile("ml", Context(view([namespace("ml")], []), NOW))


def test_gone_already_is_no_error_for_a_delete() -> None:
    stale = [template_obj("ml", t.name, stale="1") for t in templates(OLD)]
    api = FakeApi()
    for t in templates(OLD):
        accepting(api, "DELETE", f"{COLLECTION.format('ml')}/{t.name}", 404)
    reconciler(NEW, api).reconcile("ml", Context(view([namespace("ml")], [*stale]), NOW))


def test_triggers_and_keys_are_namespaces() -> None:
    subject = reconciler()
    assert list(subject.triggers("gpu-namespaces", slim_namespace_state(namespace("ml")))) == ["ml"]
    assert list(subject.triggers("resourceclaimtemplates", slim_template(template_obj("web", "t")))) == [
        "web"
    ]
    assert list(subject.triggers("pods", object())) == []
    current = view([namespace("ml")], [template_obj("old", "t"), template_obj("theirs", "t", managed=False)])
    assert list(subject.keys(current)) == ["ml", "old"]


def test_it_runs_only_for_managed_templates_of_the_dra_backend_and_declares_its_rbac() -> None:
    def built_templates(config: dict[str, Any]) -> list[Any]:
        # Other reconcilers (drift, on by default) may run beside it.
        return [r for r in build_reconcilers(parse_config(config), FakeApi()) if r.name == "dra-templates"]

    assert built_templates({}) == []
    external = {"gpuSlicing": {"backend": "dra", "dra": {"templates": "external"}}}
    assert built_templates(external) == []
    (built,) = built_templates({"gpuSlicing": {"backend": "dra"}})
    assert built.name == "dra-templates"
    assert control_rbac_rules([built]) == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates"],
            "verbs": ["create", "delete", "list", "patch", "watch"],
        },
    ]


def test_its_actions_are_counted() -> None:
    registry = CollectorRegistry()
    subject = reconciler()
    subject.register(registry)
    subject.reconcile("ml", Context(view([namespace("ml")], []), NOW))
    text = generate_latest(registry).decode()
    assert 'castslice_control_dra_template_actions_total{action="create"} 8.0' in text
    assert 'castslice_control_dra_template_actions_total{action="delete"} 0.0' in text
