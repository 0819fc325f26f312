"""function/core/mutators/vgpu.py, answer by answer: denials and reasons word for word, the env it writes
and the env it leaves, devices sharing or skipping a visible-devices env, the int64 edge, and the
plug-in as the registry builds it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core.configtypes import OnInvalidAnnotation
from function.core.mutators.base import Action, MutatorResult
from function.core.mutators.registry import Claims, Neighbours, Rename, Settings
from function.core.mutators.vgpu import PLUGIN, BadValue, Vgpu, VgpuConfig, VgpuDevice
from tests.core.test_vgpu import DENY, REQUEST, WARN, pod, run
from tests.core.test_vgpu import container as vgpu_container


def container(
    name: str = "cuda",
    *,
    resources: dict[str, str] | None = None,
    env: list[Any] | None = None,
    privileged: bool = False,
) -> dict[str, Any]:
    """tests/test_vgpu.py's container, with the resources as a map (names as Kubernetes writes them)."""
    made = vgpu_container(name, env, privileged)
    if resources:
        made["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    return made


NVIDIA: dict[str, Any] = {
    "vendor": "nvidia",
    "countResource": "nvidia.com/gpu",
    "memoryResource": "nvidia.com/gpumem",
    "priorityResource": "nvidia.com/priority",
    "visibleDevicesEnv": "NVIDIA_VISIBLE_DEVICES",
}
GPU = {"nvidia.com/gpu": "1"}
SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
"""A share of a GPU: no exclusive cores are added, so reasons stay short."""
TO_HAMI = "schedulerName (unset) -> hami-scheduler"


# --- denials and reasons ----------------------------------------------------------------------------


@pytest.mark.parametrize("containers", ["not a list", [], None])
def test_a_pod_without_a_container_list_is_denied(containers: object) -> None:
    target = pod(container(resources=GPU))
    target["spec"]["containers"] = containers
    result, _ = run(target)
    assert result == MutatorResult.denied(
        "castslice: Pod has no containers; spec.containers needs at least one"
    )


def test_a_bad_value_under_warn_keeps_the_message_as_reason() -> None:
    result, _ = run(pod(container(resources={"nvidia.com/gpumem": "lots"})), WARN)
    assert result == MutatorResult.unchanged(
        'containers/cuda: nvidia.com/gpumem "lots" is not valid; accepted: a whole number (0 or more)',
        'castslice: nvidia.com/gpumem="lots" in container cuda ignored; use a whole number >= 0',
    )


def test_a_bad_value_is_an_exception_that_reads_as_its_message() -> None:
    bad = BadValue("containers/a", "a", "nvidia.com/gpu", "x", "a whole number (0 or more)", "short")
    assert (
        str(bad)
        == bad.message
        == 'containers/a: nvidia.com/gpu "x" is not valid; accepted: a whole number (0 or more)'
    )


@pytest.mark.parametrize(
    ("name", "shown_as"),
    [(None, "?"), ("a" * 20, "a" * 20), ("b" * 21, "b" * 17 + "...")],
)
def test_warnings_name_the_container_cut_to_twenty_characters(name: str | None, shown_as: str) -> None:
    bad = container(resources={"nvidia.com/gpumem": "x"})
    if name is None:
        del bad["name"]
    else:
        bad["name"] = name
    result, _ = run(pod(bad), WARN)
    assert result.warnings == (
        f'castslice: nvidia.com/gpumem="x" in container {shown_as} ignored; use a whole number >= 0',
    )


def test_a_nameless_privileged_container_is_named_with_a_question_mark() -> None:
    privileged = container(privileged=True)
    del privileged["name"]
    result, _ = run(pod(container(resources=GPU), privileged))
    assert result == MutatorResult.denied(
        "castslice: vGPU Pod denied: container ? is privileged and would see every GPU of the node; "
        "remove securityContext.privileged or the vGPU resources"
    )


def test_a_long_node_name_is_quoted_cut_short() -> None:
    node = "n" * 70
    result, _ = run(pod(container(resources=GPU), nodeName=node))
    assert result == MutatorResult.denied(
        f'castslice: vGPU Pod denied: spec.nodeName is set ("{"n" * 61}...") but only hami-scheduler may '
        "place a vGPU Pod; remove spec.nodeName"
    )


def test_a_long_scheduler_name_is_quoted_cut_short() -> None:
    result, _ = run(pod(container(resources=GPU), schedulerName="s" * 70))
    assert result == MutatorResult.unchanged(f'Pod names scheduler "{"s" * 61}...": left alone')


def test_default_scheduler_named_outright_without_overwrite() -> None:
    result, _ = run(
        pod(container(resources=GPU), schedulerName="default-scheduler"), forceOverwriteDefaultScheduler=False
    )
    assert result == MutatorResult.unchanged(
        "Pod names default-scheduler and forceOverwriteDefaultScheduler is false: left alone"
    )


def test_the_reason_lists_every_container_and_resource() -> None:
    both = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    result, _ = run(pod(container("a", resources=both), container("b", resources=both)))
    assert result.reason == (
        "vGPU Pod: containers/a (nvidia.com/gpu, nvidia.com/gpumem), containers/b (nvidia.com/gpu, "
        f"nvidia.com/gpumem); {TO_HAMI}"
    )


def test_an_already_redirected_pod_says_so_and_notes_skipped_containers() -> None:
    target = pod(
        container("a", resources=SHARE),
        container("root", privileged=True, resources=GPU),
        schedulerName="hami-scheduler",
    )
    result, after = run(target, denyPrivileged=False)
    assert result.action is Action.unchanged
    assert result.reason == (
        "vGPU Pod: containers/a (nvidia.com/gpu, nvidia.com/gpumem); already for hami-scheduler; "
        "privileged containers/root skipped (denyPrivileged: false)"
    )
    assert after == target


# --- the int64 edge --------------------------------------------------------------------------------


def test_the_largest_int64_is_accepted_and_one_more_is_not() -> None:
    largest = str(2**63 - 1)
    result, _ = run(pod(container(resources={"nvidia.com/gpumem": largest, **GPU})))
    assert result.action is Action.mutated
    too_big = {"nvidia.com/gpumem": str(2**63), **GPU}
    denied, _ = run(pod(container(resources=too_big)))
    assert denied == MutatorResult.denied(
        f'castslice: containers/cuda: nvidia.com/gpumem "{2**63}" is not valid; '
        "accepted: a whole number below 2^63"
    )
    warned, _ = run(pod(container(resources=too_big)), WARN)
    assert warned.warnings == (
        'castslice: nvidia.com/gpumem="9223372..." in container cuda ignored; use a whole number < 2^63',
    )


# --- env --------------------------------------------------------------------------------------------

PRIORITY = {"nvidia.com/priority": "1"}


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        ({"name": "CUDA_TASK_PRIORITY", "value": "0"}, "value"),
        ({"name": "CUDA_TASK_PRIORITY", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}, "valueFrom"),
        (
            {"name": "CUDA_TASK_PRIORITY", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
            "valueFrom",
        ),
    ],
)
def test_the_priority_env_replaces_the_pods_and_says_which_kind_without_quoting_it(
    entry: dict[str, Any], kind: str
) -> None:
    result, after = run(pod(container(env=[entry], resources={**SHARE, **PRIORITY})))
    assert result.reason == (
        "vGPU Pod: containers/cuda (nvidia.com/gpu, nvidia.com/gpumem, nvidia.com/priority); "
        f"{TO_HAMI}; CUDA_TASK_PRIORITY=1 in containers/cuda (replaces the Pod's {kind})"
    )
    assert after["spec"]["containers"][0]["env"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]


