"""The preview tells the truth or says it cannot (issue 29's reproductions, one test each): GPU
workloads of kinds it does not know are warned about by name and path, explain covers every Pod a
workload makes, Pods are judged with the owner and scheduler the webhook will see, spot on a
template says what each Pod gets, a policy never silently changes what a Pod asked for, and a
Helm-rendered document keeps the lines the change did not touch."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import pytest
import yaml

from function.offline.discovery import find_pods, seen_owner
from function.offline.manifests import describe_name, owned_pod
from tests.support import ROOT
from tests.support.cli import run

WORKLOADS = ROOT / "tests" / "data" / "workloads"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- kinds the preview did not know ---------------------------------------------------------------
LLMISVC = """apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: qwen, namespace: ml}
spec:
  model: {uri: "hf://Qwen/Qwen2.5-7B-Instruct"}
  annotations: {castops.io/optimize: "true", castops.io/workload-type: inference}
  template:
    containers:
      - name: main
        resources: {limits: {nvidia.com/gpu: "1"}, requests: {nvidia.com/gpu: "1"}}
  prefill:
    template:
      containers:
        - name: main
          resources: {limits: {nvidia.com/gpu: "1"}}
"""


def test_an_llminferenceservice_is_judged_through_its_workload_annotations(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "llm.yaml", LLMISVC))
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == "llminferenceservice/qwen spec.template: mutated"
    assert "llminferenceservice/qwen spec.prefill.template: unchanged" in lines  # its own annotations: none
    document = yaml.safe_load(out)
    assert document["spec"]["template"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu-shared": "2"
    }
    # The record of what was asked goes where KServe takes the Pod's annotations from.
    assert (
        document["spec"]["annotations"]["castops.io/original-gpu-request"]
        == "containers/main: nvidia.com/gpu=1"
    )


def test_an_opt_in_on_the_llminferenceservices_own_metadata_gets_a_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    misplaced = LLMISVC.replace(
        "metadata: {name: qwen, namespace: ml}",
        'metadata: {name: qwen, namespace: ml, annotations: {castops.io/slice-ratio: "4"}}',
    )
    _, _, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "llm.yaml", misplaced))
    assert "hint: castops.io/slice-ratio is on the LLMInferenceService's own metadata" in err
    assert "put it in spec.annotations" in err


def test_the_older_serving_kubeflow_org_inferenceservice_is_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run(
        monkeypatch, "mutate", "-f", str(WORKLOADS / "10-kfserving-inferenceservice-torchserve-gpu.yaml")
    )
    assert code == 0
    assert err.startswith("inferenceservice/torchserve-gpu spec.predictor: unchanged\n")
    assert "creates no Pods" not in err


def test_gpus_in_a_kind_without_a_known_pod_template_are_warned_by_name_and_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = run(
        monkeypatch, "mutate", "-f", str(WORKLOADS / "04-kubeflow-trainer-trainjob-lammps-gpus.yaml")
    )
    assert code == 0
    assert "creates no Pods" not in err
    assert err.splitlines()[:2] == [
        "trainjob/lammps-flux: skipped: TrainJob is not a kind castslice can preview, and it asks for GPUs",
        "  warning: nvidia.com/gpu requested at spec.trainer.resourcesPerNode.limits is in no Pod template "
        "castslice knows: not previewed (the webhook judges the Pods when they are created)",
    ]
    assert out == (WORKLOADS / "04-kubeflow-trainer-trainjob-lammps-gpus.yaml").read_text()


def test_kserves_v1alpha2_framework_spec_is_warned_about_not_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old = """apiVersion: serving.kubeflow.org/v1alpha2
kind: InferenceService
metadata: {name: flowers}
spec:
  default:
    predictor:
      tensorflow:
        storageUri: gs://kfserving-samples/models/tensorflow/flowers
        resources: {limits: {nvidia.com/gpu: 1}}
