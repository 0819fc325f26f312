"""What a mutator declares it reads of the Pod (``Mutator.reads``), and the engine running a mutator
again only when another's change touched that: each declaration held to its mutator's behaviour (a
run that changed nothing gives the same answer on a Pod changed anywhere else, as does an
idempotent mutator's run on its own result), a lease's stamp running again exactly the mutators
that read it, and what the engine tells a change touched. (The engine's answer against running
every mutator again, for any Pod and configuration: tests/core/test_any_pod.py.)"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from function.core.config import parse_config
from function.core.engine import Engine, changed_parts
from function.core.leases import CHARGED_PODS, LEASE_LABEL, LEASES, STATE_LABEL, slim_lease
from function.core.mutators.base import (
    ANYTHING,
    EVERYTHING,
    Action,
    Changed,
    Keys,
    Mutator,
    MutatorResult,
    Reads,
    RequestContext,
)
from function.core.mutators.gpu_leases import LEDGER_INDEX
from function.core.mutators.gpu_slicing import ORIGINAL_REQUEST, READS, SLICE_RATIO
from function.core.mutators.pod_mutations_mutator import JOBS, OUR_MUTATIONS, selection_reads
from function.core.podmutation.names import MARK_ANNOTATION
from function.core.view import PODS, REPLICASETS, Overlay, StaticView
from tests.support import compiled_mutation, mutation_records, pm

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
EXAMPLES = int(os.environ.get("CASTSLICE_PROPERTY_EXAMPLES", "300"))


def lease(name: str, namespace: str, count: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"lease-{namespace}-{name}",
            "creationTimestamp": "2026-11-25T00:00:00Z",
        },
        "spec": {"gpuModel": H100, "count": count, "duration": "720h"},
    }


MUTATIONS = (
    # Selects on the lease's stamp: it must run again once gpu-leases has stamped the Pod.
    pm("on-the-lease", {"filter": {"pod": {"labelsFilter": [{"key": LEASE_LABEL, "value": "h100"}]}},
                        "labels": {"lease-seen": "yes"}}),
    # A regex over label keys that the stamp's keys match.
    pm("any-castops-label", {"filterV2": {"pod": {"labels": {"matchers": [
        {"keyMatcher": {"type": "regex", "value": "castops\\.io/gpu-lease-.*"}}]}}},
        "annotations": {"regex-seen": "yes"}}),
    pm("on-app", {"filter": {"pod": {"labelsFilter": [{"key": "app", "value": "x"}]}},
                  "tolerations": [{"key": "app", "operator": "Exists"}]}),
    pm("on-toleration", {"filterV2": {"pod": {"tolerations": {"matchers": [
        {"keyMatcher": {"value": "app"}}]}}}, "labels": {"tolerates": "app"}}),
    pm("on-name", {"filter": {"workload": {"names": ["web-1", "web"]}}, "labels": {"named": "web"}}),
    pm("elsewhere", {"filter": {"workload": {"namespaces": ["other"]}}, "labels": {"never": "here"}}),
)  # fmt: skip


def cluster(mutations: tuple[dict[str, Any], ...] = MUTATIONS) -> Overlay:
    static = StaticView(
        {
            LEASES.index: {f"lease-{ns}": slim_lease(lease("h100", ns)) for ns in ("ml", "default")},
            CHARGED_PODS.index: {},
            OUR_MUTATIONS.index: mutation_records(mutations),
        },
        specs=(LEASES, CHARGED_PODS, PODS, REPLICASETS, JOBS, OUR_MUTATIONS),
    )
    return Overlay(static, {LEDGER_INDEX: {}}, now=NOW)


LEASES_AND_MUTATIONS = parse_config(
    {"excludedNamespaces": [], "podMutations": {"enabled": True}, "gpuLeases": {"enabled": True}}
)


def gpu_pod(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml", "labels": dict(labels)},
        "spec": {
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }


class Counted:
    """A mutator's runs, counted."""

    def __init__(self, inner: Mutator) -> None:
        self.inner = inner
        self.name = inner.name
        self.idempotent = getattr(inner, "idempotent", False)
        self.runs = 0
        declared = getattr(inner, "reads", None)
        if declared is not None:
            self.reads = declared

    def mutate(self, pod: Any, ctx: RequestContext) -> MutatorResult:
        self.runs += 1
        return self.inner.mutate(pod, ctx)


