"""core/leases.py: what a Pod is charged (vGPU as HAMi allocates it, exact at any size), the GPU
models a Pod may run on (as the scheduler reads its nodeSelector and required affinity), what
counts as asking for GPUs, the label value any lease name gets, and the charged-Pods index keyed
by Pod uid."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from function.core.leases import (
    CHARGE_LIMIT,
    CHARGED_PODS,
    DECISION_ANNOTATION,
    LEASE_LABEL,
    ChargeUnits,
    Models,
    charged_pod_key,
    gpu_ask,
    gpus,
    lease_label,
    lease_problems,
    pod_charge,
    pod_models,
    slim_charged_pod,
)
from function.core.view import IndexState

H100, A100, L4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L4"
MODEL = "nvidia.com/gpu.product"
UNITS = ChargeUnits(memory_mib_by_model={H100: 81920, A100: 40960})


def container(**limits: str) -> dict[str, Any]:
    return {"name": "c", "image": "x", "resources": {"limits": dict(limits), "requests": dict(limits)}}


def pod_of(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": list(containers), **spec}}


# -- the charge ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "model", "milli"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1"}, H100, 1000),  # no memory: the whole memory
        ({"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30"}, "", 2000),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}, H100, 250),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "60"},
            H100,
            600,
        ),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}, H100, 250),  # 20 GiB of 80
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}, A100, 500),  # 20 GiB of 40
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}, L4, 1000),  # a model of unknown memory
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "999999"}, H100, 1000),  # never above a GPU
        ({"nvidia.com/gpumem": "20480"}, H100, 250),  # HAMi adds one device to memory alone
        ({"nvidia.com/gpu": "0", "nvidia.com/gpucores": "50"}, H100, 0),
    ],
    ids=[
        "cores-without-memory",
        "cores-two-devices",
        "percentage",
        "cores-above-percentage",
        "memory-h100",
        "memory-a100",
        "memory-unknown-model",
        "memory-capped",
        "memory-without-count",
        "count-zero",
    ],
)
def test_a_vgpu_container_is_charged_what_hami_allocates(
    limits: dict[str, str], model: str, milli: int
) -> None:
    assert pod_charge(pod_of(container(**limits)), UNITS, model) == milli


@given(st.integers(min_value=0, max_value=4000), st.sampled_from(["", "e300", "e400", "E", "Ei", "m"]))
def test_any_quantity_is_an_exact_charge_never_an_error(digits: int, suffix: str) -> None:
    amount = "9" * max(digits % 600, 1) + suffix
    for resource in (
        "nvidia.com/gpu",
        "nvidia.com/gpu-shared",
        "nvidia.com/gpumem",
        "nvidia.com/mig-1g.10gb",
    ):
        milli = pod_charge(pod_of(container(**{resource: amount})), UNITS, H100)
        assert 0 <= milli <= CHARGE_LIMIT
        assert gpus(milli)  # printable: no float on the way


def test_a_quantity_above_a_float_is_charged_the_limit_and_shown() -> None:
    milli = pod_charge(pod_of(container(**{"nvidia.com/gpu": "1e400"})), UNITS)
    assert milli == CHARGE_LIMIT
    assert gpus(milli) == "1000000000000000"
    assert gpus(2125) == "2.125" and gpus(500) == "0.5" and gpus(8000) == "8" and gpus(-1500) == "-1.5"


# -- the models a Pod may run on -----------------------------------------------------------------
def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }


def on(operator: str, *values: str) -> dict[str, Any]:
    return {"key": MODEL, "operator": operator, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize(
    ("spec", "models"),
    [
        ({}, Models()),
        ({"nodeSelector": {MODEL: H100}}, Models(frozenset({H100}))),
        ({"affinity": affinity([on("In", H100, A100), on("In", A100)])}, Models(frozenset({A100}))),
        ({"affinity": affinity([on("In", H100)], [on("In", A100)])}, Models(frozenset({H100, A100}))),
        ({"affinity": affinity([on("In", H100, A100)], [on("NotIn", H100)])}, Models(None, frozenset())),
        (
            {"affinity": affinity([on("NotIn", H100)], [on("NotIn", H100, A100)])},
            Models(None, frozenset({H100})),
        ),
        (
            {"nodeSelector": {MODEL: H100}, "affinity": affinity([on("In", A100)])},
            Models(frozenset()),
        ),
        (
            {"affinity": affinity([on("Exists")], [{"key": "zone", "operator": "In", "values": ["a"]}])},
            Models(),
        ),
        ({"affinity": affinity([on("DoesNotExist")])}, Models(frozenset())),
        ({"affinity": affinity([])}, Models(frozenset())),  # an empty term matches no node
    ],
    ids=[
        "nothing",
        "node-selector",
        "one-term-two-expressions",
        "two-terms",
        "in-or-not-in",
        "not-in-or-not-in",
        "selector-and-affinity",
        "exists-and-other-keys",
        "does-not-exist",
        "empty-term",
    ],
)
def test_the_models_a_pod_may_run_on_are_read_as_the_scheduler_reads_them(
    spec: dict[str, Any], models: Models
) -> None:
    assert pod_models(pod_of(container(), **spec), MODEL) == models


MODELS = st.sampled_from([H100, A100, L4])
EXPRESSIONS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["In", "NotIn"]), st.lists(MODELS, min_size=1, max_size=3)),
        st.tuples(st.just("Exists"), st.just([])),
    ),
    min_size=1,
    max_size=3,
)


def node_matches(model: str, terms: list[list[tuple[str, list[str]]]], selector: str | None) -> bool:
    """The scheduler's rule for one node labelled ``model``: nodeSelector AND any term (its
    expressions ANDed)."""

    def holds(operator: str, values: list[str]) -> bool:
        return {"In": model in values, "NotIn": model not in values, "Exists": True}[operator]

    if selector is not None and selector != model:
        return False
    return not terms or any(all(holds(op, values) for op, values in term) for term in terms)


@given(st.lists(EXPRESSIONS, max_size=3), st.one_of(st.none(), MODELS))
def test_a_model_is_allowed_exactly_when_a_node_of_it_matches_the_pod(
    terms: list[list[tuple[str, list[str]]]], selector: str | None
) -> None:
    spec: dict[str, Any] = {}
    if terms:
        spec["affinity"] = affinity(*[[on(op, *values) for op, values in term] for term in terms])
    if selector is not None:
        spec["nodeSelector"] = {MODEL: selector}
    models = pod_models(pod_of(container(), **spec), MODEL)
    for model in (H100, A100, L4):
        assert models.allows(model) == node_matches(model, terms, selector), (model, terms, selector)


# -- what asks for GPUs --------------------------------------------------------------------------
def test_gpus_are_asked_through_any_vendors_resource_or_a_claim() -> None:
    assert not gpu_ask(pod_of(container(cpu="1", **{"example.com/fpga": "1"})), UNITS).asks
    assert not gpu_ask(pod_of(container(**{"nvidia.com/gpu": "0"})), UNITS).asks
    amd = gpu_ask(pod_of(container(**{"amd.com/gpu": "1", "nvidia.com/gpu": "1"})), UNITS)
    assert amd.resources == ("amd.com/gpu", "nvidia.com/gpu") and amd.uncharged == ("amd.com/gpu",)
    claims = [
        {"name": "mine", "resourceClaimTemplateName": "tenant-template"},
        {"name": "shared", "resourceClaimName": "team-claim"},
        {"name": "ours", "resourceClaimTemplateName": "castslice-gpu-4-abcdef12"},
    ]
    units = ChargeUnits(claim_templates={"castslice-gpu-4-abcdef12": 500})
    ask = gpu_ask(pod_of(container(), resourceClaims=claims), units)
    assert ask.claims == ("ours",)
    assert ask.unknown_claims == (
        "mine (ResourceClaimTemplate tenant-template)",
        "shared (ResourceClaim team-claim)",
    )
    assert pod_charge(pod_of(container(), resourceClaims=claims), units) == 500


# -- any lease name ------------------------------------------------------------------------------
def test_any_lease_name_has_a_label_value_and_long_ones_stay_apart() -> None:
    assert lease_label("h100") == "h100"
    long_a, long_b = "a" * 200 + ".x", "a" * 200 + ".y"
    assert not lease_problems({"metadata": {"name": long_a}, "spec": {"gpuModel": H100, "count": 1}})
    for name in (long_a, long_b, "a" * 64, "b." * 100 + "c"):
        value = lease_label(name)
        assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
        assert set(value) <= set("abcdefghijklmnopqrstuvwxyz0123456789-.")
    assert lease_label(long_a) != lease_label(long_b)


# -- the charged-Pods index ----------------------------------------------------------------------
def charged(uid: str, decision: str, charge: str = "1000m") -> dict[str, Any]:
    return {
        "metadata": {
            "name": uid,
            "namespace": "ml",
            "uid": uid,
            "labels": {LEASE_LABEL: "h100", "castops.io/gpu-lease-state": "charged"},
            "annotations": {DECISION_ANNOTATION: decision, "castops.io/gpu-lease-charge": charge},
        }
    }


def test_a_copy_of_another_pods_decision_neither_replaces_nor_erases_its_charge() -> None:
    real = charged("pod-real", "review-1")
    copy = charged("pod-copy", "review-1", "0m")  # the decision read with kubectl get -o yaml
    assert charged_pod_key(real) != charged_pod_key(copy)
    state = IndexState.build({charged_pod_key(real): slim_charged_pod(real)}, CHARGED_PODS)
    state = state.put(
        charged_pod_key(copy), slim_charged_pod(copy), CHARGED_PODS.group_by, CHARGED_PODS.tally
    )
    assert state.tallies["ml/h100"][0] == 1000
    state = state.remove(charged_pod_key(copy), CHARGED_PODS.group_by, CHARGED_PODS.tally)
    assert state.tallies["ml/h100"][0] == 1000  # deleting the copy leaves the real charge
