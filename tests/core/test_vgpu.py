"""The vGPU mutator (HAMi's webhook semantics) as a pure function, its configuration, and how it
composes with GPU slicing in the engine; its denials and reasons word for word, the env it writes and
leaves, the int64 edge of its values, and the plug-in as the registry builds it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function import cli
from function.core.config import Config, ConfigError, OnInvalidAnnotation, parse_config
from function.core.engine import Engine, build_mutators
from function.core.mutators import vgpu
from function.core.mutators.base import Action, MutatorResult, RequestContext
from function.core.mutators.gpu_slicing import GpuSlicing
from function.core.mutators.registry import Claims, Neighbours, Rename, Settings
from function.core.mutators.vgpu import PLUGIN, BadValue, Vgpu, VgpuConfig, VgpuDevice
from function.core.view import NODES, NodeRecord, StaticView
from tests.support.vgpu import DENY, GPU, MEM, REQUEST, WARN, again, container, env_of, pod, run


def mapped_container(
    name: str = "cuda",
    *,
    resources: dict[str, str] | None = None,
    env: list[Any] | None = None,
    privileged: bool = False,
) -> dict[str, Any]:
    """``container``, with the resources as a map (names as Kubernetes writes them)."""
    made = container(name, env, privileged)
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
ONE_GPU = {"nvidia.com/gpu": "1"}
SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
"""A share of a GPU: no exclusive cores are added, so reasons stay short."""
TO_HAMI = "schedulerName (unset) -> hami-scheduler"


# -- redirection -------------------------------------------------------------------------------
def test_a_count_redirects_the_pod_and_nothing_else() -> None:
    result, out = run(pod(container(**GPU), container("sidecar"), schedulerName="default-scheduler"))
    assert result.action is Action.mutated
    assert out["spec"]["schedulerName"] == "hami-scheduler"
    assert out["spec"]["containers"][1] == container("sidecar")
    assert result.reason.startswith("vGPU Pod: containers/cuda (nvidia.com/gpu); schedulerName default")


@pytest.mark.parametrize(
    "resource", ["nvidia.com__gpumem", "nvidia.com__gpumem_percentage", "nvidia.com__gpucores"]
)
def test_memory_percentage_or_cores_alone_get_the_default_count_in_limits_and_requests(resource: str) -> None:
    _, out = run(pod(container(**{resource: "50"})))
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "1"
    assert out["spec"]["schedulerName"] == "hami-scheduler"


def test_default_count_is_configurable_and_zero_adds_none_but_still_redirects() -> None:
    _, out = run(pod(container(**MEM)), defaultCount=3)
    assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "3"
    result, out = run(pod(container(**MEM)), defaultCount=0)
    assert "nvidia.com/gpu" not in out["spec"]["containers"][0]["resources"]["limits"]
    assert out["spec"]["schedulerName"] == "hami-scheduler", result


def test_limits_only_container_gets_a_requests_section_for_the_count() -> None:
    c = {"name": "cuda", "resources": {"limits": {"nvidia.com/gpumem": 1000}}}
    _, out = run(pod(c))
    assert out["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}


def test_init_containers_count_and_ephemeral_containers_do_not() -> None:
    _, out = run(pod(container("app"), init=[container("warmup", **MEM)]))
    assert out["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    p = pod(container("app"))
    p["spec"]["ephemeralContainers"] = [container("debug", **MEM)]
    result, _ = run(p)
    assert result.action is Action.unchanged and result.reason == "not a vGPU Pod"


def test_a_pod_without_vgpu_resources_is_left_alone() -> None:
    p = pod(container(**{"nvidia.com__gpu_shared": "2", "example.com__fpga": "1"}), nodeName="n1")
    result, _ = run(p)
    assert result == MutatorResult.unchanged("not a vGPU Pod")


def test_the_scheduler_name_is_configurable() -> None:
    _, out = run(pod(container(**GPU)), schedulerName="vgpu-scheduler")
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"


@pytest.mark.parametrize(
    ("scheduler", "force_default", "force_any", "redirected"),
    [
        (None, True, False, True),
        ("", True, False, True),
        ("default-scheduler", True, False, True),
        ("default-scheduler", False, False, False),
        # Unset means default-scheduler (the apiserver's default), also for castslice mutate.
        (None, False, False, False),
        ("", False, False, False),
        (None, False, True, False),
        ("hami-scheduler", False, False, None),  # handled, already there
        ("volcano", True, False, False),
        ("volcano", True, True, True),
        ("volcano", False, True, True),
    ],
)
def test_scheduler_names_follow_hamis_rules(
    scheduler: str | None, force_default: bool, force_any: bool, redirected: bool | None
) -> None:
    spec = {} if scheduler is None else {"schedulerName": scheduler}
    result, out = run(
        pod(container(**GPU, **MEM), **spec),  # not a whole GPU: only the scheduler may change
        forceOverwriteDefaultScheduler=force_default,
        forceSchedulerName=force_any,
    )
    if redirected:
        assert result.action is Action.mutated and out["spec"]["schedulerName"] == "hami-scheduler"
    elif redirected is None:
        assert result.reason.endswith("already for hami-scheduler")
    else:
        assert result.action is Action.unchanged and "left alone" in result.reason


def test_an_unset_scheduler_is_named_in_the_reason_and_set_when_redirecting() -> None:
    result, _ = run(pod(container(**GPU)), forceOverwriteDefaultScheduler=False)
    assert result == MutatorResult.unchanged(
        "Pod names no scheduler (so default-scheduler) and forceOverwriteDefaultScheduler is false:"
        " left alone"
    )
    result, out = run(pod(container(**GPU)))
    assert out["spec"]["schedulerName"] == "hami-scheduler"
    assert "schedulerName (unset) -> hami-scheduler" in result.reason


def test_a_pod_left_to_another_scheduler_is_not_even_checked() -> None:
    p = pod(
        container(privileged=True, **{"nvidia.com__gpumem_percentage": "900"}),
        schedulerName="volcano",
        nodeName="n",
    )
    result, _ = run(p)
    assert result == MutatorResult.unchanged('Pod names scheduler "volcano": left alone')


# -- denials -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec", [{}, {"containers": []}, {"containers": None}, {"initContainers": [container(**GPU)]}]
)
def test_a_pod_with_no_containers_is_denied(spec: dict[str, Any]) -> None:
    p = {"metadata": {}, "spec": spec}
    result, _ = run(p)
    assert result.action is Action.denied and "no containers" in result.reason
    assert run({"metadata": {}})[0].action is Action.denied


def test_the_opt_out_label_comes_first_and_only_its_exact_value_counts() -> None:
    result, _ = run({"metadata": {"labels": {"hami.io/webhook": "ignore"}}, "spec": {}})
    assert result == MutatorResult.unchanged("opted out (hami.io/webhook=ignore)")
    result, _ = run(pod(container(**GPU), labels={"hami.io/webhook": "Ignore"}))
    assert result.action is Action.mutated
    result, _ = run(
        pod(container(**GPU), labels={"x.io/skip": "yes"}), optOutLabel="x.io/skip", optOutValue="yes"
    )
    assert result.action is Action.unchanged


@pytest.mark.parametrize(
    ("containers", "init", "named"),
    [
        ([container(privileged=True, **GPU)], [], "cuda"),
        ([container(**MEM), container("agent", privileged=True)], [], "agent"),
        ([container("a", privileged=True), container("b", privileged=True, **GPU)], [], "a"),
        ([container(**GPU)], [container("sysctl", privileged=True)], "sysctl"),
    ],
)
def test_a_vgpu_pod_with_a_privileged_container_is_denied_naming_it(
    containers: list[dict[str, Any]], init: list[dict[str, Any]], named: str
) -> None:
    result, _ = run(pod(*containers, init=init))
    assert result.action is Action.denied
    assert f"container {named} is privileged" in result.reason


def test_privileged_without_vgpu_is_not_this_mutators_business() -> None:
    result, _ = run(pod(container(privileged=True, **{"nvidia.com__gpu_shared": "1"})))
    assert result.action is Action.unchanged
    p = pod(container(**GPU))
    p["spec"]["containers"][0]["securityContext"] = {"privileged": "true"}  # not a boolean: not privileged
    assert run(p)[0].action is Action.mutated


def test_legacy_privileged_containers_are_skipped_with_a_warning() -> None:
    result, out = run(pod(container(privileged=True, **MEM)), denyPrivileged=False)
    assert result.action is Action.unchanged and out["spec"].get("schedulerName") is None
    assert result.warnings == (
        "castslice: container cuda is privileged, vGPU resources ignored, Pod may stay Pending;"
        " remove privileged",
    )
    # Another, unprivileged container still makes a vGPU Pod; the privileged one is not touched.
    p = pod(container(privileged=True, **MEM), container("other", **MEM))
    result, out = run(p, denyPrivileged=False, overwriteEnv=True)
    assert out["spec"]["schedulerName"] == "hami-scheduler"
    assert out["spec"]["containers"][0] == p["spec"]["containers"][0]
    assert "nvidia.com/gpu" in out["spec"]["containers"][1]["resources"]["limits"]
    assert len(result.warnings) == 1


def test_a_vgpu_pod_with_a_node_name_is_denied() -> None:
    result, _ = run(pod(container(**MEM), nodeName="gpu-node-1"))
    assert result == MutatorResult.denied(
        'castslice: vGPU Pod denied: spec.nodeName is set ("gpu-node-1") but only hami-scheduler may place'
        " a vGPU Pod; remove spec.nodeName"
    )


# -- values ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("resource", "value", "accepted"),
    [
        ("nvidia.com__gpumem_percentage", "101", "a whole number from 0 to 100"),
        ("nvidia.com__gpumem_percentage", "-1", "a whole number from 0 to 100"),
        ("nvidia.com__gpumem_percentage", "50.5", "a whole number from 0 to 100"),
        ("nvidia.com__gpumem_percentage", "1k", "a whole number from 0 to 100"),
        ("nvidia.com__gpumem", "1500m", "a whole number (0 or more)"),
        ("nvidia.com__gpumem", "1e", "a whole number (0 or more)"),
        ("nvidia.com__gpucores", True, "a whole number from 0 to 100"),
        ("nvidia.com__gpucores", "101", "a whole number from 0 to 100"),
        ("nvidia.com__gpucores", "-1", "a whole number from 0 to 100"),
        ("nvidia.com__priority", "0.5", "a whole number (0 or more)"),
        ("nvidia.com__gpu", "-2", "a whole number (0 or more)"),
    ],
)
def test_bad_values_are_denied_or_warned_about_naming_container_resource_and_value(
    resource: str, value: Any, accepted: str
) -> None:
    p = pod(container(**{resource: value}))
    result, _ = run(p)
    name = resource.replace("__", "/").replace("_", "-")
    assert result.action is Action.denied
    assert result.reason.startswith(f"castslice: containers/cuda: {name} ")
    assert result.reason.endswith(f"is not valid; accepted: {accepted}")
    result, out = run(p, on_invalid=WARN)
    assert result.action is Action.unchanged and out == p
    assert result.warnings[0].startswith(f"castslice: {name}=")
    short = "a whole number 0-100" if "0 to 100" in accepted else "a whole number >= 0"
    assert result.warnings[0].endswith(f" in container cuda ignored; use {short}")


@pytest.mark.parametrize(
    ("resource", "value"),
    [
        ("nvidia.com__gpumem_percentage", "0"),
        ("nvidia.com__gpumem_percentage", "100"),
        ("nvidia.com__gpumem_percentage", 100),
        ("nvidia.com__gpucores", "0"),
        ("nvidia.com__gpucores", "100"),
        ("nvidia.com__gpumem", "3k"),
        ("nvidia.com__gpumem", "1Ki"),
    ],
)
def test_good_values(resource: str, value: Any) -> None:
    assert run(pod(container(**{resource: value})))[0].action is Action.mutated


LONG_NAME = "c" * 63


@pytest.mark.parametrize(
    ("resource", "value", "tail"),
    [
        ("nvidia.com__gpumem_percentage", "1" * 60, "; use a whole number 0-100"),
        ("nvidia.com__gpucores", "1" * 60, "; use a whole number 0-100"),
        ("nvidia.com__gpumem", "x" * 60, "; use a whole number >= 0"),
    ],
)
def test_bad_value_warnings_keep_their_advice_with_long_names(resource: str, value: str, tail: str) -> None:
    p = pod(container(LONG_NAME, **{resource: value}), init=[container(LONG_NAME)])
    p["spec"]["initContainers"] = p["spec"].pop("containers")
    p["spec"]["containers"] = [container("app")]
    result, _ = run(p, on_invalid=WARN)
    (warning,) = result.warnings
    assert len(warning) <= 120 and warning.endswith(tail), warning
    assert f" in container {'c' * 17}... ignored" in warning
    # The denial has no length limit: it names the whole container and value.
    result, _ = run(p)
    assert f"initContainers/{LONG_NAME}: " in result.reason and value in result.reason


def test_privileged_warnings_keep_their_advice_with_long_names() -> None:
    p = pod(container("app"), init=[container(LONG_NAME, privileged=True, **MEM)])
    result, _ = run(p, denyPrivileged=False)
    (warning,) = result.warnings
    assert len(warning) <= 120 and warning.endswith("; remove privileged"), warning
    assert f"container {'c' * 17}... is privileged" in warning


# -- env ---------------------------------------------------------------------------------------
def test_priority_becomes_the_task_priority_env_once() -> None:
    p = pod(
        container(env=[{"name": "TOKEN", "value": "x"}], **GPU, **{"nvidia.com__priority": "1"}),
        container("side"),
    )
    result = again(p)
    _, out = run(p)
    assert out["spec"]["containers"][0]["env"] == [
        {"name": "TOKEN", "value": "x"},
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
    ]
    assert "env" not in out["spec"]["containers"][1]
    assert "CUDA_TASK_PRIORITY=1 in containers/cuda" in result.reason


def test_priority_alone_is_no_vgpu_pod_but_still_sets_the_env() -> None:
    prio = {"nvidia.com__priority": "1"}
    # Not redirected, and so neither the privileged nor the nodeName rule applies (as in HAMi).
    p = pod(container(**prio), container("agent", privileged=True), nodeName="n1")
    again(p)
    result, out = run(p)
    assert result == MutatorResult.mutated("not a vGPU Pod; CUDA_TASK_PRIORITY=1 in containers/cuda")
    assert "schedulerName" not in out["spec"] and out["spec"]["nodeName"] == "n1"
    assert env_of(out["spec"]["containers"][0]) == {"CUDA_TASK_PRIORITY": "1"}
    assert "nvidia.com/gpu" not in out["spec"]["containers"][0]["resources"]["limits"]
    # Left to another scheduler: not touched at all (the Pod is left alone before anything).
    assert run(pod(container(**prio), schedulerName="volcano"))[0].action is Action.unchanged
    # Still checked: a priority that is no whole number is bad input.
    result, _ = run(pod(container(**{"nvidia.com__priority": "0.5"})))
    assert result.action is Action.denied and "nvidia.com/priority" in result.reason
    # With overwriteEnv, a priority alone keeps no device visible (HAMi: only a count does).
    _, out = run(pod(container(**prio)), overwriteEnv=True)
    assert env_of(out["spec"]["containers"][0]) == {
        "CUDA_TASK_PRIORITY": "1",
        "NVIDIA_VISIBLE_DEVICES": "none",
    }
    # A privileged container asking only for a priority is no vGPU container: no legacy warning.
    result, _ = run(pod(container(privileged=True, **prio)), denyPrivileged=False)
    assert result == MutatorResult.unchanged("not a vGPU Pod")


def test_priority_env_name_is_configurable_and_quantities_are_integers() -> None:
    _, out = run(pod(container(**GPU, **{"nvidia.com__priority": "2k"})), priorityEnv="MY_PRIORITY")
    assert env_of(out["spec"]["containers"][0]) == {"MY_PRIORITY": "2000"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ([{"name": "CUDA_TASK_PRIORITY", "value": "0"}], [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]),
        (
            [{"name": "CUDA_TASK_PRIORITY", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
            [{"name": "CUDA_TASK_PRIORITY", "value": "1"}],
        ),
        (
            # Duplicate names: the container gets the last one, so that is the one corrected.
            [{"name": "CUDA_TASK_PRIORITY", "value": "1"}, {"name": "CUDA_TASK_PRIORITY", "value": "0"}],
            [{"name": "CUDA_TASK_PRIORITY", "value": "1"}, {"name": "CUDA_TASK_PRIORITY", "value": "1"}],
        ),
    ],
)
def test_the_priority_resource_wins_over_the_pods_own_env(env: list[Any], expected: list[Any]) -> None:
    p = pod(container(env=env, **GPU, **{"nvidia.com__priority": "1"}))
    again(p)
    assert run(p)[1]["spec"]["containers"][0]["env"] == expected


def test_env_that_is_not_a_list_is_not_touched() -> None:
    p = pod(container(env=None, **GPU, **{"nvidia.com__priority": "1"}))  # type: ignore[arg-type]
    p["spec"]["containers"][0]["env"] = None
    _, out = run(p)
    assert env_of(out["spec"]["containers"][0]) == {"CUDA_TASK_PRIORITY": "1"}
    p["spec"]["containers"][0]["env"] = "garbage"
    _, out = run(p)
    assert out["spec"]["containers"][0]["env"] == "garbage"


def test_overwrite_env_hides_gpus_from_containers_without_one() -> None:
    p = pod(
        container(**MEM),
        container("side"),
        container("monitor", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        container("sliced", **{"nvidia.com__gpu_shared": "2"}),
        init=[container("fetch")],
    )
    again(p, overwriteEnv=True)
    _, out = run(p, overwriteEnv=True)
    containers = out["spec"]["containers"]
    assert env_of(out["spec"]["initContainers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "none"}
    assert "env" not in containers[0]
    assert env_of(containers[1]) == {"NVIDIA_VISIBLE_DEVICES": "none"}
    assert env_of(containers[2]) == {"NVIDIA_VISIBLE_DEVICES": "all"}
    # Without slicing's rename known, the sliced container looks GPU-less; with it, it is left alone.
    assert env_of(containers[3]) == {"NVIDIA_VISIBLE_DEVICES": "none"}
    _, out = run(p, overwriteEnv=True, renamed={"nvidia.com/gpu": "nvidia.com/gpu-shared"})
    assert "env" not in out["spec"]["containers"][3]


def test_overwrite_env_applies_to_pods_without_vgpu_too() -> None:
    result, out = run(pod(container("web")), overwriteEnv=True)
    assert result.reason == "not a vGPU Pod; NVIDIA_VISIBLE_DEVICES=none in containers/web"
    assert "schedulerName" not in out["spec"]


# -- configuration -----------------------------------------------------------------------------
def test_vgpu_is_off_by_default_and_shown_by_config_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert Config().vgpu.enabled is False
    assert [m.name for m in build_mutators(Config())] == ["gpu-slicing"]
    assert cli.main(["config", "show"]) == 0
    shown = capsys.readouterr().out
    assert "vgpu:\n  enabled: false\n  mode: enforce\n  schedulerName: hami-scheduler\n" in shown
    assert "countResource: nvidia.com/gpu" in shown and "visibleDevicesEnv: NVIDIA_VISIBLE_DEVICES" in shown


@pytest.mark.parametrize(
    ("vgpu", "message"),
    [
        ({"schedulerName": "Hami"}, "not a valid scheduler name"),
        ({"schedulerName": "default-scheduler"}, "not default-scheduler"),
        ({"priorityEnv": "1BAD"}, "not a valid environment variable name"),
        ({"defaultCount": -1}, "greater than or equal to 0"),
        ({"devices": []}, "at least 1 item"),
        ({"forceSchedulerNames": True}, "vgpu.forceSchedulerNames: unknown key"),
        (
            {
                "devices": [
                    {"vendor": "a", "countResource": "x.io/gpu"},
                    {"vendor": "b", "countResource": "x.io/gpu"},
                ]
            },
            "'x.io/gpu' is listed twice",
        ),
        ({"devices": [{"vendor": "a", "countResource": "gpu"}]}, "not an extended resource name"),
        (
            {"devices": [{"vendor": "a", "countResource": "x.io/gpu", "visibleDevicesEnv": "A B"}]},
            "not a valid environment variable name",
        ),
    ],
)
def test_bad_vgpu_configuration_names_the_key(vgpu: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"vgpu": vgpu})


@pytest.mark.parametrize(
    ("slicing", "message"),
    [
        (
            {"targetResource": "nvidia.com/gpumem"},
            r"gpuSlicing.targetResource 'nvidia.com/gpumem' is also vgpu.devices\[0\].memoryResource",
        ),
        (
            {"sourceResource": "x.io/gpu", "targetResource": "nvidia.com/gpu"},
            r"gpuSlicing.targetResource 'nvidia.com/gpu' is also vgpu.devices\[0\].countResource",
        ),
        (
            {"targetResource": "nvidia.com/priority"},
            r"gpuSlicing.targetResource 'nvidia.com/priority' is also vgpu.devices\[0\].priorityResource",
        ),
        (
            {"sourceResource": "nvidia.com/gpucores"},
            r"gpuSlicing.sourceResource 'nvidia.com/gpucores' is also vgpu.devices\[0\].coresResource",
        ),
        (
            {"sourceResource": "nvidia.com/gpumem-percentage"},
            r"sourceResource .* is also vgpu.devices\[0\].memoryPercentageResource",
        ),
    ],
)
def test_slicing_must_not_use_a_vgpu_resource_but_the_count_as_source(
    slicing: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"vgpu": {"enabled": True}, "gpuSlicing": slicing})
    # Harmless while either mutator is off.
    parse_config({"gpuSlicing": slicing})
    parse_config({"vgpu": {"enabled": True}, "gpuSlicing": {"enabled": False, **slicing}})


def test_slicing_into_a_vgpu_resource_no_longer_flips_on_reinvocation() -> None:
    """The reproduction: targetResource nvidia.com/gpumem made an opted-in Pod mutate on the first
    call and be denied on the second. Such a configuration is refused; the count as source is fine."""
    with pytest.raises(ConfigError, match=r"gpuSlicing\.targetResource"):
        parse_config({"vgpu": {"enabled": True}, "gpuSlicing": {"targetResource": "nvidia.com/gpumem"}})
    config = parse_config(
        {
            "vgpu": {"enabled": True, "devices": [{"vendor": "x", "countResource": "x.io/gpu"}]},
            "gpuSlicing": {"sourceResource": "x.io/gpu", "targetResource": "x.io/gpu-shared"},
        }
    )
    engine = Engine(config)
    first = engine.decide(opted_in(container(**{"x.io__gpu": "1"})), REQUEST)
    assert first.outcome == "mutated" and first.mutated_pod is not None
    second = engine.decide(first.mutated_pod, REQUEST)
    assert second.outcome == "unchanged", second


def test_other_vendors_need_only_a_count() -> None:
    config = parse_config(
        {
            "vgpu": {
                "enabled": True,
                "devices": [
                    {
                        "vendor": "hygon",
                        "countResource": "hygon.com/dcunum",
                        "memoryResource": "hygon.com/dcumem",
                    }
                ],
            }
        }
    )
    assert config.vgpu.devices[0].resources == ("hygon.com/dcunum", "hygon.com/dcumem")
    declared = Neighbours((vgpu.PLUGIN.claims(config.vgpu),))
    assert declared.qualifiers_of("hygon.com/dcunum") == ("hygon.com/dcumem",)
    assert declared.qualifiers_of("nvidia.com/gpu") == ()


# -- composition with slicing ------------------------------------------------------------------
BOTH = {"vgpu": {"enabled": True}}


def test_engine_order_is_slicing_then_vgpu_and_slicing_knows_hamis_resources_with_vgpu_off_too() -> None:
    mutators = build_mutators(parse_config(BOTH))
    assert [m.name for m in mutators] == ["gpu-slicing", "vgpu"]
    slicing = mutators[0]
    assert isinstance(slicing, GpuSlicing)
    assert slicing.vgpu_resources == {
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
    }, "not the priority: it only becomes an env var, which a sliced Pod can carry"
    alone = build_mutators(parse_config({"gpuSlicing": {"enabled": False}, **BOTH}))
    assert [m.name for m in alone] == ["vgpu"]
    # HAMi may run beside CastSlice without its vGPU mutator: slicing still knows HAMi's names.
    slicing_alone = build_mutators(Config())[0]
    assert isinstance(slicing_alone, GpuSlicing) and slicing_alone.vgpu_resources == slicing.vgpu_resources


def opted_in(*containers: dict[str, Any]) -> dict[str, Any]:
    p = pod(*containers)
    p["metadata"]["annotations"] = {"castops.io/optimize": "true"}
    return p


def test_an_opted_in_pod_is_sliced_and_then_no_vgpu_pod() -> None:
    decision = Engine(parse_config(BOTH)).decide(opted_in(container(**GPU)), REQUEST)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("gpu-slicing",)
    assert decision.mutated_pod is not None and "schedulerName" not in decision.mutated_pod["spec"]


def test_an_opted_in_pod_with_a_priority_is_sliced_and_keeps_its_priority_env() -> None:
    p = opted_in(container(**GPU, **{"nvidia.com__priority": "1"}))
    decision = Engine(parse_config(BOTH)).decide(p, REQUEST)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("gpu-slicing", "vgpu")
    assert decision.mutated_pod is not None and "schedulerName" not in decision.mutated_pod["spec"]
    assert decision.mutated_pod["spec"]["containers"][0]["env"] == [
        {"name": "CUDA_TASK_PRIORITY", "value": "1"}
    ]


@pytest.mark.parametrize("extra", [MEM, {"nvidia.com__gpucores": "10"}])
def test_an_opted_in_pod_asking_for_hami_resources_is_bad_input(extra: dict[str, str]) -> None:
    p = opted_in(container(**GPU), container("helper", **extra))
    decision = Engine(parse_config(BOTH)).decide(p, REQUEST)
    assert decision.outcome == "denied" and decision.denial is not None
    assert "containers/helper asks for nvidia.com/gp" in decision.denial
    assert "opts into GPU slicing" in decision.denial

    # Under warn: not sliced, left to vGPU, converging in one pass (no NotConverged).
    decision = Engine(parse_config({"invalidAnnotations": "warn", **BOTH})).decide(p, REQUEST)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("vgpu",)
    assert decision.warnings and decision.warnings[0].startswith("castslice: Pod not sliced, nvidia.com/gp")
    assert decision.warnings[0].endswith("; remove castops.io/optimize or it")
    assert decision.mutated_pod is not None
    assert decision.mutated_pod["spec"]["schedulerName"] == "hami-scheduler"
    assert "nvidia.com/gpu" in decision.mutated_pod["spec"]["containers"][0]["resources"]["limits"]


def test_without_vgpu_an_opted_in_pod_asking_for_hami_resources_is_still_bad_input() -> None:
    """Sliced, it would keep asking for HAMi's memory with no GPU count and stay Pending."""
    decision = Engine(Config()).decide(opted_in(container(**GPU, **MEM)), REQUEST)
    assert decision.outcome == "denied" and decision.denial is not None
    assert "nvidia.com/gpumem" in decision.denial and "nvidia.com/gpu=1" in decision.denial


