"""GPU slicing (function/core/mutators/gpu_slicing.py) in full: what it does to each container, and
the reason and warnings it gives, word for word (they reach the audit event, the reply's warnings and
`castslice mutate`); a multi-GPU container left whole unless a ratio asks; only to a resource some
node advertises."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core.config import parse_config, watches_for
from function.core.engine import Engine
from function.core.mutators.base import Action, Mutator, MutatorResult, RequestContext
from function.core.view import EMPTY_VIEW, NODES, NodeRecord, StaticView

CTX = RequestContext(uid="u", namespace="ml")
OPT_IN = {"castops.io/optimize": "true"}
TYPO_WARNING = (
    'castslice: castops.io/workload-type="nope" unknown (slice-ratio 4 applies); '
    "use batch, dev, inference, training"
)


def slicing(config: dict[str, Any] | None = None) -> Mutator:
    (mutator, *_) = Engine(parse_config(config or {})).mutators
    assert mutator.name == "gpu-slicing"
    return mutator


def pod(annotations: dict[str, Any], *containers: dict[str, Any]) -> dict[str, Any]:
    # A copy: slicing records the original request in the Pod's annotations.
    return {"metadata": {"annotations": dict(annotations)}, "spec": {"containers": list(containers)}}


def container(name: str, **resources: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "resources": resources}


def answer(result: MutatorResult) -> tuple[Action, str, tuple[str, ...]]:
    return result.action, result.reason, result.warnings


def test_a_container_asking_for_zero_gpus_is_left_alone_and_the_next_one_is_still_sliced() -> None:
    subject = pod(
        OPT_IN,
        container("a", limits={"nvidia.com/gpu": "0"}),
        container("b", limits={"nvidia.com/gpu": "1"}),
        container("c", limits={"nvidia.com/gpu": "1"}, requests={"cpu": "1"}),
    )
    assert answer(slicing().mutate(subject, CTX)) == (
        Action.mutated,
        "nvidia.com/gpu -> nvidia.com/gpu-shared: 1 (default) in containers/b, containers/c; "
        "containers/a asks for 0 nvidia.com/gpu, left alone",
        (),
    )
    a, b, c = subject["spec"]["containers"]
    assert a["resources"] == {"limits": {"nvidia.com/gpu": "0"}}
    assert b["resources"] == {
        "limits": {"nvidia.com/gpu-shared": "1"},
        "requests": {"nvidia.com/gpu-shared": "1"},
    }
    # A section without the GPU (requests with only cpu) gets the slices and keeps the rest.
    assert c["resources"] == {
        "limits": {"nvidia.com/gpu-shared": "1"},
        "requests": {"cpu": "1", "nvidia.com/gpu-shared": "1"},
    }


def test_a_ratio_written_another_way_says_how_it_was_read_and_a_workload_typo_warns() -> None:
    annotations = {**OPT_IN, "castops.io/slice-ratio": "04", "castops.io/workload-type": "nope"}
    subject = pod(annotations, container("a", limits={"nvidia.com/gpu": "1"}))
    assert answer(slicing().mutate(subject, CTX)) == (
        Action.mutated,
        'nvidia.com/gpu -> nvidia.com/gpu-shared: 4 (castops.io/slice-ratio="04", read as 4) in containers/a',
        (TYPO_WARNING,),
    )


def test_a_ratio_written_plainly_is_quoted_as_it_is() -> None:
    subject = pod({**OPT_IN, "castops.io/slice-ratio": "4"}, container("a", limits={"nvidia.com/gpu": "1"}))
    assert slicing().mutate(subject, CTX).reason == (
        "nvidia.com/gpu -> nvidia.com/gpu-shared: 4 (castops.io/slice-ratio=4) in containers/a"
    )


def test_nothing_to_slice_keeps_the_warnings() -> None:
    annotations = {**OPT_IN, "castops.io/slice-ratio": "4", "castops.io/workload-type": "nope"}
    subject = pod(annotations, container("a", limits={"nvidia.com/gpu": "0"}))
    assert answer(slicing().mutate(subject, CTX)) == (
        Action.unchanged,
        "opted in, but no container requests nvidia.com/gpu; "
        "containers/a asks for 0 nvidia.com/gpu, left alone",
        (TYPO_WARNING,),
    )


def test_not_opted_in_says_what_the_annotation_was() -> None:
    assert (
        slicing().mutate(pod({}, container("a")), CTX).reason == "not opted in (castops.io/optimize absent)"
    )
    assert slicing().mutate(pod({"castops.io/optimize": "yes"}, container("a")), CTX).reason == (
        'not opted in (castops.io/optimize is "yes", not "true")'
    )


def test_a_vgpu_resource_names_the_container_that_asks_for_it() -> None:
    mutator = slicing({"vgpu": {"enabled": True}, "invalidAnnotations": "warn"})
    subject = pod(OPT_IN, container("a"), container("b", limits={"nvidia.com/gpumem": "1000"}))
    assert answer(mutator.mutate(subject, CTX)) == (
        Action.unchanged,
        "opted in, but containers/b asks for HAMi vGPU resource nvidia.com/gpumem: not sliced",
        (
            "castslice: Pod not sliced, nvidia.com/gpumem is a HAMi vGPU resource; "
            "remove castops.io/optimize or it",
        ),
    )


def test_a_container_without_a_name_is_named_by_its_index() -> None:
    subject = pod(
        OPT_IN,
        {"resources": {"limits": {"nvidia.com/gpu": "0"}}},
        container("z", limits={"nvidia.com/gpu": "0"}),
        {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
    )
    assert slicing().mutate(subject, CTX).reason == (
        "nvidia.com/gpu -> nvidia.com/gpu-shared: 1 (default) in containers/2; "
        "containers/0, containers/z asks for 0 nvidia.com/gpu, left alone"
    )
    vgpu = slicing({"vgpu": {"enabled": True}, "invalidAnnotations": "warn"})
    unnamed = pod(OPT_IN, {"resources": {"limits": {"nvidia.com/gpumem": "1"}}})
    assert vgpu.mutate(unnamed, CTX).reason == (
        "opted in, but containers/0 asks for HAMi vGPU resource nvidia.com/gpumem: not sliced"
    )


def test_a_bad_annotation_under_warn_is_explained_in_the_reason_and_the_warning() -> None:
    mutator = slicing({"invalidAnnotations": "warn"})
    subject = pod(
        {**OPT_IN, "castops.io/slice-ratio": "zero"}, container("a", limits={"nvidia.com/gpu": "1"})
    )
    assert answer(mutator.mutate(subject, CTX)) == (
        Action.unchanged,
        'annotation castops.io/slice-ratio: "zero" is not valid; accepted: a whole number from 1 to 1000 '
        "in digits 0-9 (a leading + or leading zeros are allowed)",
        (
            'castslice: castops.io/slice-ratio="zero" ignored, Pod not sliced; '
            "use digits 0-9 for a whole number 1-1000",
        ),
    )
    assert subject["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}


# -- never split a job across slices of one device ------------------------------------------------
@pytest.mark.parametrize(
    "annotations",
    [
        OPT_IN,
        {**OPT_IN, "castops.io/workload-type": "training"},
        {**OPT_IN, "castops.io/workload-type": "dev"},
    ],
)
def test_a_container_asking_for_several_gpus_is_left_whole_without_an_explicit_ratio(
    annotations: dict[str, str],
) -> None:
    subject = pod(
        annotations,
        container("launcher", limits={"nvidia.com/gpu": "1"}),
        container("trainer", limits={"nvidia.com/gpu": "2"}),
    )
    before = copy.deepcopy(subject)
    action, reason, warnings = answer(slicing().mutate(subject, CTX))
    assert action is Action.unchanged and subject == before
    assert reason.startswith("opted in, but containers/trainer asks for 2 nvidia.com/gpu: not sliced, ")
    assert reason.endswith(
        "(asked: containers/launcher: nvidia.com/gpu=1; containers/trainer: nvidia.com/gpu=2)"
    )
    assert warnings == (
        "castslice: multi-GPU containers/trainer (2 nvidia.com/gpu) not sliced; "
        "set castops.io/slice-ratio to force",
    )


def test_an_explicit_ratio_slices_a_multi_gpu_container_and_records_what_it_asked() -> None:
    subject = pod(
        {**OPT_IN, "castops.io/slice-ratio": "4"}, container("trainer", limits={"nvidia.com/gpu": "2"})
    )
    action, reason, warnings = answer(slicing().mutate(subject, CTX))
    assert action is Action.mutated and not warnings
    assert reason == (
        "nvidia.com/gpu -> nvidia.com/gpu-shared: 4 (castops.io/slice-ratio=4) in containers/trainer "
        "(asked 2 nvidia.com/gpu)"
    )
    assert subject["metadata"]["annotations"]["castops.io/original-gpu-request"] == (
        "containers/trainer: nvidia.com/gpu=2"
    )


def test_every_multi_gpu_container_is_named_in_the_reason() -> None:
    subject = pod(
        OPT_IN, container("a", limits={"nvidia.com/gpu": "2"}), container("b", limits={"nvidia.com/gpu": "8"})
    )
    reason = slicing().mutate(subject, CTX).reason
    assert "containers/a asks for 2, containers/b asks for 8 nvidia.com/gpu: not sliced" in reason


# -- only to a resource some node advertises ------------------------------------------------------
NODE_CHECK = {"gpuSlicing": {"requireAdvertisedTarget": True}}


def nodes_view(*offers: dict[str, str]) -> StaticView:
    records = {
        f"node-{number}": NodeRecord(
            f"node-{number}", "", (), tuple(x for pair in sorted(allocatable.items()) for x in pair)
        )
        for number, allocatable in enumerate(offers)
    }
    return StaticView({NODES.index: records}, (NODES,))


def with_view(view: Any) -> RequestContext:
    return RequestContext(uid="u", namespace="ml", cluster=view)


def test_no_node_offering_the_target_leaves_the_pod_whole_and_names_the_resource() -> None:
    subject = pod(OPT_IN, container("a", limits={"nvidia.com/gpu": "1"}))
    before = copy.deepcopy(subject)
    ctx = with_view(nodes_view({"nvidia.com/gpu": "8"}, {"cpu": "4"}))
    action, reason, warnings = answer(slicing(NODE_CHECK).mutate(subject, ctx))
    assert action is Action.unchanged and subject == before
    assert reason.startswith("opted in, but no node advertises nvidia.com/gpu-shared (status.allocatable): ")
    assert warnings == (
        "castslice: not sliced, no node offers nvidia.com/gpu-shared; Pod keeps its nvidia.com/gpu",
    )


def test_a_node_offering_the_target_lets_the_pod_be_sliced() -> None:
    subject = pod(OPT_IN, container("a", limits={"nvidia.com/gpu": "1"}))
    ctx = with_view(nodes_view({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu-shared": "32"}))
    action, reason, _ = answer(slicing(NODE_CHECK).mutate(subject, ctx))
    assert (action, reason) == (
        Action.mutated,
        "nvidia.com/gpu -> nvidia.com/gpu-shared: 1 (default) in containers/a",
    )


def test_a_node_offering_none_of_the_target_does_not_count() -> None:
    ctx = with_view(nodes_view({"nvidia.com/gpu-shared": "0"}))
    result = slicing(NODE_CHECK).mutate(pod(OPT_IN, container("a", limits={"nvidia.com/gpu": "1"})), ctx)
    assert result.action is Action.unchanged and "no node advertises" in result.reason


@pytest.mark.parametrize(
    ("view", "why"),
    [
        (EMPTY_VIEW, "no cluster view"),
        (StaticView({}, (NODES,)), "cluster view not synced"),
        (nodes_view(), "no Node in the cluster view"),
    ],
)
def test_a_view_that_cannot_tell_slices_and_says_it_did_not_check(view: Any, why: str) -> None:
    result = slicing(NODE_CHECK).mutate(
        pod(OPT_IN, container("a", limits={"nvidia.com/gpu": "1"})), with_view(view)
    )
    assert result.action is Action.mutated
    assert result.reason.endswith(f"; whether a node offers nvidia.com/gpu-shared not checked ({why})")


def test_the_node_check_watches_nodes_only_when_on_and_never_with_the_dra_backend() -> None:
    assert watches_for(parse_config(NODE_CHECK)) == (NODES,)
    assert watches_for(parse_config({})) == ()
    dra = parse_config({"gpuSlicing": {"requireAdvertisedTarget": True, "backend": "dra"}})
    assert NODES not in watches_for(dra)


def test_a_multi_gpu_pod_is_left_whole_before_the_nodes_are_looked_at() -> None:
    subject = pod(OPT_IN, container("a", limits={"nvidia.com/gpu": "4"}))
    reason = slicing(NODE_CHECK).mutate(subject, with_view(nodes_view({"nvidia.com/gpu": "8"}))).reason
    assert "asks for 4 nvidia.com/gpu: not sliced" in reason
