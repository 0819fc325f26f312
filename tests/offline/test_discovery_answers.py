"""function/offline/discovery.py, answer by answer: the Pod judged for each shape of site, written whole; the
refusals of patch paths, word for word; and the edges of the walk and of path reading."""

from __future__ import annotations

from typing import Any

import pytest

from function.offline.discovery import (
    WALK_DEPTH,
    PodSite,
    Unmappable,
    find_pods,
    get_path,
    known_paths,
    walk_templates,
)

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
