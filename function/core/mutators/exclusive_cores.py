"""Exclusive compute for a container that takes whole GPUs (current HAMi, PR #1354).

HAMi's scheduler books a container's share of a GPU's compute from its cores resource
(``nvidia.com/gpucores``, percent of the GPU), 0 when absent. A container asking for whole GPUs
(a count and no memory size) would thus reserve all of a GPU's memory and none of its compute, and
share the compute with whatever else lands there. Since September 2025 HAMi's NVIDIA device
(``pkg/device/nvidia/device.go``, ``defaultExclusiveCoreIfNeeded``, read at HAMi 4707fb02) gives
such a container ``gpucores: 100`` at admission. Its rule, after the default count is added:

- the container has the count (asked or just added) and does not ask for the cores;
- its memory is exclusive: with the memory percentage, only when it is 100; without it, when the
  device has no memory resource or the container does not ask for the memory size.

One deliberate difference: a count of 0 gets no cores. It asks for no GPU (HAMi's scheduler skips
it too); and with GPU slicing on, an opted-in Pod's ``nvidia.com/gpu: 0`` container is left
unsliced, so cores added to it would make slicing see a HAMi resource on reinvocation and deny
a Pod that is admitted today.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

EXCLUSIVE_CORES = 100
"""A cores value of 100 is what HAMi's scheduler reads as "this GPU exclusively"."""


class DeviceResources(Protocol):
    """The names of one device's resources (``VgpuDevice`` has them)."""

    @property
    def countResource(self) -> str: ...

    @property
    def memoryResource(self) -> str | None: ...

    @property
    def memoryPercentageResource(self) -> str | None: ...

    @property
    def coresResource(self) -> str | None: ...


def whole_gpu_cores(device: DeviceResources, values: Mapping[str, int], added_count: int) -> str | None:
    """The cores resource a container gets ``EXCLUSIVE_CORES`` of, or None when it does not take
    whole GPUs of ``device`` (or the device has no cores resource).

    ``values``: the device resources the container asks for, each with its (checked) value;
    ``added_count``: the count this pass adds to it (0 when none is added).
    """
    cores = device.coresResource
    if _asked(values, cores) is not None:
        return None  # the Pod chose its share of the compute itself
    count = values.get(device.countResource, added_count)
    if count <= 0:
        return None
    percentage = _asked(values, device.memoryPercentageResource)
    if percentage is not None:
        return cores if percentage == 100 else None
    return cores if _asked(values, device.memoryResource) is None else None


def _asked(values: Mapping[str, int], name: str | None) -> int | None:
    """What the container asks for of ``name``; None when it does not, or the device has no such
    resource (``name`` None)."""
    return next((value for asked, value in values.items() if asked == name), None)