@pytest.mark.parametrize(
    ("annotations", "config"),
    [
        ({}, BOTH),
        ({"castops.io/workload-type": "training"}, BOTH),
        ({}, {**BOTH, "gpuSlicing": {"requireAdvertisedTarget": True}}),
    ],
)
def test_an_opted_in_multi_gpu_pod_left_whole_goes_to_vgpu_and_is_not_denied_for_its_cores(
    annotations: dict[str, str], config: dict[str, Any]
) -> None:
    """The issue's 8-GPU Pod: slicing leaves it whole, vGPU adds nvidia.com/gpucores 100 (whole
    GPUs: exclusive compute), and the next pass of slicing must not deny it for those cores; the
    reinvocation changes nothing more."""
    p = opted_in(container(**{"nvidia.com__gpu": "8"}))
    p["metadata"]["annotations"].update(annotations)
    engine = Engine(parse_config(config))
    decision = engine.decide(p, REQUEST)
    assert decision.outcome == "mutated", decision.reason
    assert decision.acting_mutators == ("vgpu",)
    assert decision.mutated_pod is not None
    limits = decision.mutated_pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "8", "nvidia.com/gpucores": "100"}
    assert engine.decide(decision.mutated_pod, REQUEST).outcome == "unchanged"


def test_an_opted_in_pod_left_whole_for_want_of_a_node_goes_to_vgpu_and_is_not_denied() -> None:
    nodes = StaticView({NODES.index: {"n": NodeRecord("n", "uid-n", (), ("nvidia.com/gpu", "8"))}}, (NODES,))
    request = RequestContext(uid="u", namespace="ml", cluster=nodes)
    config = parse_config({**BOTH, "gpuSlicing": {"requireAdvertisedTarget": True}})
    decision = Engine(config).decide(opted_in(container(**GPU)), request)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("vgpu",), decision.reason
    assert "castslice: not sliced, no node offers nvidia.com/gpu-shared" in decision.warnings[0]


