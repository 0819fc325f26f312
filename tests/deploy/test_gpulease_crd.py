"""The GpuLease component: the CRD, its validating webhook and the Python model stay in step, the
schema and ``lease_problems`` agree on what is valid, and the webhook's RBAC is what its watches
need. The CEL rules themselves run on a real apiserver in tests/e2e/test_leases_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from function import contract
from function.core import leases
from function.core.leases import lease_problems
from function.core.mutators.gpu_leases import GpuLeasesConfig, watches
from function.core.view import rbac_rules

COMPONENT = Path(__file__).resolve().parents[2] / "knative" / "components" / "gpu-leases"


def _load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]


def _version() -> dict[str, Any]:
    (crd,) = _load("gpulease-crd.yaml")
    (version,) = crd["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def test_crd_names_group_scope_short_name_and_status() -> None:
    (crd,) = _load("gpulease-crd.yaml")
    assert crd["metadata"]["name"] == f"{leases.PLURAL}.{leases.GROUP}" == "gpuleases.castops.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == leases.KIND
    assert crd["spec"]["names"]["shortNames"] == ["gpul"]
    version = _version()
    assert version["name"] == leases.VERSION and version["subresources"] == {"status": {}}


def test_printer_columns_answer_how_much_is_left_and_until_when() -> None:
    columns = {c["name"]: c["jsonPath"] for c in _version()["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.gpuModel" and columns["GPUs"] == ".spec.count"
    assert columns["Used"] == ".status.used" and columns["Phase"] == ".status.phase"
    assert columns["Free"] == ".status.free"
    assert columns["Ends"] == ".status.windowEnd" and "Age" in columns
    types = {c["name"]: c["type"] for c in _version()["additionalPrinterColumns"]}
    # kubectl prints a date column as the time since it: a window's end ahead is "<invalid>".
    assert types["Ends"] == "string"


def test_spec_fields_and_enums_are_the_models() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert tuple(spec["properties"]) == leases.SPEC_FIELDS
    assert spec["properties"]["enforcement"]["enum"] == [e.value for e in leases.Enforcement]
    assert spec["properties"]["overflow"]["enum"] == [e.value for e in leases.Overflow]
    assert spec["properties"]["onExpiry"]["properties"]["action"]["enum"] == [
        e.value for e in leases.ExpiryAction
    ]
    assert spec["properties"]["gpuModel"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    status = _version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [p.value for p in leases.Phase]
    assert status["conditions"]["x-kubernetes-list-type"] == "map"  # per-condition ownership


def _schema_accepts(obj: dict[str, Any]) -> bool:
    schema = _version()["schema"]["openAPIV3Schema"]
    try:
        jsonschema.validate(obj, schema, format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError:
        return False
    return True


def lease(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {"name": "h100", "namespace": "ml"},
        "spec": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "count": 8, **spec},
    }


VALID = [
    lease(),
    lease(count="0.5"),
    lease(duration="72h", enforcement="Queue", overflow="Preemptible"),
    lease(window={"start": "2026-11-25T00:00:00Z", "end": "2026-11-27T18:00:00Z"}, priority=5),
    lease(podSelector={"matchLabels": {"team": "a"}}, onExpiry={"action": "Evict", "gracePeriodSeconds": 0}),
]
INVALID = [
    (lease(count=0), "spec.count"),
    (lease(count="1.2345"), "spec.count"),
    (lease(gpuModel="not a label"), "spec.gpuModel"),
    (lease(duration="3 days"), "spec.duration"),
    (lease(enforcement="Reject"), "spec.enforcement"),
    (lease(onExpiry={"action": "Kill"}), "spec.onExpiry.action"),
    (lease(podSelector={"matchExpressions": [{"key": "a", "operator": "Near"}]}), "spec.podSelector"),
    # What the code cannot compute with (the window's edges are CEL's: tests/e2e/test_leases_e2e.py).
    (lease(duration="87600000h"), "spec.duration"),
    (lease(onExpiry={"action": "Evict", "gracePeriodSeconds": 2592001}), "spec.onExpiry.gracePeriodSeconds"),
    (lease(priority=2**31), "spec.priority"),
    (lease(count=10**10), "spec.count"),
    (lease(count="12345678901234m"), "spec.count"),
]


@pytest.mark.parametrize("obj", VALID, ids=range(len(VALID)))
def test_what_the_schema_accepts_the_webhook_accepts(obj: dict[str, Any]) -> None:
    assert _schema_accepts(obj)
    assert lease_problems(obj) == []


@pytest.mark.parametrize(("obj", "field"), INVALID, ids=[f for _, f in INVALID])
def test_the_webhook_names_each_field_the_schema_refuses(obj: dict[str, Any], field: str) -> None:
    assert not _schema_accepts(obj)
    assert any(problem.startswith(field) for problem in lease_problems(obj))


def test_the_webhook_names_every_invalid_field_at_once() -> None:
    bad = lease(count=-1, duration="x", enforcement="Sometimes", window={"end": "tomorrow"}, extra=1)
    problems = lease_problems(bad)
    for field in ("spec.extra", "spec.count", "spec.window.end", "spec.duration", "spec.enforcement"):
        assert any(p.startswith(field) for p in problems), (field, problems)


def test_validating_webhook_calls_the_served_path_for_gpuleases() -> None:
    (config,) = _load("validating-webhook.yaml")
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["url"].endswith(contract.VALIDATE_GPULEASES_PATH)
    (rule,) = hook["rules"]
    assert rule["apiGroups"] == [leases.GROUP] and rule["resources"] == [leases.PLURAL]
    assert rule["scope"] == "Namespaced"


def test_webhook_rbac_is_what_the_mutators_watches_need() -> None:
    role = next(
        d
        for d in _load("rbac.yaml")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "castslice-gpuleases"
    )
    needed = rbac_rules(watches(GpuLeasesConfig(enabled=True)))
    assert sorted(role["rules"], key=str) == sorted(needed, key=str)


def test_tenants_can_read_leases_and_nothing_else() -> None:
    reader = next(d for d in _load("rbac.yaml") if d["metadata"]["name"] == "castslice-gpulease-reader")
    assert reader["rules"] == [
        {
            "apiGroups": ["castops.io"],
            "resources": ["gpuleases", "gpuleases/status"],
            "verbs": ["get", "list", "watch"],
        }
    ]
