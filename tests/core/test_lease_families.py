"""Leases of several GPU models or a family: one count for all of them, a cap per model, GFD's
-SHARED and MIG product labels as the model they come from, and the status per model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from function.control.reconcilers.gpu_leases import models_status
from function.core.families import base_model, is_family, models_of, node_values
from function.core.leases import (
    CHARGE_ANNOTATION,
    DECISION_ANNOTATION,
    LEASE_LABEL,
    MODEL_ANNOTATION,
    STAMP_ANNOTATIONS,
    STATE_LABEL,
    lease_problems,
    slim_charged_pod,
    slim_lease,
)
from function.core.mutators.base import Action
from function.core.mutators.gpu_leases import GpuLeasesConfig, LedgerCharge, ledger_charge
from tests.core.test_gpu_leases import MODEL, decide, lease_obj, pod, view

H100, H200, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100-SXM4-40GB"
FAMILIES = {"modelFamilies": {"h100-class": [H100, H200]}}


def family_lease(count: Any = 4, **spec: Any) -> dict[str, Any]:
    obj = lease_obj("hopper", count=count, **spec)
    del obj["spec"]["gpuModel"]
    obj["spec"]["gpuModels"] = [H100, H200]
    return obj


def on(model: str, milli: int, n: int, lease: str = "hopper", state: str = "charged") -> dict[str, Any]:
    annotations = {CHARGE_ANNOTATION: f"{milli}m", DECISION_ANNOTATION: f"d-{n}"}
    if model:
        annotations[MODEL_ANNOTATION] = model
    return {
        "metadata": {
            "name": f"{lease}-{n}",
            "namespace": "ml",
            "uid": f"pod-{n}",
            "labels": {LEASE_LABEL: lease, STATE_LABEL: state},
            "annotations": annotations,
            "creationTimestamp": "2026-11-25T01:00:00Z",
        }
    }


def test_gfd_suffixes_name_the_gpu_they_come_from() -> None:
    assert base_model("NVIDIA-A100-SXM4-40GB-SHARED") == A100
    assert base_model("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == A100
    assert base_model("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb-SHARED") == A100
    assert base_model(H100) == H100


def test_models_of_expands_families_from_the_object_its_spec_and_the_views_record() -> None:
    families = {"h100-class": (H100, H200)}
    one = lease_obj(model="h100-class")
    assert models_of(one, families) == (H100, H200) == models_of(one["spec"], families)
    assert models_of(slim_lease(one), families) == (H100, H200)
    assert models_of(one) == ("h100-class",)  # without the configuration, a name is a model
    listed = family_lease()
    listed["spec"]["gpuModels"] = ["h100-class", A100, H200]
    assert models_of(listed, families) == (H100, H200, A100)
    assert is_family(listed) and is_family(one, families) and not is_family(lease_obj())
    assert node_values((H100,)) == (H100, f"{H100}-SHARED")


def test_the_spec_takes_one_model_or_several_never_both_and_caps_of_counts() -> None:
    assert lease_problems(family_lease(caps={H200: 2})) == []
    both = family_lease()
    both["spec"]["gpuModel"] = H100
    assert any(p.startswith("spec.gpuModels: give spec.gpuModel or") for p in lease_problems(both))
    neither = family_lease()
    del neither["spec"]["gpuModels"]
    assert any(p.startswith("spec.gpuModel: required") for p in lease_problems(neither))
    bad = family_lease(caps={H200: "lots", "no way": 1})
    bad["spec"]["gpuModels"] = [H100, H100, ""]
    problems = lease_problems(bad)
    assert any(p.startswith("spec.gpuModels[2]:") for p in problems)
    assert any(p.startswith("spec.gpuModels: names a model twice") for p in problems)
    assert any(p.startswith(f"spec.caps.{H200}:") for p in problems)
    assert any(p.startswith("spec.caps.no way:") for p in problems)
    # With the configuration, a cap names one of the lease's models.
    capped = lease_obj(model="h100-class", caps={A100: 1})
    assert lease_problems(capped) == []
    assert [p for p in lease_problems(capped, families={"h100-class": (H100, H200)})] == [
        f"spec.caps.{A100}: not one of the lease's models ({H100}, {H200})"
    ]


def test_the_configuration_refuses_a_nested_family_and_a_bad_name() -> None:
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilies": {"a": ["b"], "b": [H100]}})
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilies": {"a": ["not a label"]}})
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilies": {"a": []}})
    with pytest.raises(ValidationError):
        GpuLeasesConfig.model_validate({"modelFamilys": {}})


@pytest.mark.parametrize("model", [H100, H200, f"{H200}-SHARED", f"{H100}-MIG-1g.10gb"])
def test_pods_on_either_model_are_charged_to_one_count(model: str) -> None:
    p = pod(1, model=model)
    result = decide(p, view([family_lease()], [on(H100, 2000, 1), on(H200, 1000, 2)]))
    assert result.action == Action.mutated, result.reason
    assert "3 of 4 GPU in use, this Pod needs 1" in result.reason
    assert p["metadata"]["annotations"][MODEL_ANNOTATION] == base_model(model)
    assert p["spec"]["nodeSelector"] == {MODEL: model} and "affinity" not in p["spec"]  # not pinned
    full = decide(pod(1, model=model), view([family_lease()], [on(H100, 3000, 1), on(H200, 1000, 2)]))
    assert full.action == Action.denied and "LeaseExhausted" in full.reason
    assert "4 of 4 GPU in use" in full.reason


def test_a_family_of_the_configuration_is_a_lease_of_its_models() -> None:
    lease = lease_obj("hopper", model="h100-class", count=2)
    assert decide(pod(1, model=H200), view([lease]), **FAMILIES).action == Action.mutated
    refused = decide(pod(1, model=A100), view([lease]), **FAMILIES)
    assert refused.action == Action.denied and "NoMatchingLease" in refused.reason
    # Without the family in the configuration the name is a model no Pod asks for.
    assert decide(pod(1, model=H200), view([lease])).action == Action.denied


def test_a_pod_naming_no_model_is_pinned_to_the_family_with_its_shared_forms() -> None:
    p = pod(1)
    result = decide(p, view([family_lease()]))
    assert result.action == Action.mutated
    assert MODEL_ANNOTATION not in p["metadata"]["annotations"]  # any model of the lease
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": MODEL, "operator": "In", "values": list(node_values((H100, H200)))}
                ]
            }
        ]
    }


def test_a_pod_that_may_run_beyond_the_family_is_pinned_within_each_of_its_terms() -> None:
    p = pod(1)
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": MODEL, "operator": "In", "values": [H100, A100]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                ]
            }
        }
    }
    assert decide(p, view([family_lease()])).action == Action.mutated
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        assert term["matchExpressions"][-1]["values"] == list(node_values((H100, H200)))


def test_a_cap_holds_one_model_within_the_count() -> None:
    lease = family_lease(caps={H200: 2})
    pods = [on(H200, 1000, 1), on(H200, 1000, 2)]
    refused = decide(pod(1, model=H200), view([lease], pods))
    assert refused.action == Action.denied and "LeaseExhausted" in refused.reason
    assert f"the cap of {H200} is 2 GPU, 2 in use, this Pod needs 1" in refused.reason
    assert decide(pod(1, model=H100), view([lease], pods)).action == Action.mutated
    # A Pod that may run on either goes where no cap holds it: pinned to H100, charged as "any".
    either = pod(1)
    assert decide(either, view([lease], pods)).action == Action.mutated
    values = either["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert values["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == list(node_values((H100,)))
    assert either["metadata"]["annotations"][MODEL_ANNOTATION] == H100


def test_every_model_capped_takes_the_first_with_room() -> None:
    lease = family_lease(caps={H100: 1, H200: 2})
    p = pod(1)
    assert decide(p, view([lease], [on(H100, 1000, 1)])).action == Action.mutated
    assert p["metadata"]["annotations"][MODEL_ANNOTATION] == H200
    full = decide(pod(1), view([lease], [on(H100, 1000, 1), on(H200, 2000, 2)]))
    assert full.action == Action.denied and f"the cap of {H100} is 1 GPU" in full.reason


def test_this_processs_charges_count_against_a_cap_until_the_view_shows_them() -> None:
    lease = family_lease(caps={H200: 1})
    ledger = {"ml/hopper": (LedgerCharge("d-9", 1000, "charged", H200),)}
    refused = decide(pod(1, model=H200), view([lease], ledger=ledger))
    assert refused.action == Action.denied and "cap of" in refused.reason
    p = pod(1, model=H200)
    assert decide(p, view([lease])).action == Action.mutated
    p["metadata"].update(namespace="ml", uid="u")
    assert ledger_charge(p) == ("ml/hopper", LedgerCharge("review-1", 1000, "charged", H200))


def test_the_model_is_part_of_the_stamp() -> None:
    assert MODEL_ANNOTATION in STAMP_ANNOTATIONS
    record = slim_charged_pod(on(H200, 1000, 1))
    assert record is not None and record.model == H200


def test_status_reports_each_model_and_its_cap() -> None:
    lease = slim_lease(family_lease(caps={H200: 2}))
    assert lease is not None
    pods = [slim_charged_pod(p) for p in (on(H100, 1000, 1), on(H200, 2000, 2), on("", 500, 3))]
    queued = slim_charged_pod(on(H100, 1000, 4, state="queued"))
    rows = models_status(lease, [p for p in (*pods, queued) if p is not None])
    assert rows == [
        {"model": H200, "used": "2", "cap": "2"},
        {"model": H100, "used": "1"},
        {"model": "any", "used": "0.5"},
    ]
    single = slim_lease(lease_obj())
    assert single is not None and models_status(single, []) is None


def test_status_models_is_written_by_the_controller() -> None:
    from function.control.reconcilers.gpu_leases import desired_status
    from function.core.leases import Usage

    lease = slim_lease(family_lease())
    record = slim_charged_pod(on(H200, 1000, 1))
    assert lease is not None and record is not None
    status = desired_status(
        lease, Usage(used=1000, pods=1), 0, datetime(2026, 11, 25, 12, tzinfo=UTC), pods=[record]
    )
    assert status["models"] == [{"model": H200, "used": "1"}]
