"""GPU slicing (function/core/mutators/gpu_slicing.py) in full: what it does to each container, and
the reason and warnings it gives, word for word (they reach the audit event, the reply's warnings and
`castslice mutate`)."""

from __future__ import annotations

from typing import Any

from function.core.config import parse_config
from function.core.engine import Engine
from function.core.mutators.base import Action, Mutator, MutatorResult, RequestContext

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
    return {"metadata": {"annotations": annotations}, "spec": {"containers": list(containers)}}


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
