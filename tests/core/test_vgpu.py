"""The vGPU mutator (HAMi's webhook semantics) as a pure function, its configuration, and how it
composes with GPU slicing in the engine."""

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
from function.core.mutators.registry import Neighbours
from function.core.mutators.vgpu import Vgpu, VgpuConfig

REQUEST = RequestContext(uid="u", namespace="ml")
DENY, WARN = OnInvalidAnnotation.deny, OnInvalidAnnotation.warn


def container(
    name: str = "cuda", env: list[Any] | None = None, privileged: bool = False, **limits: Any
) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "image": "cuda"}
    if limits:
        resources = {key.replace("__", "/").replace("_", "-"): value for key, value in limits.items()}
        result["resources"] = {"limits": resources, "requests": dict(resources)}
    if env is not None:
        result["env"] = env
    if privileged:
        result["securityContext"] = {"privileged": True}
    return result


GPU = {"nvidia.com__gpu": "1"}
MEM = {"nvidia.com__gpumem": "3k"}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": spec.pop("labels", {})},
        "spec": {"containers": list(containers), **spec},
    }
    if init:
        result["spec"]["initContainers"] = init
    return result


def run(
    p: dict[str, Any],
    on_invalid: OnInvalidAnnotation = DENY,
    renamed: dict[str, str] | None = None,
    **config: Any,
) -> tuple[MutatorResult, dict[str, Any]]:
    working = copy.deepcopy(p)
    result = Vgpu(VgpuConfig(enabled=True, **config), on_invalid, renamed).mutate(working, REQUEST)
    changed = working != p
    assert changed == (result.action is Action.mutated), result
    assert all(len(w) <= 120 for w in result.warnings)
    return result, working


def again(p: dict[str, Any], **config: Any) -> MutatorResult:
    """A second pass over the first pass's output changes nothing (reinvocation)."""
    first, out = run(p, **config)
    second, out2 = run(out, **config)
    assert second.action is not Action.mutated and out2 == out, second
    return first


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


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


def test_engine_order_is_slicing_then_vgpu_and_each_knows_the_other_only_when_both_are_on() -> None:
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
    slicing_alone = build_mutators(Config())[0]
    assert isinstance(slicing_alone, GpuSlicing) and not slicing_alone.vgpu_resources


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


def test_without_vgpu_slicing_ignores_hami_resources_as_before() -> None:
    decision = Engine(Config()).decide(opted_in(container(**GPU, **MEM)), REQUEST)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("gpu-slicing",)
