"""Where the Pods are in a manifest: Pod templates and Pod specs of every kind that makes Pods.

Used by ``castslice mutate``: each place found is turned into a Pod the engine judges, and the
engine's patch (relative to that Pod) is mapped back to paths in the document.

Two ways to find them, on purpose:

- ``KNOWN_KINDS``, an explicit table of paths per (API group, kind), checked against each
  project's API types (Kubernetes, Kubeflow training-operator and mpi-operator, KubeRay, JobSet,
  LeaderWorkerSet, Argo Rollouts, Knative Serving, KServe). A table is exact: it names the role of
  each template in the decision line, it never mistakes an unrelated ``template`` for a Pod, and it
  covers shapes that are not Pod templates at all (a KServe component is a Pod spec with the
  model as an extra container).
- ``walk_templates``, a general walk for kinds the table does not know (Volcano Jobs, in-house
  CRDs, ...): any object under ``spec`` shaped like a PodTemplateSpec (only ``metadata`` and
  ``spec`` keys, and a ``spec.containers`` list). Its finds are reported as such, so a user sees
  that the preview guessed. Only the table is trusted for known kinds; a test checks that the walk
  finds the same templates there (KServe aside), so the table cannot silently miss one.

A document may hold a GPU request where neither finds a Pod (Kubeflow Trainer's
``spec.trainer.resourcesPerNode``, KServe's older ``serving.kubeflow.org/v1alpha2`` framework
specs): ``resources_outside`` names those places, so the preview warns instead of claiming the
document makes no Pods.

Each Pod is judged as the webhook will see it: with the controller the webhook's owner walk ends
at (``seen_owner``: a LeaderWorkerSet's Pods belong to StatefulSets, a RayService's to a
RayCluster, a Deployment's to its ReplicaSet) and with the fields the controller fills in
(``PodSite.inherited``: a Volcano Job's ``schedulerName``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from function.core.json_patch import copy_json
from function.core.pointer import escape, tokens

Segment = str | int
Path = tuple[Segment, ...]
WILDCARD = "*"
"""In a table path: every key of a map, or every item of a list, at that place."""

Shape = Literal["pod", "template", "podspec", "kserve-component"]
"""``podspec``: a bare PodSpec whose Pod metadata (``labels``, ``annotations``) sits beside it
(KServe's LLMInferenceService ``spec.template``, with ``spec.annotations``)."""

# The built-in kinds whose controllers turn a template into Pods.
_BUILT_IN: dict[tuple[str, str], tuple[Path, ...]] = {
    ("apps", "Deployment"): (("spec", "template"),),
    ("apps", "StatefulSet"): (("spec", "template"),),
    ("apps", "DaemonSet"): (("spec", "template"),),
    ("apps", "ReplicaSet"): (("spec", "template"),),
    ("", "ReplicationController"): (("spec", "template"),),
    ("batch", "Job"): (("spec", "template"),),
    ("batch", "CronJob"): (("spec", "jobTemplate", "spec", "template"),),
}


def _kubeflow(replica_specs: str) -> tuple[Path, ...]:
    # training-operator (and mpi-operator v2beta1): spec.<x>ReplicaSpecs.<Role>.template
    return (("spec", replica_specs, WILDCARD, "template"),)


def _ray(cluster: Path) -> tuple[Path, ...]:
    # KubeRay's RayClusterSpec: one head group and a list of worker groups, each with a template.
    return (
        (*cluster, "headGroupSpec", "template"),
        (*cluster, "workerGroupSpecs", WILDCARD, "template"),
    )


KNOWN_KINDS: dict[tuple[str, str], tuple[Path, ...]] = {
    **_BUILT_IN,
    ("kubeflow.org", "PyTorchJob"): _kubeflow("pytorchReplicaSpecs"),
    ("kubeflow.org", "TFJob"): _kubeflow("tfReplicaSpecs"),
    ("kubeflow.org", "MPIJob"): _kubeflow("mpiReplicaSpecs"),
    ("kubeflow.org", "XGBoostJob"): _kubeflow("xgbReplicaSpecs"),
    ("kubeflow.org", "PaddleJob"): _kubeflow("paddleReplicaSpecs"),
    ("kubeflow.org", "MXJob"): _kubeflow("mxReplicaSpecs"),
    ("ray.io", "RayCluster"): _ray(("spec",)),
    # RayJob: its cluster, and the Pod that runs `ray job submit` (K8sJobMode).
    ("ray.io", "RayJob"): (*_ray(("spec", "rayClusterSpec")), ("spec", "submitterPodTemplate")),
    ("ray.io", "RayService"): _ray(("spec", "rayClusterConfig")),
    ("jobset.x-k8s.io", "JobSet"): (("spec", "replicatedJobs", WILDCARD, "template", "spec", "template"),),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ),
    ("argoproj.io", "Rollout"): (("spec", "template"),),
    # A Knative revision template: metadata plus a RevisionSpec (a PodSpec subset).
    ("serving.knative.dev", "Service"): (("spec", "template"),),
    ("serving.knative.dev", "Configuration"): (("spec", "template"),),
    # Volcano's batch Job: one template per task; its Pods take the Job's schedulerName.
    ("batch.volcano.sh", "Job"): (("spec", "tasks", WILDCARD, "template"),),
}

