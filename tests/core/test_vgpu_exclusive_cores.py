"""The vGPU mutator gives whole-GPU containers exclusive cores (HAMi PR #1354): where it writes,
what the reason says, reinvocation, the per-device switch and its HAMi default, and how it composes
with GPU slicing. The rule itself, case by case from HAMi's tests, is in test_exclusive_cores.py."""

from __future__ import annotations

from typing import Any

import pytest

from function import cli
from function.core.config import ConfigError, parse_config
from function.core.engine import Engine
from function.core.mutators.base import Action
from function.core.mutators.vgpu import VgpuConfig, VgpuDevice
from tests.support.vgpu import DENY, GPU, MEM, REQUEST, WARN, again, container, pod, run

CORES = "nvidia.com/gpucores"
WHOLE = f"{CORES}: 100 added to containers/cuda (whole GPU: exclusive compute)"


def resources(out: dict[str, Any], kind: str = "containers", index: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = out["spec"][kind][index]["resources"]
    return result


def nvidia(**extra: Any) -> dict[str, Any]:
    return {
        "vendor": "nvidia",
        "countResource": "nvidia.com/gpu",
        "memoryResource": "nvidia.com/gpumem",
        "memoryPercentageResource": "nvidia.com/gpumem-percentage",
        "coresResource": CORES,
        **extra,
    }


def test_a_whole_gpu_gets_100_cores_in_limits_and_requests_said_in_the_reason_once() -> None:
    result = again(pod(container(**{"nvidia.com__gpu": "2"})))
    assert result.action is Action.mutated
    assert result.reason == (
        f"vGPU Pod: containers/cuda (nvidia.com/gpu); schedulerName (unset) -> hami-scheduler; {WHOLE}"
    )
    _, out = run(pod(container(**{"nvidia.com__gpu": "2"})))
    assert resources(out)["limits"] == {"nvidia.com/gpu": "2", CORES: "100"}
    assert resources(out)["requests"] == {"nvidia.com/gpu": "2", CORES: "100"}


def test_a_limits_only_container_gets_a_requests_section_for_the_cores() -> None:
    c = {"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    _, out = run(pod(c))
    assert resources(out) == {"limits": {"nvidia.com/gpu": 1, CORES: "100"}, "requests": {CORES: "100"}}


def test_a_pod_already_on_the_vgpu_scheduler_still_gets_its_cores() -> None:
    """HAMi handles Pods naming its own scheduler like any other: the cores are added there too."""
    result, out = run(pod(container(**GPU), schedulerName="hami-scheduler"))
    assert result.action is Action.mutated and result.reason.endswith(WHOLE)
    assert "schedulerName" not in result.reason
    assert resources(out)["limits"][CORES] == "100"


def test_memory_percentage_100_alone_gets_the_count_and_the_cores() -> None:
    result = again(pod(container(**{"nvidia.com__gpumem_percentage": "100"})))
    assert result.reason.endswith(f"nvidia.com/gpu: 1 added to containers/cuda; {WHOLE}")
    _, out = run(pod(container(**{"nvidia.com__gpumem_percentage": "100"})))
    assert resources(out)["limits"] == {
        "nvidia.com/gpumem-percentage": "100",
        "nvidia.com/gpu": "1",
        CORES: "100",
    }
    assert resources(out)["requests"] == resources(out)["limits"]


@pytest.mark.parametrize(
    "limits",
    [
        {**GPU, "nvidia.com__gpucores": "30"},  # explicit cores stay as they are
        {**GPU, "nvidia.com__gpucores": "0"},
        {**GPU, "nvidia.com__gpucores": "100"},
        {**GPU, **MEM},  # a memory size shares the GPU
        {**GPU, "nvidia.com__gpumem_percentage": "99"},
        {"nvidia.com__gpumem_percentage": "50"},
        {"nvidia.com__gpucores": "40"},
        {"nvidia.com__gpu": "0"},  # asks for no GPU (HAMi would add 100: see docs/vgpu.md)
    ],
)
def test_containers_not_taking_whole_gpus_keep_their_cores(limits: dict[str, str]) -> None:
    before = container(**limits)
    cores_before = before["resources"]["limits"].get(CORES)
    result, out = run(pod(before))
    assert resources(out)["limits"].get(CORES) == cores_before
    assert resources(out)["requests"].get(CORES) == cores_before
    assert "exclusive compute" not in result.reason


def test_percentage_100_without_a_default_count_gets_no_cores() -> None:
    result, out = run(pod(container(**{"nvidia.com__gpumem_percentage": "100"})), defaultCount=0)
    assert set(resources(out)["limits"]) == {"nvidia.com/gpumem-percentage"}
    assert out["spec"]["schedulerName"] == "hami-scheduler", result


def test_init_containers_get_cores_and_each_container_is_judged_alone() -> None:
    p = pod(
        container("cuda", **GPU),
        container("shares", **GPU, **MEM),
        container("sidecar"),
        init=[container("warmup", **GPU)],
    )
    result, out = run(p)
    assert resources(out, "initContainers")["limits"][CORES] == "100"
    assert resources(out)["limits"][CORES] == "100"
    assert CORES not in resources(out, index=1)["limits"]
    assert "resources" not in out["spec"]["containers"][2]
    assert result.reason.count("exclusive compute") == 2
    assert "100 added to initContainers/warmup (whole GPU" in result.reason


def test_legacy_privileged_containers_are_skipped_and_get_no_cores() -> None:
    result, out = run(pod(container(privileged=True, **GPU), container("app")), denyPrivileged=False)
    assert CORES not in resources(out)["limits"]
    assert "skipped" in result.reason


def test_a_bad_value_stops_everything_including_the_cores() -> None:
    p = pod(container(**GPU), container("bad", **{"nvidia.com__gpumem": "1.5"}))
    result, out = run(p, on_invalid=WARN)
    assert result.action is Action.unchanged and CORES not in resources(out)["limits"]
    result, _ = run(p, on_invalid=DENY)
    assert result.action is Action.denied


# -- the switch, per device entry ---------------------------------------------------------------
def test_the_switch_off_leaves_whole_gpus_without_cores() -> None:
    result, out = run(pod(container(**GPU)), devices=[nvidia(defaultExclusiveCores=False)])
    assert resources(out)["limits"] == {"nvidia.com/gpu": "1"}
    assert (
        result.reason == "vGPU Pod: containers/cuda (nvidia.com/gpu); schedulerName (unset) -> hami-scheduler"
    )


def test_custom_resource_names_get_their_own_cores_resource() -> None:
    names = {
        "vendor": "nvidia",
        "countResource": "hami.io/gpu",
        "memoryPercentageResource": "hami.io/gpumem-percentage",
        "coresResource": "hami.io/gpucores",
    }
    c = container(**{"hami.io__gpu": "1", "hami.io__gpumem_percentage": "100"})
    result, out = run(pod(c), devices=[names])
    assert resources(out)["limits"]["hami.io/gpucores"] == "100"
    assert resources(out)["requests"]["hami.io/gpucores"] == "100"
    assert CORES not in resources(out)["limits"]
    assert "hami.io/gpucores: 100 added to containers/cuda" in result.reason


def test_each_device_entry_has_its_own_switch() -> None:
    devices = [
        nvidia(),
        {"vendor": "hygon", "countResource": "hygon.com/dcunum", "coresResource": "hygon.com/dcucores"},
    ]
    _, out = run(pod(container("a", **GPU), container("b", **{"hygon.com__dcunum": "1"})), devices=devices)
    assert resources(out)["limits"][CORES] == "100"
    assert resources(out, index=1)["limits"] == {"hygon.com/dcunum": "1"}
    devices[1]["defaultExclusiveCores"] = True
    _, out = run(pod(container("b", **{"hygon.com__dcunum": "1"})), devices=devices)
    assert resources(out)["limits"]["hygon.com/dcucores"] == "100"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (nvidia(), True),  # HAMi's NVIDIA device does it
        ({**nvidia(), "vendor": "NVIDIA"}, True),  # HAMi's own spelling of the vendor
        ({**nvidia(), "defaultExclusiveCores": False}, False),
        ({"vendor": "nvidia", "countResource": "nvidia.com/gpu"}, False),  # no cores resource
        (
            {"vendor": "hygon", "countResource": "h.com/n", "coresResource": "h.com/c"},
            False,
        ),  # HAMi: NVIDIA only
        (
            {
                "vendor": "hygon",
                "countResource": "h.com/n",
                "coresResource": "h.com/c",
                "defaultExclusiveCores": True,
            },
            True,
        ),
    ],
)
def test_the_default_is_hamis_on_for_nvidia_only(entry: dict[str, Any], expected: bool) -> None:
    assert VgpuDevice.model_validate(entry).defaultExclusiveCores is expected