def test_an_equal_priority_env_does_not_stop_the_visible_devices_env() -> None:
    own = {"name": "CUDA_TASK_PRIORITY", "value": "1"}
    result, after = run(pod(container(env=[own], resources=PRIORITY)), overwriteEnv=True)
    assert result.reason == "not a vGPU Pod; NVIDIA_VISIBLE_DEVICES=none in containers/cuda"
    assert after["spec"]["containers"][0]["env"] == [own, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


@pytest.mark.parametrize("junk", ["not a map", {"value": "no name"}, {"name": 5}])
def test_env_entries_that_are_no_named_maps_are_passed_over(junk: object) -> None:
    result, after = run(pod(container(env=[junk], resources={**GPU, **PRIORITY})))
    assert after["spec"]["containers"][0]["env"] == [junk, {"name": "CUDA_TASK_PRIORITY", "value": "1"}]
    assert result.reason.endswith("; CUDA_TASK_PRIORITY=1 in containers/cuda")


def two_devices(second_env: str) -> list[dict[str, Any]]:
    return [
        {"vendor": "acme", "countResource": "acme.com/gpu", "visibleDevicesEnv": "ACME_VISIBLE_DEVICES"},
        {"vendor": "other", "countResource": "other.com/gpu", "visibleDevicesEnv": second_env},
    ]


def test_a_pods_own_visible_devices_env_does_not_stop_the_next_one() -> None:
    own = {"name": "ACME_VISIBLE_DEVICES", "value": "all"}
    result, after = run(
        pod(container(env=[own])), overwriteEnv=True, devices=two_devices("OTHER_VISIBLE_DEVICES")
    )
    assert after["spec"]["containers"][0]["env"] == [own, {"name": "OTHER_VISIBLE_DEVICES", "value": "none"}]
    assert result.reason == "not a vGPU Pod; OTHER_VISIBLE_DEVICES=none in containers/cuda"


def test_a_device_without_a_visible_devices_env_does_not_hide_the_next_devices() -> None:
    devices = [{"vendor": "acme", "countResource": "acme.com/gpu"}, NVIDIA]
    _, after = run(pod(container()), overwriteEnv=True, devices=devices)
    assert after["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


def test_devices_sharing_one_visible_devices_env_each_keep_it_visible() -> None:
    devices = two_devices("ACME_VISIBLE_DEVICES")
    for resource in ("acme.com/gpu", "other.com/gpu"):
        result, after = run(pod(container(resources={resource: "1"})), overwriteEnv=True, devices=devices)
        assert "env" not in after["spec"]["containers"][0], resource
        assert result.reason.endswith(TO_HAMI)


# --- the plug-in as the registry builds it --------------------------------------------------------


def test_the_plugin_keeps_a_sliced_gpu_visible() -> None:
    shared = Rename(
        "nvidia.com/gpu", "nvidia.com/gpu.shared", "gpuSlicing.sourceResource", "gpuSlicing.targetResource"
    )
    mutator = PLUGIN.build(
        VgpuConfig(enabled=True, overwriteEnv=True), Settings(), Neighbours((Claims((shared,)),))
    )
    target = pod(container(resources={"nvidia.com/gpu.shared": "1"}))
    before = copy.deepcopy(target)
    result = mutator.mutate(target, REQUEST)
    assert result == MutatorResult.unchanged("not a vGPU Pod")
    assert target == before


@pytest.mark.parametrize(("policy", "action"), [(DENY, Action.denied), (WARN, Action.unchanged)])
def test_the_plugin_follows_the_invalid_annotations_policy(
    policy: OnInvalidAnnotation, action: Action
) -> None:
    mutator = PLUGIN.build(VgpuConfig(enabled=True), Settings(policy), Neighbours())
    assert mutator.mutate(pod(container(resources={"nvidia.com/gpumem": "lots"})), REQUEST).action is action


def test_the_plugin_claims_every_configured_resource_past_a_missing_one() -> None:
    config = VgpuConfig(
        enabled=True,
        devices=[VgpuDevice(vendor="acme", countResource="acme.com/gpu", coresResource="acme.com/cores")],
    )
    claims = PLUGIN.claims(config)
    assert [(owned.name, owned.is_count, owned.needs_count) for owned in claims.owns] == [
        ("acme.com/gpu", True, None),
        ("acme.com/cores", False, "acme.com/gpu"),
    ]


def test_a_vgpu_built_by_hand_without_renames() -> None:
    result = Vgpu(VgpuConfig(enabled=True), DENY).mutate(pod(container(resources=GPU)), REQUEST)
    assert result.action is Action.mutated


def test_a_nameless_container_is_named_by_its_index() -> None:
    nameless = container(resources=SHARE)
    del nameless["name"]
    result, _ = run(pod(container("a"), nameless))
    assert result.reason == f"vGPU Pod: containers/1 (nvidia.com/gpu, nvidia.com/gpumem); {TO_HAMI}"
