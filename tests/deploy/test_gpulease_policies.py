"""The admission policies that keep a GPU lease closed (components/gpu-leases/lease-policies.yaml)
name the keys, the mark and the GPU resources the Python code uses, fail closed, and are bound.
What their CEL does is run on a real apiserver by tests/e2e/test_lease_bypass_e2e.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

from function.core import leases

COMPONENT = Path(__file__).resolve().parents[2] / "knative" / "components" / "gpu-leases"


def policies(name: str = "lease-policies.yaml") -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def cel_strings(expression: str) -> list[str]:
    return re.findall(r"'([^']*)'", expression)


def cel_list(expression: str) -> list[str]:
    """A CEL list literal of strings, as Python reads it."""
    value = ast.literal_eval(" ".join(expression.split()))
    assert isinstance(value, list)
    return value


def test_the_component_lists_the_policies() -> None:
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert "lease-policies.yaml" in kustomization["resources"]


def test_every_policy_fails_closed_and_is_bound() -> None:
    found = policies()
    for (kind, name), policy in found.items():
        if kind.endswith("Binding"):
            continue
        assert policy["spec"]["failurePolicy"] == "Fail", name
        binding = found[(f"{kind}Binding", name)]
        assert binding["spec"]["policyName"] == name
        if kind == "ValidatingAdmissionPolicy":
            assert binding["spec"]["validationActions"][0] == "Deny"


def test_the_witness_marks_exactly_the_stamp_keys_and_runs_once_before_the_webhooks() -> None:
    witness = policies()[("MutatingAdmissionPolicy", "castslice-gpulease-witness")]["spec"]
    assert witness["reinvocationPolicy"] == "Never"
    assert witness["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    (condition,) = witness["matchConditions"]
    keys = set(cel_strings(condition["expression"]))
    assert keys == set(leases.STAMP_LABELS) | set(leases.STAMP_ANNOTATIONS)
    (written,) = witness["variables"]
    assert set(cel_strings(written["expression"])) >= keys
    (mutation,) = witness["mutations"]
    assert f"'{leases.FORGED_ANNOTATION}'" in mutation["applyConfiguration"]["expression"]


def test_a_refused_stamp_or_uncharged_gpu_pod_is_in_the_audit_log() -> None:
    for name in ("castslice-gpulease-forged", "castslice-gpulease-required"):
        binding = policies()[("ValidatingAdmissionPolicyBinding", name)]
        assert binding["spec"]["validationActions"] == ["Deny", "Audit"]


def test_the_mark_is_refused_in_every_namespace() -> None:
    forged = policies()[("ValidatingAdmissionPolicy", "castslice-gpulease-forged")]["spec"]
    assert "namespaceSelector" not in forged["matchConstraints"]
    assert leases.FORGED_ANNOTATION in forged["matchConditions"][0]["expression"]


def test_the_required_namespaces_policy_knows_the_gpu_resources_the_label_and_the_stamp() -> None:
    required = policies()[("ValidatingAdmissionPolicy", "castslice-gpulease-required")]["spec"]
    selector = required["matchConstraints"]["namespaceSelector"]
    assert selector == {"matchLabels": {leases.REQUIRED_LABEL: leases.REQUIRED_VALUE}}
    variables = {v["name"]: v["expression"] for v in required["variables"]}
    assert tuple(cel_list(variables["prefixes"])) == leases.GPU_RESOURCE_PREFIXES
    stamp = set(cel_strings(variables["stamped"]))
    assert {leases.LEASE_LABEL, leases.CHARGE_ANNOTATION, leases.DECISION_ANNOTATION} <= stamp
    assert leases.FORGED_ANNOTATION in stamp
    assert "resourceClaims" in variables["asksForGpus"]


def test_the_shipped_configuration_charges_only_resources_the_policy_calls_gpus() -> None:
    from function.core.mutators.gpu_leases import GpuLeasesConfig

    units = GpuLeasesConfig(enabled=True).units()
    for name in (
        *units.whole,
        units.shared,
        units.memory,
        units.memory_percentage,
        units.cores,
        "nvidia.com/mig-1g.10gb",
    ):
        assert name.startswith(leases.GPU_RESOURCE_PREFIXES), name


def test_the_stamp_policy_keeps_each_annotation_only_castslice_writes() -> None:
    stamp = policies("stamp-policy.yaml")[("ValidatingAdmissionPolicy", "castslice-gpulease-stamp")]["spec"]
    guarded = {key for rule in stamp["validations"] for key in cel_strings(rule["expression"])}
    # The charge, the decision, the priority and the model a family lease charged: fixed at
    # creation; the end: the controller's to keep.
    assert set(leases.STAMP_ANNOTATIONS) <= guarded
    assert set(leases.STAMP_LABELS) <= guarded
