"""Where the Pods are: the table of known kinds, the general walk, and the way back to the document."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
import yaml

from function.offline.discovery import (
    KNOWN_KINDS,
    KSERVE,
    WALK_DEPTH,
    PodSite,
    Unmappable,
    api_group,
    dotted,
    expand,
    find_pods,
    get_path,
    known_paths,
    parse_pointer,
    pointer,
    walk_templates,
)
from tests.support import ROOT

GOLDEN = ROOT / "tests" / "golden"


def golden_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(GOLDEN.rglob("*.yaml")) + sorted(GOLDEN.rglob("*.json")):
        if path.name != "input.yaml" and "input" not in path.relative_to(GOLDEN).parts:
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "List":
                objects.extend(item for item in document.get("items", []) if isinstance(item, dict))
            elif isinstance(document, dict):
                objects.append(document)
    return objects


OBJECTS = golden_objects()


def test_every_known_kind_has_a_golden_case() -> None:
    seen = {(api_group(o), o.get("kind")) for o in OBJECTS}
    # MXJob is in the table for completeness (training-operator still serves it); Configuration
    # is in the rollout-knative case.
    missing = set(KNOWN_KINDS) - seen - {("kubeflow.org", "MXJob")}
    assert not missing, f"known kinds without a golden case: {sorted(missing)}"
    assert KSERVE in seen


@pytest.mark.parametrize(
    "document",
    [o for o in OBJECTS if (api_group(o), o.get("kind")) in KNOWN_KINDS and find_pods(o)],
    ids=lambda o: f"{o['kind']}/{o['metadata'].get('name')}",
)
def test_the_walk_finds_what_the_table_finds(document: dict[str, Any]) -> None:
    """The table is the authority for known kinds; the walk must agree with it on every case, or
    the table misses a template (or the walk would misfire on unknown kinds)."""
    table = [site.path for site in find_pods(document)]
    assert walk_templates(document) == table


def test_pod_is_its_own_site_and_core_service_is_not_knative() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    assert find_pods(pod) == [PodSite((), "pod")]
    service = {"apiVersion": "v1", "kind": "Service", "spec": {"template": {"spec": {"containers": []}}}}
    # A core Service is unknown to the table and the walk would find this odd shape: reported as
    # found by the walk, never as a known kind.
    assert [s.found_by for s in find_pods(service)] == ["walk"]
    knative = {**service, "apiVersion": "serving.knative.dev/v1"}
    assert [s.found_by for s in find_pods(knative)] == ["kind"]


def test_a_built_in_kind_without_apiversion_is_still_recognised() -> None:
    snippet = {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}
    assert [(s.path, s.found_by) for s in find_pods(snippet)] == [(("spec", "template"), "kind")]
    custom = {"kind": "RayCluster", "spec": {"headGroupSpec": {"template": {"spec": {"containers": []}}}}}
    assert [s.found_by for s in find_pods(custom)] == ["walk"]


def test_a_known_kind_without_its_template_has_no_site() -> None:
    rollout = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "spec": {"workloadRef": {}}}
    assert find_pods(rollout) == []
    half = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"metadata": {}}}}
    assert find_pods(half) == []


def test_the_walk_needs_the_pod_template_shape() -> None:
    document = {
        "kind": "Thing",
        "spec": {
            "template": {"owner": "x", "spec": {"containers": []}},  # a third key: not a PodTemplateSpec
            "other": {"spec": {"containers": "not a list"}},
            "ok": [{"metadata": {}, "spec": {"containers": []}}],
            "nested": {"template": {"spec": {"containers": [], "template": {"spec": {"containers": []}}}}},
        },
        "status": {"template": {"spec": {"containers": []}}},  # only under spec
    }
    assert walk_templates(document) == [("spec", "ok", 0), ("spec", "nested", "template")]


def test_the_walk_stops_at_its_depth() -> None:
    node: dict[str, Any] = {"spec": {"containers": []}}
    for _ in range(30):
        node = {"x": node}
    assert walk_templates({"spec": node}) == []


def test_expand_takes_every_key_and_index() -> None:
    document = {"spec": {"a": {"t": 1}, "b": {"t": 2}, "l": [{"t": 3}, {"u": 4}]}}
    assert list(expand(document, ("spec", "*", "t"))) == [("spec", "a", "t"), ("spec", "b", "t")]
    assert list(expand(document, ("spec", "l", "*", "t"))) == [("spec", "l", 0, "t")]


def test_paths_read_as_users_write_them() -> None:
    assert dotted(("spec", "workerGroupSpecs", 0, "template")) == "spec.workerGroupSpecs[0].template"
    assert dotted(("items", 1)) == "items[1]"
    assert pointer(("a", "nvidia.com/gpu", "x~y")) == "/a/nvidia.com~1gpu/x~0y"
    assert parse_pointer("/a/nvidia.com~1gpu/x~0y") == ("a", "nvidia.com/gpu", "x~y")
    assert get_path({"a": [{"b": 1}]}, ("a", 0, "b")) == 1
    assert get_path({"a": [{"b": 1}]}, ("a", 3, "b")) is None


ISVC: dict[str, Any] = {
    "apiVersion": "serving.kserve.io/v1beta1",
    "kind": "InferenceService",
    "metadata": {"name": "m", "annotations": {"castops.io/optimize": "true", "shared": "top"}},
    "spec": {
        "predictor": {
            "annotations": {"shared": "component"},
            "containers": [{"name": "sidecar", "image": "s"}],
            "model": {"modelFormat": {"name": "x"}, "resources": {"limits": {"nvidia.com/gpu": 1}}},
        },
        "transformer": {"containers": [{"name": "t", "image": "t"}]},
        "explainer": {"minReplicas": 1},  # neither containers nor a model: no Pod to judge
    },
}


def test_kserve_component_pod_has_the_model_as_its_last_container() -> None:
    sites = find_pods(ISVC)
    assert [(s.path, s.model_key) for s in sites] == [
        (("spec", "predictor"), "model"),
        (("spec", "transformer"), None),
    ]
    pod = sites[0].pod(ISVC)
    # The InferenceService's annotations reach the Pod; the component's own win.
    assert pod["metadata"]["annotations"] == {"castops.io/optimize": "true", "shared": "component"}
    assert [c["name"] for c in pod["spec"]["containers"]] == ["sidecar", "kserve-container"]
    assert "annotations" not in pod["spec"]


@pytest.mark.parametrize(
    ("pod_path", "document_path"),
    [
        ("/spec/containers/1/resources/limits/x", ("spec", "predictor", "model", "resources", "limits", "x")),
        ("/spec/containers/0/env", ("spec", "predictor", "containers", "0", "env")),
        ("/spec/schedulerName", ("spec", "predictor", "schedulerName")),
        ("/metadata/annotations/a", ("spec", "predictor", "annotations", "a")),
        ("/metadata/labels", ("spec", "predictor", "labels")),
    ],
)
def test_kserve_patch_paths_map_back_to_the_component(pod_path: str, document_path: tuple[str, ...]) -> None:
    site = find_pods(ISVC)[0]
    assert site.document_path(parse_pointer(pod_path)) == document_path


@pytest.mark.parametrize(
    "pod_path",
    ["/spec/containers", "/spec/containers/1", "/spec/containers/1/name", "/metadata/name", "/kind"],
)
def test_kserve_changes_with_no_place_in_the_component_are_refused(pod_path: str) -> None:
    with pytest.raises(Unmappable):
        find_pods(ISVC)[0].document_path(parse_pointer(pod_path))


def test_template_patch_paths_are_prefixed_and_nothing_else_maps() -> None:
    site = PodSite(("spec", "template"), "template")
    assert site.document_path(("spec", "x")) == ("spec", "template", "spec", "x")
    assert site.document_path(("metadata", "labels")) == ("spec", "template", "metadata", "labels")
    with pytest.raises(Unmappable):
        site.document_path(("apiVersion",))


def test_a_patch_on_the_judged_pod_lands_on_the_same_values_in_the_document() -> None:
    """Round trip: apply a patch to the component's Pod and, mapped, to the document; the Pod of
    the patched document is the patched Pod."""
    site = find_pods(ISVC)[0]
    pod = site.pod(ISVC)
    patch = [
        {"op": "remove", "path": "/spec/containers/1/resources/limits/nvidia.com~1gpu"},
        {"op": "add", "path": "/spec/containers/1/resources/limits/nvidia.com~1gpu-shared", "value": "2"},
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]},
        {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
    ]
    patched_pod = jsonpatch.apply_patch(pod, patch)
    mapped = [{**op, "path": pointer(site.document_path(parse_pointer(op["path"])))} for op in patch]
    document = jsonpatch.apply_patch(copy.deepcopy(ISVC), mapped)
    assert site.pod(document) == patched_pod


# -- the Pod judged for each site shape, patch-path refusals word for word, the walk's edges ------
KSERVE_ONLY_MODEL: dict[str, Any] = {
    "apiVersion": "serving.kserve.io/v1beta1",
    "kind": "InferenceService",
    "metadata": {"name": "m", "labels": {"team": "a"}},
    "spec": {
        "explainer": {"minReplicas": 1},
        "predictor": {"labels": {"role": "p"}, "model": {"name": "mine", "image": "m"}},
        "transformer": {"containers": [{"name": "t"}]},
    },
}


def test_a_template_is_judged_as_a_whole_pod() -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {"template": {"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "c"}]}}},
    }
    (site,) = find_pods(deployment)
    assert site.pod(deployment) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c"}]},
    }


def test_a_kserve_component_with_only_a_model_is_one_container_pod() -> None:
    sites = find_pods(KSERVE_ONLY_MODEL)
    assert sites == [
        PodSite(("spec", "predictor"), "kserve-component", "kind", "model", 0),
        PodSite(("spec", "transformer"), "kserve-component", "kind", None, 1),
    ]
    assert sites[0].pod(KSERVE_ONLY_MODEL) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {"team": "a", "role": "p"}},
        "spec": {"containers": [{"name": "mine", "image": "m"}]},
    }


def test_a_kserve_document_without_metadata_still_gives_pods() -> None:
    document = {**KSERVE_ONLY_MODEL, "metadata": "not a map"}
    assert find_pods(document)[1].pod(document) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {"containers": [{"name": "t"}]},
    }


@pytest.mark.parametrize(
    ("site", "pod_path", "message"),
    [
        (PodSite(("spec", "template"), "template"), ("kind",), "/kind is not part of a Pod template"),
        (
            PodSite(("spec", "template"), "template"),
            ("status", "phase"),
            "/status/phase is not part of a Pod template",
        ),
        (
            PodSite(("spec", "predictor"), "kserve-component", "kind", "model", 0),
            ("spec", "containers"),
            "a change to the whole container list of a KServe component",
        ),
        (
            PodSite(("spec", "predictor"), "kserve-component", "kind", "model", 0),
            ("spec", "containers", "0", "name"),
            "a change to the name KServe gives the model container",
        ),
        (
            PodSite(("spec", "predictor"), "kserve-component", "kind", None, 0),
            ("spec",),
            "/spec has no place in a KServe component",
        ),
        (
            PodSite(("spec", "predictor"), "kserve-component", "kind", None, 0),
            ("spec", "labels"),
            "/spec/labels has no place in a KServe component",
        ),
        (
            PodSite(("spec", "predictor"), "kserve-component", "kind", None, 0),
            ("metadata", "name"),
            "/metadata/name has no place in a KServe component",
        ),
    ],
)
def test_paths_with_no_place_in_the_document_are_refused_by_name(
    site: PodSite, pod_path: tuple[str, ...], message: str
) -> None:
    with pytest.raises(Unmappable) as raised:
        site.document_path(pod_path)
    assert str(raised.value) == message


def test_a_kserve_spec_annotations_path_is_the_components_own() -> None:
    site = PodSite(("spec", "predictor"), "kserve-component", "kind", None, 0)
    with pytest.raises(Unmappable):
        site.document_path(("spec", "annotations", "a"))
    assert site.document_path(("spec", "nodeSelector")) == ("spec", "predictor", "nodeSelector")


def test_get_path_stops_at_the_end_of_a_list_and_at_non_string_keys() -> None:
    document = {"a": [1, 2], "m": {"1": "one"}}
    assert get_path(document, ("a", 1)) == 2
    assert get_path(document, ("a", 2)) is None
    assert get_path(document, ("m", 1)) is None
    assert get_path(document, ("m", "1")) == "one"


def test_the_walk_reaches_exactly_its_depth() -> None:
    template: dict[str, Any] = {"spec": {"containers": []}}
    node: Any = template
    for _ in range(WALK_DEPTH - 1):
        node = {"x": node}
    path = ("spec",) + ("x",) * (WALK_DEPTH - 1)
    assert walk_templates({"spec": node}) == [path]
    assert len(path) == WALK_DEPTH


def test_an_unknown_kind_is_walked_and_its_sites_say_so() -> None:
    document = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "spec": {"worker": {"spec": {"containers": []}}},
    }
    assert find_pods(document) == [PodSite(("spec", "worker"), "template", "walk")]


def test_a_custom_kind_needs_its_group_even_without_an_api_version() -> None:
    assert known_paths({"kind": "Deployment"}) == (("spec", "template"),)
    assert known_paths({"kind": "PyTorchJob"}) is None
    assert known_paths({"apiVersion": "v1", "kind": "Deployment"}) is None


def test_a_kserve_component_without_a_pod_does_not_hide_the_next() -> None:
    document = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "spec": {
            "predictor": "not a map",
            "transformer": {"minReplicas": 1},
            "explainer": {"containers": []},
        },
    }
    assert find_pods(document) == [PodSite(("spec", "explainer"), "kserve-component", "kind", None, 0)]


def test_the_walk_of_something_that_is_not_a_document_finds_nothing() -> None:
    assert walk_templates(["spec"]) == []