"""
    _, _, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "old.yaml", old))
    assert "nvidia.com/gpu requested at spec.default.predictor.tensorflow.resources.limits" in err


# -- explain covers every Pod ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            "01-kubeflow-pytorchjob-mnist-nccl.yaml",
            [
                "pytorchjob/pytorch-dist-mnist-nccl spec.pytorchReplicaSpecs.Master.template: "
                "workload PyTorchJob/pytorch-dist-mnist-nccl in namespace default",
                "pytorchjob/pytorch-dist-mnist-nccl spec.pytorchReplicaSpecs.Worker.template: "
                "workload PyTorchJob/pytorch-dist-mnist-nccl in namespace default",
            ],
        ),
        (
            "13-lws-vllm-gpu.yaml",
            [
                "leaderworkerset/vllm spec.leaderWorkerTemplate.leaderTemplate: workload StatefulSet/vllm "
                "in namespace default",
                "leaderworkerset/vllm spec.leaderWorkerTemplate.workerTemplate: workload StatefulSet/vllm-0 "
                "in namespace default",
            ],
        ),
        (
            "09-kserve-inferenceservice-torchserve-gpu.yaml",
            [
                "inferenceservice/torchserve-gpu spec.predictor: "
                "workload Deployment/torchserve-gpu-predictor in namespace default"
            ],
        ),
        (
            "16-volcano-job-mindspore-gpu.yaml",
            [
                "job/mindspore-gpu spec.tasks[0].template: workload Job/mindspore-gpu in namespace default",
                "job/mindspore-gpu spec.tasks[1].template: workload Job/mindspore-gpu in namespace default",
            ],
        ),
        (
            "07-kuberay-rayservice-vllm.yaml",
            [
                "rayservice/llama-3-8b spec.rayClusterConfig.headGroupSpec.template: "
                "workload RayCluster/llama-3-8b-raycluster-xxxxx in namespace default",
                "rayservice/llama-3-8b spec.rayClusterConfig.workerGroupSpecs[0].template: "
                "workload RayCluster/llama-3-8b-raycluster-xxxxx in namespace default",
            ],
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_explain_names_every_pod_with_the_workload_the_webhook_will_match(
    monkeypatch: pytest.MonkeyPatch, manifest: str, expected: list[str]
) -> None:
    code, out, _ = run(monkeypatch, "explain", "-f", str(WORKLOADS / manifest))
    assert code == 0
    assert [line for line in out.splitlines() if not line.startswith(" ")] == expected


def test_explain_covers_a_jobset_and_says_so_for_a_document_without_pods(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jobset = """apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: train}
spec:
  replicatedJobs:
    - name: workers
      template:
        spec:
          template:
            spec:
              containers: [{name: t, image: x, resources: {limits: {nvidia.com/gpu: 8}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
"""
    code, out, _ = run(monkeypatch, "explain", "-f", write(tmp_path, "js.yaml", jobset))
    assert code == 0
    assert out.splitlines() == [
        "jobset/train spec.replicatedJobs[0].template.spec.template: "
        "workload JobSet/train in namespace default",
        "  no PodMutation matches",
        "configmap/settings: creates no Pod castslice can find: nothing to explain",
    ]


# -- the owner the webhook will see --------------------------------------------------------------
def owners(manifest: str) -> list[tuple[str, str]]:
    found = []
    for document in yaml.safe_load_all((WORKLOADS / manifest).read_text()):
        for site in find_pods(document) if isinstance(document, dict) else []:
            owner = seen_owner(document, site, describe_name(document))
            if owner is not None:
                found.append((owner.kind, owner.name))
    return found


def test_a_leaderworkersets_pods_belong_to_its_statefulsets() -> None:
    assert owners("14-lws-sglang.yaml") == [("StatefulSet", "sglang"), ("StatefulSet", "sglang-0")]


def test_kserve_llm_pods_belong_to_the_deployments_kserve_creates() -> None:
    assert owners("12-kserve-llminferenceservice-pd-qwen2-7b-gpu.yaml") == [
        ("Deployment", "qwen2-7b-instruct-pd-kserve"),
        ("Deployment", "qwen2-7b-instruct-pd-kserve-prefill"),
    ]


def test_a_deployments_pods_belong_to_its_replicaset_named_with_a_template_hash() -> None:
    [(kind, name)] = owners("23-gpu-operator-deployment-plugin-test.yaml")
    assert (
        kind == "ReplicaSet"
        and name.startswith("nvidia-plugin-test-")
        and len(name) == len("nvidia-plugin-test-") + 10
    )


def test_a_podmutation_for_kind_statefulset_applies_to_a_leaderworkerset_preview(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In a cluster the LWS's Pods match kind StatefulSet, not LeaderWorkerSet: so does the preview."""
    mutations = tmp_path / "mutations.yaml"
    mutations.write_text(
        """apiVersion: castops.io/v1alpha1
kind: PodMutation
metadata: {name: by-lws-kind}
spec:
  filter: {workload: {kinds: [LeaderWorkerSet]}}
  labels: {matched: lws}
---
apiVersion: castops.io/v1alpha1
kind: PodMutation
metadata: {name: by-statefulset-kind}
spec:
  filter: {workload: {kinds: [StatefulSet]}}
  labels: {matched: statefulset}
"""
    )
    code, out, _ = run(
        monkeypatch, "mutate", "-f", str(WORKLOADS / "14-lws-sglang.yaml"), "--mutations", str(mutations)
    )
    assert code == 0
    lws = next(yaml.safe_load_all(out))
    for role in ("leaderTemplate", "workerTemplate"):
        assert lws["spec"]["leaderWorkerTemplate"][role]["metadata"]["labels"]["matched"] == "statefulset"


# -- vGPU and Volcano's scheduler ----------------------------------------------------------------
def test_vgpu_forced_onto_a_volcano_task_writes_the_scheduler_into_the_template(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Pod gets volcano from the Job; forceSchedulerName replaces it, which in the template is
    an addition (the template's own schedulerName wins over the Job's)."""
    config = write(tmp_path, "config.yaml", "vgpu: {enabled: true, forceSchedulerName: true}\n")
    code, out, err = run(
        monkeypatch, "mutate", "-f", str(WORKLOADS / "16-volcano-job-mindspore-gpu.yaml"), "--config", config
    )
    assert code == 0, err
    tasks = next(yaml.safe_load_all(out))["spec"]["tasks"]
    assert "schedulerName" not in tasks[0]["template"]["spec"]  # no GPU: not a vGPU Pod
    assert tasks[1]["template"]["spec"]["schedulerName"] == "hami-scheduler"
    assert "schedulerName volcano -> hami-scheduler" in err


# -- spot on templates ----------------------------------------------------------------------------
DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: apps}}
spec:
  template:
    metadata: {{name: named-template, labels: {{app: web}}{annotations}}}
    spec:
      containers: [{{name: c, image: nginx}}]
"""


def spot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: str, annotations: str = ""
) -> tuple[int, str, str]:
    manifest = write(tmp_path, "web.yaml", DEPLOYMENT.format(annotations=annotations))
    return run(monkeypatch, "mutate", "-f", manifest, "--config", write(tmp_path, "spot.yaml", config))


def test_spot_on_a_template_says_what_each_pod_gets_and_writes_nothing_even_when_it_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out, err = spot(monkeypatch, tmp_path, "spot: {enabled: true, preset: allSpot}\n")
    assert code == 0
    assert (
        "  spot: unchanged: a Pod template: placed per Pod when each is created; each Pod: spot by rule "
        "defaultToSpot: toleration scheduling.cast.ai/spot Exists, nodeSelector scheduling.cast.ai/spot=true"
    ) in err.splitlines()
    assert out == DEPLOYMENT.format(annotations="")  # no sticky label, no placement-decision: offline-0


def test_spot_on_a_template_with_a_percentage_describes_the_split(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, _, err = spot(
        monkeypatch,
        tmp_path,
        "spot: {enabled: true}\n",
        ', annotations: {scheduling.cast.ai/spot-percentage: "40"}',
    )
    assert "rule scheduling.cast.ai/spot-percentage=40: of the n live Pods of ReplicaSet web-" in err
    assert "floor(n x 40/100) on spot (4 of 10), the others on-demand" in err


@pytest.mark.parametrize(
    ("config", "code", "line"),
    [
        (
            "spot: {enabled: true, preset: allSpotExceptKubeSystem}\n",
            1,
            '  spot: denied: castslice: annotation scheduling.cast.ai/lifecycle: "spotty" is not valid; '
            'accepted: "spot" or "on-demand"',
        ),
        (
            "invalidAnnotations: warn\nspot: {enabled: true, preset: allSpot}\n",
            0,
            '  spot: unchanged: annotation scheduling.cast.ai/lifecycle: "spotty" is not valid; '
            'accepted: "spot" or "on-demand"; its Pods are not placed',
        ),
    ],
    ids=["deny", "warn"],
)
def test_an_invalid_lifecycle_on_a_template_is_judged_as_the_webhook_judges_its_pods(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: str, code: int, line: str
) -> None:
    got, _, err = spot(monkeypatch, tmp_path, config, ", annotations: {scheduling.cast.ai/lifecycle: spotty}")
    assert got == code
    assert line in err.splitlines()


# -- no silent change of meaning ------------------------------------------------------------------
def opted_in(manifest: str, **annotations: str) -> str:
    documents = []
    for document in yaml.safe_load_all((WORKLOADS / manifest).read_text()):
        for site in find_pods(document):
            node: Any = document
            for part in site.annotations_path:
                node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
            node.update(annotations)
        documents.append(document)
    return yaml.safe_dump_all(documents, sort_keys=False)


def test_an_8_gpu_tensor_parallel_server_is_not_shrunk_by_a_preset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = opted_in(
        "13-lws-vllm-gpu.yaml", **{"castops.io/optimize": "true", "castops.io/workload-type": "inference"}
    )
    code, out, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "lws.yaml", text))
    assert code == 0
    assert out == text
    assert (
        "  gpu-slicing: unchanged: opted in, but containers/vllm-leader asks for 8 nvidia.com/gpu: not "
        "sliced, a job on several GPUs needs distinct devices and the slices of one device may all land "
        "on one GPU; castops.io/slice-ratio slices it anyway "
        "(asked: containers/vllm-leader: nvidia.com/gpu=8)"
    ) in err.splitlines()
    assert (
        "  warning: castslice: multi-GPU containers/vllm-leader (8 nvidia.com/gpu) not sliced; "
        "set castops.io/slice-ratio to force"
    ) in err.splitlines()


def test_a_2_gpu_container_is_left_whole_even_where_the_preset_gives_more_slices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The issue's torchrun case: 2 GPUs and the training preset (4) would make 4 slices of what
    may be one device, which NCCL refuses."""
    text = opted_in(
        "01-kubeflow-pytorchjob-mnist-nccl.yaml",
        **{"castops.io/optimize": "true", "castops.io/workload-type": "training"},
    )
    document = yaml.safe_load(text)
    for role in document["spec"]["pytorchReplicaSpecs"].values():
        role["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2}}
    text = yaml.safe_dump(document, sort_keys=False)
    code, out, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "job.yaml", text))
    assert code == 0
    assert out == text
    assert err.count("(2 nvidia.com/gpu) not sliced; set castops.io/slice-ratio to force") == len(
        document["spec"]["pytorchReplicaSpecs"]
    )


def test_an_explicit_ratio_below_the_gpu_count_slices_warns_and_records_the_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = opted_in("13-lws-vllm-gpu.yaml", **{"castops.io/optimize": "true", "castops.io/slice-ratio": "4"})
    code, out, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "lws.yaml", text))
    assert code == 0
    assert (
        "  gpu-slicing: mutated: nvidia.com/gpu -> nvidia.com/gpu-shared: 4 (castops.io/slice-ratio=4) in "
        "containers/vllm-leader (asked 8 nvidia.com/gpu)"
    ) in err.splitlines()
    assert (
        "  warning: castslice: containers/vllm-leader asked for 8 nvidia.com/gpu, "
        "gets 4 nvidia.com/gpu-shared; a multi-GPU job may not run"
    ) in err.splitlines()
    leader = next(yaml.safe_load_all(out))["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert leader["metadata"]["annotations"]["castops.io/original-gpu-request"] == (
        "containers/vllm-leader: nvidia.com/gpu=8"
    )


def test_a_hami_pod_opted_into_slicing_with_vgpu_off_is_refused_naming_what_it_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its two GPUs are sliced only on an explicit ratio; then HAMi's memory and cores are named in
    name order, as the webhook names them (the apiserver sends resources sorted; the file has
    gpumem first)."""
    text = opted_in(
        "17-hami-pod-default-use.yaml", **{"castops.io/optimize": "true", "castops.io/slice-ratio": "2"}
    )
    code, _, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "hami.yaml", text))
    assert code == 1
    assert (
        "  gpu-slicing: denied: castslice: containers/ubuntu-container asks for nvidia.com/gpucores, "
        "nvidia.com/gpumem, HAMi vGPU resources, and the Pod opts into GPU slicing "
        "(castops.io/optimize=true); use one or the other "
        "(asked: containers/ubuntu-container: nvidia.com/gpu=2)"
    ) in err.splitlines()


