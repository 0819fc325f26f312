"""function/core/mutators/pod_mutations.py, the plug-in's own answers: every reason and warning word
for word (and cut at 120 characters), the Job -> CronJob chain, sibling counting over odd records, the
watches and the records they keep, and the cache of loaded mutations. (The plug-in through the real
engine, app and CLI: tests/core/test_podmutation_plugin.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from function.core.mutators.base import MutatorResult, RequestContext
from function.core.mutators.pod_mutations import PodMutationsConfig, watches
from function.core.mutators.pod_mutations_mutator import (
    CASTAI_MUTATIONS,
    JOBS,
    OUR_MUTATIONS,
    JobRecord,
    PodMutations,
    loaded_mutations,
    siblings_of,
    slim_job,
    slim_podmutation,
)
from function.core.placement import SiblingCounts
from function.core.pod import Owner
from function.core.podmutation.apply import Siblings
from function.core.podmutation.compiled import InvalidMutation, compile_object
from function.core.podmutation.names import MARK_ANNOTATION
from function.core.view import EMPTY_VIEW, PODS, REPLICASETS, IndexState, PodRecord, StaticView, View
from tests.support import PodGroupView, mutation_records, pm

SPECS = (PODS, REPLICASETS, JOBS, OUR_MUTATIONS, CASTAI_MUTATIONS)


def view(*objects: dict[str, Any], **indices: Any) -> StaticView:
    return StaticView({"podmutations": mutation_records(objects), **indices}, specs=SPECS)


def pod(
    name: str | None = "web", owner: tuple[str, str, str] | None = None, **metadata: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {**metadata}
    if name is not None:
        meta["name"] = name
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "uid": owner[2], "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "c"}]}}


def mutate(
    target: dict[str, Any], cluster: Any, castai: bool = False, namespace: str = "prod"
) -> MutatorResult:
    mutator = PodMutations(PodMutationsConfig(enabled=True, castaiObjects=castai))
    return mutator.mutate(target, RequestContext(uid="u", namespace=namespace, cluster=cluster))


# --- reasons ----------------------------------------------------------------------------------------


def test_a_marked_pod_is_left_alone_and_says_by_which_mutation() -> None:
    marked = pod(annotations={MARK_ANNOTATION: "m/3"})
    assert mutate(marked, view(pm("m", {"labels": {"a": "1"}}))) == MutatorResult.unchanged(
        "already mutated by podmutation m/3"
    )


def test_an_opted_out_pod_says_so() -> None:
    opted_out = pod(labels={"pod-mutator.cast.ai/ignore": "true"})
    assert mutate(opted_out, view(pm("m", {"labels": {"a": "1"}}))) == MutatorResult.unchanged(
        "pod opted out (pod-mutator.cast.ai/ignore=true)"
    )


def test_no_mutation_loaded_and_no_mutation_matching_say_so() -> None:
    assert mutate(pod(), view()) == MutatorResult.unchanged("no PodMutation loaded")
    other = view(pm("m", {"filter": {"workload": {"names": ["api"]}}, "labels": {"a": "1"}}))
    assert mutate(pod(), other) == MutatorResult.unchanged("no PodMutation matches Pod/web")


def test_the_namespace_is_the_requests() -> None:
    by_namespace = view(pm("m", {"filter": {"workload": {"namespaces": ["prod"]}}, "labels": {"a": "1"}}))
    assert mutate(pod(), by_namespace).reason == "podmutation m (generation 1) for Pod/web: labels a"
    assert mutate(pod(), by_namespace, namespace="dev").reason == "no PodMutation matches Pod/web"


def test_a_mutation_with_nothing_left_to_change_still_marks() -> None:
    result = mutate(pod(labels={"a": "1"}), view(pm("m", {"labels": {"a": "1"}})))
    assert result == MutatorResult.mutated("podmutation m (generation 1) for Pod/web: no change but the mark")


def test_every_change_and_every_skipped_path_is_listed() -> None:
    spec = {
        "labels": {"a": "1"},
        "annotations": {"b": "2"},
        "patches": [
            {"op": "remove", "path": "/spec/tolerations/[key=x]"},
            {"op": "remove", "path": "/spec/containers/*/ports"},
        ],
    }
    result = mutate(pod(), view(pm("m", spec)))
    assert result.reason == (
        "podmutation m (generation 1) for Pod/web: labels a; annotations b; "
        "skipped: patches [0] remove /spec/tolerations/[key=x]: selects nothing; "
        "patches [1] remove /spec/containers/*/ports: selects nothing"
    )


def test_a_tie_names_every_other_mutation() -> None:
    spec = {"filter": {"workload": {"names": ["web"]}}, "labels": {"t": "x"}}
    result = mutate(pod(), view(pm("a", spec), pm("b", spec), pm("c", spec)))
    assert result.warnings == ("podmutation a (generation 1) chosen by name over equally specific b, c",)


def failing_warning(name: str) -> str:
    spec = {"patches": [{"op": "remove", "path": "/spec/nothing"}]}
    (warning,) = mutate(pod(), view(pm(name, spec))).warnings
    return warning


def test_warnings_are_cut_to_120_characters_keeping_what_fits() -> None:
    short = failing_warning("m")
    assert len(short) < 120
    exact_name = "m" * (1 + 120 - len(short))
    assert failing_warning(exact_name) == short.replace("podmutation m/", f"podmutation {exact_name}/")
    assert len(failing_warning(exact_name)) == 120
    too_long = failing_warning(exact_name + "m")
    whole = short.replace("podmutation m/", f"podmutation {exact_name}m/")
    assert too_long == whole[:117] + "..."


# --- the controller chain -----------------------------------------------------------------------------


def test_a_cronjobs_pods_match_through_the_job_in_the_view() -> None:
    job = JobRecord("prod", "nightly-28000000", "job-uid", Owner("cron-uid", "CronJob", "nightly"))
    spec = {"filter": {"workload": {"kinds": ["CronJob"], "names": ["nightly"]}}, "labels": {"k": "c"}}
    cluster = view(pm("cron", spec), jobs=[job])
    result = mutate(pod("nightly-28000000-x", owner=("Job", "nightly-28000000", "job-uid")), cluster)
    assert result.reason == "podmutation cron (generation 1) for CronJob/nightly: labels k"


def test_a_job_uid_in_the_replicasets_index_is_not_followed() -> None:
    from function.core.view import ReplicaSetRecord

    impostor = ReplicaSetRecord("prod", "x", "job-uid", Owner("dep-uid", "Deployment", "x"), 1, False)
    spec = {"filter": {"workload": {"kinds": ["Job"]}}, "labels": {"k": "j"}}
    cluster = view(pm("jobs", spec), replicasets=[impostor])
    result = mutate(pod("j-x", owner=("Job", "j", "job-uid")), cluster)
    assert result.reason == "podmutation jobs (generation 1) for Job/j: labels k"


# --- counting siblings ------------------------------------------------------------------------------


def record(**fields: Any) -> SimpleNamespace:
    return SimpleNamespace(**fields)


def test_siblings_count_every_kind_of_record_and_skip_the_terminating() -> None:
    members = {
        "gone": record(terminating=True, placement="spot", group="a"),
        "s1": record(placement="spot", group="a"),
        "s2": record(terminating=False, placement="spot"),
        "o1": record(placement="on-demand", group="b"),
        "o2": record(placement="on-demand"),
        "u1": record(placement="", group=""),
        "u2": record(),
    }
    assert siblings_of(
        pod(owner=("ReplicaSet", "rs", "rs-uid")), PodGroupView("rs-uid", members)
    ) == Siblings(SiblingCounts(spot=2, on_demand=2, unplaced=2), ("a", "b"))


@pytest.mark.parametrize("metadata", ["not a map", {"name": "bare"}])
def test_a_pod_without_a_controller_has_no_siblings(metadata: Any) -> None:
    members = {"u": record(placement="spot")}
    bare = {"metadata": metadata, "spec": {}}
    assert siblings_of(bare, PodGroupView("rs-uid", members)) == Siblings()
    others_unowned = StaticView({"pods": [PodRecord("prod", "solo", "solo-uid", Owner(), "spot", False)]})
    assert siblings_of(bare, others_unowned) == Siblings()


def test_siblings_of_with_no_cluster_view() -> None:
    assert siblings_of(pod(owner=("ReplicaSet", "rs", "rs-uid")), EMPTY_VIEW) == Siblings()


# --- what is watched and kept -----------------------------------------------------------------------


def test_castai_objects_are_watched_only_when_asked() -> None:
    assert watches(PodMutationsConfig()) == (OUR_MUTATIONS, PODS, REPLICASETS, JOBS)
    assert watches(PodMutationsConfig(castaiObjects=True)) == (
        OUR_MUTATIONS,
        PODS,
        REPLICASETS,
        JOBS,
        CASTAI_MUTATIONS,
    )


@pytest.mark.parametrize(
    ("obj", "kept"),
    [
        (
            {"metadata": {"namespace": "prod", "name": "j", "uid": "u", "ownerReferences": []}},
            JobRecord("prod", "j", "u", Owner()),
        ),
        (
            {
                "metadata": {
                    "uid": "u",
                    "ownerReferences": [{"kind": "CronJob", "name": "c", "uid": "c1", "controller": True}],
                }
            },
            JobRecord("", "", "u", Owner("c1", "CronJob", "c")),
        ),
        ({"metadata": {"uid": 5}}, None),
        ({"metadata": {"uid": ""}}, None),
        ({"metadata": "not a map"}, None),
        ({}, None),
    ],
)
def test_slim_job(obj: dict[str, Any], kept: JobRecord | None) -> None:
    assert slim_job(obj) == kept


def test_a_podmutation_is_kept_compiled() -> None:
    obj = pm("m", {"labels": {"a": "1"}})
    assert slim_podmutation(obj) == compile_object(obj)


def test_invalid_mutations_are_reported_apart() -> None:
    broken = pm("broken", {"filter": {"workload": {"names": ["(("]}}})
    valid, invalid = loaded_mutations(view(broken, pm("ok", {"labels": {"a": "1"}})), castai=False)
    assert [m.name for m in valid] == ["ok"]
    assert len(invalid) == 1 and isinstance(invalid[0], InvalidMutation) and invalid[0].name == "broken"


def test_a_changed_castai_index_is_seen_even_when_ours_is_unchanged() -> None:
    ours = IndexState.build(mutation_records([]), None)

    def cluster(label: str) -> View:
        theirs = mutation_records([pm("theirs", {"labels": {"v": label}}, api="pod-mutations.cast.ai/v1")])
        return View({"podmutations": ours, "podmutations-castai": IndexState.build(theirs, None)})

    mutator = PodMutations(PodMutationsConfig(enabled=True, castaiObjects=True))
    first, second = pod(), pod()
    mutator.mutate(first, RequestContext(namespace="prod", cluster=cluster("1")))
    mutator.mutate(second, RequestContext(namespace="prod", cluster=cluster("2")))
    assert first["metadata"]["labels"] == {"v": "1"} and second["metadata"]["labels"] == {"v": "2"}