def test_a_hami_pod_opted_into_slicing_is_denied_naming_the_same_resources_whatever_their_order() -> None:
    """Live, the apiserver sends resources sorted by name; a file keeps its own order: both name
    gpucores and gpumem, in that order."""
    denials = set()
    for order in (["nvidia.com/gpumem", "nvidia.com/gpucores"], ["nvidia.com/gpucores", "nvidia.com/gpumem"]):
        limits = {"nvidia.com/gpu": "1", **{name: "30" for name in order}}
        p = opted_in({"name": "cuda", "image": "cuda", "resources": {"limits": limits}})
        decision = Engine(parse_config(BOTH)).decide(p, REQUEST)
        assert decision.outcome == "denied"
        denials.add(decision.denial)
    (denial,) = denials
    assert (
        denial is not None
        and "asks for nvidia.com/gpucores, nvidia.com/gpumem, HAMi vGPU resources" in denial
    )


# -- denials and reasons, word for word ------------------------------------------------------------
@pytest.mark.parametrize("containers", ["not a list", [], None])
def test_a_pod_without_a_container_list_is_denied(containers: object) -> None:
    target = pod(mapped_container(resources=ONE_GPU))
    target["spec"]["containers"] = containers
    result, _ = run(target)
    assert result == MutatorResult.denied(
        "castslice: Pod has no containers; spec.containers needs at least one"
    )


