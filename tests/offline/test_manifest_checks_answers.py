"""function/offline/manifest_checks.py, answer by answer: the preview's problems word for word, and hints for
opt-ins on a workload's own metadata in every shape of document."""

from __future__ import annotations

from typing import Any

from function.offline.discovery import find_pods
from function.offline.manifest_checks import misplaced_opt_in
from tests.offline.test_manifest_checks import GOOD, POD, problems_of


def test_a_date_is_a_warning_that_says_what_tools_make_of_it() -> None:
    assert problems_of(POD.format(**{**GOOD, "env": "2024-01-01"})) == {
        "spec.containers[0].env[0].value": (
            "warning",
            "2024-01-01 is a date; YAML tools that read dates (PyYAML, ruamel, Helm values) turn it into a "
            'date; quote it ("2024-01-01")',
        )
    }


def test_an_env_name_is_checked_too() -> None:
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "spec:\n  containers:\n  - name: c\n    env: [{name: 5, value: x}]\n"
    )
    assert problems_of(text) == {
        "spec.containers[0].env[0].name": (
            "error",
            '5 is a number; Kubernetes wants a string here: quote it ("5")',
        )
    }


def test_a_kserve_components_own_fields_are_checked() -> None:
    text = (
        "apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata: {name: m}\n"
        "spec:\n  predictor:\n    serviceAccountName: 5\n    containers: [{name: c}]\n"
    )
    assert set(problems_of(text)) == {"spec.predictor.serviceAccountName"}


def workload(metadata: Any, *templates: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"template": templates[0]},
    }


EMPTY_TEMPLATE: dict[str, Any] = {"spec": {"containers": []}}


def test_hints_for_malformed_or_nameless_documents() -> None:
    malformed = workload("not a map", EMPTY_TEMPLATE)
    assert misplaced_opt_in(malformed, find_pods(malformed)) == []
    kindless = {
        "metadata": {"annotations": {"castops.io/optimize": "true"}},
        "spec": {"template": {"spec": {"containers": []}}},
    }
    sites = find_pods({**kindless, "kind": "Deployment"})
    assert misplaced_opt_in(kindless, sites) == [
        "the opt-in castops.io/optimize is on the object's own metadata, which its Pods never see: "
        "put it in spec.template.metadata.annotations"
    ]


def test_every_misplaced_annotation_is_hinted_past_others() -> None:
    own = {"example.com/a": "1", "castops.io/optimize": "true", "castops.io/slice-ratio": "2", "x.io/b": "1"}
    template = {"metadata": {"annotations": {"castops.io/optimize": "true"}}, "spec": {"containers": []}}
    document = workload({"annotations": own}, template)
    assert misplaced_opt_in(document, find_pods(document)) == [
        "castops.io/slice-ratio is on the Deployment's own metadata, which its Pods never see: "
        "put it in spec.template.metadata.annotations"
    ]