def test_a_hami_pod_opted_into_slicing_without_a_ratio_is_left_whole_as_a_multi_gpu_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = opted_in("17-hami-pod-default-use.yaml", **{"castops.io/optimize": "true"})
    code, out, err = run(monkeypatch, "mutate", "-f", write(tmp_path, "hami.yaml", text))
    assert code == 0
    assert out == text
    assert "(2 nvidia.com/gpu) not sliced; set castops.io/slice-ratio to force" in err


def test_explain_gives_the_slicing_decision_and_why_as_mutate_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = opted_in(
        "13-lws-vllm-gpu.yaml", **{"castops.io/optimize": "true", "castops.io/workload-type": "inference"}
    )
    path = write(tmp_path, "lws.yaml", text)
    code, out, _ = run(monkeypatch, "explain", "-f", path)
    assert code == 0
    _, _, report = run(monkeypatch, "mutate", "-f", path)
    slicing = [line for line in out.splitlines() if "gpu-slicing:" in line or "warning:" in line]
    assert slicing and all(line in report.splitlines() for line in slicing)


def test_explain_and_mutate_with_the_cluster_nodes_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    case = ROOT / "tests" / "golden" / "nodes-none-offers-target"
    options = ["--config", str(case / "config.yaml"), "--cluster", str(case / "cluster.yaml")]
    _, out, _ = run(monkeypatch, "explain", "-f", str(case / "input.yaml"), *options)
    assert (
        "  warning: castslice: not sliced, no node offers nvidia.com/gpu-shared; Pod keeps its nvidia.com/gpu"
        in (out.splitlines())
    )


