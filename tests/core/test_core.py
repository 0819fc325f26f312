"""Unit tests of the pure core: quantities, apiserver rules, patches and their proof, config, engine."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from function.core.config import Config, ConfigError, parse_config
from function.core.engine import Engine, NotConverged
from function.core.mutators.base import Action, MutatorResult, RequestContext
from function.core.quantity import QuantityError, parse_quantity
from function.core.rules import extended_resource_violations, is_extended_resource


# -- quantities --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("0", 0),
        ("+2", 2),
        ("-3", -3),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("500m", Fraction(1, 2)),
        ("3k", 3000),
        ("1Ki", 1024),
        ("2Gi", 2 * 2**30),
        ("1e3", 1000),
        ("1E-2", Fraction(1, 100)),
        ("10n", Fraction(1, 10**8)),
        (7, 7),
        (2.5, Fraction(5, 2)),
    ],
)
def test_quantities_parse_like_the_apiserver(text: Any, value: Any) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", " 1", "1 ", "1.5.0", "0x10", "1e", "1Kb", "abc", "1ki", "--1", True, None, [1]]
)
def test_quantities_the_apiserver_rejects(text: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


# -- apiserver rules ---------------------------------------------------------------------------
def pod_with(resources: dict[str, Any], kind: str = "containers") -> dict[str, Any]:
    return {"kind": "Pod", "spec": {kind: [{"name": "c", "resources": resources}]}}


def test_extended_resource_names() -> None:
    assert is_extended_resource("nvidia.com/gpu")
    assert not is_extended_resource("cpu")
    assert not is_extended_resource("hugepages-2Mi")
    assert not is_extended_resource("kubernetes.io/something")
    assert not is_extended_resource("requests.nvidia.com/gpu")


@pytest.mark.parametrize(
    ("resources", "problem"),
    [
        ({"requests": {"nvidia.com/gpu": "1"}}, "has a request but no limit"),
        ({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}, "must equal its limit"),
        ({"limits": {"nvidia.com/gpu": "1.5"}}, "must be an integer"),
        (
            {"limits": {"nvidia.com/gpu": "500m"}, "requests": {"nvidia.com/gpu": "500m"}},
            "must be an integer",
        ),
        ({"limits": {"nvidia.com/gpu": "-1"}}, "must be non-negative"),
        ({"limits": {"nvidia.com/gpu": "x"}}, "not a valid quantity"),
    ],
)
def test_extended_resource_violations(resources: dict[str, Any], problem: str) -> None:
    found = extended_resource_violations(pod_with(resources, "initContainers"))
    assert any(problem in p for p in found), found


def test_valid_extended_resources_have_no_violations() -> None:
    assert not extended_resource_violations(pod_with({"limits": {"nvidia.com/gpu": "1"}}))
    assert not extended_resource_violations(
        pod_with(
            {"limits": {"nvidia.com/gpu": "1", "cpu": "500m"}, "requests": {"nvidia.com/gpu": 1, "cpu": "1"}}
        )
    )


# -- configuration ------------------------------------------------------------------------------
def test_defaults_are_the_seed_presets() -> None:
    config = Config()
    assert config.gpuSlicing.presets == {"training": 4, "inference": 2, "batch": 2, "dev": 1}
    assert config.gpuSlicing.targetResource == "nvidia.com/gpu-shared"
    assert config.onInternalError.value == "admit" and config.invalidAnnotations.value == "deny"
    assert "kube-system" in config.excludedNamespaces


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpuSlicing": {"sourceResources": "x"}}, "gpuSlicing.sourceResources: unknown key"),
        ({"gpuSlicing": {"targetResource": "gpu"}}, "gpuSlicing.targetResource"),
        ({"gpuSlicing": {"presets": {"training": 0}}}, "gpuSlicing.presets.training"),
        ({"gpuSlicing": {"targetResource": "nvidia.com/gpu"}}, "must differ"),
        ({"onInternalError": "panic"}, "onInternalError"),
        ({"excludedNamespaces": "kube-system"}, "excludedNamespaces"),
        ([1, 2], "top level must be a mapping"),
    ],
)
def test_bad_configuration_names_the_key(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config(data, "test.yaml")


def test_digest_identifies_the_effective_configuration() -> None:
    assert Config().digest() == parse_config({}).digest()
    assert Config().digest() != parse_config({"invalidAnnotations": "warn"}).digest()


# -- the engine --------------------------------------------------------------------------------
GPU_POD = {
    "kind": "Pod",
    "metadata": {"annotations": {"castops.io/optimize": "true"}},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}
REQUEST = RequestContext(uid="u1", namespace="default")


class Liar:
    name = "liar"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        pod["spec"]["nodeName"] = "sneaky"
        return MutatorResult.unchanged("did nothing, honest")


class Boaster:
    name = "boaster"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        return MutatorResult.mutated("changed everything")


class Counter:
    """Never converges: bumps an annotation on every pass."""

    name = "counter"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
        annotations["n"] = str(int(annotations.get("n", "0")) + 1)
        return MutatorResult.mutated("bumped")


class BreaksTheRules:
    """Produces a request without a limit: the apiserver would reject the Pod."""

    name = "rule-breaker"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        resources = pod["spec"]["containers"][0]["resources"]
        if "requests" in resources:
            return MutatorResult.unchanged("already done")
        resources["requests"] = {"example.com/fpga": "1"}
        return MutatorResult.mutated("added an fpga request")


class MutatesThenDenies:
    """Adds a marker, then denies the Pod carrying it: the second pass's denial must win."""

    name = "second-thoughts"

    def mutate(self, pod: dict[str, Any], request: RequestContext) -> MutatorResult:
        metadata = pod.setdefault("metadata", {})
        if "marker" in metadata:
            return MutatorResult.denied("second-thoughts: the marker is not allowed")
        metadata["marker"] = "x"
        return MutatorResult.mutated("added a marker")