def test_a_bad_value_under_warn_keeps_the_message_as_reason() -> None:
    result, _ = run(pod(mapped_container(resources={"nvidia.com/gpumem": "lots"})), WARN)
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
    bad = mapped_container(resources={"nvidia.com/gpumem": "x"})
    if name is None:
        del bad["name"]
    else:
        bad["name"] = name
    result, _ = run(pod(bad), WARN)
    assert result.warnings == (
        f'castslice: nvidia.com/gpumem="x" in container {shown_as} ignored; use a whole number >= 0',
    )


def test_a_nameless_privileged_container_is_named_with_a_question_mark() -> None:
    privileged = mapped_container(privileged=True)
    del privileged["name"]
    result, _ = run(pod(mapped_container(resources=ONE_GPU), privileged))
    assert result == MutatorResult.denied(
        "castslice: vGPU Pod denied: container ? is privileged and would see every GPU of the node; "
        "remove securityContext.privileged or the vGPU resources"
    )


def test_a_long_node_name_is_quoted_cut_short() -> None:
    node = "n" * 70
    result, _ = run(pod(mapped_container(resources=ONE_GPU), nodeName=node))
    assert result == MutatorResult.denied(
        f'castslice: vGPU Pod denied: spec.nodeName is set ("{"n" * 61}...") but only hami-scheduler may '
        "place a vGPU Pod; remove spec.nodeName"
    )


