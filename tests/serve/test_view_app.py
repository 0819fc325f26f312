"""The cluster view wired into the webhook and the CLI: one snapshot per review, no API request
while answering, /readyz until synced, /metrics, no watch (and no credentials) when none is needed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from function import cli
from function.core.config import parse_config, watches_for
from function.core.engine import Engine
from function.core.mutators.base import MutatorResult, RequestContext
from function.core.view import EMPTY_VIEW, PODS, REPLICASETS, ClusterView
from function.kube.credentials import NoCredentials
from function.offline.manifests import mutate_chunk
from function.offline.state_file import load_state
from function.offline.yamldoc import load_documents
from function.serve.app import build_webhook
from function.serve.http_api import WebhookHttp
from tests.support import load_review
from tests.support.view import FakeApiServer, make_pod, transport_for

STATE = Path(__file__).parents[1] / "data" / "cluster" / "state.yaml"
RS_UID = "22222222-0000-0000-0000-000000000001"


class SiblingProbe:
    """A mutator that only reads the view: how many Pods share the new Pod's controller."""

    name = "probe"

    def __init__(self) -> None:
        self.seen: list[tuple[str, ClusterView, int]] = []

    def mutate(self, pod: dict[str, Any], ctx: RequestContext) -> MutatorResult:
        references = pod.get("metadata", {}).get("ownerReferences") or [{}]
        owner = references[0].get("uid", "")
        self.seen.append((ctx.uid, ctx.cluster, len(ctx.cluster.group("pods", owner))))
        return MutatorResult.unchanged("probe")


def review_for(owner_uid: str) -> bytes:
    review = load_review("default-inference-fleet-64d4bcc9b8")
    review["request"]["uid"] = str(uuid.uuid4())
    review["request"]["object"]["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner_uid, "controller": True}
    ]
    return json.dumps(review).encode()


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def webhooks() -> Iterator[list[WebhookHttp]]:
    built: list[WebhookHttp] = []
    yield built
    for webhook in built:
        if webhook.watcher is not None:
            webhook.watcher.stop()


def test_the_shipped_mutators_need_no_cluster_state() -> None:
    # GPU slicing and vGPU decide from the Pod alone: nothing is watched, no RBAC is granted.
    config = parse_config({"gpuSlicing": {"enabled": True}, "vgpu": {"enabled": True, "mode": "shadow"}})
    assert watches_for(config) == ()


def test_no_watch_means_no_thread_no_credentials_and_ready(webhooks: list[WebhookHttp]) -> None:
    webhook = build_webhook(parse_config({}), {"KUBECONFIG": "/nonexistent"})
    webhooks.append(webhook)
    assert webhook.watcher is None
    assert webhook.handle("GET", "/readyz", None).status == 200
    assert b"castslice_view_" not in webhook.handle("GET", "/metrics", None).body
    assert webhook.admission.cluster() is EMPTY_VIEW


def test_watches_without_credentials_stop_start_up_with_a_clear_message() -> None:
    with pytest.raises(NoCredentials, match=r"needs the cluster view .* no usable kubeconfig"):
        build_webhook(
            parse_config({}), {"KUBECONFIG": "/nonexistent/kubeconfig"}, watches=(PODS,), freeze_gc=False
        )