def test_a_denial_in_a_later_pass_is_final() -> None:
    decision = Engine(Config(), [MutatesThenDenies()]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "denied" and not decision.allowed and not decision.patch
    assert decision.denial == "second-thoughts: the marker is not allowed"


@pytest.mark.parametrize("mutator", [Liar(), Boaster()])
def test_a_mutator_misreporting_its_action_is_an_internal_error(mutator: Any) -> None:
    decision = Engine(Config(), [mutator]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "error" and decision.allowed and not decision.patch
    assert "MutatorLied" in decision.reason


def test_non_converging_mutators_are_an_internal_error() -> None:
    decision = Engine(Config(), [Counter()]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "error" and "NotConverged" in decision.reason and not decision.patch


def test_a_patch_breaking_apiserver_rules_is_withheld() -> None:
    decision = Engine(Config(), [BreaksTheRules()]).decide(GPU_POD, REQUEST)
    assert decision.outcome == "error" and decision.allowed and not decision.patch
    assert "request but no limit" in decision.reason
    assert decision.warnings == ("castslice: mutation withheld by a safety check; Pod admitted unchanged",)


def test_run_to_fixed_point_raises_not_converged() -> None:
    with pytest.raises(NotConverged):
        Engine(Config(), [Counter()]).run_to_fixed_point(GPU_POD, REQUEST)


def test_engine_never_mutates_its_input() -> None:
    import copy

    before = copy.deepcopy(GPU_POD)
    decision = Engine(Config()).decide(GPU_POD, REQUEST)
    assert decision.outcome == "mutated" and before == GPU_POD


def test_decisions_say_which_mutator_did_what() -> None:
    decision = Engine(Config()).decide(GPU_POD, REQUEST)
    assert [(d.mutator, d.action) for d in decision.decisions] == [("gpu-slicing", Action.mutated)]
    assert decision.acting_mutators == ("gpu-slicing",)
    assert "nvidia.com/gpu -> nvidia.com/gpu-shared: 1 (default)" in decision.decisions[0].reason
    assert decision.as_dict()["mutators"][0]["mutator"] == "gpu-slicing"


def test_excluded_namespace_and_opt_out_label() -> None:
    engine = Engine(Config())
    assert (
        engine.decide(GPU_POD, RequestContext(namespace="kube-system")).reason
        == "namespace kube-system is excluded"
    )
    labelled = {**GPU_POD, "metadata": {**GPU_POD["metadata"], "labels": {"castops.io/webhook": "ignore"}}}
    assert "opted out" in engine.decide(labelled, REQUEST).reason


def test_an_opted_in_pod_whose_first_container_has_resources_but_no_gpu() -> None:
    """The first container has resources without the source resource: it is passed over (not
    stopped at), untouched, and the GPU container after it is sliced."""
    pod = {
        "kind": "Pod",
        "metadata": {"annotations": {"castops.io/optimize": "true"}},
        "spec": {
            "containers": [
                {"name": "sidecar", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}},
                {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]
        },
    }
    decision = Engine(Config()).decide(pod, REQUEST)
    assert decision.outcome == "mutated"
    assert decision.mutated_pod is not None
    sidecar, gpu = decision.mutated_pod["spec"]["containers"]
    assert sidecar == pod["spec"]["containers"][0]
    assert gpu["resources"] == {
        "limits": {"nvidia.com/gpu-shared": "1"},
        "requests": {"nvidia.com/gpu-shared": "1"},
    }
    assert decision.decisions[0].reason.endswith("in containers/gpu")