# -- Helm-rendered output keeps its lines ---------------------------------------------------------
def test_a_changed_helm_rendered_document_changes_only_the_lines_the_patch_touches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """llm-d's rendered chart has lines holding only spaces and lists indented Helm's way; a change
    must not reformat them."""
    rendered = (WORKLOADS / "24-llm-d-modelservice-rendered-pd.yaml").read_text()
    opted = rendered.replace(
        "        llm-d.ai/role: decode\n    spec:",
        '        llm-d.ai/role: decode\n      annotations:\n        castops.io/optimize: "true"\n    spec:',
    )
    code, out, _ = run(monkeypatch, "mutate", "-f", write(tmp_path, "pd.yaml", opted))
    assert code == 0
    diff = list(difflib.ndiff(opted.splitlines(), out.splitlines()))
    removed = [line[2:] for line in diff if line.startswith("- ")]
    added = [line[2:] for line in diff if line.startswith("+ ")]
    assert removed == ['              nvidia.com/gpu: "1"'] * 2
    assert added == [
        '        castops.io/original-gpu-request: "containers/vllm: nvidia.com/gpu=1"',
        '              nvidia.com/gpu-shared: "1"',
        '              nvidia.com/gpu-shared: "1"',
    ]
    assert len(out.splitlines()) == len(opted.splitlines()) + 1


