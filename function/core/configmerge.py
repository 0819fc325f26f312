"""Map-valued settings merge with their defaults: a file names only what it changes.

``gpuSlicing.presets: {training: 8}`` changes the training preset and keeps the other defaults.
A key set to ``null`` removes that default (``presets: {dev: null}``). To state the whole map and
drop every default, the section sets the map's ``replace`` flag (``replacePresets: true``): then
the map is taken as written. Lists (``excludedNamespaces``, ``vgpu.devices``) are not merged:
a list given in the file replaces the default list, as in Helm values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_map(defaults: Mapping[str, Any], given: Any, replace: bool) -> Any:
    """``given`` over ``defaults`` (or alone with ``replace``), null values removing keys.

    Anything but a mapping is returned unchanged, for the model's own validation to refuse."""
    if not isinstance(given, Mapping):
        return given
    merged = dict(given) if replace else {**defaults, **given}
    return {key: value for key, value in merged.items() if value is not None}
