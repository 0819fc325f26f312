"""The pod-mutations plug-in through the real engine, app and CLI: PodMutations from the cluster
view, the proven patch, idempotence, the validating webhook, and the offline commands."""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from function import cli
from function.core.config import parse_config
from function.core.engine import Engine
from function.core.json_patch import copy_json
from function.core.mutators.base import RequestContext
from function.core.mutators.pod_mutations_mutator import JOBS, OUR_MUTATIONS, siblings_of
from function.core.pod import Owner
from function.core.podmutation.apply import pod_shape_problem
from function.core.podmutation.names import MARK_ANNOTATION
from function.core.view import PodRecord, StaticView, slim_pod
from tests.support import asgi_client, mutation_records, pm, pod_review

TEMPLATE = "scheduling.cast.ai/node-template"


def view(
    *objects: dict[str, Any], pods: tuple[Any, ...] = (), extra: dict[str, Any] | None = None
) -> StaticView:
    castai = [o for o in objects if o["apiVersion"].startswith("pod-mutations.cast.ai")]
    ours = [o for o in objects if o not in castai]
    indices: dict[str, Any] = {"podmutations": mutation_records(ours), "pods": list(pods)}
    if castai:
        indices["podmutations-castai"] = mutation_records(castai)
    indices.update(extra or {})
    from function.core.view import PODS, REPLICASETS

    return StaticView(indices, specs=(PODS, REPLICASETS, JOBS, OUR_MUTATIONS))


def engine(**section: Any) -> Engine:
    return Engine(parse_config({"podMutations": {"enabled": True, **section}}))