def decide(pod: dict[str, Any], mutations: tuple[dict[str, Any], ...], full: bool = False) -> Any:
    engine = Engine(LEASES_AND_MUTATIONS)
    engine.skip_repeated_runs = not full
    counted = [Counted(m) for m in engine.mutators]
    engine.mutators = counted  # type: ignore[assignment]
    request = RequestContext(uid="review-1", namespace="ml", cluster=cluster(mutations))
    decision = engine.decide(copy.deepcopy(pod), request)
    return decision, {m.name: m.runs for m in counted}


# --- a lease's stamp --------------------------------------------------------------------------------


def test_a_stamp_runs_again_only_the_mutators_reading_what_it_changed() -> None:
    # No PodMutation here reads the stamp: slicing and PodMutations run once; gpu-leases runs again
    # (it is not idempotent) and finds its own stamp.
    decision, runs = decide(gpu_pod(), MUTATIONS[2:])
    assert decision.outcome == "mutated" and decision.mutated_pod["metadata"]["labels"][LEASE_LABEL] == "h100"
    assert runs == {"gpu-slicing": 1, "pod-mutations": 1, "gpu-leases": 2}
    full, full_runs = decide(gpu_pod(), MUTATIONS[2:], full=True)
    assert decision == full and decision.mutated_pod == full.mutated_pod
    assert full_runs == {"gpu-slicing": 2, "pod-mutations": 2, "gpu-leases": 2}


@pytest.mark.parametrize("mutation", [MUTATIONS[0], MUTATIONS[1]], ids=["exact-key", "regex-key"])
def test_a_podmutation_selecting_on_the_lease_stamp_runs_again_and_applies(mutation: dict[str, Any]) -> None:
    decision, runs = decide(gpu_pod(), (mutation,))
    full, _ = decide(gpu_pod(), (mutation,), full=True)
    assert decision == full and decision.mutated_pod == full.mutated_pod
    assert runs["pod-mutations"] == 3  # before the stamp, after it (applies), and on its own mark
    acted = {d.mutator: d.action for d in decision.decisions}
    assert acted["pod-mutations"] is Action.mutated and acted["gpu-leases"] is Action.mutated
    assert MARK_ANNOTATION in decision.mutated_pod["metadata"]["annotations"]


def test_a_podmutation_on_other_labels_runs_again_when_a_change_touches_them() -> None:
    # gpu-leases adds no `app` label; a Pod already labelled app=x is matched on the first run.
    decision, _ = decide(gpu_pod(app="x"), MUTATIONS[2:])
    assert {d.mutator: d.action for d in decision.decisions}["pod-mutations"] is Action.mutated
    full, _ = decide(gpu_pod(app="x"), MUTATIONS[2:], full=True)
    assert decision == full and decision.mutated_pod == full.mutated_pod


# --- what a PodMutations run reads ------------------------------------------------------------------


def test_podmutations_read_only_the_mark_and_the_opt_out_where_none_may_match() -> None:
    mutations = [compiled_mutation({"filter": {"workload": {"namespaces": ["other"]}}, "labels": {"a": "b"}})]
    reads = selection_reads(mutations, "ml")
    assert not reads.touched_by(Changed(frozenset({LEASE_LABEL, STATE_LABEL}), frozenset(), frozenset()))
    assert reads.touched_by(Changed(frozenset(), frozenset({MARK_ANNOTATION}), frozenset()))
    assert reads.touched_by(Changed(frozenset({"pod-mutator.cast.ai/ignore"}), frozenset(), frozenset()))
    assert selection_reads(mutations, "other").touched_by(Changed(paths=frozenset({("metadata", "name")})))


def test_podmutations_read_the_label_keys_their_filters_name_or_match() -> None:
    exact = selection_reads(
        [compiled_mutation({"filter": {"pod": {"labelsFilter": [{"key": "team"}]}}})], "ml"
    )
    assert exact.touched_by(Changed(frozenset({"team"})))
    assert not exact.touched_by(Changed(frozenset({LEASE_LABEL})))
    regex = compiled_mutation(
        {"filterV2": {"pod": {"labels": {"matchers": [{"keyMatcher": {"type": "regex", "value": "te.*"}}]}}}}
    )
    reads = selection_reads([regex], "ml")
    assert reads.touched_by(Changed(frozenset({"tenant"}))) and not reads.touched_by(
        Changed(frozenset({"app"}))
    )
    assert reads.touched_by(Changed(None))  # the labels map itself replaced