@pytest.mark.parametrize(
    ("kind", "path", "owner_kind"),
    [
        ("StatefulSet", ("spec", "template"), "StatefulSet"),
        ("DaemonSet", ("spec", "template"), "DaemonSet"),
        ("ReplicaSet", ("spec", "template"), "ReplicaSet"),
        ("Job", ("spec", "template"), "Job"),
        ("CronJob", ("spec", "jobTemplate", "spec", "template"), "CronJob"),
    ],
)
def test_a_built_in_workloads_pod_is_owned_by_it_and_nothing_of_the_owner_is_written(
    kind: str, path: tuple[str, ...], owner_kind: str
) -> None:
    document: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w"}}
    node = document
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c"}]}}
    [site] = find_pods(document)
    pod = owned_pod(document, site, 3)
    assert pod["metadata"] == {
        "labels": {"app": "w"},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": owner_kind, "name": "w", "uid": "offline-3", "controller": True}
        ],
    }
    assert "ownerReferences" not in node[path[-1]]["metadata"]  # the document is not touched


def test_a_template_keeps_its_own_owner_and_a_pod_document_is_its_own_pod() -> None:
    own = [{"kind": "X", "name": "x", "uid": "x", "controller": True}]
    job = {
        "kind": "Job",
        "spec": {"template": {"metadata": {"ownerReferences": own}, "spec": {"containers": []}}},
    }
    [site] = find_pods(job)
    assert owned_pod(job, site, 0)["metadata"]["ownerReferences"] == own
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    [site] = find_pods(pod)
    assert owned_pod(pod, site, 0) == pod