VOLCANO_JOB = ("batch.volcano.sh", "Job")
VOLCANO_SCHEDULER = "volcano"
"""What Volcano's admission defaults a Job's ``spec.schedulerName`` to."""

KSERVE = ("serving.kserve.io", "InferenceService")
KSERVE_GROUPS = ("serving.kserve.io", "serving.kubeflow.org")
"""KServe, and KFServing before its rename: ``serving.kubeflow.org/v1beta1`` has KServe's shape."""
LLM_INFERENCE_SERVICE = ("serving.kserve.io", "LLMInferenceService")
LLMISVC_WORKLOADS: tuple[Path, ...] = (("spec",), ("spec", "prefill"))
"""Where an LLMInferenceService's WorkloadSpecs sit: the main (decode) one, inline, and prefill.
Each has a ``template`` PodSpec (the head Pod when multi-node), an optional ``worker`` PodSpec, and
the ``labels`` and ``annotations`` KServe adds to their Pods."""
KSERVE_COMPONENTS = ("predictor", "transformer", "explainer")
KSERVE_MODEL_KEYS = (
    "model",
    # The older framework-specific predictors; KServe allows one per component.
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
)
KSERVE_CONTAINER = "kserve-container"
"""The name KServe gives the container it builds from the model spec."""

WALK_DEPTH = 16
"""The general walk stops this deep: real templates sit within a few levels of ``spec``."""


def api_group(document: Mapping[str, Any]) -> str:
    api_version = document.get("apiVersion")
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


class Unmappable(Exception):
    """A patch operation touches a part of the Pod that has no place in the document."""