def pod(
    name: str = "web", labels: dict[str, str] | None = None, owner: tuple[str, str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "prod"}
    if labels:
        metadata["labels"] = labels
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": owner[2], "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def decide(eng: Engine, p: dict[str, Any], cluster: StaticView) -> Any:
    return eng.decide(p, RequestContext(uid="u", namespace="prod", cluster=cluster))


def test_winning_mutation_is_applied_named_and_proven() -> None:
    cluster = view(
        pm("by-namespace", {"filter": {"workload": {"namespaces": ["prod"]}}, "labels": {"a": "ns"}}),
        pm("by-name", {"filter": {"workload": {"names": ["web"]}}, "labels": {"a": "name"}}, generation=7),
    )
    decision = decide(engine(), pod(), cluster)
    assert decision.outcome == "mutated"
    (part,) = [d for d in decision.decisions if d.mutator == "pod-mutations"]
    assert part.reason.startswith("podmutation by-name (generation 7) for Pod/web: labels a")
    assert decision.mutated_pod["metadata"]["labels"] == {"a": "name"}
    assert decision.mutated_pod["metadata"]["annotations"] == {MARK_ANNOTATION: "by-name/7"}
    again = decide(engine(), decision.mutated_pod, cluster)  # reinvocation: nothing more
    assert again.outcome == "unchanged" and again.patch == ()


def test_disabled_by_default_and_castai_objects_only_with_the_switch() -> None:
    castai = pm("theirs", {"labels": {"from": "castai"}}, api="pod-mutations.cast.ai/v1")
    cluster = view(castai)
    assert Engine(parse_config({})).decide(pod(), RequestContext(cluster=cluster)).outcome == "unchanged"
    assert decide(engine(), pod(), cluster).outcome == "unchanged"
    decision = decide(engine(castaiObjects=True), pod(), cluster)
    assert decision.mutated_pod["metadata"]["labels"] == {"from": "castai"}


def test_edited_and_deleted_mutations_apply_to_the_next_pod() -> None:
    eng = engine()
    first = decide(eng, pod(), view(pm("m", {"labels": {"v": "1"}}, generation=1)))
    second = decide(eng, pod(), view(pm("m", {"labels": {"v": "2"}}, generation=2)))
    third = decide(eng, pod(), view())
    assert first.mutated_pod["metadata"]["labels"] == {"v": "1"}
    assert second.mutated_pod["metadata"]["annotations"][MARK_ANNOTATION] == "m/2"
    assert second.mutated_pod["metadata"]["labels"] == {"v": "2"}
    assert third.outcome == "unchanged"


def test_invalid_mutations_are_skipped_and_ties_reported() -> None:
    cluster = view(
        pm("broken", {"filter": {"workload": {"names": ["(("]}}, "labels": {"x": "y"}}),
        pm("b-tie", {"filter": {"workload": {"names": ["web"]}}, "labels": {"t": "b"}}),
        pm("a-tie", {"filter": {"workload": {"names": ["web"]}}, "labels": {"t": "a"}}),
    )
    decision = decide(engine(), pod(), cluster)
    assert decision.mutated_pod["metadata"]["labels"] == {"t": "a"}
    assert any("chosen by name over equally specific b-tie" in w for w in decision.warnings)


def test_deployment_pods_match_through_the_replicaset_in_the_view() -> None:
    from function.core.view import ReplicaSetRecord

    rs = ReplicaSetRecord("prod", "api-6d4b", "rs-uid", Owner("dep-uid", "Deployment", "api"), 3, False)
    cluster = view(
        pm(
            "deploy",
            {"filter": {"workload": {"kinds": ["Deployment"], "names": ["api"]}}, "labels": {"k": "d"}},
        ),
        extra={"replicasets": [rs]},
    )
    p = pod(
        "api-6d4b-x", owner=("ReplicaSet", "api-6d4b", "rs-uid")
    )  # no pod-template-hash: the view decides
    assert decide(engine(), p, cluster).mutated_pod["metadata"]["labels"] == {"k": "d"}


def test_distribution_groups_count_siblings_the_view_kept_of_earlier_pods() -> None:
    """Each admitted Pod's own metadata, slimmed as the watch slims it, is what the next decision
    counts: the groups' shares hold across a scale-up, not only inside one review."""
    mutation = pm(
        "groups",
        {
            "distributionGroups": [
                {"name": "a", "percentage": 50, "configuration": {"spotMode": "only-spot"}},
                {"name": "b", "percentage": 30},
            ]
        },
    )
    admitted: list[Any] = []
    for i in range(10):
        new = pod(f"api-{i}", owner=("ReplicaSet", "api", "rs-uid"))
        decision = decide(engine(), new, view(mutation, pods=tuple(admitted)))
        stored = decision.mutated_pod
        stored["metadata"]["uid"] = f"pod-{i}"  # as the apiserver stores it
        admitted.append(slim_pod(stored))
    groups = [record.group for record in admitted]
    assert (groups.count("a"), groups.count("b"), groups.count("none")) == (5, 3, 2)
    next_pod = pod(owner=("ReplicaSet", "api", "rs-uid"))
    assert sorted(siblings_of(next_pod, view(mutation, pods=tuple(admitted))).groups) == sorted(groups)


def test_spot_split_counts_siblings_from_the_view() -> None:
    mutation = pm("half", {"spotConfig": {"mode": "only-spot", "distributionPercentage": 50}})
    owner = ("ReplicaSet", "rs", "rs-uid")

    def sibling(i: int, placement: str, terminating: bool = False) -> PodRecord:
        return PodRecord(
            "prod", f"p{i}", f"p{i}", Owner("rs-uid", "ReplicaSet", "rs"), placement, terminating
        )

    one_on_demand = view(mutation, pods=(sibling(1, "on-demand"),))
    p = pod("new", owner=owner)
    assert siblings_of(p, one_on_demand).counts.on_demand == 1
    assert decide(engine(), p, one_on_demand).mutated_pod["spec"]["nodeSelector"] == {
        "scheduling.cast.ai/spot": "true"
    }
    terminating = view(mutation, pods=(sibling(1, "on-demand", terminating=True),))
    assert "nodeSelector" not in decide(engine(), p, terminating).mutated_pod["spec"]


def test_a_patch_that_fails_leaves_the_rest_and_warns_never_denies() -> None:
    cluster = view(pm("m", {"labels": {"ok": "1"}, "patches": [{"op": "remove", "path": "/spec/nothing"}]}))
    decision = decide(engine(), pod(), cluster)
    assert decision.allowed and decision.outcome == "mutated"
    assert decision.mutated_pod["metadata"]["labels"] == {"ok": "1"}
    assert any("patches not applied: [0] remove /spec/nothing" in w for w in decision.warnings)


def test_castai_opt_out_label() -> None:
    cluster = view(pm("m", {"labels": {"ok": "1"}}))
    decision = decide(engine(), pod(labels={"pod-mutator.cast.ai/ignore": "true"}), cluster)
    assert decision.outcome == "unchanged"


# -- property: any mutation on any Pod: a proven patch or an unchanged Pod, never a rejection -----
_keys = st.sampled_from(["app", "tier", "team", "example.com/x"])
_values = st.sampled_from(["web", "api", "fe", "a"])
_paths = st.sampled_from(
    [
        "/metadata/labels/app",
        "/metadata/labels",
        "/metadata/annotations/note",
        "/spec/nodeSelector",
        "/spec/nodeSelector/zone",
        "/spec/tolerations",
        "/spec/tolerations/0",
        "/spec/tolerations/-",
        "/spec/tolerations/[key=app]/value",
        "/spec/tolerations/*/effect",
        "/spec/affinity",
        "/spec/priority",
    ]
)
_operations = st.lists(
    st.one_of(
        st.builds(
            lambda p, v: {"op": "add", "path": p, "value": v},
            _paths,
            st.one_of(_values, st.just({"zone": "a"})),
        ),
        st.builds(lambda p: {"op": "remove", "path": p}, _paths),
        st.builds(lambda p, v: {"op": "replace", "path": p, "value": v}, _paths, _values),
        st.builds(lambda p, v: {"op": "test", "path": p, "value": v}, _paths, _values),
        st.builds(
            lambda f, p: {"op": "copy", "from": f, "path": p},
            st.just("/metadata/labels/app"),
            st.just("/metadata/labels/copied"),
        ),
    ),
    max_size=4,
)
_specs = st.fixed_dictionaries(
    {},
    optional={
        "filter": st.fixed_dictionaries(
            {
                "workload": st.fixed_dictionaries(
                    {}, optional={"names": st.lists(st.sampled_from(["web", "w.*", "api"]), max_size=2)}
                )
            }
        ),
        "labels": st.dictionaries(_keys, _values, max_size=2),
        "annotations": st.dictionaries(_keys, _values, max_size=2),
        "nodeSelector": st.fixed_dictionaries(
            {
                "add": st.dictionaries(st.just("zone"), _values),
                "remove": st.lists(st.just("disk"), max_size=1),
            }
        ),
        "tolerations": st.lists(
            st.builds(
                lambda k, v: {"key": k, "operator": "Equal", "value": v, "effect": "NoSchedule"},
                _keys,
                _values,
            ),
            max_size=2,
        ),
        "nodeTemplatesToConsolidate": st.lists(st.sampled_from(["t1", "t2"]), unique=True, max_size=2),
        "spotConfig": st.fixed_dictionaries(
            {
                "mode": st.sampled_from(["optional-spot", "only-spot", "preferred-spot"]),
                "distributionPercentage": st.integers(0, 100),
            }
        ),
        "patches": _operations,
    },
)
_pods = st.builds(
    lambda labels, selector, tolerations, affinity: {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "prod", **({"labels": labels} if labels else {})},
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            **({"nodeSelector": selector} if selector else {}),
            **({"tolerations": tolerations} if tolerations else {}),
            **(
                {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity}
                        }
                    }
                }
                if affinity
                else {}
            ),
        },
    },
    st.dictionaries(_keys, _values, max_size=2),
    st.dictionaries(st.sampled_from(["zone", "disk", TEMPLATE]), _values, max_size=2),
    st.lists(st.builds(lambda k: {"key": k, "operator": "Exists"}, _keys), max_size=2),
    st.lists(st.just({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}), max_size=2),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_specs, original=_pods)