# --- what the engine tells a change touched ---------------------------------------------------------


def parts(before: dict[str, Any], after: dict[str, Any]) -> Changed:
    return changed_parts(orjson.dumps(before), after, orjson.dumps(after))


def test_a_change_touches_the_keys_and_places_that_differ_as_json() -> None:
    before = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"priority": 1, "nodeSelector": {}}}
    after = {
        "metadata": {"labels": {"a": "1", "c": "3"}, "annotations": {"x": "y"}},
        "spec": {"priority": 2, "nodeSelector": {}},
    }
    expected = Changed(frozenset({"b", "c"}), frozenset({"x"}), frozenset({("spec", "priority")}))
    assert parts(before, after) == expected
    assert parts(before, copy.deepcopy(before)) == Changed()


def test_a_change_only_json_sees_touches_everything() -> None:
    # 1 and true are equal to Python's ==: the change is found by the Pod's exact JSON, and then
    # nothing is known of where it is.
    before = {"metadata": {"labels": {"a": "1"}}, "spec": {"priority": 1, "hostNetwork": True}}
    after = {"metadata": {"labels": {"a": "2"}}, "spec": {"priority": True, "hostNetwork": True}}
    assert parts(before, after) == ANYTHING
    assert changed_parts(orjson.dumps(before), after) == ANYTHING  # the Pod's JSON after unknown


def test_a_map_that_is_not_a_map_touches_every_key() -> None:
    assert parts({"metadata": {"labels": None}}, {"metadata": {"labels": {"a": "1"}}}).labels is None
    replaced = parts({"metadata": {"labels": {"a": "1"}}}, {"metadata": "junk"})
    assert replaced.labels is None and replaced.annotations is None and ("metadata",) in replaced.paths
    assert changed_parts(None, {}) == ANYTHING


def test_a_read_is_touched_by_a_change_above_below_or_at_it() -> None:
    reads = Reads(Keys(), Keys(frozenset({"k"})), (("spec", "containers"),))
    assert reads.touched_by(Changed(paths=frozenset({("spec",)})))
    assert reads.touched_by(Changed(paths=frozenset({("spec", "containers")})))
    assert not reads.touched_by(Changed(paths=frozenset({("spec", "nodeSelector")})))
    assert reads.touched_by(Changed(annotations=None)) and not reads.touched_by(Changed(labels=None))
    assert EVERYTHING.touched_by(Changed(paths=frozenset({("status",)})))


# --- every declaration held to its mutator ----------------------------------------------------------