@dataclass(frozen=True)
class PodSite:
    """One Pod (or Pod template) in a document, and how to judge it and write the result back."""

    path: Path
    """Where it sits in the document: () for a Pod, ('spec', 'template') for a Deployment, ..."""
    shape: Shape
    found_by: Literal["kind", "walk"] = "kind"
    model_key: str | None = None
    """KServe: the model spec judged as the component's last container."""
    model_index: int = 0
    """KServe: that container's index in the judged Pod (after the component's own containers)."""
    meta_path: Path = ()
    """``podspec``: the object whose ``labels`` and ``annotations`` the controller puts on the Pod."""
    inherited: tuple[tuple[str, Any], ...] = ()
    """Pod spec fields the controller fills in when the template leaves them out."""

    @property
    def label(self) -> str:
        """The path as users write it: spec.workerGroupSpecs[0].template."""
        return dotted(self.path)

    def node(self, document: Any) -> Any:
        return get_path(document, self.path)

    def pod(self, document: Any) -> dict[str, Any]:
        """The Pod the engine judges: a copy, so the document is never changed by the engine."""
        node = self.node(document)
        if self.shape == "pod":
            pod: dict[str, Any] = copy_json(node)
            return pod
        if self.shape == "template":
            metadata = copy_json(node.get("metadata") or {})
            if isinstance(metadata, dict):
                # A controller names its Pods itself: a name in the template never reaches them.
                metadata.pop("name", None)
                metadata.pop("generateName", None)
            spec = copy_json(node.get("spec"))
            return self._inherit({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
        if self.shape == "podspec":
            holder = get_path(document, self.meta_path)
            holder = holder if isinstance(holder, dict) else {}
            metadata = {key: copy_json(holder[key]) for key in ("labels", "annotations") if key in holder}
            return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy_json(node)}
        return self._kserve_pod(document, node)

    def _inherit(self, pod: dict[str, Any]) -> dict[str, Any]:
        spec = pod.get("spec")
        if isinstance(spec, dict):
            for key, value in self.inherited:
                spec.setdefault(key, value)
        return pod

    def inherits(self, document: Any, pod_path: Path) -> bool:
        """True when ``pod_path`` is a spec field the judged Pod got from the controller, not the
        template (a patch may then add it to the template, never replace or remove it there)."""
        if len(pod_path) != 2 or pod_path[0] != "spec" or pod_path[1] not in dict(self.inherited):
            return False
        spec = get_path(document, (*self.path, "spec"))
        return not (isinstance(spec, dict) and pod_path[1] in spec)

    def _kserve_pod(self, document: Any, component: dict[str, Any]) -> dict[str, Any]:
        # KServe copies the InferenceService's own annotations and labels onto the component's
        # Pods, under the component's own (which win).
        metadata: dict[str, Any] = {}
        top = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
        for key in ("annotations", "labels"):
            merged = {**(top.get(key) or {}), **(component.get(key) or {})}
            if merged:
                metadata[key] = merged
        # The model spec is judged as a container, not left in the spec as well.
        skip = ("annotations", "labels", self.model_key)
        spec = {k: v for k, v in component.items() if k not in skip}
        spec = copy_json(spec)
        if self.model_key is not None:
            model = copy_json(component[self.model_key])
            model.setdefault("name", KSERVE_CONTAINER)
            containers = spec.get("containers") if isinstance(spec.get("containers"), list) else []
            spec["containers"] = [*containers, model]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def document_path(self, pod_path: Path) -> Path:
        """The document path of a path in the judged Pod (a patch operation's target)."""
        if self.shape == "pod":
            return pod_path
        if self.shape == "template":
            if pod_path[:1] in (("metadata",), ("spec",)):
                return (*self.path, *pod_path)
            raise Unmappable(f"/{'/'.join(map(str, pod_path))} is not part of a Pod template")
        if self.shape == "podspec":
            if pod_path[:2] in (("metadata", "annotations"), ("metadata", "labels")):
                return (*self.meta_path, *pod_path[1:])
            if pod_path[:1] == ("spec",) and len(pod_path) > 1:
                return (*self.path, *pod_path[1:])
            raise Unmappable(f"/{'/'.join(map(str, pod_path))} has no place in {self.label}")
        return self._kserve_path(pod_path)

    @property
    def annotations_path(self) -> Path:
        """Where the Pod's annotations are written in the document."""
        if self.shape == "pod":
            return ("metadata", "annotations")
        if self.shape == "template":
            return (*self.path, "metadata", "annotations")
        if self.shape == "podspec":
            return (*self.meta_path, "annotations")
        return (*self.path, "annotations")

    def _kserve_path(self, pod_path: Path) -> Path:
        head = pod_path[:2]
        if head in (("metadata", "annotations"), ("metadata", "labels")):
            return (*self.path, pod_path[1], *pod_path[2:])
        if pod_path[:1] == ("spec",) and len(pod_path) > 1 and pod_path[1] not in ("annotations", "labels"):
            rest = pod_path[1:]
            if self.model_key is not None and rest[0] == "containers":
                if len(rest) < 3:
                    raise Unmappable("a change to the whole container list of a KServe component")
                if str(rest[1]) == str(self.model_index):
                    if rest[2] == "name":
                        raise Unmappable("a change to the name KServe gives the model container")
                    return (*self.path, self.model_key, *rest[2:])
            return (*self.path, *rest)
        raise Unmappable(f"/{'/'.join(map(str, pod_path))} has no place in a KServe component")


def dotted(path: Path) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + part
    return text


def pointer(path: Path) -> str:
    return "".join("/" + escape(str(part)) for part in path)


def parse_pointer(text: str) -> Path:
    """An RFC 6901 pointer as path segments (strings; list indices stay digit strings)."""
    return tokens(text)


def get_path(document: Any, path: Path) -> Any:
    node = document
    for part in path:
        if isinstance(node, dict):
            node = node.get(part) if isinstance(part, str) else None
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return None
        if node is None:
            return None
    return node


def is_pod_template(node: Any) -> bool:
    """The PodTemplateSpec shape: a mapping of ``metadata`` and ``spec`` whose spec has containers."""
    if not isinstance(node, dict) or not set(node) <= {"metadata", "spec"}:
        return False
    spec = node.get("spec")
    return isinstance(spec, dict) and isinstance(spec.get("containers"), list)


def expand(document: Any, pattern: Path) -> Iterator[Path]:
    """Every concrete path matching ``pattern`` (``*`` takes every key or list index)."""

    def step(node: Any, done: Path, rest: Path) -> Iterator[Path]:
        if not rest:
            yield done
            return
        head, tail = rest[0], rest[1:]
        if head == WILDCARD:
            if isinstance(node, dict):
                for key, value in node.items():
                    if isinstance(key, str):
                        yield from step(value, (*done, key), tail)
            elif isinstance(node, list):
                for index, value in enumerate(node):
                    yield from step(value, (*done, index), tail)
        elif isinstance(node, dict) and head in node:
            yield from step(node[head], (*done, head), tail)

    yield from step(document, (), pattern)


def walk_templates(document: Any) -> list[Path]:
    """The general walk: every PodTemplateSpec-shaped object under ``spec``, outermost first."""
    found: list[Path] = []

    def visit(node: Any, path: Path) -> None:
        if len(path) > WALK_DEPTH:
            return
        if path and is_pod_template(node):
            found.append(path)
            return
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str):
                    visit(value, (*path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, (*path, index))

    spec = document.get("spec") if isinstance(document, dict) else None
    if isinstance(spec, dict):
        visit(spec, ("spec",))
    return found


def known_paths(document: Mapping[str, Any]) -> tuple[Path, ...] | None:
    """The table's paths for this document's kind, None when the kind is not in the table.

    Without an apiVersion (not a valid manifest, but common in snippets) a built-in kind is
    recognised by its kind alone; a custom kind always needs its group (Knative's Service is not
    the core Service)."""
    kind = document.get("kind")
    if not isinstance(kind, str):
        return None
    group = api_group(document)
    if (group, kind) in KNOWN_KINDS:
        return KNOWN_KINDS[(group, kind)]
    if "apiVersion" not in document:
        for (_, built_in_kind), paths in _BUILT_IN.items():
            if built_in_kind == kind:
                return paths
    return None


def _kserve_sites(document: Mapping[str, Any]) -> list[PodSite]:
    spec = document.get("spec")
    if not isinstance(spec, dict):
        return []
    sites = []
    for component in KSERVE_COMPONENTS:
        node = spec.get(component)
        if not isinstance(node, dict):
            continue
        model_key = next((k for k in KSERVE_MODEL_KEYS if isinstance(node.get(k), dict)), None)
        containers = node.get("containers")
        if model_key is None and not isinstance(containers, list):
            continue
        index = len(containers) if isinstance(containers, list) else 0
        sites.append(PodSite(("spec", component), "kserve-component", "kind", model_key, index))
    return sites


def _llmisvc_sites(document: Mapping[str, Any]) -> list[PodSite]:
    sites = []
    for workload in LLMISVC_WORKLOADS:
        for field_name in ("template", "worker"):
            path = (*workload, field_name)
            if isinstance(get_path(document, path), dict):
                sites.append(PodSite(path, "podspec", meta_path=workload))
    scheduler = ("spec", "router", "scheduler")
    if isinstance(get_path(document, (*scheduler, "template")), dict):
        sites.append(PodSite((*scheduler, "template"), "podspec", meta_path=scheduler))
    return sites


def _inherited(document: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    if (api_group(document), document.get("kind")) == VOLCANO_JOB:
        scheduler = get_path(document, ("spec", "schedulerName"))
        named = scheduler if isinstance(scheduler, str) and scheduler else VOLCANO_SCHEDULER
        return (("schedulerName", named),)
    return ()


def find_pods(document: Any) -> list[PodSite]:
    """Every Pod or Pod template of a document, in document order ([] when it makes no Pods)."""
    if not isinstance(document, dict):
        return []
    kind = document.get("kind")
    if kind == "Pod" and api_group(document) == "":
        return [PodSite((), "pod")]
    group = api_group(document)
    if kind == KSERVE[1] and group in KSERVE_GROUPS:
        return _kserve_sites(document)
    if (group, kind) == LLM_INFERENCE_SERVICE:
        return _llmisvc_sites(document)
    paths = known_paths(document)
    if paths is not None:
        inherited = _inherited(document)
        return [
            PodSite(concrete, "template", inherited=inherited)
            for pattern in paths
            for concrete in expand(document, pattern)
            if isinstance(get_path(document, concrete), dict)
            and isinstance(get_path(document, (*concrete, "spec")), dict)
        ]
    return [PodSite(path, "template", "walk") for path in walk_templates(document)]


# --- what the webhook will see --------------------------------------------------------------------


@dataclass(frozen=True)
class SeenOwner:
    """The controller of a workload's Pods as the webhook's owner walk ends at it.

    The webhook walks a Pod's controller through the ReplicaSets and Jobs it watches (a
    Deployment's Pod reaches the Deployment, a JobSet's Pod the JobSet through its Job) and stops
    at anything else: a LeaderWorkerSet's Pods belong to StatefulSets, a RayService's and a
    RayJob's to the RayCluster it creates, KServe's to the Deployment it creates. Names with a
    random part show it as ``xxxxx``."""

    api_version: str
    kind: str
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    """Labels the controller puts on its Pods that the owner walk reads (``pod-template-hash``)."""

    def reference(self, uid: str) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": uid,
            "controller": True,
        }


_TEMPLATE_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet Kubernetes writes pod-template-hash in (``rand.SafeEncodeString``)."""


def _template_hash(node: Any) -> str:
    digest = hashlib.sha256(json.dumps(node, sort_keys=True, default=str).encode()).digest()
    return "".join(_TEMPLATE_HASH_ALPHABET[byte % len(_TEMPLATE_HASH_ALPHABET)] for byte in digest[:10])


def _kserve_deployment(document: Mapping[str, Any], name: str, component: str) -> str:
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    annotations = (metadata or {}).get("annotations")
    mode = annotations.get("serving.kserve.io/deploymentMode") if isinstance(annotations, dict) else None
    if mode in ("Serverless", "Knative"):
        return f"{name}-{component}-00001-deployment"  # the first Knative revision's Deployment
    return f"{name}-{component}"


def seen_owner(document: Mapping[str, Any], site: PodSite, name: str) -> SeenOwner | None:
    """The owner the webhook will see for the Pods of ``site`` (None for a Pod document)."""
    if site.shape == "pod":
        return None
    group, kind = api_group(document), str(document.get("kind", ""))
    api_version = str(document.get("apiVersion", ""))
    path = site.path
    if (group, kind) == ("apps", "Deployment") or (group, kind) == ("argoproj.io", "Rollout"):
        template_hash = _template_hash(site.node(document))
        return SeenOwner(
            "apps/v1", "ReplicaSet", f"{name}-{template_hash}", (("pod-template-hash", template_hash),)
        )
    if (group, kind) == ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"):
        # The leader StatefulSet is named after the set; group i's workers form StatefulSet <name>-<i>.
        return SeenOwner("apps/v1", "StatefulSet", name if path[-1] == "leaderTemplate" else f"{name}-0")
    if group == "ray.io" and kind in ("RayService", "RayJob") and path[-1] != "submitterPodTemplate":
        return SeenOwner("ray.io/v1", "RayCluster", f"{name}-raycluster-xxxxx")
    if kind == KSERVE[1] and group in KSERVE_GROUPS:
        return SeenOwner("apps/v1", "Deployment", _kserve_deployment(document, name, str(path[-1])))
    if (group, kind) == LLM_INFERENCE_SERVICE:
        base = f"{name}-kserve" + ("-prefill" if "prefill" in path else "")
        if "router" in path:
            return SeenOwner("apps/v1", "Deployment", f"{name}-kserve-router-scheduler")
        multi_node = isinstance(get_path(document, (*site.meta_path, "worker")), dict)
        if not multi_node:
            return SeenOwner("apps/v1", "Deployment", base)
        # Multi-node: a LeaderWorkerSet, whose Pods belong to its StatefulSets.
        return SeenOwner("apps/v1", "StatefulSet", base if path[-1] == "template" else f"{base}-0")
    if (group, kind) in (("serving.knative.dev", "Service"), ("serving.knative.dev", "Configuration")):
        return SeenOwner("apps/v1", "Deployment", f"{name}-00001-deployment")
    return SeenOwner(api_version, kind, name)


def resources_outside(
    document: Any, sites: list[PodSite], resources: Collection[str]
) -> list[tuple[Path, str]]:
    """(path of the map, resource) for every request of ``resources`` that no site covers."""
    covered = [site.path for site in sites]
    found: list[tuple[Path, str]] = []

    def visit(node: Any, path: Path) -> None:
        if len(path) > WALK_DEPTH + 8 or any(path[: len(c)] == c for c in covered if c):
            return
        if isinstance(node, dict):
            for key, value in node.items():
                if key in resources and not isinstance(value, dict | list):
                    found.append((path, str(key)))
                elif isinstance(key, str):
                    visit(value, (*path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, (*path, index))

    if isinstance(document, dict) and not any(site.shape == "pod" for site in sites):
        visit(document, ())
    return found