def test_readyz_waits_for_the_watches_then_reviews_read_one_snapshot_and_make_no_request(
    api: FakeApiServer, webhooks: list[WebhookHttp]
) -> None:
    owner = str(uuid.uuid4())
    api.load(PODS.path(), [make_pod(f"web-{i}", owner, placement="spot") for i in range(3)])
    api.fail = [503] * 3  # the apiserver is not answering yet
    config = parse_config({})
    webhook = build_webhook(
        config, {}, transport=transport_for(api.url), watches=(PODS, REPLICASETS), freeze_gc=False
    )
    webhooks.append(webhook)
    assert webhook.handle("GET", "/readyz", None).status == 503
    assert webhook.watcher is not None and webhook.watcher.wait_synced(10)
    assert webhook.handle("GET", "/readyz", None).status == 200
    metrics = webhook.handle("GET", "/metrics", None).body.decode()
    assert 'castslice_view_objects{index="pods"} 3.0' in metrics
    assert "castslice_admission_requests_total" in metrics  # one registry, one scrape

    probe = SiblingProbe()
    webhook.admission.engine = Engine(config, mutators=[probe], shadow=[])
    deadline = time.monotonic() + 5
    while len(api.requests("watch")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    asked = len(api.seen)
    for _ in range(20):
        assert webhook.handle("POST", "/mutate", review_for(owner)).status == 200
    assert len(api.seen) == asked  # answering reviews asked the apiserver nothing
    assert {count for _, _, count in probe.seen} == {3}
    # One snapshot per review: every pass of one review saw the very same view object.
    by_review: dict[str, set[int]] = {}
    for uid, view, _ in probe.seen:
        by_review.setdefault(uid, set()).add(id(view))
    assert all(len(views) == 1 for views in by_review.values())

    api.put(PODS.path(), make_pod("web-new", owner))
    deadline = time.monotonic() + 5
    while len(webhook.admission.cluster().group("pods", owner)) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    webhook.handle("POST", "/mutate", review_for(owner))
    assert probe.seen[-1][2] == 4


# -- offline: castslice mutate --cluster ----------------------------------------------------------
def test_mutate_chunk_hands_the_state_to_the_mutators() -> None:
    probe = SiblingProbe()
    engine = Engine(parse_config({}), mutators=[probe], shadow=[])
    pod = json.loads(review_for(RS_UID))["request"]["object"]
    (chunk,) = load_documents(json.dumps(pod), "pod.json")
    mutate_chunk(engine, chunk, "pod.json", 0, "default", load_state(STATE))
    assert probe.seen[-1][2] == 3 and probe.seen[-1][1].available
    mutate_chunk(engine, chunk, "pod.json", 0, "default")
    assert probe.seen[-1][1] is EMPTY_VIEW  # no file: the mutator is told there is no state


OWNED_POD = f"""apiVersion: v1
kind: Pod
metadata:
  generateName: web-7d4b9c-
  namespace: shop
  ownerReferences:
  - {{apiVersion: apps/v1, kind: ReplicaSet, name: web-7d4b9c, uid: {RS_UID}, controller: true}}
spec:
  containers: [{{name: c, image: i}}]
"""


def test_cli_mutate_decides_over_the_cluster_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real spot mutator's partial split counts the ReplicaSet's Pods in --cluster's state.
    config = tmp_path / "config.yaml"
    config.write_text("gpuSlicing: {enabled: false}\nspot: {enabled: true, preset: partialSpot}\n")
    pod = tmp_path / "pod.yaml"
    pod.write_text(OWNED_POD)
    assert cli.main(["mutate", "-f", str(pod), "--config", str(config), "--cluster", str(STATE)]) == 0
    err = capsys.readouterr().err
    assert "siblings 1 spot, 1 on-demand, 0 unplaced" in err, err  # the terminating and failed Pods not
    assert cli.main(["mutate", "-f", str(pod), "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "hash split (no cluster view)" in err, err  # no state: said so, not guessed silently


def test_cli_mutate_names_a_bad_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: i}]}\n"
    )
    state = tmp_path / "state.yaml"
    state.write_text("- not\n- a list object\n")
    assert cli.main(["mutate", "-f", str(pod), "--cluster", str(state)]) == 2
    assert (
        f"cluster state {state}, document 0: expected a Kubernetes object or List" in capsys.readouterr().err
    )
    assert cli.main(["mutate", "-f", str(pod), "--cluster", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_readyz_names_the_objects_the_view_could_not_read(
    api: FakeApiServer, webhooks: list[WebhookHttp]
) -> None:
    import dataclasses

    from function.core.view import slim_pod

    def fussy(obj: dict[str, Any]) -> Any:
        if obj["metadata"]["name"] == "poison":
            raise OverflowError("date value out of range")
        return slim_pod(obj)

    api.load(PODS.path(), [make_pod("fine"), make_pod("poison")])
    webhook = build_webhook(
        parse_config({}),
        {},
        transport=transport_for(api.url),
        watches=(dataclasses.replace(PODS, slim=fussy),),
        freeze_gc=False,
    )
    webhooks.append(webhook)
    assert webhook.watcher is not None and webhook.watcher.wait_synced(10)
    reply = webhook.handle("GET", "/readyz", None)
    assert reply.status == 200
    assert json.loads(reply.body) == {
        "status": "ready",
        "unreadable": {"pods": {"default/poison": "OverflowError: date value out of range"}},
    }
