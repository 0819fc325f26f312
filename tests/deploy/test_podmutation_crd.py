"""The PodMutation CRD, its validating webhook and the Python spec model stay in step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import yaml

from function import contract
from function.core.mutators.pod_mutations import PodMutationsConfig, watches
from function.core.mutators.pod_mutations_mutator import CASTAI_MUTATIONS, OUR_MUTATIONS
from function.core.podmutation import names
from function.core.podmutation import spec as model
from function.core.podmutation.jsonpatch_ext import OPS

COMPONENT = Path(__file__).resolve().parents[2] / "knative" / "components" / "pod-mutations"


def _load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]


def _spec_schema() -> dict[str, Any]:
    (crd,) = _load("podmutation-crd.yaml")
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_crd_names_group_scope_and_status() -> None:
    (crd,) = _load("podmutation-crd.yaml")
    assert crd["metadata"]["name"] == f"{names.PLURAL}.{names.OUR_GROUP}"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == names.KIND
    assert crd["spec"]["names"]["shortNames"] == ["podmut"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == names.OUR_VERSION and version["subresources"] == {"status": {}}


def test_crd_spec_fields_are_the_model_fields() -> None:
    assert set(_spec_schema()["properties"]) == set(model.PodMutationSpec.model_fields)
    workload = _spec_schema()["properties"]["filter"]["properties"]["workload"]["properties"]
    assert set(workload) == set(model.WorkloadFilter.model_fields)
    assert set(_spec_schema()["properties"]["filterV2"]["properties"]["workload"]["properties"]) == set(
        model.WorkloadFilterV2.model_fields
    )


def test_crd_enums_are_the_model_literals() -> None:
    props = _spec_schema()["properties"]
    assert tuple(props["spotConfig"]["properties"]["mode"]["enum"]) == get_args(model.SpotMode)
    assert tuple(props["patches"]["items"]["properties"]["op"]["enum"]) == OPS
    assert props["restartPolicy"]["enum"] == ["deferred", "immediate"]


def test_validating_webhook_calls_the_served_path_for_our_group_only() -> None:
    (config,) = _load("validating-webhook.yaml")
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["url"].endswith(contract.VALIDATE_PODMUTATIONS_PATH)
    (rule,) = hook["rules"]
    assert rule["apiGroups"] == [names.OUR_GROUP] and rule["resources"] == [names.PLURAL]
    assert hook["sideEffects"] == "None"


def test_rbac_covers_every_watch_the_plugin_declares() -> None:
    role = _load("rbac.yaml")[0]
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    own = {(s.group, s.plural) for s in watches(PodMutationsConfig(enabled=True))}
    # pods and replicasets are granted with the spot placement's view; ours are the rest
    assert own - {("", "pods"), ("apps", "replicasets")} == granted
    castai = _load("../pod-mutations-castai/rbac.yaml")[0]
    assert castai["rules"][0]["apiGroups"] == [CASTAI_MUTATIONS.group]
    assert CASTAI_MUTATIONS in watches(PodMutationsConfig(enabled=True, castaiObjects=True))
    assert CASTAI_MUTATIONS not in watches(PodMutationsConfig(enabled=True))
    assert OUR_MUTATIONS.namespaced is False
