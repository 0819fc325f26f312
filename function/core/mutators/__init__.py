"""The mutator plug-ins, in one list: adding a mutator means one import and one entry here.

The engine runs the enabled ones by ascending ``order``; the configuration gets one section per
plug-in, keyed by its ``config_key``.
"""

from __future__ import annotations

from function.core.mutators import gpu_leases, gpu_slicing, pod_mutations, spot, vgpu
from function.core.mutators.registry import MutatorPlugin

PLUGINS: tuple[MutatorPlugin, ...] = tuple(
    sorted(
        (gpu_slicing.PLUGIN, vgpu.PLUGIN, pod_mutations.PLUGIN, gpu_leases.PLUGIN, spot.PLUGIN),
        key=lambda plugin: plugin.order,
    )
)
