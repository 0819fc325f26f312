"""function/core/pod.py: who owns a Pod (one answer for spot, PodMutations, the view and denials), how
a message names the Pod (namespace and name, or generateName and controller), and how a warning is
fitted to the apiserver's 120 characters and a value quoted in it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from function.admission.review import naming_pod
from function.core.pod import (
    NO_OWNER,
    WARNING_LIMIT,
    Owner,
    controller_of,
    describe_pod,
    first_owner,
    fit_warning,
    metadata_of,
    shown,
)
from function.core.podmutation.match import Workload, workload_of
from function.core.view import slim_pod
from tests.support import asgi_client, load_review
from tests.support.spot import Ctx, spot_mutator

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
        # A reference without controller: true owns nothing: spot and PodMutations treat the Pod
        # as bare, and so does its denial.
        (
            {"generateName": "g-", "ownerReferences": [{"kind": "Job", "name": "j", "uid": "u"}]},
            "ml",
            "pod ml/g-*",
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


# -- controller_of: the one owner ------------------------------------------------------------------
def test_controller_of_takes_the_controller_reference_only() -> None:
    metadata = {
        "ownerReferences": [
            {"kind": "Thing", "name": "t", "uid": "1"},
            {"kind": "Other", "uid": "false-controller", "name": "b", "controller": False},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "2", "controller": True},
        ]
    }
    assert controller_of(metadata) == Owner("2", "ReplicaSet", "web-1")
    assert controller_of({"ownerReferences": [{"uid": "x", "controller": "true"}]}) == NO_OWNER
    assert controller_of({"ownerReferences": "junk"}) == NO_OWNER
    assert controller_of({}) == NO_OWNER


@pytest.mark.parametrize(
    "reference",
    [
        {"kind": "X", "controller": True},  # no uid
        {"uid": "u", "name": "x", "controller": True},  # no kind
        {"kind": "ReplicaSet", "name": "web", "uid": 42, "controller": True},  # a uid that is no string
        {"kind": ["ReplicaSet"], "name": "web", "uid": "u", "controller": True},
    ],
)
def test_a_controller_reference_needs_a_kind_and_a_uid(reference: dict[str, Any]) -> None:
    assert controller_of({"ownerReferences": [reference]}) == NO_OWNER


def test_controller_of_a_pod_with_malformed_metadata() -> None:
    assert controller_of(metadata_of({"metadata": "not a map"})) == NO_OWNER
    assert controller_of(metadata_of({})) == NO_OWNER
    assert controller_of(metadata_of(None)) == NO_OWNER


def test_controller_of_blanks_a_name_that_is_not_a_string() -> None:
    reference = {"kind": "ReplicaSet", "name": 7, "uid": "u1", "apiVersion": ["apps/v1"], "controller": True}
    assert controller_of({"ownerReferences": [reference]}) == Owner("u1", "ReplicaSet", "")


def test_first_owner_names_the_controller_else_the_first_reference_for_reports_only() -> None:
    plain = {"kind": "Job", "name": "j", "uid": "u"}
    controller = {"kind": "ReplicaSet", "name": "r", "uid": "v", "controller": True}
    assert first_owner({"ownerReferences": ["junk", plain, controller]}) == controller
    assert first_owner({"ownerReferences": ["junk", plain]}) == plain
    assert first_owner({"ownerReferences": ["junk"]}) is None
    assert first_owner({}) is None


# -- one owner for every reader ------------------------------------------------------------------
CONTROLLER = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "web-7d9c5",
    "uid": "rs-1",
    "controller": True,
}
NOT_CONTROLLER = {key: value for key, value in CONTROLLER.items() if key != "controller"}


def readings(reference: dict[str, Any]) -> tuple[str, str, Workload, Owner]:
    """How each reader takes a Pod of ml made by generateName with this one ownerReference: its
    denial's name, spot's reason, the PodMutation workload, the view's group owner."""
    pod = {
        "metadata": {
            "generateName": "web-7d9c5-",
            "namespace": "ml",
            "uid": "p1",
            "ownerReferences": [reference],
        },
        "spec": {"containers": [{"name": "c"}]},
    }
    spot = spot_mutator().mutate(pod, Ctx(namespace="ml"))
    record = slim_pod(pod)
    assert record is not None
    return describe_pod(pod, "ml"), spot.reason, workload_of(pod, "ml"), record.owner


def test_a_controller_is_the_owner_to_spot_podmutations_the_view_and_the_denial() -> None:
    denial, spot, workload, grouped = readings(CONTROLLER)
    assert denial == "pod ml/web-7d9c5-* of ReplicaSet/web-7d9c5"
    assert "bare Pod" not in spot
    assert workload == Workload("ml", "ReplicaSet", "web-7d9c5")
    assert grouped == Owner("rs-1", "ReplicaSet", "web-7d9c5")


def test_a_reference_without_controller_true_is_no_owner_to_any_of_them() -> None:
    denial, spot, workload, grouped = readings(NOT_CONTROLLER)
    assert denial == "pod ml/web-7d9c5-*"
    assert spot == "bare Pod (no controller): left alone (placeBarePods: false)"
    assert workload == Workload("ml", "Pod", "web-7d9c5-")
    assert grouped == NO_OWNER


# -- messages about a Pod: warnings fitted to the apiserver's 120 characters, values quoted --------
def test_a_warning_that_fits_is_kept_whole() -> None:
    head, tail = "h" * 100, "t" * 20
    assert fit_warning(head, tail) == head + tail


def test_a_long_head_is_cut_and_the_tail_kept() -> None:
    head, tail = "h" * 100, "t" * 21
    assert fit_warning(head, tail) == "h" * 96 + "..." + tail
    assert len(fit_warning(head, tail)) == WARNING_LIMIT


def test_a_long_tail_next_to_a_short_head_still_fits() -> None:
    head, tail = "h" * 10, "t" * 115
    assert fit_warning(head, tail) == "h" * 2 + "..." + tail


def test_a_tail_longer_than_the_limit_leaves_no_head() -> None:
    assert fit_warning("head", "t" * 118) == "..." + "t" * 117


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("v" * 24, '"' + "v" * 24 + '"'),
        ("v" * 25, '"' + "v" * 21 + '..."'),
        (5, '"5"'),
        (None, '"None"'),
        ("é\n", '"é\\n"'),
    ],
)
def test_shown_quotes_and_cuts_at_24_by_default(value: object, text: str) -> None:
    assert shown(value) == text


def test_shown_cuts_at_the_limit_given() -> None:
    assert shown("x" * 10, 10) == '"' + "x" * 10 + '"'
    assert shown("x" * 11, 10) == '"xxxxxxx..."'