LABEL_KEYS = ["app", "team", LEASE_LABEL, STATE_LABEL, "pod-mutator.cast.ai/ignore", "pod-template-hash"]
ANNOTATION_KEYS = [
    "castops.io/optimize",
    "castops.io/workload-type",
    SLICE_RATIO,
    ORIGINAL_REQUEST,
    MARK_ANNOTATION,
    "castops.io/gpu-lease-charge",
    "note",
]
VALUES = {
    "castops.io/optimize": ["true", "false"],
    "castops.io/workload-type": ["training", "inference", "nope"],
    SLICE_RATIO: ["2", "3", "x"],
    MARK_ANNOTATION: ["on-app/1", "junk"],
}
PLACES: dict[tuple[str, ...], list[Any]] = {
    ("metadata", "name"): ["web-1", "train-2"],
    ("metadata", "ownerReferences"): [
        [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7f", "uid": "rs-1", "controller": True}]
    ],
    ("spec", "nodeSelector"): [{"nvidia.com/gpu.product": H100}, {}],
    ("spec", "tolerations"): [[{"key": "app", "operator": "Exists"}], []],
    ("spec", "priority"): [5],
    ("spec", "schedulingGates"): [[{"name": "castops.io/gpu-lease"}]],
    ("spec", "containers"): [
        [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    ],
    ("spec", "initContainers"): [
        [{"name": "i", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    ],
    ("spec", "resourceClaims"): [[{"name": "own", "resourceClaimTemplateName": "t"}]],
}


@st.composite
def any_pod(draw: Any) -> dict[str, Any]:
    def value(key: str) -> Any:
        return draw(st.sampled_from(VALUES.get(key, ["x", "h100", "true"])))

    labels = {key: value(key) for key in draw(st.lists(st.sampled_from(LABEL_KEYS), unique=True, max_size=4))}
    annotations = {
        key: value(key) for key in draw(st.lists(st.sampled_from(ANNOTATION_KEYS), unique=True, max_size=4))
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "p-", "namespace": "ml", "labels": labels, "annotations": annotations},
        "spec": {"containers": draw(st.sampled_from(PLACES[("spec", "containers")]))},
    }
    for place in draw(st.lists(st.sampled_from(sorted(PLACES)), unique=True, max_size=3)):
        pod[place[0]][place[1]] = copy.deepcopy(draw(st.sampled_from(PLACES[place])))
    return pod


def elsewhere(reads: Reads) -> list[Callable[[dict[str, Any]], None]]:
    """Every change of a Pod outside ``reads`` these tests know: each label or annotation key it
    does not read set to each value or removed, each place it does not read replaced or removed."""
    changes: list[Callable[[dict[str, Any]], None]] = []
    for section, keys, declared in (
        ("labels", LABEL_KEYS, reads.labels),
        ("annotations", ANNOTATION_KEYS, reads.annotations),
    ):
        for key in [*keys, "other"]:
            if not declared.hit({key}):
                for value in [None, *VALUES.get(key, ["x", "h100", "true"])]:
                    changes.append(set_key(section, key, value))
    for place, values in PLACES.items():
        if not reads.touched_by(Changed(paths=frozenset({place}))):
            for value in [None, *values]:
                changes.append(replace(place, value))
    return changes


def set_key(section: str, key: str, value: str | None) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        values = pod["metadata"].setdefault(section, {})
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value

    return change


def replace(place: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        if value is None:
            pod[place[0]].pop(place[1], None)
        else:
            pod[place[0]][place[1]] = copy.deepcopy(value)

    return change


DECLARING = {
    "gpu-slicing": parse_config({"excludedNamespaces": []}),
    "gpu-slicing-dra": parse_config({"excludedNamespaces": [], "gpuSlicing": {"backend": "dra"}}),
    "gpu-slicing-warn": parse_config({"excludedNamespaces": [], "invalidAnnotations": "warn"}),
    "pod-mutations": LEASES_AND_MUTATIONS,
}


def declaring_mutators(config_name: str) -> list[Mutator]:
    mutators = Engine(DECLARING[config_name]).mutators
    return [m for m in mutators if getattr(m, "reads", None) is not None]


def declaration_problem(
    mutator: Mutator, reads: Reads, pod: dict[str, Any], change: Callable[[dict[str, Any]], None],
    request: RequestContext,
) -> str | None:  # fmt: skip
    """Why ``reads`` is not what ``mutator`` reads, shown by ``pod`` and ``change`` (a change
    outside ``reads``), or None. The engine skips a mutator's run after another's change outside
    its reads when its last run changed nothing, or changed the Pod and it is idempotent: so a Pod
    it leaves unchanged (``pod``, or its own result) must stay unchanged, with the same answer, once
    changed outside its reads."""
    settled = copy.deepcopy(pod)
    result = mutator.mutate(settled, request)
    if result.action is Action.denied:
        return None
    if result.action is Action.mutated:
        if not getattr(mutator, "idempotent", False):
            return None  # the engine always runs it again after its own change
        result = mutator.mutate(settled, request)
        if result.action is not Action.unchanged:
            return f"{mutator.name} is not idempotent: {result.reason}"
    change(settled)
    changed = copy.deepcopy(settled)
    again = mutator.mutate(changed, request)
    if (again.action, again.reason, again.warnings) != (result.action, result.reason, result.warnings):
        return f"{mutator.name} answered {again.action.value} ({again.reason}), not {result.reason}"
    if changed != settled:
        return f"{mutator.name} changed a Pod it left alone before"
    return None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=any_pod(), config_name=st.sampled_from(sorted(DECLARING)))
def test_a_declaring_mutator_answers_the_same_for_a_pod_changed_only_where_it_does_not_read(
    pod: dict[str, Any], config_name: str
) -> None:
    request = RequestContext(uid="review-1", namespace="ml", cluster=cluster())
    mutators = declaring_mutators(config_name)
    assert mutators  # the property is exercised
    for mutator in mutators:
        reads = mutator.reads(request)  # type: ignore[attr-defined]
        assert reads != EVERYTHING
        for change in elsewhere(reads):
            assert declaration_problem(mutator, reads, pod, change, request) is None


def gpus(count: str, **annotations: str) -> dict[str, Any]:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = count
    pod["metadata"]["annotations"] = {"castops.io/optimize": "true", **annotations}
    return pod


def ask_gpus(count: str) -> Callable[[dict[str, Any]], None]:
    return lambda pod: pod["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": count})


WITHOUT_SLICE_RATIO = Reads(Keys(), Keys(READS.annotations.names - {SLICE_RATIO}), READS.paths)
WITHOUT_CONTAINERS = Reads(Keys(), READS.annotations, (("spec", "initContainers"),))
WITHOUT_THE_LEASE_LABEL = Reads(Keys(frozenset({"app"})), Keys(frozenset({MARK_ANNOTATION})), ())


@pytest.mark.parametrize(
    ("config_name", "left_out", "pod", "change"),
    [
        # Two GPUs are left whole, unless a slice ratio says to slice them.
        ("gpu-slicing", WITHOUT_SLICE_RATIO, gpus("2"), set_key("annotations", SLICE_RATIO, "2")),
        # Sliced, and then a container asks for a GPU again.
        ("gpu-slicing", WITHOUT_CONTAINERS, gpus("1"), ask_gpus("1")),
        # Matched by no PodMutation, until the lease's stamp.
        ("pod-mutations", WITHOUT_THE_LEASE_LABEL, gpu_pod(), set_key("labels", LEASE_LABEL, "h100")),
    ],
    ids=["slicing-without-slice-ratio", "slicing-without-containers", "podmutations-without-the-lease-label"],
)
def test_a_declaration_leaving_out_a_read_is_caught(
    config_name: str, left_out: Reads, pod: dict[str, Any], change: Callable[[dict[str, Any]], None]
) -> None:
    """The property above fails for a declaration that leaves out what the mutator reads."""
    request = RequestContext(uid="review-1", namespace="ml", cluster=cluster(MUTATIONS[:1]))
    (mutator,) = [m for m in declaring_mutators(config_name) if m.name == config_name]
    assert declaration_problem(mutator, left_out, pod, change, request) is not None


# --- the engine's answer against running every mutator again ----------------------------------------

ENGINE_CONFIGS = {
    "leases-podmutations": LEASES_AND_MUTATIONS,
    "leases-podmutations-spot-vgpu": parse_config(
        {
            "excludedNamespaces": [],
            "podMutations": {"enabled": True},
            "gpuLeases": {"enabled": True},
            "spot": {"enabled": True, "preset": "allSpotExceptKubeSystem"},
            "vgpu": {"enabled": True},
        }
    ),
    "leases-queue-dra": parse_config(
        {
            "excludedNamespaces": [],
            "invalidAnnotations": "warn",
            "podMutations": {"enabled": True},
            "gpuLeases": {"enabled": True},
            "gpuSlicing": {"backend": "dra"},
        }
    ),
}


class FullRunEngine(Engine):
    skip_repeated_runs = False


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pod=any_pod(),
    config_name=st.sampled_from(sorted(ENGINE_CONFIGS)),
    namespace=st.sampled_from(["ml", "default", "other"]),
    reverse=st.booleans(),
)
def test_running_again_only_what_a_change_touched_gives_the_full_runs_decision(
    pod: dict[str, Any], config_name: str, namespace: str, reverse: bool
) -> None:
    # In reverse order too: PodMutations and slicing then run after the lease's stamp.
    config = ENGINE_CONFIGS[config_name]
    mutators = Engine(config).mutators[:: -1 if reverse else 1]
    request = RequestContext(uid="review-1", namespace=namespace, cluster=cluster())
    smart = Engine(config, mutators, []).decide(copy.deepcopy(pod), request)
    full = FullRunEngine(config, mutators, []).decide(copy.deepcopy(pod), request)
    assert smart == full and smart.mutated_pod == full.mutated_pod