def test_any_mutation_on_any_pod_gives_a_proven_patch_or_an_unchanged_pod(
    spec: dict[str, Any], original: dict[str, Any]
) -> None:
    cluster = view(pm("generated", spec))
    # As the apiserver sends it: parsed JSON, no object shared between two places (st.just repeats one)
    original = json.loads(json.dumps(original))
    before = copy_json(original)
    decision = decide(engine(), original, cluster)
    assert original == before  # the engine works on copies
    assert decision.allowed and decision.outcome in ("mutated", "unchanged"), decision.reason
    if decision.outcome == "mutated":
        assert decision.patch and decision.mutated_pod is not None
        import jsonpatch

        assert jsonpatch.apply_patch(copy_json(original), list(decision.patch)) == decision.mutated_pod
        assert pod_shape_problem(decision.mutated_pod) is None  # no label/selector the apiserver refuses
        second = decide(engine(), decision.mutated_pod, cluster)
        assert second.outcome == "unchanged" and second.patch == ()


# -- the validating webhook, through the real app -------------------------------------------------
def validation_review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "v-1",
            "kind": {"group": "castops.io", "version": "v1alpha1", "kind": "PodMutation"},
            "resource": {"group": "castops.io", "version": "v1alpha1", "resource": "podmutations"},
            "name": obj["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": obj,
        },
    }


