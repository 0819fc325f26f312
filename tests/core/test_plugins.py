"""The plug-in seams: registry, per-mutator configuration, declared conflicts, shadow mode,
the typed wire response and the shared Pod helpers."""

from __future__ import annotations

import ast
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from function.admission.wire import allowed, denied, patched
from function.core.config import Config, ConfigError, parse_config
from function.core.configtypes import MutatorConfig
from function.core.engine import Engine, build_mutators
from function.core.mutators import PLUGINS
from function.core.mutators.base import Action, MutatorResult, RequestContext
from function.core.mutators.registry import Claims, MutatorPlugin, Neighbours, OwnedResource, Rename, conflict
from function.core.pod import (
    WARNING_LIMIT,
    Owner,
    asked_resources,
    cap_warning,
    container_label,
    ensure_map,
    iter_containers,
    resource_sections,
    set_resource,
)
from function.core.view import EMPTY_VIEW, PodRecord, StaticView

ROOT = Path(__file__).resolve().parents[2]
OPTED_IN_GPU_POD: dict[str, Any] = {
    "kind": "Pod",
    "metadata": {"annotations": {"castops.io/optimize": "true"}},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


# -- the registry ----------------------------------------------------------------------------------
def test_plugins_are_ordered_and_each_has_its_own_config_section() -> None:
    assert [p.name for p in PLUGINS] == ["gpu-slicing", "vgpu", "pod-mutations", "gpu-leases", "spot"]
    assert [p.order for p in PLUGINS] == sorted(p.order for p in PLUGINS)
    config = Config()
    for plugin in PLUGINS:
        section = config.section(plugin.config_key)
        assert type(section) is plugin.config_model and isinstance(section, MutatorConfig)
        assert section.mode == "enforce"


def test_the_engine_and_the_config_import_no_concrete_mutator() -> None:
    for module in ("core/engine.py", "core/config.py", "admission/review.py"):
        tree = ast.parse((ROOT / "function" / module).read_text())
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & {"function.core.mutators.gpu_slicing", "function.core.mutators.vgpu"}, module


def test_a_mutator_section_refuses_unknown_keys_and_bad_modes() -> None:
    with pytest.raises(ConfigError, match=r"gpuSlicing\.mode"):
        parse_config({"gpuSlicing": {"mode": "dry"}})
    with pytest.raises(ConfigError, match=r"vgpu\.schedulername: unknown key"):
        parse_config({"vgpu": {"schedulername": "x"}})


# -- conflicts declared by each mutator ---------------------------------------------------------------
class _Stub:
    name = "stub"


def _plugin(name: str) -> MutatorPlugin:
    return MutatorPlugin(name, 1, name, MutatorConfig, lambda *_: _Stub())  # type: ignore[arg-type, return-value]


RENAMER = Claims(renames=(Rename("x.io/gpu", "x.io/slice", "a.source", "a.target"),))


@pytest.mark.parametrize(
    ("owned", "problem"),
    [
        (OwnedResource("x.io/slice", "b.slice"), "a.target 'x.io/slice' is also b.slice"),
        (OwnedResource("x.io/gpu", "b.gpu"), "a.source 'x.io/gpu' is also b.gpu"),
        (OwnedResource("x.io/gpu", "b.count", is_count=True), None),
        (OwnedResource("x.io/slice", "b.count", is_count=True), "a.target 'x.io/slice' is also b.count"),
        (OwnedResource("x.io/other", "b.other"), None),
    ],
)
def test_a_renamer_may_read_another_mutators_count_and_nothing_else_it_owns(
    owned: OwnedResource, problem: str | None
) -> None:
    found = conflict(_plugin("a"), RENAMER, [(_plugin("b"), Claims(owns=(owned,)))])
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem) and "must not use a resource of b" in found


