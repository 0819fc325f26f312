"""A GpuLease of a model no Node offers, through the webhook a serving process builds
(function/serve/app.py) over a stand-in apiserver: `POST /validate/gpuleases` admits it with a
warning (kubectl prints it at apply), read from the process's own cluster view of the Nodes, with
no API request while answering; nothing is said while the view cannot tell."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from function.core.config import parse_config, watches_for
from function.core.view import NODES
from function.serve.app import build_webhook
from function.serve.http_api import WebhookHttp
from tests.support.view import FakeApiServer, transport_for

PATH = "/validate/gpuleases"
LABEL = "nvidia.com/gpu.product"
H100, B200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-B200"
LEASES_ON = parse_config({"gpuLeases": {"enabled": True}})


def node(name: str, product: str, gpus: str = "8") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {LABEL: product}},
        "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": gpus}},
    }


def lease(model: str, name: str = "lease", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "castops.io/v1alpha1",
        "kind": "GpuLease",
        "metadata": {"name": name, "namespace": "ml", "uid": "u-1"},
        "spec": {"gpuModel": model, "count": 1, **spec},
    }


def review(obj: dict[str, Any], operation: str = "CREATE") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "castops.io", "version": "v1alpha1", "kind": "GpuLease"},
                "resource": {"group": "castops.io", "version": "v1alpha1", "resource": "gpuleases"},
                "operation": operation,
                "namespace": "ml",
                "userInfo": {"username": "admin"},
                "object": obj,
            },
        }
    ).encode()


def answer(webhook: WebhookHttp, obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    reply = webhook.handle("POST", PATH, review(obj, operation))
    assert reply.status == 200, reply.body
    response: dict[str, Any] = json.loads(reply.body)["response"]
    return response


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def serve(api: FakeApiServer) -> Iterator[Callable[..., WebhookHttp]]:
    built: list[WebhookHttp] = []

    def build(config: Any = LEASES_ON) -> WebhookHttp:
        webhook = build_webhook(config, {}, transport=transport_for(api.url), freeze_gc=False)
        built.append(webhook)
        return webhook

    yield build
    for webhook in built:
        if webhook.watcher is not None:
            webhook.watcher.stop()


def test_gpu_leases_make_the_serving_process_watch_the_nodes() -> None:
    assert NODES in watches_for(LEASES_ON)
    assert NODES not in watches_for(parse_config({"gpuSlicing": {"requireAdvertisedTarget": False}}))


def test_a_lease_of_a_model_no_node_offers_is_admitted_with_a_warning_read_from_the_view(
    api: FakeApiServer, serve: Callable[..., WebhookHttp]
) -> None:
    api.load(NODES.path(), [node("h100-1", H100), node("h100-2", H100 + "-SHARED", "32")])
    webhook = serve()
    assert webhook.watcher is not None and webhook.watcher.wait_synced(10)
    asked = len(api.seen)

    unknown = answer(webhook, lease(B200, "b200"))
    assert unknown["allowed"] is True
    (warning,) = unknown["warnings"]
    assert B200 in warning and "b200" in warning and LABEL in warning
    # Applied again (an update): said again; the model the nodes offer, sliced or whole: nothing.
    assert len(answer(webhook, lease(B200, "b200"), "UPDATE")["warnings"]) == 1
    assert "warnings" not in answer(webhook, lease(H100))
    assert "warnings" not in answer(webhook, lease(H100 + "-SHARED"))
    # An invalid lease is refused for what is wrong with it, not told about the nodes.
    refused = answer(webhook, lease(B200, count="-1"))
    assert refused["allowed"] is False and "warnings" not in refused
    assert "warnings" not in answer(webhook, lease(B200), "DELETE")
    assert len(api.seen) == asked  # answered from the view: no request to the apiserver

    # A node of the model joins: the next apply is not warned about.
    api.put(NODES.path(), node("b200-1", B200))
    deadline = time.monotonic() + 10
    while "warnings" in answer(webhook, lease(B200, "b200")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "warnings" not in answer(webhook, lease(B200, "b200"))


def test_a_family_lease_is_warned_about_only_when_no_node_offers_any_of_its_models(
    api: FakeApiServer, serve: Callable[..., WebhookHttp]
) -> None:
    api.load(NODES.path(), [node("h100-1", H100)])
    families = {"hopper": [H100, "NVIDIA-H200"], "blackwell": [B200, "NVIDIA-B300"]}
    webhook = serve(parse_config({"gpuLeases": {"enabled": True, "modelFamilies": families}}))
    assert webhook.watcher is not None and webhook.watcher.wait_synced(10)
    assert "warnings" not in answer(webhook, lease("hopper"))
    several = lease(B200)
    several["spec"]["gpuModels"] = [several["spec"].pop("gpuModel"), H100]
    assert "warnings" not in answer(webhook, several)
    (warning,) = answer(webhook, lease("blackwell", "bw"))["warnings"]
    assert f"{B200}+NVIDIA-B300" in warning and "bw" in warning  # as its ModelOffered condition says


def test_a_cap_naming_a_model_outside_the_leases_family_is_refused_at_apply(
    api: FakeApiServer, serve: Callable[..., WebhookHttp]
) -> None:
    api.load(NODES.path(), [node("h100-1", H100)])
    families = {"hopper": [H100, "NVIDIA-H200"]}
    webhook = serve(parse_config({"gpuLeases": {"enabled": True, "modelFamilies": families}}))
    assert webhook.watcher is not None and webhook.watcher.wait_synced(10)
    assert answer(webhook, lease("hopper", caps={"NVIDIA-H200": 1}))["allowed"] is True
    refused = answer(webhook, lease("hopper", caps={B200: 1}))
    assert refused["allowed"] is False and f"spec.caps.{B200}" in refused["status"]["message"]


def test_nothing_is_said_while_the_nodes_are_not_listed(
    api: FakeApiServer, serve: Callable[..., WebhookHttp]
) -> None:
    api.fail = [503] * 1000  # the apiserver is not answering: nothing is listed
    webhook = serve()
    assert webhook.handle("GET", "/readyz", None).status == 503
    unknown = answer(webhook, lease(B200))
    assert unknown["allowed"] is True and "warnings" not in unknown
