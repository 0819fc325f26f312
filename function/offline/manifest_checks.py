"""Checks of a manifest before the engine sees it: where YAML typing and users go wrong.

YAML reads ``optimize: true``, ``slice-ratio: 4`` and ``date: 2024-01-01`` as a boolean, a number
and a date. Where Kubernetes wants a string (annotation and label values, env values, args, ...)
kubectl and the apiserver refuse the first two ("cannot unmarshal bool into Go struct field
ObjectMeta.metadata.annotations of type string"); a date stays text for kubectl (its YAML 1.1
decoder keeps timestamps as strings) but becomes a date in PyYAML- and ruamel-based tools, Helm's
values included. The preview names each such place with its path and the quoted form to write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from function.core.pod import CONTAINER_LISTS
from function.offline.discovery import Path, PodSite, dotted, get_path
from function.offline.yamldoc import YAML11_BOOLEANS, DateText, is_plain_scalar

CASTSLICE_PREFIX = "castops.io/"
OPT_IN_ANNOTATION = "castops.io/optimize"
_STRING_MAPS_OF_META = ("annotations", "labels")
_STRING_FIELDS_OF_META = ("name", "generateName", "namespace")
_STRING_FIELDS_OF_SPEC = (
    "schedulerName",
    "serviceAccountName",
    "nodeName",
    "priorityClassName",
    "runtimeClassName",
)
_STRING_FIELDS_OF_CONTAINER = ("name", "image", "workingDir")
_STRING_LISTS_OF_CONTAINER = ("command", "args")
_STRING_FIELDS_OF_TOLERATION = ("key", "operator", "value", "effect")


@dataclass(frozen=True)
class Problem:
    severity: Literal["error", "warning"]
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _describe(value: Any) -> tuple[str, str, Literal["error", "warning"]] | None:
    """(what YAML made of it, its text, severity) for a value that is not a plain string."""
    if isinstance(value, bool):
        return "a boolean", "true" if value else "false", "error"
    if isinstance(value, int | float):
        return "a number", str(value), "error"
    if isinstance(value, DateText):
        return "a date", str(value), "warning"
    if is_plain_scalar(value) and value in YAML11_BOOLEANS:
        return "a boolean for kubectl (YAML 1.1)", str(value), "error"
    return None


def _check(value: Any, path: Path) -> Iterator[Problem]:
    described = _describe(value)
    if described is None:
        return
    what, text, severity = described
    advice = f'Kubernetes wants a string here: quote it ("{text}")'
    if severity == "warning":
        advice = (
            f"YAML tools that read dates (PyYAML, ruamel, Helm values) turn it into a date; "
            f'quote it ("{text}")'
        )
    yield Problem(severity, dotted(path), f"{text} is {what}; {advice}")


def _string_map(tree: Any, path: Path) -> Iterator[Problem]:
    node = get_path(tree, path)
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _check(value, (*path, str(key)))


def _string_fields(tree: Any, path: Path, fields: tuple[str, ...]) -> Iterator[Problem]:
    node = get_path(tree, path)
    if isinstance(node, Mapping):
        for field in fields:
            if field in node:
                yield from _check(node[field], (*path, field))


def _string_list(tree: Any, path: Path) -> Iterator[Problem]:
    node = get_path(tree, path)
    if isinstance(node, list):
        for index, value in enumerate(node):
            yield from _check(value, (*path, index))


def metadata_problems(tree: Any, metadata: Path) -> Iterator[Problem]:
    for name in _STRING_MAPS_OF_META:
        yield from _string_map(tree, (*metadata, name))
    yield from _string_fields(tree, metadata, _STRING_FIELDS_OF_META)


def container_problems(tree: Any, container: Path) -> Iterator[Problem]:
    yield from _string_fields(tree, container, _STRING_FIELDS_OF_CONTAINER)
    for name in _STRING_LISTS_OF_CONTAINER:
        yield from _string_list(tree, (*container, name))
    env = get_path(tree, (*container, "env"))
    if isinstance(env, list):
        for index in range(len(env)):
            yield from _string_fields(tree, (*container, "env", index), ("name", "value"))


def pod_spec_problems(tree: Any, spec: Path) -> Iterator[Problem]:
    yield from _string_fields(tree, spec, _STRING_FIELDS_OF_SPEC)
    yield from _string_map(tree, (*spec, "nodeSelector"))
    for kind in CONTAINER_LISTS:
        containers = get_path(tree, (*spec, kind))
        if isinstance(containers, list):
            for index in range(len(containers)):
                yield from container_problems(tree, (*spec, kind, index))
    tolerations = get_path(tree, (*spec, "tolerations"))
    if isinstance(tolerations, list):
        for index in range(len(tolerations)):
            yield from _string_fields(tree, (*spec, "tolerations", index), _STRING_FIELDS_OF_TOLERATION)


def site_problems(tree: Any, site: PodSite) -> Iterator[Problem]:
    """Every non-string value where the Pod of ``site`` needs a string (paths in the document)."""
    base = site.path
    if site.shape == "kserve-component":
        for name in _STRING_MAPS_OF_META:
            yield from _string_map(tree, (*base, name))
        yield from pod_spec_problems(tree, base)
        if site.model_key is not None:
            yield from container_problems(tree, (*base, site.model_key))
        return
    if site.shape == "podspec":
        for name in _STRING_MAPS_OF_META:
            yield from _string_map(tree, (*site.meta_path, name))
        yield from pod_spec_problems(tree, base)
        return
    if site.shape == "template":
        yield from metadata_problems(tree, (*base, "metadata"))
    yield from pod_spec_problems(tree, (*base, "spec"))


def object_problems(tree: Any, sites: list[PodSite]) -> list[Problem]:
    """The object's own metadata, then each Pod's; each place reported once."""
    problems: dict[str, Problem] = {}
    found = list(metadata_problems(tree, ("metadata",)))
    for site in sites:
        found.extend(site_problems(tree, site))
    for problem in found:
        problems.setdefault(problem.path, problem)
    return list(problems.values())


def misplaced_opt_in(document: Mapping[str, Any], sites: list[PodSite]) -> list[str]:
    """Hints for CastSlice annotations on a workload's own metadata, which its Pods never see.

    Not for a Pod (its metadata is the Pod's) nor a KServe InferenceService (KServe copies its
    annotations onto the component Pods)."""
    if not sites or any(site.shape not in ("template", "podspec") for site in sites):
        return []
    metadata = document.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    hints = []
    kind = str(document.get("kind", "object"))
    for key in annotations:
        if not str(key).startswith(CASTSLICE_PREFIX):
            continue
        missing = [s for s in sites if key not in (get_path(document, s.annotations_path) or {})]
        if not missing:
            continue
        where = dotted(missing[0].annotations_path)
        if len(missing) > 1:
            where += f" (and the {len(missing) - 1} other Pod template(s))"
        what = "the opt-in " if key == OPT_IN_ANNOTATION else ""
        hints.append(
            f"{what}{key} is on the {kind}'s own metadata, which its Pods never see: put it in {where}"
        )
    return hints
