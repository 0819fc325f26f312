"""Contract tests through the real functions-framework ASGI app: the bad-input catalogue
(controller-runtime style), methods, paths, size limits, and internal errors never being a 500."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from function.contract import MAX_BODY_BYTES
from function.core.mutators.gpu_slicing import GpuSlicing
from tests.support import CONFIGS, asgi_client, decode_reply, load_review

GOOD = load_review("default-slice-inference")


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    return asgi_client(monkeypatch)


def with_request(**changes: Any) -> dict[str, Any]:
    review = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is KeyError:
            review["request"].pop(key)
        else:
            review["request"][key] = value
    return review


def without(key: str) -> dict[str, Any]:
    review = copy.deepcopy(GOOD)
    review.pop(key)
    return review


def replaced(key: str, value: Any) -> dict[str, Any]:
    review = copy.deepcopy(GOOD)
    review[key] = value
    return review


# (case id, raw body, words the 400 message must contain)
BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("empty body", b"", "empty body"),
    ("whitespace body", b"  \n ", "empty body"),
    ("not json", b"{apiVersion: v1", "not JSON"),
    ("not utf-8", b"\xff\xfe{}", "not JSON"),
    ("json array", b"[]", "got a JSON array"),
    ("json string", b'"AdmissionReview"', "JSON object"),
    ("json number", b"42", "JSON object"),
    ("json null", b"null", "got a JSON null"),
    ("wrong kind", json.dumps(replaced("kind", "Pod")).encode(), "kind must be 'AdmissionReview'"),
    ("missing kind", json.dumps(without("kind")).encode(), "kind must be 'AdmissionReview'"),
    ("wrong apiVersion", json.dumps(replaced("apiVersion", "admission.k8s.io/v2")).encode(), "apiVersion"),
    ("missing apiVersion", json.dumps(without("apiVersion")).encode(), "apiVersion"),
    ("no request", json.dumps(without("request")).encode(), "request is missing"),
    ("request not an object", json.dumps(replaced("request", "x")).encode(), "request must be a JSON object"),
    ("no uid", json.dumps(with_request(uid=KeyError)).encode(), "request.uid is missing"),
    (
        "uid is a number",
        json.dumps(with_request(uid=123)).encode(),
        "request.uid must be a string (got number)",
    ),
    ("uid is null", json.dumps(with_request(uid=None)).encode(), "request.uid must be a string"),
    ("uid is empty", json.dumps(with_request(uid="")).encode(), "request.uid must not be empty"),
    ("object missing", json.dumps(with_request(object=KeyError)).encode(), "request.object must be a Pod"),
    ("object is a list", json.dumps(with_request(object=[])).encode(), "request.object must be a Pod"),
    (
        "object is a Deployment",
        json.dumps(with_request(object={"kind": "Deployment", "spec": {}})).encode(),
        "got kind 'Deployment'",
    ),
    (
        "object Pod without spec",
        json.dumps(with_request(object={"kind": "Pod", "metadata": {}})).encode(),
        "request.object must be a Pod",
    ),
    (
        "unknown request field",
        json.dumps(with_request(surprise=1)).encode(),
        "request.surprise is not a field",
    ),
    ("bad operation", json.dumps(with_request(operation="PATCH")).encode(), "request.operation"),
    (
        "dryRun not a bool",
        json.dumps(with_request(dryRun="yes")).encode(),
        "request.dryRun must be true or false",
    ),
    ("no userInfo", json.dumps(with_request(userInfo=KeyError)).encode(), "request.userInfo is missing"),
    ("nested too deeply", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize(
    ("body", "words"), [(b, w) for _, b, w in BAD_BODIES], ids=[c for c, _, _ in BAD_BODIES]
)
def test_bad_request_gets_400_naming_the_problem(client: Any, body: bytes, words: str) -> None:
    answer = client.post("/mutate", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert answer.headers["content-type"].startswith("application/json")
    payload = answer.json()
    assert payload["status"] == 400
    assert words in payload["error"], payload["error"]


def test_body_over_7_mib_is_413_by_declared_length(client: Any) -> None:
    body = b" " * (MAX_BODY_BYTES + 1)
    answer = client.post("/mutate", content=body)
    assert answer.status_code == 413
    assert "larger than" in answer.json()["error"]


def test_body_over_7_mib_is_413_when_streamed_without_length(client: Any) -> None:
    def chunks() -> Any:
        for _ in range(8):
            yield b" " * (1024 * 1024)

    answer = client.post("/mutate", content=chunks())
    assert answer.status_code == 413


def test_body_of_exactly_7_mib_is_read(client: Any) -> None:
    review = json.dumps(GOOD).encode()
    body = review + b" " * (MAX_BODY_BYTES - len(review))
    assert len(body) == MAX_BODY_BYTES
    answer = client.post("/mutate", content=body)
    assert answer.status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/mutate", "POST"),
        ("PUT", "/mutate", "POST"),
        ("DELETE", "/", "POST"),
        ("PATCH", "/mutate", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/readyz", "GET, HEAD"),
        ("PUT", "/metrics", "GET, HEAD"),
    ],
)
def test_other_methods_get_405(client: Any, method: str, path: str, allow: str) -> None:
    answer = client.request(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    assert method in answer.json()["error"]


def test_unknown_path_is_404(client: Any) -> None:
    assert client.post("/validate", json=GOOD).status_code == 404


@pytest.mark.parametrize("path", ["/mutate", "/", "/mutate?timeout=5s"])
def test_review_is_answered_on_both_paths_with_the_apiserver_timeout_query(client: Any, path: str) -> None:
    answer = client.post(path, json=GOOD)
    assert answer.status_code == 200
    assert decode_reply(answer.json())["response"]["patchType"] == "JSONPatch"


def test_health_and_readiness(client: Any) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize(
    "changes",
    [
        {"operation": "UPDATE"},
        {"operation": "DELETE"},
        {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
        {"subResource": "status"},
        {
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "object": {"kind": "ConfigMap"},
        },
    ],
    ids=["pod-update", "pod-delete", "deployments", "pods-status", "configmaps"],
)
def test_other_resources_and_operations_are_allowed_without_patch(
    client: Any, changes: dict[str, Any]
) -> None:
    review = with_request(**changes)
    answer = client.post("/mutate", json=review)
    assert answer.status_code == 200
    assert answer.json()["response"] == {"uid": GOOD["request"]["uid"], "allowed": True}


def test_reply_echoes_v1beta1(client: Any) -> None:
    review = load_review("default-v1beta1-review")
    answer = client.post("/mutate", json=review).json()
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["kind"] == "AdmissionReview"


def _explode(self: GpuSlicing, pod: Any, request: Any) -> Any:
    raise RuntimeError("boom")


def test_internal_error_admits_unchanged_with_warning_by_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(GpuSlicing, "mutate", _explode)
    client = asgi_client(monkeypatch)
    answer = client.post("/mutate", json=GOOD)
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"] == ["castslice: internal error: RuntimeError; Pod admitted unchanged"]
    assert response["auditAnnotations"] == {"outcome": "error"}
    assert GOOD["request"]["uid"] in caplog.text


def test_internal_error_denies_when_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    config = tmp_path / "deny.yaml"
    config.write_text("onInternalError: deny\n")
    monkeypatch.setattr(GpuSlicing, "mutate", _explode)
    client = asgi_client(monkeypatch, config)
    response = client.post("/mutate", json=GOOD).json()["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert GOOD["request"]["uid"] in response["status"]["message"]
    assert "onInternalError" in response["status"]["message"]


def test_invalid_configuration_stops_start_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from function.core.config import ConfigError

    config = tmp_path / "typo.yaml"
    config.write_text("invalidAnnotation: warn\n")
    with pytest.raises(ConfigError, match="invalidAnnotation: unknown key"), asgi_client(monkeypatch, config):
        pass  # the webhook is built when the server starts (ASGI lifespan startup), which fails


def test_test_configs_exist() -> None:
    assert (CONFIGS / "warn.yaml").exists()


def test_an_unexpected_error_outside_the_engine_is_a_json_500(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from function.serve import http_api

    def broken(body: bytes) -> Any:
        raise RuntimeError("bug in parsing")

    monkeypatch.setattr(http_api, "parse_review", broken)
    client = asgi_client(monkeypatch)
    answer = client.post("/mutate", json=GOOD)
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal error (logged by the webhook)", "status": 500}
    assert "bug in parsing" in caplog.text


def test_a_withheld_patch_names_no_mutator_in_the_audit_annotations(monkeypatch: pytest.MonkeyPatch) -> None:
    from function.core.engine import Engine

    monkeypatch.setattr(
        Engine, "_proof_problem", lambda self, original, patch, intended, intended_json=None: "simulated"
    )
    response = asgi_client(monkeypatch).post("/mutate", json=GOOD).json()["response"]
    assert response["allowed"] is True and "patch" not in response
    assert response["auditAnnotations"] == {"outcome": "error"}
