"""Denials name the Pod: namespace and name, or generateName and owner."""

from __future__ import annotations

import json
from typing import Any

import pytest

from function.admission.review import naming_pod
from function.core.pod_identity import describe_pod
from tests.support import asgi_client, load_review

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "fleet-7d9c5", "uid": "u", "controller": True}


@pytest.mark.parametrize(
    ("metadata", "namespace", "expected"),
    [
        ({"name": "trainer-0"}, "ml", "pod ml/trainer-0"),
        ({"name": "trainer-0", "generateName": "x-"}, "ml", "pod ml/trainer-0"),
        (
            {"generateName": "fleet-7d9c5-", "ownerReferences": [OWNER]},
            "ml",
            "pod ml/fleet-7d9c5-* of ReplicaSet/fleet-7d9c5",
        ),
        (
            {
                "generateName": "g-",
                "ownerReferences": [{"kind": "Job", "name": "j"}, {**OWNER, "name": "ctl"}],
            },
            "ml",
            "pod ml/g-* of ReplicaSet/ctl",
        ),
        (
            {"generateName": "g-", "ownerReferences": [{"kind": "Job", "name": "j"}]},
            "ml",
            "pod ml/g-* of Job/j",
        ),
        ({"generateName": "g-"}, "ml", "pod ml/g-*"),
        ({}, "ml", "pod in ml (no name)"),
        ({"name": "p"}, "", "pod (no namespace)/p"),
        ({"name": "evil\nline"}, "ml", 'pod ml/"evil\\nline"'),
        ({"name": 7}, "ml", "pod in ml (no name)"),
    ],
)
def test_describe_pod(metadata: dict[str, Any], namespace: str, expected: str) -> None:
    assert describe_pod({"metadata": metadata}, namespace) == expected


def test_describe_pod_copes_with_junk() -> None:
    assert describe_pod(None, "ml") == "pod in ml (no name)"
    assert describe_pod({"metadata": "x"}, "ml") == "pod in ml (no name)"
    assert describe_pod({"metadata": {"generateName": "g-", "ownerReferences": ["x"]}}, "ml") == "pod ml/g-*"


def test_naming_pod_goes_after_the_castslice_prefix() -> None:
    assert naming_pod("castslice: annotation x bad", "pod ml/p") == "castslice: pod ml/p: annotation x bad"
    assert naming_pod("something else", "pod ml/p") == "castslice: pod ml/p: something else"
    assert naming_pod("castslice: x", "") == "castslice: x"


def test_a_denied_controller_pod_is_named_by_generate_name_and_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    review = load_review("default-inference-fleet-64d4bcc9b8")
    review["request"]["object"]["metadata"]["annotations"]["castops.io/slice-ratio"] = "-1"
    client = asgi_client(monkeypatch)
    answer = client.post("/mutate?timeout=10s", content=json.dumps(review))
    response = answer.json()["response"]
    assert response["allowed"] is False
    assert response["status"]["message"].startswith(
        "castslice: pod default/inference-fleet-64d4bcc9b8-* of ReplicaSet/inference-fleet-64d4bcc9b8: "
        'annotation castops.io/slice-ratio: "-1" is not valid'
    )