def test_validating_webhook_refuses_with_the_field_named_and_allows_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = asgi_client(monkeypatch)
    bad = pm(
        "bad",
        {"filter": {"workload": {"names": ["(("]}}, "patches": [{"op": "add", "path": "/x/[k", "value": 1}]},
    )
    reply = client.post("/validate/podmutations", json=validation_review(bad)).json()
    response = reply["response"]
    assert response["uid"] == "v-1" and response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith(
        "PodMutation bad is invalid: spec.filter.workload.names: '((' is not a valid regex"
    )
    assert "patches[0].path" in message
    good = client.post(
        "/validate/podmutations", json=validation_review(pm("good", {"labels": {"a": "b"}}))
    ).json()
    assert good["response"] == {"uid": "v-1", "allowed": True}
    assert client.get("/validate/podmutations").status_code == 405
    assert client.post("/validate/podmutations", content=b"{}").status_code == 400


# -- offline commands -----------------------------------------------------------------------------
def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    code = cli.main(args)
    return code, out.getvalue(), err.getvalue()


def test_mutations_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump_all([pm("good", {"labels": {"a": "b"}}), {"kind": "ConfigMap"}]))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(pm("bad", {"spotConfig": {"mode": "only-spot", "distributionPercentage": 300}}))
    )
    code, out, err = run_cli(["mutations", "validate", str(good)], monkeypatch)
    assert code == 0 and "podmutation/good: valid" in out and "not a PodMutation, skipped" in err
    code, out, err = run_cli(["mutations", "validate", str(tmp_path)], monkeypatch)
    assert code == 1
    assert "podmutation/bad: invalid" in err and "spec.spotConfig.distributionPercentage" in err


def test_mutate_with_a_mutations_directory_and_explain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mutations = tmp_path / "mutations"
    mutations.mkdir()
    (mutations / "a.yaml").write_text(
        yaml.safe_dump_all(
            [
                pm("ns", {"filter": {"workload": {"namespaces": ["default"]}}, "labels": {"by": "ns"}}),
                pm(
                    "name",
                    {
                        "filter": {"workload": {"names": ["web"], "kinds": ["Deployment"]}},
                        "labels": {"by": "name"},
                    },
                ),
            ]
        )
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
        },
    }
    manifest = tmp_path / "app.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    code, out, err = run_cli(["mutate", "-f", str(manifest), "--mutations", str(mutations)], monkeypatch)
    assert code == 0, err
    result = yaml.safe_load(out)
    assert result["spec"]["template"]["metadata"]["labels"] == {"app": "web", "by": "name"}
    assert "ownerReferences" not in result["spec"]["template"]["metadata"]  # the offline owner is not written
    code, out, _ = run_cli(["explain", "-f", str(manifest), "--mutations", str(mutations)], monkeypatch)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "deployment/web spec.template: workload Deployment/web in namespace default"
    assert lines[1].startswith("  1. name (generation 1): names exact") and lines[1].endswith("<- winner")
    assert lines[2].startswith("  2. ns (generation 1):")
    assert '"path": "/metadata/labels/by"' in out


