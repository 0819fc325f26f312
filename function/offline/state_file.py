"""A cluster state file, as ``castslice mutate --cluster`` and the tests read it: the view a webhook
would build from its watches, built instead from what ``kubectl get ... -o yaml`` printed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from function.core.view import PODS, REPLICASETS, Record, StaticView, WatchSpec, merge_specs


class StateFileError(ValueError):
    """A cluster state file that cannot be read; the message names the file and what is wrong."""


def _objects(document: Any, where: str) -> Iterator[Mapping[str, Any]]:
    if document is None:
        return
    if not isinstance(document, Mapping):
        raise StateFileError(f"{where}: expected a Kubernetes object or List, got {type(document).__name__}")
    items, kind = document.get("items"), document.get("kind")
    is_list = isinstance(kind, str) and kind.endswith("List")
    if is_list and isinstance(items, list):
        for position, item in enumerate(items):
            yield from _objects(item, f"{where}, items[{position}]")
    elif is_list and "items" in document:
        raise StateFileError(f"{where}: 'items' of a {document.get('kind')} must be a list")
    else:
        yield document


def read_objects(source: str | Path | TextIO, name: str | None = None) -> list[Mapping[str, Any]]:
    """Every object of a state file (a path) or stream, the items of its Lists in order: what
    ``kubectl get ... -o yaml`` prints (a List, or any YAML/JSON stream of objects and Lists).
    ``name`` is how messages name the source (by default its path, or the stream's name)."""
    if name is None:
        name = str(source) if isinstance(source, str | Path) else getattr(source, "name", "<stream>")
    try:
        text = Path(source).read_text(encoding="utf-8") if isinstance(source, str | Path) else source.read()
        documents = list(yaml.safe_load_all(text))
    except (OSError, UnicodeDecodeError) as error:
        raise StateFileError(f"cluster state {name}: cannot read it: {error}") from error
    except yaml.YAMLError as error:
        raise StateFileError(f"cluster state {name}: not YAML: {error}") from error
    return [
        obj
        for number, document in enumerate(documents)
        for obj in _objects(document, f"cluster state {name}, document {number}")
    ]


def view_of(
    objects: Iterable[Mapping[str, Any]], specs: Iterable[WatchSpec] = (PODS, REPLICASETS)
) -> StaticView:
    """The view the webhook's watches would keep of these objects: each spec's ``slim`` runs over
    the objects of its kind, exactly as the watch does, so an offline decision sees what the
    webhook would see. Every spec counts as synced: the objects are taken as the whole state
    (objects of kinds no spec wants are ignored)."""
    specs = merge_specs(specs)
    loaded: dict[str, dict[str, Record]] = {spec.index: {} for spec in specs}
    for obj in objects:
        for spec in specs:
            if spec.matches(obj):
                key, record = spec.key(obj), spec.slim(obj)
                if key and record is not None:
                    loaded[spec.index][key] = record
    return StaticView(loaded, specs)


def load_state(source: str | Path | TextIO, specs: Iterable[WatchSpec] = (PODS, REPLICASETS)) -> StaticView:
    """The view of a state file or stream (``read_objects``, ``view_of``)."""
    return view_of(read_objects(source), specs)
