"""PodMutation pure core: every example of CAST AI's "Pod mutations" documentation page, every
spec field, the ranking table case by case, and the extended JSON Patch."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from function.core.placement import PLACEMENT_LABEL, SiblingCounts
from function.core.podmutation.apply import (
    GROUP_ANNOTATION,
    MARK_ANNOTATION,
    Siblings,
    apply_mutation,
    choose_group,
)
from function.core.podmutation.compiled import (
    CompiledMutation,
    InvalidMutation,
    compile_object,
    from_api_form,
)
from function.core.podmutation.jsonpatch_ext import apply_sequence, compile_operations, expand, parse_path
from function.core.podmutation.match import Rank, Workload, rank, select, workload_of
from function.core.podmutation.names import is_api_form

OURS = "castops.io/v1alpha1"
CASTAI = "pod-mutations.cast.ai/v1"
TEMPLATE = "scheduling.cast.ai/node-template"


def mutation(name: str, spec: dict[str, Any], api: str = OURS, generation: int = 1) -> CompiledMutation:
    compiled = compile_object(
        {
            "apiVersion": api,
            "kind": "PodMutation",
            "metadata": {"name": name, "generation": generation},
            "spec": spec,
        }
    )
    assert isinstance(compiled, CompiledMutation), compiled
    return compiled


def invalid(spec: Any, api: str = OURS) -> tuple[str, ...]:
    compiled = compile_object(
        {"apiVersion": api, "kind": "PodMutation", "metadata": {"name": "bad"}, "spec": spec}
    )
    assert isinstance(compiled, InvalidMutation), compiled
    return compiled.problems


def api_mutation(doc: dict[str, Any]) -> CompiledMutation:
    assert is_api_form(doc)
    compiled = compile_object(from_api_form(doc))
    assert isinstance(compiled, CompiledMutation), compiled
    return compiled


def pod(
    name: str = "web",
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    owner: tuple[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "u-1", "controller": True}
        ]
    body: dict[str, Any] = {"containers": [{"name": "app", "image": "nginx"}]}
    body.update(spec or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def run(
    m: CompiledMutation, p: dict[str, Any], siblings: Siblings | None = None
) -> tuple[dict[str, Any], Any]:
    return apply_mutation(copy.deepcopy(p), m, siblings or Siblings())


def winner(mutations: list[CompiledMutation], p: dict[str, Any], namespace: str = "default") -> str | None:
    chosen = select(mutations, workload_of(p, namespace), p).winner
    return chosen.mutation.name if chosen else None


# -- CAST AI's documented examples ---------------------------------------------------------------------
SYSTEM_NAMESPACES = {
    "name": "system-namespaces",
    "objectFilter": {"namespaces": ["kube-system", "argocd"]},
    "nodeSelector": {TEMPLATE: "system-workloads"},
}
SPECIFIC_LABELS = {
    "name": "specific-labels",
    "objectFilter": {"labels": {"app.kubernetes.io/name": "castai-agent"}},
    "nodeSelector": {TEMPLATE: "system-workloads"},
}


def test_castai_docs_namespace_mutation_sets_the_node_template_selector_in_its_namespaces_only() -> None:
    m = api_mutation(SYSTEM_NAMESPACES)
    p = pod()
    assert winner([m], p, "kube-system") == "system-namespaces"
    assert winner([m], p, "argocd") == "system-namespaces"
    assert winner([m], p, "default") is None
    out, done = run(m, p)
    assert out["spec"]["nodeSelector"] == {TEMPLATE: "system-workloads"}
    assert out["metadata"]["annotations"] == {MARK_ANNOTATION: "system-namespaces/0"}
    assert done.changes == ["nodeSelector"]


def test_castai_docs_label_mutation_and_the_namespace_and_label_combination() -> None:
    """Namespaces and labels are ANDed inside one mutation; OR takes two mutations (CAST AI's
    advice), and a Pod matching both gets the more specific one: labels outrank namespaces."""
    ns, labels = api_mutation(SYSTEM_NAMESPACES), api_mutation(SPECIFIC_LABELS)
    agent = pod(labels={"app.kubernetes.io/name": "castai-agent"})
    assert winner([ns, labels], agent, "kube-system") == "specific-labels"
    assert winner([ns, labels], agent, "default") == "specific-labels"
    assert winner([ns, labels], pod(), "argocd") == "system-namespaces"
    assert winner([ns, labels], pod(labels={"app.kubernetes.io/name": "other"}), "default") is None
    both = api_mutation(
        {
            "name": "both",
            "objectFilter": {
                "namespaces": ["kube-system"],
                "labels": {"app.kubernetes.io/name": "castai-agent"},
            },
        }
    )
    assert winner([both], agent, "kube-system") == "both"
    assert winner([both], agent, "default") is None  # AND, not OR


def test_castai_docs_api_example_labels_and_tolerations_for_named_workloads() -> None:
    m = api_mutation(
        {
            "objectFilter": {"names": ["app1", "app2"], "namespaces": ["production"]},
            "labels": {"environment": "production"},
            "spotType": "UNSPECIFIED_SPOT_TYPE",
            "name": "production-mutation",
            "organizationId": "fhytif73-f95f-44de-ad4b-f7898ce5ee42",
            "clusterId": "11111111-1111-1111-1111-111111111111",
            "enabled": True,
            "tolerations": [
                {"key": TEMPLATE, "operator": "Equal", "value": "production-template", "effect": "NoSchedule"}
            ],
        }
    )
    assert m.spec.spotConfig is None  # UNSPECIFIED: no spot settings
    app1 = pod("app1-7d9c-abcde", labels={"pod-template-hash": "7d9c"}, owner=("ReplicaSet", "app1-7d9c"))
    assert workload_of(app1, "production") == Workload("production", "Deployment", "app1")
    assert winner([m], app1, "production") == "production-mutation"
    assert winner([m], app1, "staging") is None
    assert winner([m], pod("app3"), "production") is None
    out, _ = run(m, app1)
    assert out["metadata"]["labels"]["environment"] == "production"
    assert out["spec"]["tolerations"] == [
        {"key": TEMPLATE, "operator": "Equal", "value": "production-template", "effect": "NoSchedule"}
    ]


TERRAFORM_SPEC = {
    "filter": {
        "workload": {
            "namespaces": ["production", "staging"],
            "names": ["^frontend-.*$", "^backend-.*$"],
            "kinds": ["Pod", "Deployment", "ReplicaSet"],
        },
        "pod": {
            "labelsOperator": "and",
            "labelsFilter": [
                {"key": "app.kubernetes.io/part-of", "value": "platform"},
                {"key": "tier", "value": "frontend"},
            ],
        },
    },
    "restartPolicy": "deferred",
    "patches": [{"op": "add", "path": "/metadata/annotations/mutated-by-pod-mutator", "value": "true"}],
    "spotConfig": {"mode": "preferred-spot", "distributionPercentage": 50},
}
PLATFORM = {"app.kubernetes.io/part-of": "platform", "tier": "frontend"}


@pytest.mark.parametrize("api", [CASTAI, OURS])
def test_castai_docs_terraform_example(api: str) -> None:
    m = mutation("test-pod-mutation", TERRAFORM_SPEC, api=api)
    deployment_pod = pod(
        "x", labels={**PLATFORM, "pod-template-hash": "5f6"}, owner=("ReplicaSet", "frontend-web-5f6")
    )
    assert winner([m], deployment_pod, "production") == "test-pod-mutation"
    assert winner([m], deployment_pod, "dev") is None
    assert winner([m], pod("frontend-x", labels={"tier": "frontend"}), "staging") is None  # and: both labels
    assert winner([m], pod("frontend-x", labels=PLATFORM), "staging") == "test-pod-mutation"
    assert winner([m], pod("middle-x", labels=PLATFORM), "staging") is None
    stateful = pod("frontend-0", labels=PLATFORM, owner=("StatefulSet", "frontend"))
    assert winner([m], stateful, "production") is None  # kinds: Pod, Deployment, ReplicaSet only
    # 50 %: the first Pod of a controller is on-demand (the on-demand minimum first), the second spot
    out, done = run(m, deployment_pod)
    assert out["metadata"]["annotations"]["mutated-by-pod-mutator"] == "true"  # no annotations before: works
    assert done.placement == "on-demand" and out["metadata"]["labels"][PLACEMENT_LABEL] == "on-demand"
    assert "tolerations" not in out["spec"]
    out, done = run(m, deployment_pod, Siblings(SiblingCounts(on_demand=1)))
    assert done.placement == "spot"
    assert out["spec"]["tolerations"] == [{"key": "scheduling.cast.ai/spot", "operator": "Exists"}]
    assert out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 1,
            "preference": {"matchExpressions": [{"key": "scheduling.cast.ai/spot", "operator": "Exists"}]},
        }
    ]


def test_castai_docs_node_template_consolidation() -> None:
    m = api_mutation(
        {
            "objectFilter": {"namespaces": ["production"]},
            "name": "production-mutation",
            "nodeTemplatesToConsolidate": ["template-1", "template-2"],
        }
    )
    p = pod(
        spec={
            "nodeSelector": {TEMPLATE: "template-1", "zone": "a"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["amd64"]}]},
                            {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["arm64"]}]},
                        ]
                    }
                }
            },
        }
    )
    out, _ = run(m, p)
    consolidated = {"key": TEMPLATE, "operator": "In", "values": ["template-1", "template-2"]}
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [  # ANDed into every term, never a new (ORed) term
        {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["amd64"]}, consolidated]},
        {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["arm64"]}, consolidated]},
    ]
    assert out["spec"]["nodeSelector"] == {"zone": "a"}  # the template selector became the affinity
    assert out["spec"]["tolerations"] == [
        {"key": TEMPLATE, "operator": "Equal", "value": "template-1", "effect": "NoSchedule"},
        {"key": TEMPLATE, "operator": "Equal", "value": "template-2", "effect": "NoSchedule"},
    ]
    bare, _ = run(m, pod())
    assert bare["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [consolidated]}]
    }
    assert "nodeSelector" not in bare["spec"]


def test_castai_docs_spot_example_75_percent_preferred() -> None:
    m = api_mutation(
        {
            "name": "production-spot-mutation",
            "organizationId": "org-12345",
            "clusterId": "cluster-67890",
            "enabled": True,
            "objectFilter": {"namespaces": ["production"]},
            "spotType": "PREFERRED_SPOT",
            "spotDistributionPercentage": 75,
        }
    )
    assert m.spec.spotConfig is not None and m.spec.spotConfig.mode == "preferred-spot"
    placements: list[str] = []
    for _ in range(8):  # sequential scale-up, each Pod counting the ones before it
        counts = SiblingCounts(spot=placements.count("spot"), on_demand=placements.count("on-demand"))
        _, done = run(m, pod(owner=("ReplicaSet", "api-1")), Siblings(counts))
        placements.append(done.placement)
    assert placements[0] == "on-demand"  # a single Pod below 100 % stays on-demand
    assert placements.count("spot") == 6 and placements.count("on-demand") == 2  # 75 % / 25 %


@pytest.mark.parametrize(
    ("mode", "selector", "preferred"),
    [("optional-spot", False, False), ("only-spot", True, False), ("preferred-spot", False, True)],
)
def test_spot_modes(mode: str, selector: bool, preferred: bool) -> None:
    m = mutation("spot", {"spotConfig": {"mode": mode}})  # distributionPercentage defaults to 100
    out, done = run(m, pod())
    assert done.placement == "spot"
    assert {"key": "scheduling.cast.ai/spot", "operator": "Exists"} in out["spec"]["tolerations"]
    assert (out["spec"].get("nodeSelector") == {"scheduling.cast.ai/spot": "true"}) is selector
    assert ("affinity" in out["spec"]) is preferred


def test_on_demand_share_removes_spot_settings_the_pod_had() -> None:
    m = mutation("od", {"spotConfig": {"mode": "only-spot", "distributionPercentage": 0}})
    p = pod(spec={"tolerations": [{"key": "scheduling.cast.ai/spot", "operator": "Exists"}]})
    out, done = run(m, p)
    assert done.placement == "on-demand" and "tolerations" not in out["spec"]


# CAST AI's documented JSON Patch examples -------------------------------------------------------------
def patched(patches: list[dict[str, Any]], p: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    return run(mutation("patch", {"patches": patches}), p)


def test_castai_docs_patch_add_node_selector_replaces_it_whole() -> None:
    out, _ = patched(
        [{"op": "add", "path": "/spec/nodeSelector", "value": {TEMPLATE: "high-performance"}}],
        pod(spec={"nodeSelector": {"old": "x"}}),
    )
    assert out["spec"]["nodeSelector"] == {TEMPLATE: "high-performance"}


def test_castai_docs_patch_add_one_key_keeps_the_others_and_fails_without_a_node_selector() -> None:
    ops = [
        {
            "op": "add",
            "path": "/spec/nodeSelector/scheduling.cast.ai~1node-template",
            "value": "high-performance",
        }
    ]
    out, done = patched(ops, pod(spec={"nodeSelector": {"old": "x"}}))
    assert out["spec"]["nodeSelector"] == {"old": "x", TEMPLATE: "high-performance"}
    out, done = patched(ops, pod())  # "this patch will fail if the nodeSelector object doesn't exist"
    assert "nodeSelector" not in out["spec"]
    assert len(done.warnings) == 1 and done.warnings[0].startswith("patches not applied: [0] add")


def test_castai_docs_patch_replace_toleration_effect_and_remove_by_index_and_by_key() -> None:
    tolerations = [{"key": f"k{i}", "operator": "Exists", "effect": "NoExecute"} for i in range(4)]
    out, _ = patched(
        [{"op": "replace", "path": "/spec/tolerations/0/effect", "value": "NoSchedule"}],
        pod(spec={"tolerations": tolerations}),
    )
    assert out["spec"]["tolerations"][0]["effect"] == "NoSchedule"
    assert out["spec"]["tolerations"][1:] == tolerations[1:]
    out, _ = patched(
        [{"op": "remove", "path": "/spec/tolerations/2"}], pod(spec={"tolerations": tolerations})
    )
    assert [t["key"] for t in out["spec"]["tolerations"]] == ["k0", "k1", "k3"]
    out, _ = patched(
        [{"op": "remove", "path": "/spec/nodeSelector/environment"}],
        pod(spec={"nodeSelector": {"environment": "prod", "zone": "a"}}),
    )
    assert out["spec"]["nodeSelector"] == {"zone": "a"}


def test_castai_docs_patch_test_then_remove_the_control_plane_toleration() -> None:
    ops = [
        {"op": "test", "path": "/spec/tolerations/0/key", "value": "node-role.kubernetes.io/control-plane"},
        {"op": "remove", "path": "/spec/tolerations/0"},
    ]
    control_plane = {
        "key": "node-role.kubernetes.io/control-plane",
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    other = {"key": "other", "operator": "Exists"}
    out, done = patched(ops, pod(spec={"tolerations": [control_plane, other]}))
    assert out["spec"]["tolerations"] == [other] and not done.warnings
    out, done = patched(ops, pod(spec={"tolerations": [other, control_plane]}))  # test fails: nothing removed
    assert out["spec"]["tolerations"] == [other, control_plane]
    assert done.warnings and "[0] test /spec/tolerations/0/key" in done.warnings[0]


def test_castai_docs_patch_complex_replace_affinity_and_add_toleration() -> None:
    ops = [
        {"op": "remove", "path": "/spec/affinity"},
        {"op": "add", "path": "/spec/nodeSelector", "value": {TEMPLATE: "custom-template"}},
        {
            "op": "add",
            "path": "/spec/tolerations/-",
            "value": {
                "key": TEMPLATE,
                "operator": "Equal",
                "value": "custom-template",
                "effect": "NoSchedule",
            },
        },
    ]
    p = pod(spec={"affinity": {"nodeAffinity": {}}, "tolerations": [{"key": "a", "operator": "Exists"}]})
    out, done = patched(ops, p)
    assert "affinity" not in out["spec"]
    assert out["spec"]["nodeSelector"] == {TEMPLATE: "custom-template"}
    assert (
        out["spec"]["tolerations"][-1]["value"] == "custom-template" and len(out["spec"]["tolerations"]) == 2
    )
    # RFC 6902: remove of a missing /spec/affinity fails the whole list; the Pod is left as it was
    out, done = patched(ops, pod(spec={"tolerations": [{"key": "a", "operator": "Exists"}]}))
    assert "nodeSelector" not in out["spec"] and len(out["spec"]["tolerations"]) == 1
    assert "[0] remove /spec/affinity" in done.warnings[0]


AZURE_PATCH = [
    {"op": "move", "from": "/metadata/labels/agentpool", "path": "/metadata/labels/dedicated"},
    {"op": "move", "from": "/spec/nodeSelector/agentpool", "path": "/spec/nodeSelector/dedicated"},
    {"op": "replace", "path": "/spec/tolerations/[key=agentpool]/key", "value": "dedicated"},
    {
        "op": "replace",
        "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
        "/nodeSelectorTerms/*/matchExpressions/[key=agentpool]/key",
        "value": "dedicated",
    },
    {
        "op": "replace",
        "path": "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution"
        "/*/preference/matchExpressions/[key=agentpool]/key",
        "value": "dedicated",
    },
]


def azure_pod() -> dict[str, Any]:
    def expr(key: str) -> dict[str, Any]:
        return {"key": key, "operator": "In", "values": ["system"]}

    return pod(
        labels={"agentpool": "system", "app": "x"},
        spec={
            "nodeSelector": {"agentpool": "system"},
            "tolerations": [
                {"key": "agentpool", "operator": "Equal", "value": "system", "effect": "NoSchedule"},
                {"key": "CriticalAddonsOnly", "operator": "Exists"},
                {"key": "agentpool", "operator": "Equal", "value": "system", "effect": "NoExecute"},
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [expr("agentpool"), expr("zone")]},
                            {"matchExpressions": [expr("zone")]},
                            {"matchExpressions": [expr("agentpool")]},
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 10, "preference": {"matchExpressions": [expr("agentpool")]}},
                        {"weight": 5, "preference": {"matchExpressions": [expr("zone")]}},
                    ],
                }
            },
        },
    )


def test_castai_docs_azure_agentpool_move_and_replace() -> None:
    out, done = patched(AZURE_PATCH, azure_pod())
    assert not done.warnings
    assert out["metadata"]["labels"] == {"dedicated": "system", "app": "x"}
    assert out["spec"]["nodeSelector"] == {"dedicated": "system"}
    assert [t["key"] for t in out["spec"]["tolerations"]] == ["dedicated", "CriticalAddonsOnly", "dedicated"]
    affinity = out["spec"]["affinity"]["nodeAffinity"]
    keys = [
        [e["key"] for e in t["matchExpressions"]]
        for t in affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ]
    assert keys == [["dedicated", "zone"], ["zone"], ["dedicated"]]
    pref = [
        [e["key"] for e in t["preference"]["matchExpressions"]]
        for t in affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    ]
    assert pref == [["dedicated"], ["zone"]]


def test_castai_docs_azure_patch_without_affinity_skips_the_affinity_paths_and_records_it() -> None:
    p = azure_pod()
    del p["spec"]["affinity"]
    out, done = patched(AZURE_PATCH, p)
    assert not done.warnings
    assert out["spec"]["nodeSelector"] == {"dedicated": "system"}
    assert len(done.notes) == 2 and all("selects nothing" in n for n in done.notes)


def test_castai_docs_azure_patch_on_a_pod_without_the_label_is_not_applied() -> None:
    p = azure_pod()
    del p["metadata"]["labels"]["agentpool"]
    out, done = patched(AZURE_PATCH, p)
    assert out["spec"]["nodeSelector"] == {"agentpool": "system"}  # nothing of the list applied
    assert "[0] move /metadata/labels/agentpool" in done.warnings[0]


# -- extended paths ------------------------------------------------------------------------------------
def test_extended_path_parsing() -> None:
    path = parse_path("/spec/tolerations/[key=a~1b]/key")
    assert path.extended and path.segments[2].key == "key" and path.segments[2].value == "a/b"
    assert not parse_path("/spec/nodeSelector/scheduling.cast.ai~1node-template").extended
    assert parse_path("/spec/nodeSelector/scheduling.cast.ai~1node-template").segments[-1].key == TEMPLATE
    for bad in ("spec/x", "/spec/[key]/x", "/spec/[=v]", "/spec/a~2"):
        with pytest.raises(ValueError):
            parse_path(bad)


def test_expand_selects_only_what_exists() -> None:
    doc = {"a": [{"k": "x", "v": 1}, {"k": "y"}, {"k": "x"}, "s"]}
    assert expand(doc, parse_path("/a/[k=x]/v"), "replace") == ["/a/0/v"]
    assert expand(doc, parse_path("/a/[k=x]/v"), "add") == ["/a/0/v", "/a/2/v"]
    assert expand(doc, parse_path("/a/*/k"), "remove") == ["/a/0/k", "/a/1/k", "/a/2/k"]
    assert expand(doc, parse_path("/a/[v=1]"), "remove") == ["/a/0"]  # scalars compared by JSON text
    assert expand(doc, parse_path("/b/*/k"), "remove") == []


def test_extended_remove_runs_last_to_first() -> None:
    doc = {"t": [{"key": "a"}, {"key": "b"}, {"key": "a"}]}
    outcome = apply_sequence(doc, compile_operations([{"op": "remove", "path": "/t/[key=a]"}], "p"))
    assert outcome.document == {"t": [{"key": "b"}]}
    assert [o["path"] for o in outcome.applied] == ["/t/2", "/t/0"]
    assert doc == {"t": [{"key": "a"}, {"key": "b"}, {"key": "a"}]}  # the input is never edited


def test_test_operation_compares_as_json() -> None:
    ops = compile_operations([{"op": "test", "path": "/a", "value": 1}], "p")
    assert apply_sequence({"a": True}, ops).document is None  # true is not 1 in JSON
    assert apply_sequence({"a": 1}, ops).document == {"a": 1}


# -- the declarative fields ----------------------------------------------------------------------------
def test_every_declarative_field_and_idempotence() -> None:
    m = mutation(
        "all",
        {
            "labels": {"team": "a"},
            "annotations": {"example.com/note": "hi"},
            "nodeSelector": {"add": {"disk": "ssd"}, "remove": ["legacy"]},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 3,
                            "preference": {"matchExpressions": [{"key": "fast", "operator": "Exists"}]},
                        }
                    ],
                }
            },
        },
    )
    p = pod(
        spec={
            "nodeSelector": {"legacy": "1"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ],
        }
    )
    out, done = run(m, p)
    assert out["metadata"]["labels"] == {"team": "a"}
    assert out["metadata"]["annotations"] == {"example.com/note": "hi", MARK_ANNOTATION: "all/1"}
    assert out["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert len(out["spec"]["tolerations"]) == 1  # already there: not added twice
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    ]
    assert na["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 3
    assert done.changes[:3] == ["labels team", "annotations example.com/note", "nodeSelector"]
    again, done_again = run(m, out)
    assert again == out and done_again.changes == []


def test_patches_win_over_the_declarative_fields() -> None:
    m = mutation(
        "p",
        {
            "labels": {"team": "a"},
            "patches": [{"op": "replace", "path": "/metadata/labels/team", "value": "b"}],
        },
    )
    out, _ = run(m, pod())
    assert out["metadata"]["labels"]["team"] == "b"


def test_patches_v2_sequences_are_independent() -> None:
    m = mutation(
        "v2",
        {
            "patchesV2": [
                {"operations": [{"op": "remove", "path": "/spec/missing"}]},
                {"operations": [{"op": "add", "path": "/metadata/labels", "value": {"ok": "1"}}]},
            ]
        },
    )
    out, done = run(m, pod())
    assert out["metadata"]["labels"] == {"ok": "1"}
    assert len(done.warnings) == 1 and done.warnings[0].startswith("patches #1 not applied")


def test_a_patch_removing_every_annotation_keeps_the_mark() -> None:
    m = mutation("strip", {"patches": [{"op": "remove", "path": "/metadata/annotations"}]})
    out, _ = run(m, pod())
    assert out["metadata"]["annotations"] == {MARK_ANNOTATION: "strip/1"}


def test_distribution_groups() -> None:
    m = mutation(
        "groups",
        {
            "distributionGroups": [
                {"name": "a", "percentage": 50, "configuration": {"spotMode": "only-spot"}},
                {
                    "name": "b",
                    "percentage": 30,
                    "configuration": {
                        "patches": [{"op": "add", "path": "/metadata/labels", "value": {"g": "b"}}]
                    },
                },
            ]
        },
    )
    chosen: list[str] = []
    for _ in range(10):
        groups = tuple(chosen)
        siblings = Siblings(SiblingCounts(unplaced=len(groups)), groups)
        out, done = run(m, pod(owner=("ReplicaSet", "rs")), siblings)
        chosen.append(out["metadata"]["annotations"][GROUP_ANNOTATION])
        if done.group == "a":
            assert out["spec"]["nodeSelector"] == {"scheduling.cast.ai/spot": "true"}
        if done.group == "b":
            assert out["metadata"]["labels"]["g"] == "b"
    assert (chosen.count("a"), chosen.count("b"), chosen.count("none")) == (5, 3, 2)
    assert choose_group(m.groups, Siblings()) is not None and choose_group(m.groups, Siblings()).name == "a"  # type: ignore[union-attr]


# -- matching and ranking ------------------------------------------------------------------------------
def test_workload_identity_through_the_controller_chain() -> None:
    rs_pod = pod(labels={"pod-template-hash": "abc12"}, owner=("ReplicaSet", "api-abc12"))
    assert workload_of(rs_pod, "ns") == Workload("ns", "Deployment", "api")
    orphan_rs = pod(owner=("ReplicaSet", "plain"))
    assert workload_of(orphan_rs, "ns") == Workload("ns", "ReplicaSet", "plain")
    job_pod = pod(owner=("Job", "backup-28001"))

    def owners(kind: str, name: str, uid: str) -> tuple[str, str, str] | None:
        return ("CronJob", "backup", "cj") if kind == "Job" else None

    assert workload_of(job_pod, "ns", owners) == Workload("ns", "CronJob", "backup")
    assert workload_of(job_pod, "ns") == Workload("ns", "Job", "backup-28001")
    assert workload_of(pod("bare"), "ns") == Workload("ns", "Pod", "bare")


def both(
    a: dict[str, Any], b: dict[str, Any], p: dict[str, Any] | None = None, namespace: str = "prod"
) -> str | None:
    return winner(
        [mutation("aaa", a), mutation("bbb", b)],
        p or pod("web", labels={"app": "web", "tier": "fe"}),
        namespace,
    )


WEB = {"filter": {"workload": {"names": ["web"]}}}
WEB_RE = {"filter": {"workload": {"names": ["w.*"]}}}
LABEL = {"filter": {"pod": {"labelsFilter": [{"key": "app", "value": "web"}]}}}
LABEL_RE = {"filter": {"pod": {"labelsFilter": [{"key": "app", "value": "w.b"}]}}}
TWO_LABELS = {
    "filter": {"pod": {"labelsFilter": [{"key": "app", "value": "web"}, {"key": "tier", "value": "fe"}]}}
}
KIND = {"filter": {"workload": {"kinds": ["Pod"]}}}
KIND_RE = {"filter": {"workload": {"kinds": ["P.d"]}}}
NS = {"filter": {"workload": {"namespaces": ["prod"]}}}
NS_RE = {"filter": {"workload": {"namespaces": ["pr.*"]}}}
EMPTY: dict[str, Any] = {}
TOLERATES = {"filterV2": {"pod": {"tolerations": {"matchers": [{"keyMatcher": {"value": "gpu"}}]}}}}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # each row: the less specific mutation is "aaa" (it would win a tie by name), so "bbb" winning
        # proves the rank and not the name decided
        (WEB_RE, WEB, "bbb"),  # names: exact > regex
        (LABEL, WEB_RE, "bbb"),  # names > labels
        (LABEL_RE, LABEL, "bbb"),  # labels: exact > regex
        (LABEL, TWO_LABELS, "bbb"),  # more labels matched > fewer
        (KIND, LABEL_RE, "bbb"),  # labels > kinds
        (KIND_RE, KIND, "bbb"),  # kinds: exact > regex
        (NS, KIND_RE, "bbb"),  # kinds > namespaces
        (NS_RE, NS, "bbb"),  # namespaces: exact > regex
        (EMPTY, NS_RE, "bbb"),  # any filter > no filter
        (KIND, TOLERATES, "bbb"),  # tolerations > kinds
        (TOLERATES, LABEL_RE, "bbb"),  # labels > tolerations
        (WEB, WEB, "aaa"),  # a tie: broken by name
    ],
)
def test_ranking_table(a: dict[str, Any], b: dict[str, Any], expected: str) -> None:
    p = pod(
        "web",
        labels={"app": "web", "tier": "fe"},
        spec={"tolerations": [{"key": "gpu", "operator": "Exists"}]},
    )
    assert both(a, b, p) == expected
    assert both(b, a, p) == "aaa"  # names swapped: the specific one (now "aaa") wins again


def test_ties_are_reported() -> None:
    ms = [mutation("zeta", WEB), mutation("alpha", WEB), mutation("ns", NS)]
    chosen = select(ms, Workload("prod", "Pod", "web"), pod())
    assert chosen.winner is not None and chosen.winner.mutation.name == "alpha"
    assert [c.mutation.name for c in chosen.tied] == ["zeta"]
    assert [c.mutation.name for c in chosen.candidates] == ["alpha", "zeta", "ns"]


def test_ours_before_castai_on_an_equal_name_and_rank() -> None:
    ms = [mutation("same", WEB, api=CASTAI), mutation("same", WEB, api=OURS)]
    chosen = select(ms, Workload("prod", "Pod", "web"), pod())
    assert chosen.winner is not None and chosen.winner.mutation.group == "castops.io"


def test_excludes_and_or_operator_and_v2_matchers() -> None:
    m = mutation(
        "x",
        {
            "filter": {
                "workload": {
                    "namespaces": ["prod.*"],
                    "excludeNamespaces": ["prod-secret"],
                    "excludeNames": ["^db-.*"],
                },
                "pod": {
                    "labelsOperator": "or",
                    "labelsFilter": [{"key": "app", "value": "web"}, {"key": "app", "value": "api"}],
                    "excludeLabelsFilter": [{"key": "skip"}],
                },
            }
        },
    )
    w = Workload("prod-a", "Pod", "web")
    assert rank(m, w, pod(labels={"app": "api"})) == Rank(labels=2, label_hits=1, namespaces=1)
    assert rank(m, Workload("prod-secret", "Pod", "web"), pod(labels={"app": "api"})) is None
    assert rank(m, Workload("prod-a", "Pod", "db-1"), pod(labels={"app": "api"})) is None
    assert rank(m, w, pod(labels={"app": "api", "skip": "yes"})) is None  # empty value: any value
    assert rank(m, w, pod(labels={"app": "other"})) is None
    v2 = mutation(
        "v2",
        {
            "filterV2": {
                "workload": {
                    "names": [{"type": "regex", "value": "web"}],
                    "kinds": [{"type": "exact", "value": "Pod"}],
                },
                "pod": {
                    "labels": {
                        "operator": "and",
                        "matchers": [{"keyMatcher": {"type": "regex", "value": "a.*"}}],
                    },
                    "excludeLabels": {"matchers": [{"keyMatcher": {"value": "skip"}}]},
                },
            }
        },
    )
    # a regex matcher never counts as exact, even when its text equals the name
    assert rank(v2, w, pod(labels={"app": "x"})) == Rank(names=1, labels=1, label_hits=1, kinds=2)
    assert rank(v2, w, pod(labels={"skip": "x", "app": "x"})) is None
    assert rank(v2, w, pod(labels={"zzz": "x"})) is None


# -- validation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (
            {"filter": {"workload": {"names": ["a(("]}}},
            "spec.filter.workload.names: 'a((' is not a valid regex",
        ),
        (
            {"filterV2": {"workload": {"names": [{"type": "regex", "value": "["}]}}},
            "spec.filterV2.workload.names[0]",
        ),
        ({"patches": [{"op": "frob", "path": "/a"}]}, "patches[0].op: 'frob' is not an operation"),
        (
            {"patches": [{"op": "add", "path": "a", "value": 1}]},
            "patches[0].path: 'a' does not start with '/'",
        ),
        ({"patches": [{"op": "add", "path": "/a/[x"}]}, "patches[0].path"),
        ({"patches": [{"op": "add", "path": "/a"}]}, "patches[0].value is required for add"),
        ({"patches": [{"op": "move", "path": "/a"}]}, "patches[0].from is required for move"),
        (
            {"patches": [{"op": "move", "from": "/a/[k=v]", "path": "/b"}]},
            "move takes plain JSON pointers only",
        ),
        ({"patches": [{"op": "replace", "path": "/metadata/name", "value": "x"}]}, "the Pod's identity"),
        ({"patchesV2": [{"operations": [{"op": "nope", "path": "/a"}]}]}, "spec.patchesV2[0].operations"),
        (
            {"spotConfig": {"mode": "only-spot", "distributionPercentage": 101}},
            "spec.spotConfig.distributionPercentage",
        ),
        ({"spotConfig": {"mode": "cheap"}}, "spec.spotConfig.mode"),
        (
            {"distributionGroups": [{"name": "a", "percentage": 60}, {"name": "b", "percentage": 50}]},
            "percentages add up to 110 %",
        ),
        ({"distributionGroups": [{"name": "a", "percentage": -1}]}, "spec.distributionGroups[0].percentage"),
        ({"filter": {}, "filterV2": {}}, "filter and filterV2 are both set"),
        ({"nodeSelector": {"add": {"a": "1"}, "remove": ["a"]}}, "keys both added and removed: a"),
        ({"labels": {"bad key!": "x"}}, "spec.labels: label 'bad key!' is not a Kubernetes qualified name"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "without key must have operator Exists"),
        ({"affinity": {"podAffinity": {}}}, "spec.affinity.nodeAffinity"),
        ({"restartPolicy": "sometimes"}, "spec.restartPolicy"),
        ({"nodeSelecter": {}}, "spec.nodeSelecter: unknown field"),
        (
            {"nodeTemplatesToConsolidate": ["a"], "nodeSelector": {"add": {TEMPLATE: "b"}}},
            "nodeTemplatesToConsolidate and nodeSelector.add",
        ),
        (
            {
                "spotConfig": {"mode": "only-spot"},
                "distributionGroups": [
                    {"name": "a", "percentage": 5, "configuration": {"spotMode": "only-spot"}}
                ],
            },
            "spotConfig and a distribution group's spotMode",
        ),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, Any], needle: str) -> None:
    problems = invalid(spec)
    assert any(needle in p for p in problems), problems


def test_castai_objects_drop_unknown_fields_with_a_warning_ours_refuse_them() -> None:
    spec = {
        "labels": {"a": "b"},
        "futureField": {"x": 1},
        "filter": {"workload": {"names": ["x"], "newList": []}},
    }
    m = mutation("c", spec, api=CASTAI)
    assert set(m.warnings) == {
        "spec.futureField: unknown field ignored",
        "spec.filter.workload.newList: unknown field ignored",
    }
    assert m.spec.labels == {"a": "b"}
    assert "spec.futureField: unknown field" in invalid(spec)


def test_restart_policy_immediate_is_accepted_with_a_warning() -> None:
    m = mutation("r", {"restartPolicy": "immediate"})
    assert m.warnings == ("spec.restartPolicy: immediate is accepted, but CastSlice restarts nothing",)


def test_test_past_the_end_fails_the_list() -> None:
    ops = compile_operations([{"op": "test", "path": "/a/-", "value": 1}], "p")
    outcome = apply_sequence({"a": [1]}, ops)
    assert outcome.document is None and outcome.error is not None and "names no value" in outcome.error


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        (
            {"op": "add", "path": "/metadata/labels", "value": {"app": {"x": 1}}},
            "metadata.labels[app]: not a valid label",
        ),
        (
            {"op": "add", "path": "/metadata/labels", "value": {"app": "not a label value!"}},
            "metadata.labels[app]",
        ),
        ({"op": "add", "path": "/spec/nodeSelector", "value": ["x"]}, "spec.nodeSelector: must be a map"),
        (
            {"op": "add", "path": "/spec/tolerations", "value": ["x"]},
            "spec.tolerations[0]: must be a map",
        ),
        ({"op": "add", "path": "/spec/tolerations", "value": [{"value": "x"}]}, "spec.tolerations[0]"),
        ({"op": "replace", "path": "/spec", "value": 1}, "metadata and spec must stay objects"),
    ],
)
def test_a_patch_that_would_make_the_pod_invalid_is_not_applied(patch: dict[str, Any], problem: str) -> None:
    out, done = patched([patch], pod(labels={"keep": "me"}))
    assert out["metadata"]["labels"] == {"keep": "me"} and isinstance(out["spec"], dict)
    assert (
        len(done.warnings) == 1
        and "the Pod would be invalid" in done.warnings[0]
        and problem in done.warnings[0]
    )


def test_anded_expressions_are_copied_per_term_never_shared() -> None:
    m = mutation("t", {"nodeTemplatesToConsolidate": ["a", "b"]})
    two_terms = {"matchExpressions": [{"key": "x", "operator": "Exists"}]}
    p = pod(
        spec={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [copy.deepcopy(two_terms), copy.deepcopy(two_terms)]
                    }
                }
            }
        }
    )
    out, _ = run(m, p)
    first, second = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert first == second
    assert first["matchExpressions"][1] is not second["matchExpressions"][1]
    assert first["matchExpressions"][1]["values"] is not second["matchExpressions"][1]["values"]


def test_a_pod_template_gets_no_share_but_a_whole_mode_still_applies() -> None:
    template = pod()
    del template["metadata"]["name"]  # castslice mutate's view of a Deployment's template
    half, done = run(
        mutation("half", {"spotConfig": {"mode": "only-spot", "distributionPercentage": 50}}), template
    )
    assert done.placement is None and PLACEMENT_LABEL not in (half["metadata"].get("labels") or {})
    assert done.notes == ["spot distribution and groups: chosen per Pod when each is created"]
    whole, done = run(mutation("whole", {"spotConfig": {"mode": "only-spot"}}), template)
    assert done.placement == "spot" and whole["spec"]["nodeSelector"] == {"scheduling.cast.ai/spot": "true"}
    named = dict(template, metadata={"generateName": "web-"})
    _, done = run(
        mutation("half", {"spotConfig": {"mode": "only-spot", "distributionPercentage": 50}}), named
    )
    assert done.placement == "on-demand"  # a real Pod (generateName): its share is chosen