def test_a_long_scheduler_name_is_quoted_cut_short() -> None:
    result, _ = run(pod(mapped_container(resources=ONE_GPU), schedulerName="s" * 70))
    assert result == MutatorResult.unchanged(f'Pod names scheduler "{"s" * 61}...": left alone')


def test_default_scheduler_named_outright_without_overwrite() -> None:
    result, _ = run(
        pod(mapped_container(resources=ONE_GPU), schedulerName="default-scheduler"),
        forceOverwriteDefaultScheduler=False,
    )
    assert result == MutatorResult.unchanged(
        "Pod names default-scheduler and forceOverwriteDefaultScheduler is false: left alone"
    )


def test_the_reason_lists_every_container_and_resource() -> None:
    both = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    result, _ = run(pod(mapped_container("a", resources=both), mapped_container("b", resources=both)))
    assert result.reason == (
        "vGPU Pod: containers/a (nvidia.com/gpu, nvidia.com/gpumem), containers/b (nvidia.com/gpu, "
        f"nvidia.com/gpumem); {TO_HAMI}"
    )


def test_an_already_redirected_pod_says_so_and_notes_skipped_containers() -> None:
    target = pod(
        mapped_container("a", resources=SHARE),
        mapped_container("root", privileged=True, resources=ONE_GPU),
        schedulerName="hami-scheduler",
    )
    result, after = run(target, denyPrivileged=False)
    assert result.action is Action.unchanged
    assert result.reason == (
        "vGPU Pod: containers/a (nvidia.com/gpu, nvidia.com/gpumem); already for hami-scheduler; "
        "privileged containers/root skipped (denyPrivileged: false)"
    )
    assert after == target


