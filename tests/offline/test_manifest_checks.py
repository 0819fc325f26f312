"""Where YAML typing and users go wrong, named before the engine runs."""

from __future__ import annotations

from typing import Any

import pytest

from function.offline.discovery import find_pods
from function.offline.manifest_checks import misplaced_opt_in, object_problems
from function.offline.yamldoc import load_documents, to_plain


def problems_of(text: str) -> dict[str, tuple[str, str]]:
    [chunk] = load_documents(text, "t")
    sites = find_pods(to_plain(chunk.tree))
    return {p.path: (p.severity, p.message) for p in object_problems(chunk.tree, sites)}


POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{a: {annotation}}}
  labels: {{l: {label}}}
spec:
  nodeSelector: {{zone: {selector}}}
  schedulerName: {scheduler}
  tolerations: [{{key: k, value: {toleration}}}]
  containers:
  - name: c
    image: {image}
    args: [{arg}]
    command: [run]
    env: [{{name: E, value: {env}}}]
    resources: {{limits: {{cpu: 1, nvidia.com/gpu: 1}}}}
"""

GOOD = {
    "name": "p",
    "annotation": '"true"',
    "label": "web",
    "selector": '"1"',
    "scheduler": "default-scheduler",
    "toleration": "'yes'",
    "image": "busybox:1.36",
    "arg": "--port=8080",
    "env": '"2024-01-01"',
}


def test_quoted_and_plain_strings_pass_and_quantities_may_be_numbers() -> None:
    assert problems_of(POD.format(**GOOD)) == {}


@pytest.mark.parametrize(
    ("field", "value", "path", "what"),
    [
        ("annotation", "true", "metadata.annotations.a", "true is a boolean"),
        ("annotation", "4", "metadata.annotations.a", "4 is a number"),
        ("annotation", "1.5", "metadata.annotations.a", "1.5 is a number"),
        ("annotation", "yes", "metadata.annotations.a", "yes is a boolean for kubectl (YAML 1.1)"),
        ("label", "on", "metadata.labels.l", "on is a boolean for kubectl"),
        ("name", "2024", "metadata.name", "2024 is a number"),
        ("selector", "1", "spec.nodeSelector.zone", "1 is a number"),
        ("scheduler", "false", "spec.schedulerName", "false is a boolean"),
        ("toleration", "Y", "spec.tolerations[0].value", "Y is a boolean for kubectl"),
        ("image", "3", "spec.containers[0].image", "3 is a number"),
        ("arg", "8080", "spec.containers[0].args[0]", "8080 is a number"),
        ("env", "0", "spec.containers[0].env[0].value", "0 is a number"),
    ],
)
def test_a_non_string_where_kubernetes_wants_one_is_an_error(
    field: str, value: str, path: str, what: str
) -> None:
    found = problems_of(POD.format(**{**GOOD, field: value}))
    assert list(found) == [path]
    severity, message = found[path]
    assert severity == "error"
    assert message.startswith(what)
    assert message.endswith(f'quote it ("{value}")')


def test_an_unquoted_date_is_a_warning() -> None:
    found = problems_of(POD.format(**{**GOOD, "env": "2024-01-01"}))
    assert found["spec.containers[0].env[0].value"][0] == "warning"
    assert "is a date" in found["spec.containers[0].env[0].value"][1]


def test_a_workload_is_checked_on_its_own_metadata_and_each_template() -> None:
    text = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: j, labels: {v: 1}}
spec:
  pytorchReplicaSpecs:
    Master:
      template: {metadata: {annotations: {castops.io/optimize: true}}, spec: {containers: [{name: c}]}}
    Worker: {template: {spec: {containers: [{name: c, env: [{name: E, value: 3}]}]}}}
"""
    assert set(problems_of(text)) == {
        "metadata.labels.v",
        "spec.pytorchReplicaSpecs.Master.template.metadata.annotations.castops.io/optimize",
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env[0].value",
    }


def test_kserve_component_and_model_are_checked() -> None:
    text = """apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: m}
spec:
  predictor:
    annotations: {castops.io/slice-ratio: 2}
    model: {modelFormat: {name: x}, args: [--workers, 4]}
"""
    assert set(problems_of(text)) == {
        "spec.predictor.annotations.castops.io/slice-ratio",
        "spec.predictor.model.args[1]",
    }


def deployment(own: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "annotations": own},
        "spec": {"template": {"metadata": {"annotations": template}, "spec": {"containers": []}}},
    }


def test_opt_in_on_the_workloads_own_metadata_gets_a_hint() -> None:
    document = deployment({"castops.io/optimize": "true", "castops.io/workload-type": "dev"}, {})
    hints = misplaced_opt_in(document, find_pods(document))
    assert hints == [
        "the opt-in castops.io/optimize is on the Deployment's own metadata, which its Pods never see: "
        "put it in spec.template.metadata.annotations",
        "castops.io/workload-type is on the Deployment's own metadata, which its Pods never see: "
        "put it in spec.template.metadata.annotations",
    ]


def test_no_hint_when_the_template_has_it_or_for_pods_and_kserve() -> None:
    both = deployment({"castops.io/optimize": "true"}, {"castops.io/optimize": "true"})
    assert misplaced_opt_in(both, find_pods(both)) == []
    other = deployment({"example.com/x": "1"}, {})
    assert misplaced_opt_in(other, find_pods(other)) == []
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"annotations": {"castops.io/optimize": "true"}}}
    assert misplaced_opt_in(pod, find_pods(pod)) == []
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"annotations": {"castops.io/optimize": "true"}},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "x"}}}},
    }
    assert misplaced_opt_in(isvc, find_pods(isvc)) == []


def test_several_templates_missing_it_are_counted() -> None:
    document = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"annotations": {"castops.io/optimize": "true"}},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": []}}},
            "workerGroupSpecs": [{"template": {"spec": {"containers": []}}}],
        },
    }
    [hint] = misplaced_opt_in(document, find_pods(document))
    assert hint.endswith("spec.headGroupSpec.template.metadata.annotations (and the 1 other Pod template(s))")


# -- the preview's problems word for word; hints for opt-ins on a workload's own metadata ----------
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