def test_decision_patch_over_the_wire_names_the_mutation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply the apiserver gets: a base64 JSON Patch adding the mark (and the mutation's fields)."""
    decision = decide(
        engine(), pod(), view(pm("wire", {"annotations": {"example.com/a": "b"}}, generation=4))
    )
    patch = list(decision.patch)
    encoded = base64.b64encode(json.dumps(patch).encode()).decode()
    assert json.loads(base64.b64decode(encoded)) == [
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {"example.com/a": "b", MARK_ANNOTATION: "wire/4"},
        }
    ]


def test_spot_mutator_leaves_a_pod_placed_by_a_podmutation_alone() -> None:
    both = Engine(parse_config({"podMutations": {"enabled": True}, "spot": {"enabled": True}}))
    owner = ("ReplicaSet", "rs", "rs-uid")
    preferred = view(pm("pref", {"spotConfig": {"mode": "preferred-spot"}}))
    decision = decide(both, pod("p", owner=owner), preferred)
    spec = decision.mutated_pod["spec"]
    assert "nodeSelector" not in spec  # spot's only-spot placement did not override preferred-spot
    assert (
        spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1
    )
    (spot,) = [d for d in decision.decisions if d.mutator == "spot"]
    assert spot.action.value == "unchanged" and spot.reason == "placed by podmutation pref/1"
    # a mutation without spot settings: the spot mutator still places the Pod
    plain = view(pm("plain", {"labels": {"a": "b"}}))
    decision = decide(both, pod("p", owner=owner), plain)
    (spot,) = [d for d in decision.decisions if d.mutator == "spot"]
    assert spot.action.value == "mutated"


def test_skipped_extended_paths_are_recorded_in_the_decision() -> None:
    spec = {"patches": [{"op": "replace", "path": "/spec/tolerations/[key=absent]/value", "value": "x"}]}
    decision = decide(engine(), pod(), view(pm("skips", spec)))
    (part,) = [d for d in decision.decisions if d.mutator == "pod-mutations"]
    assert part.reason.endswith(
        "; skipped: patches [0] replace /spec/tolerations/[key=absent]/value: selects nothing"
    )
    assert not decision.warnings


# --- issue 25: decisions lost or widened -------------------------------------------------------------

NULL_PARTS_TERMS = [
    {"matchExpressions": None, "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    {"matchFields": None, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
]


def gpu_pod_with_required_terms(terms: list[Any]) -> dict[str, Any]:
    p = pod()
    p["metadata"]["annotations"] = {"castops.io/optimize": "true"}
    p["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1"},
        "requests": {"nvidia.com/gpu": "1"},
    }
    p["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    return p


@pytest.mark.parametrize(
    "spec",
    [
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}},
        {"nodeTemplatesToConsolidate": ["t1"]},
    ],
    ids=["affinity", "consolidation"],
)  # fmt: skip
def test_null_match_expressions_or_fields_keep_the_whole_decision(spec: dict[str, Any]) -> None:
    """A term with ``matchExpressions: null`` (or ``matchFields: null``) is a term without them:
    the mutation is ANDed into it, and the rest of the decision (GPU slicing) stays."""
    cluster = view(pm("m", spec))
    decision = Engine(parse_config({"podMutations": {"enabled": True}})).decide(
        gpu_pod_with_required_terms(copy_json(NULL_PARTS_TERMS)),
        RequestContext(uid="u", namespace="prod", cluster=cluster),
    )
    assert decision.outcome == "mutated", decision.reason
    assert [d.mutator for d in decision.decisions if d.action.value == "mutated"] == [
        "gpu-slicing",
        "pod-mutations",
    ]
    terms = decision.mutated_pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    added = "gpu" if "affinity" in spec else TEMPLATE
    assert all(any(e["key"] == added for e in term["matchExpressions"]) for term in terms)
    assert terms[0]["matchFields"] == NULL_PARTS_TERMS[0]["matchFields"]