# -- the int64 edge --------------------------------------------------------------------------------
def test_the_largest_int64_is_accepted_and_one_more_is_not() -> None:
    largest = str(2**63 - 1)
    result, _ = run(pod(mapped_container(resources={"nvidia.com/gpumem": largest, **ONE_GPU})))
    assert result.action is Action.mutated
    too_big = {"nvidia.com/gpumem": str(2**63), **ONE_GPU}
    denied, _ = run(pod(mapped_container(resources=too_big)))
    assert denied == MutatorResult.denied(
        f'castslice: containers/cuda: nvidia.com/gpumem "{2**63}" is not valid; '
        "accepted: a whole number below 2^63"
    )
    warned, _ = run(pod(mapped_container(resources=too_big)), WARN)
    assert warned.warnings == (
        'castslice: nvidia.com/gpumem="9223372..." in container cuda ignored; use a whole number < 2^63',
    )


# -- env: devices and their visible-devices env ----------------------------------------------------
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
    result, after = run(pod(mapped_container(env=[entry], resources={**SHARE, **PRIORITY})))
    assert result.reason == (
        "vGPU Pod: containers/cuda (nvidia.com/gpu, nvidia.com/gpumem, nvidia.com/priority); "
        f"{TO_HAMI}; CUDA_TASK_PRIORITY=1 in containers/cuda (replaces the Pod's {kind})"
    )
    assert after["spec"]["containers"][0]["env"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]