def test_neighbours_answer_renames_and_qualifiers() -> None:
    owns = Claims(
        owns=(
            OwnedResource("x.io/gpu", "c", is_count=True),
            OwnedResource("x.io/mem", "m", needs_count="x.io/gpu"),
            OwnedResource("x.io/prio", "p"),
        )
    )
    neighbours = Neighbours((RENAMER, owns))
    assert neighbours.renamed() == {"x.io/gpu": "x.io/slice"}
    assert neighbours.qualifiers_of("x.io/gpu") == ("x.io/mem",)
    assert Neighbours().renamed() == {} and Neighbours().qualifiers_of("x.io/gpu") == ()


def test_conflicts_are_checked_between_enabled_mutators_only() -> None:
    clash = {"gpuSlicing": {"targetResource": "nvidia.com/gpumem"}}
    assert parse_config(clash).section("gpuSlicing").targetResource == "nvidia.com/gpumem"
    with pytest.raises(ConfigError, match=r"gpuSlicing\.targetResource 'nvidia\.com/gpumem' is also vgpu"):
        parse_config({**clash, "vgpu": {"enabled": True}})
    # A shadow neighbour still counts: switching it to enforce must not change the other's behaviour.
    with pytest.raises(ConfigError, match="is also vgpu"):
        parse_config({**clash, "vgpu": {"enabled": True, "mode": "shadow"}})


# -- shadow mode ------------------------------------------------------------------------------------------
def test_a_shadow_mutator_is_audited_but_sends_nothing() -> None:
    config = parse_config({"gpuSlicing": {"mode": "shadow"}})
    engine = Engine(config)
    assert engine.mutators == [] and [m.name for m in engine.shadow] == ["gpu-slicing"]
    decision = engine.decide(OPTED_IN_GPU_POD, RequestContext(uid="u"))
    assert decision.outcome == "unchanged" and decision.allowed and not decision.patch
    assert decision.acting_mutators == ()
    (shadowed,) = decision.decisions
    assert shadowed.shadow and shadowed.action is Action.mutated
    assert "nvidia.com/gpu -> nvidia.com/gpu-shared" in shadowed.reason
    assert shadowed.as_dict()["shadow"] is True
    assert decision.reason == "no mutator enforcing"


def test_a_shadow_denial_denies_nothing_and_its_warnings_stay_in_the_audit() -> None:
    bad = {
        **OPTED_IN_GPU_POD,
        "metadata": {"annotations": {"castops.io/optimize": "true", "castops.io/slice-ratio": "0"}},
    }
    config = parse_config({"gpuSlicing": {"mode": "shadow"}})
    decision = Engine(config).decide(bad, RequestContext(uid="u"))
    assert decision.allowed and decision.outcome == "unchanged" and decision.denial is None
    assert decision.decisions[0].action is Action.denied and decision.decisions[0].shadow
    assert decision.warnings == ()


def test_shadow_runs_on_what_the_enforcing_mutators_produced() -> None:
    seen: list[dict[str, Any]] = []

    class Watcher:
        name = "watcher"

        def mutate(self, pod: dict[str, Any], ctx: RequestContext) -> MutatorResult:
            seen.append(json.loads(json.dumps(pod)))
            pod.setdefault("metadata", {})["labels"] = {"shadowed": "yes"}
            return MutatorResult.mutated("labelled")

    decision = Engine(Config(), shadow=[Watcher()]).decide(OPTED_IN_GPU_POD, RequestContext(uid="u"))
    assert decision.outcome == "mutated" and decision.acting_mutators == ("gpu-slicing",)
    assert seen[0]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu-shared": "1"}
    assert all("shadowed" not in json.dumps(op) for op in decision.patch)
    assert [d.shadow for d in decision.decisions] == [False, True]


def test_a_lying_shadow_mutator_is_still_caught() -> None:
    class Liar:
        name = "liar"

        def mutate(self, pod: dict[str, Any], ctx: RequestContext) -> MutatorResult:
            pod["spec"]["nodeName"] = "x"
            return MutatorResult.unchanged("nothing")

    decision = Engine(Config(), shadow=[Liar()]).decide(OPTED_IN_GPU_POD, RequestContext(uid="u"))
    assert decision.outcome == "error" and "MutatorLied" in decision.reason


