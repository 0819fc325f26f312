"""Which containers take whole GPUs and so get exclusive cores: HAMi's own cases, translated.

Each case of HAMi's ``TestMutateAdmissionDefaultsExclusiveCore`` (pkg/device/nvidia/device_test.go
at HAMi 4707fb02) is one row below, under its HAMi name; the rows after them pin the corners
HAMi's code decides without a test of its own (and the one place CastSlice differs: a count of 0).
The mutator's use of this rule (limits and requests, reasons, the switch) is in test_vgpu.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from function.core.mutators.exclusive_cores import EXCLUSIVE_CORES, whole_gpu_cores


@dataclass(frozen=True)
class Names:
    countResource: str = "nvidia.com/gpu"
    memoryResource: str | None = "nvidia.com/gpumem"
    memoryPercentageResource: str | None = "nvidia.com/gpumem-percentage"
    coresResource: str | None = "nvidia.com/gpucores"


NVIDIA = Names()
NO_MEMORY_NAME = Names(memoryResource=None)
HAMI_NAMES = Names("hami.io/gpu", "hami.io/gpumem", "hami.io/gpumem-percentage", "hami.io/gpucores")
GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)

HAMI_CASES = [
    # (HAMi's case name, device, the container's values, gets 100 cores)
    ("exclusive via percentage", NVIDIA, {GPU: 1, PCT: 100}, True),
    # HAMi reads limits, then requests; CastSlice's values already merge both sections.
    ("exclusive via percentage in requests only", NVIDIA, {GPU: 1, PCT: 100}, True),
    ("non-exclusive percentage", NVIDIA, {GPU: 1, PCT: 50}, False),
    ("no memory fields defaults to exclusive", NVIDIA, {GPU: 1}, True),
    ("explicit cores remains unchanged", NVIDIA, {GPU: 1, CORES: 70}, False),
    ("explicit cores in requests remains unchanged", NVIDIA, {GPU: 1, CORES: 55}, False),
    ("memory size present treated as shareable", NVIDIA, {GPU: 1, MEM: 8192}, False),
    ("memory name empty treated as exclusive", NO_MEMORY_NAME, {GPU: 1}, True),
    ("custom resource names", HAMI_NAMES, {"hami.io/gpu": 1, "hami.io/gpumem-percentage": 100}, True),
]


@pytest.mark.parametrize(("case", "device", "values", "expected"), HAMI_CASES, ids=[c[0] for c in HAMI_CASES])
def test_hamis_own_cases(case: str, device: Names, values: dict[str, int], expected: bool) -> None:
    assert whole_gpu_cores(device, values, added_count=0) == (device.coresResource if expected else None)


def test_exclusive_means_100_percent_of_the_compute() -> None:
    assert EXCLUSIVE_CORES == 100


@pytest.mark.parametrize(
    ("values", "added", "expected"),
    [
        # The count HAMi adds (DefaultGPUNum) counts: memory percentage 100 alone takes a whole GPU...
        ({PCT: 100}, 1, True),
        # ...unless no count is added (defaultCount: 0, HAMi's DefaultGPUNum 0): no count, no cores.
        ({PCT: 100}, 0, False),
        ({PCT: 99}, 1, False),
        # Memory alone gets a count but stays shareable; cores alone are explicit cores.
        ({MEM: 1000}, 1, False),
        ({CORES: 30}, 1, False),
        # The percentage is looked at first: at 100 it wins over a memory size (HAMi's order).
        ({GPU: 1, PCT: 100, MEM: 1000}, 0, True),
        ({GPU: 1, PCT: 50, MEM: 1000}, 0, False),
        # Percentage 0 is not 100 (HAMi's scheduler reads 0 as "unset", its webhook as not exclusive).
        ({GPU: 1, PCT: 0}, 0, False),
        ({GPU: 2}, 0, True),
        # CastSlice's one difference: a count of 0 asks for no GPU and gets no cores (HAMi adds 100).
        ({GPU: 0}, 0, False),
        ({GPU: 0, PCT: 100}, 0, False),
        # Cores 0 asked explicitly stay 0: the Pod said so.
        ({GPU: 1, CORES: 0}, 0, False),
    ],
)
def test_corners_of_hamis_rule(values: dict[str, int], added: int, expected: bool) -> None:
    assert whole_gpu_cores(NVIDIA, values, added_count=added) == (CORES if expected else None)


def test_a_device_without_a_cores_resource_never_gets_cores() -> None:
    assert whole_gpu_cores(Names(coresResource=None), {GPU: 1}, added_count=0) is None


def test_a_device_without_a_percentage_resource_decides_by_the_memory_size() -> None:
    no_percentage = Names(memoryPercentageResource=None)
    assert whole_gpu_cores(no_percentage, {GPU: 1}, added_count=0) == CORES
    assert whole_gpu_cores(no_percentage, {GPU: 1, MEM: 10}, added_count=0) is None
    # Another device's percentage resource means nothing to this one.
    assert whole_gpu_cores(no_percentage, {GPU: 1, PCT: 50}, added_count=0) == CORES