def test_an_equal_priority_env_does_not_stop_the_visible_devices_env() -> None:
    own = {"name": "CUDA_TASK_PRIORITY", "value": "1"}
    result, after = run(pod(mapped_container(env=[own], resources=PRIORITY)), overwriteEnv=True)
    assert result.reason == "not a vGPU Pod; NVIDIA_VISIBLE_DEVICES=none in containers/cuda"
    assert after["spec"]["containers"][0]["env"] == [own, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


@pytest.mark.parametrize("junk", ["not a map", {"value": "no name"}, {"name": 5}])
def test_env_entries_that_are_no_named_maps_are_passed_over(junk: object) -> None:
    result, after = run(pod(mapped_container(env=[junk], resources={**ONE_GPU, **PRIORITY})))
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
        pod(mapped_container(env=[own])), overwriteEnv=True, devices=two_devices("OTHER_VISIBLE_DEVICES")
    )
    assert after["spec"]["containers"][0]["env"] == [own, {"name": "OTHER_VISIBLE_DEVICES", "value": "none"}]
    assert result.reason == "not a vGPU Pod; OTHER_VISIBLE_DEVICES=none in containers/cuda"


def test_a_device_without_a_visible_devices_env_does_not_hide_the_next_devices() -> None:
    devices = [{"vendor": "acme", "countResource": "acme.com/gpu"}, NVIDIA]
    _, after = run(pod(mapped_container()), overwriteEnv=True, devices=devices)
    assert after["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


def test_devices_sharing_one_visible_devices_env_each_keep_it_visible() -> None:
    devices = two_devices("ACME_VISIBLE_DEVICES")
    for resource in ("acme.com/gpu", "other.com/gpu"):
        result, after = run(
            pod(mapped_container(resources={resource: "1"})), overwriteEnv=True, devices=devices
        )
        assert "env" not in after["spec"]["containers"][0], resource
        assert result.reason.endswith(TO_HAMI)


# -- the plug-in as the registry builds it ---------------------------------------------------------
def test_the_plugin_keeps_a_sliced_gpu_visible() -> None:
    shared = Rename(
        "nvidia.com/gpu", "nvidia.com/gpu.shared", "gpuSlicing.sourceResource", "gpuSlicing.targetResource"
    )
    mutator = PLUGIN.build(
        VgpuConfig(enabled=True, overwriteEnv=True), Settings(), Neighbours((Claims((shared,)),))
    )
    target = pod(mapped_container(resources={"nvidia.com/gpu.shared": "1"}))
    before = copy.deepcopy(target)
    result = mutator.mutate(target, REQUEST)
    assert result == MutatorResult.unchanged("not a vGPU Pod")
    assert target == before


@pytest.mark.parametrize(("policy", "action"), [(DENY, Action.denied), (WARN, Action.unchanged)])
def test_the_plugin_follows_the_invalid_annotations_policy(
    policy: OnInvalidAnnotation, action: Action
) -> None:
    mutator = PLUGIN.build(VgpuConfig(enabled=True), Settings(policy), Neighbours())
    assert (
        mutator.mutate(pod(mapped_container(resources={"nvidia.com/gpumem": "lots"})), REQUEST).action
        is action
    )


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
    result = Vgpu(VgpuConfig(enabled=True), DENY).mutate(pod(mapped_container(resources=ONE_GPU)), REQUEST)
    assert result.action is Action.mutated


def test_a_nameless_container_is_named_by_its_index() -> None:
    nameless = mapped_container(resources=SHARE)
    del nameless["name"]
    result, _ = run(pod(mapped_container("a"), nameless))
    assert result.reason == f"vGPU Pod: containers/1 (nvidia.com/gpu, nvidia.com/gpumem); {TO_HAMI}"