def test_the_default_nvidia_entry_has_it_on_and_config_show_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert VgpuConfig().devices[0].defaultExclusiveCores is True
    assert cli.main(["config", "show"]) == 0
    assert "defaultExclusiveCores: true" in capsys.readouterr().out


def test_the_switch_on_without_a_cores_resource_is_refused_naming_the_key() -> None:
    entry = {"vendor": "hygon", "countResource": "hygon.com/dcunum", "defaultExclusiveCores": True}
    with pytest.raises(ConfigError, match=r"'hygon': defaultExclusiveCores needs a coresResource"):
        parse_config({"vgpu": {"devices": [entry]}})
    with pytest.raises(ConfigError, match=r"vgpu.defaultExclusiveCores: unknown key"):
        parse_config({"vgpu": {"defaultExclusiveCores": True}})  # it is per device entry


# -- with GPU slicing ---------------------------------------------------------------------------
BOTH = {"vgpu": {"enabled": True}}


def opted_in(*containers: dict[str, Any]) -> dict[str, Any]:
    p = pod(*containers)
    p["metadata"]["annotations"] = {"castops.io/optimize": "true"}
    return p


def test_an_opted_in_whole_gpu_is_sliced_and_gets_no_cores() -> None:
    decision = Engine(parse_config(BOTH)).decide(opted_in(container(**GPU)), REQUEST)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("gpu-slicing",)
    assert decision.mutated_pod is not None
    assert resources(decision.mutated_pod)["limits"] == {"nvidia.com/gpu-shared": "1"}


def test_an_opted_in_pod_with_zero_gpus_is_still_admitted() -> None:
    """Why a count of 0 gets no cores: slicing leaves it unsliced, and cores added to it would
    make slicing see a HAMi resource on the next pass and deny the Pod."""
    p = opted_in(container(**{"nvidia.com__gpu": "0"}))
    decision = Engine(parse_config(BOTH)).decide(p, REQUEST)
    assert decision.outcome == "mutated" and decision.acting_mutators == ("vgpu",), decision
    assert decision.mutated_pod is not None
    assert CORES not in resources(decision.mutated_pod)["limits"]


def test_a_not_opted_in_whole_gpu_goes_to_hami_with_cores_and_converges() -> None:
    engine = Engine(parse_config(BOTH))
    decision = engine.decide(pod(container(**GPU)), REQUEST)
    assert decision.outcome == "mutated" and decision.mutated_pod is not None
    assert resources(decision.mutated_pod)["requests"][CORES] == "100"
    assert engine.decide(decision.mutated_pod, REQUEST).outcome == "unchanged"
