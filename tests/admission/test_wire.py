"""function/admission/wire.py: the 400 messages a malformed AdmissionReview gets, word for word, and
how client input is quoted in them (cut, never echoed whole)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from function.admission.wire import BadReview, denied, json_type, parse_review, quoted
from function.contract import MAX_QUOTED_CHARS
from tests.support import load_review

REVIEW = load_review("default-slice-inference")
NOT_A_POD = "request.object must be a Pod (kind 'Pod' with a spec) for a pods CREATE request"


def refusal(document: Any) -> str:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    with pytest.raises(BadReview) as raised:
        parse_review(body)
    return str(raised.value)


def review_with(**changes: Any) -> dict[str, Any]:
    document = copy.deepcopy(REVIEW)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = document
        for key in parents:
            node = node[key]
        node[last] = value
    return document


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "boolean"),
        (1, "number"),
        (1.5, "number"),
        ("s", "string"),
        ([], "array"),
        ({}, "object"),
    ],
)
def test_json_type_names_what_json_calls_it(value: object, name: str) -> None:
    assert json_type(value) == name


def test_json_type_of_something_json_cannot_hold_is_its_python_name() -> None:
    assert json_type((1,)) == "tuple"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("x" * MAX_QUOTED_CHARS, repr("x" * MAX_QUOTED_CHARS)),
        (
            "x" * (MAX_QUOTED_CHARS + 1),
            repr("x" * MAX_QUOTED_CHARS) + f"... ({MAX_QUOTED_CHARS + 1} characters)",
        ),
        (None, "None"),
        (False, "False"),
        (12, "12"),
        (10 ** (MAX_QUOTED_CHARS - 1), str(10 ** (MAX_QUOTED_CHARS - 1))),
        (10**MAX_QUOTED_CHARS, f"a number of {MAX_QUOTED_CHARS + 1} characters"),
        ({"a": 1}, "a JSON object"),
        ([1], "a JSON array"),
    ],
)
def test_quoted_cuts_strings_and_numbers_and_names_the_rest(value: object, text: str) -> None:
    assert quoted(value) == text


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"  \n", "empty body: expected an AdmissionReview JSON object"),
        (b"", "empty body: expected an AdmissionReview JSON object"),
        ([REVIEW], "body must be a JSON object (an AdmissionReview), got a JSON array"),
        (review_with(kind="Review"), "kind must be 'AdmissionReview' (got 'Review')"),
        (
            review_with(apiVersion="admission.k8s.io/v2"),
            "apiVersion must be one of admission.k8s.io/v1, admission.k8s.io/v1beta1 "
            "(got 'admission.k8s.io/v2')",
        ),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
            "request is missing: an AdmissionReview sent to a webhook carries a request",
        ),
        (review_with(request=[1]), "request must be a JSON object (got array)"),
        (
            review_with(request__operation="PATCH"),
            "invalid AdmissionReview: request.operation must be 'CREATE', 'UPDATE', 'DELETE' or 'CONNECT' "
            "(got 'PATCH')",
        ),
        (
            review_with(request__dryRun="yes"),
            "invalid AdmissionReview: request.dryRun must be true or false (got 'yes')",
        ),
        (review_with(request__uid=""), "invalid AdmissionReview: request.uid must not be empty"),
        (review_with(request__name=5), "invalid AdmissionReview: request.name must be a string (got number)"),
        (
            review_with(request__object=[1]),
            f"{NOT_A_POD} (got array)",
        ),
        (
            review_with(request__object={"kind": "Service", "spec": {}}),
            f"{NOT_A_POD} (got kind 'Service')",
        ),
        (
            review_with(request__object={"kind": "Pod", "spec": []}),
            f"{NOT_A_POD} (got a Pod without a spec object)",
        ),
    ],
)
def test_malformed_reviews_are_refused_word_for_word(document: Any, message: str) -> None:
    assert refusal(document) == message


def test_an_invalid_body_names_the_json_error() -> None:
    # orjson's own words (not pinned here), after ours
    message = refusal(b"{nope")
    assert message.startswith("body is not JSON: ") and "line 1 column 2" in message


def test_a_huge_kind_is_cut_in_the_message() -> None:
    message = refusal(review_with(kind="K" * 6_000_000))
    assert message == f"kind must be 'AdmissionReview' (got {quoted('K' * 6_000_000)})"
    assert len(message) < 300


def test_a_denial_without_a_message_has_an_empty_status_message() -> None:
    assert denied("u", "").as_dict()["status"] == {"code": 403, "reason": "Forbidden", "message": ""}


def test_at_most_five_problems_are_listed() -> None:
    assert refusal(review_with(request={"x": 1})) == (
        "invalid AdmissionReview: request.uid is missing; request.kind is missing; "
        "request.resource is missing; request.operation is missing; request.userInfo is missing"
    )