@pytest.mark.parametrize(
    "empty", [{}, {"matchExpressions": None}, {"matchExpressions": [], "matchFields": []}]
)
def test_an_empty_node_selector_term_stays_empty(empty: dict[str, Any]) -> None:
    """An empty term matches no node; ANDing an expression into it would make it match nodes and
    widen where the Pod may run. The other terms are narrowed as usual."""
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    cluster = view(pm("m", {"nodeTemplatesToConsolidate": ["t1"]}))
    decision = decide(engine(), gpu_pod_with_required_terms([copy_json(empty), copy_json(zone)]), cluster)
    terms = decision.mutated_pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0] == empty
    assert terms[1]["matchExpressions"][-1] == {"key": TEMPLATE, "operator": "In", "values": ["t1"]}


# --- issue 25: bounded cost --------------------------------------------------------------------------

CATASTROPHIC = "(a+)+b"
"""Exponential for a backtracking engine: Python's re took 3.2 s on a name of 27 ``a``s."""


@pytest.mark.parametrize("name_length", [30, 100_000])
def test_a_catastrophic_pattern_and_a_long_name_decide_in_linear_time(name_length: int) -> None:
    """RE2 (Go's regexp, as CAST AI's mutator) matches in time linear in the name: well under a
    millisecond here, where backtracking would take minutes at 30 characters and forever beyond.
    The bound is far above the expected cost; it only says the review does not hang."""
    import time

    cluster = view(
        pm("v1", {"filter": {"workload": {"names": [CATASTROPHIC]}}, "labels": {"by": "v1"}}),
        pm(
            "v2",
            {
                "filterV2": {"workload": {"names": [{"type": "regex", "value": CATASTROPHIC}]}},
                "labels": {"by": "v2"},
            },
        ),
        pm("fallback", {"labels": {"by": "fallback"}}),
    )
    started = time.perf_counter()
    decision = decide(engine(), pod("a" * name_length), cluster)
    assert time.perf_counter() - started < 2.0
    assert decision.mutated_pod["metadata"]["labels"] == {"by": "fallback"}  # no name ends in b
    assert decide(engine(), pod("a" * name_length + "b"), cluster).mutated_pod["metadata"]["labels"] == {
        "by": "v1"  # v1 and v2 match with the same rank: the name decides
    }


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?=a)a", "invalid perl operator: (?="),
        (r"(a)\1", r"invalid escape sequence: \1"),
        ("a++", "bad repetition operator: ++"),
        (r"web\Z", r"invalid escape sequence: \Z"),
        ("a{1001}", "invalid repetition size: {1001}"),
    ],
)
def test_what_re2_cannot_run_is_refused_at_validation_naming_the_pattern(
    pattern: str, why: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Backreferences, lookaround, possessive quantifiers, Python's \\Z: Go's regexp (and so CAST
    AI) refuses them too. Refused by the validating webhook and ``castslice mutations validate``."""
    bad_v1 = pm("bad-v1", {"filter": {"workload": {"names": [pattern]}}})
    bad_v2 = pm("bad-v2", {"filterV2": {"pod": {"labels": {"matchers": [
        {"keyMatcher": {"type": "regex", "value": pattern}}]}}}})  # fmt: skip
    client = asgi_client(monkeypatch)
    for obj, field in ((bad_v1, "spec.filter.workload.names"), (bad_v2, "spec.filterV2.pod.labels")):
        response = client.post("/validate/podmutations", json=validation_review(obj)).json()["response"]
        assert response["allowed"] is False
        message = response["status"]["message"]
        assert field in message and repr(pattern) in message and why in message, message
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad_v1))
    code, _, err = run_cli(["mutations", "validate", str(path)], monkeypatch)
    assert code == 1 and repr(pattern) in err and why in err


# --- issue 25: a PodMutation patch that breaks extended resources is dropped alone ------------------


def sliced_gpu_pod() -> dict[str, Any]:
    p = gpu_pod_with_required_terms([{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}])
    p["metadata"]["annotations"]["example.com/fraction"] = "0.5"
    return p


@pytest.mark.parametrize(
    ("patches", "problem"),
    [
        ([{"op": "remove", "path": "/spec/containers/*/resources/limits"}], "has a request but no limit"),
        (
            [{"op": "copy", "from": "/metadata/annotations/example.com~1fraction",
              "path": "/spec/containers/0/resources/limits/example.com~1fpga"}],
            "must be an integer",
        ),
    ],
    ids=["remove-limits", "copy-a-fraction"],
)  # fmt: skip
def test_a_patch_breaking_extended_resources_is_dropped_and_the_slicing_kept(
    patches: list[dict[str, Any]], problem: str
) -> None:
    """The proof runs on the PodMutation's patch list alone: the list is not applied, a warning
    names the PodMutation, and the rest of the decision (its labels, GPU slicing) is sent."""
    cluster = view(pm("gpu-limits", {"labels": {"team": "ml"}, "patches": patches}, generation=3))
    decision = decide(engine(), sliced_gpu_pod(), cluster)
    assert decision.outcome == "mutated", decision.reason
    resources = decision.mutated_pod["spec"]["containers"][0]["resources"]
    assert resources == {
        "limits": {"nvidia.com/gpu-shared": "1"},
        "requests": {"nvidia.com/gpu-shared": "1"},
    }
    assert decision.mutated_pod["metadata"]["labels"] == {"team": "ml"}
    (warning,) = decision.warnings
    assert warning.startswith("podmutation gpu-limits/3: patches not applied: the Pod would be invalid")
    (part,) = [d for d in decision.decisions if d.mutator == "pod-mutations"]
    assert problem in part.reason


@pytest.mark.parametrize(
    ("patch", "refusal"),
    [
        (
            {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "0.5"},
            "spec.patches: patches[0]: limits[nvidia.com/gpu] '0.5' must be a whole number",
        ),
        (
            {"op": "replace", "path": "/spec/containers/*/resources",
             "value": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}},
            "spec.patches: patches[0]: nvidia.com/gpu request must equal its limit",
        ),
        (
            {"op": "remove", "path": "/spec/containers/*/resources/limits/nvidia.com~1gpu"},
            "spec.patches: patches[0]: removes the limit of nvidia.com/gpu but not its request",
        ),
    ],
)  # fmt: skip
def test_patches_known_to_break_extended_resources_are_refused_at_validation(
    patch: dict[str, Any], refusal: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = pm("bad", {"patches": [patch]})
    response = asgi_client(monkeypatch).post("/validate/podmutations", json=validation_review(bad)).json()
    assert response["response"]["allowed"] is False
    assert refusal in response["response"]["status"]["message"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, _, err = run_cli(["mutations", "validate", str(path)], monkeypatch)
    assert code == 1 and refusal in err


def test_removing_whole_limits_is_accepted_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether it breaks the rules depends on the Pod (a container asking for a GPU): a warning at
    ``kubectl apply``; a list that removes the request too is accepted silently."""
    warned = pm("warned", {"patches": [{"op": "remove", "path": "/spec/containers/*/resources/limits"}]})
    client = asgi_client(monkeypatch)
    response = client.post("/validate/podmutations", json=validation_review(warned)).json()["response"]
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert warning.startswith("spec.patches[0]: removes resources.limits")
    both = pm("both", {"patches": [
        {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
        {"op": "remove", "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu"},
    ]})  # fmt: skip
    assert client.post("/validate/podmutations", json=validation_review(both)).json()["response"] == {
        "uid": "v-1",
        "allowed": True,
    }


@pytest.mark.parametrize(
    ("podmutations", "mark"),
    [(False, "pref/1"), (True, ""), (True, "not a mark"), (True, "Pref/1")],
    ids=["podmutations-off", "empty-mark", "stray-value", "not-a-name"],
)
def test_spot_places_a_pod_whose_mark_is_no_podmutation_s(podmutations: bool, mark: str) -> None:
    """Only a PodMutation mark (``<name>/<generation>``, PodMutations on) makes spot leave a placed
    Pod alone; any other value is no placement: the label is sticky and spot applies it."""
    both = Engine(parse_config({"podMutations": {"enabled": podmutations}, "spot": {"enabled": True}}))
    forged = pod("p", labels={"castops.io/placement": "spot"}, owner=("ReplicaSet", "rs", "rs-uid"))
    forged["metadata"]["annotations"] = {MARK_ANNOTATION: mark}
    decision = decide(both, forged, view())
    (spot,) = [d for d in decision.decisions if d.mutator == "spot"]
    assert spot.action.value == "mutated" and "already placed" in spot.reason, spot.reason
    assert decision.mutated_pod["spec"]["nodeSelector"] == {"scheduling.cast.ai/spot": "true"}
    assert {"key": "scheduling.cast.ai/spot", "operator": "Exists"} in decision.mutated_pod["spec"][
        "tolerations"
    ]


# --- issue 25: what a PodMutation copies out of a container stays out of the audit event ------------


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("/spec/containers/0/env/0/value", "/metadata/annotations/example.com~1token"),
        ("/spec/containers/0/args/1", "/metadata/labels/example.com~1mode"),
    ],
    ids=["env-value-to-annotation", "arg-to-label"],
)
def test_a_copied_env_value_or_arg_is_redacted_from_the_audit_event(source: str, target: str) -> None:
    from datetime import UTC, datetime

    from function.admission.facts import audit_facts
    from function.audit.events import REDACTED, event_data

    secret = "s3cr3t-token"
    p = pod(labels={"app": "web"})
    p["metadata"]["annotations"] = {"team": "ml"}
    p["spec"]["containers"][0]["env"] = [{"name": "TOKEN", "value": secret}]
    p["spec"]["containers"][0]["args"] = ["--mode", secret]
    cluster = view(pm("copier", {"patches": [{"op": "copy", "from": source, "path": target}]}))
    decision = decide(engine(), copy_json(p), cluster)
    assert decision.outcome == "mutated", decision.reason
    assert secret in json.dumps(list(decision.patch))  # the apiserver gets the copy
    review = pod_review()
    review.request.object = p  # the Pod the decision was made on, whose secrets are redacted
    data = event_data(
        audit_facts(review, decision), decision, config_digest="d", decided_at=datetime.now(UTC)
    )
    assert secret not in json.dumps(data)
    assert data["patchRedactions"] == 1 and REDACTED in json.dumps(data["patch"])


def test_a_term_the_apiserver_refuses_is_kept_once_not_copied_for_each_new_term() -> None:
    """Found by the larger fuzz campaign (seed 11): a required term with malformed expressions,
    ANDed with a mutation of two terms, became two copies of the problem, and the proof withheld
    the whole decision. Such a Pod is refused whatever is added: the term stays as it is, once."""
    broken = {"matchExpressions": [None, 5, {"key": None}]}
    gpu = {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [gpu, zone]}}
    two_terms = {"affinity": {"nodeAffinity": required}}
    decision = decide(engine(), gpu_pod_with_required_terms([copy_json(broken)]), view(pm("m", two_terms)))
    assert decision.outcome == "mutated", decision.reason
    terms = decision.mutated_pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [broken]