def test_build_mutators_splits_by_mode() -> None:
    config = parse_config({"vgpu": {"enabled": True, "mode": "shadow"}})
    assert [m.name for m in build_mutators(config)] == ["gpu-slicing"]
    assert [m.name for m in Engine(config).shadow] == ["vgpu"]


# -- the request context carries one cluster snapshot ----------------------------------------------------
def test_request_context_defaults_to_no_cluster_view() -> None:
    assert RequestContext().cluster is EMPTY_VIEW
    assert not EMPTY_VIEW.available and len(EMPTY_VIEW.index("pods")) == 0 and not EMPTY_VIEW.synced("pods")
    # issue-spot's StaticView: records with a uid, grouped as the spec says (merged on issue-place)
    record = PodRecord("ns", "p1", "u1", Owner("rs-1", "ReplicaSet", "rs"), "spot", False)
    view = StaticView({"pods": [record]})
    assert view.available and view.synced("pods") and not view.synced("replicasets")
    assert view.index("pods")["u1"] == record
    with pytest.raises(TypeError):
        view.index("pods")["u2"] = record  # type: ignore[index]


# -- the typed response ----------------------------------------------------------------------------------
def test_named_response_constructors_serialize_as_the_apiserver_expects() -> None:
    long = "w" * 200
    envelope = patched(
        "u", [{"op": "add", "path": "/x", "value": 1}], (long,), {"outcome": "mutated"}
    ).review("admission.k8s.io/v1beta1")
    assert envelope["apiVersion"] == "admission.k8s.io/v1beta1" and envelope["kind"] == "AdmissionReview"
    response = envelope["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [{"op": "add", "path": "/x", "value": 1}]
    assert response["warnings"] == ["w" * WARNING_LIMIT]
    assert response["auditAnnotations"] == {"outcome": "mutated"}
    assert allowed("u").as_dict() == {"uid": "u", "allowed": True}
    assert denied("u", "no").as_dict() == {
        "uid": "u",
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "no"},
    }


# -- shared Pod helpers -----------------------------------------------------------------------------------
def test_set_resource_writes_limits_and_requests_together() -> None:
    container: dict[str, Any] = {"name": "c", "resources": {"limits": None, "requests": {"cpu": "1"}}}
    set_resource(container, "x.io/gpu", "2")
    assert container["resources"] == {"limits": {"x.io/gpu": "2"}, "requests": {"cpu": "1", "x.io/gpu": "2"}}
    assert asked_resources(container) == {"cpu", "x.io/gpu"}
    assert resource_sections({"resources": ["odd"]}) == []
    bare: dict[str, Any] = {}
    set_resource(bare, "x.io/gpu", "1")
    assert bare == {"resources": {"limits": {"x.io/gpu": "1"}, "requests": {"x.io/gpu": "1"}}}


def test_iter_containers_skips_odd_shapes_and_labels_containers() -> None:
    pod = {
        "spec": {"initContainers": [{"name": "i"}, "junk"], "containers": [{}], "ephemeralContainers": None}
    }
    found = [(kind, index) for kind, index, _ in iter_containers(pod)]
    assert found == [("initContainers", 0), ("containers", 0)]
    assert [kind for kind, _, _ in iter_containers(pod, ("containers",))] == ["containers"]
    assert container_label("containers", 3, {"name": "web"}) == "containers/web"
    assert container_label("containers", 3, {}) == "containers/3"
    assert list(iter_containers({"spec": []})) == []


def test_ensure_map_and_cap_warning() -> None:
    parent: dict[str, Any] = {"a": None}
    ensure_map(parent, "a")["b"] = 1
    assert parent == {"a": {"b": 1}}
    kept = {"k": 1}
    assert ensure_map({"m": kept}, "m") is kept
    assert cap_warning("x" * 121) == "x" * 120 and cap_warning("short") == "short"
