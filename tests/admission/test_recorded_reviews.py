"""Every recorded AdmissionReview, through the real functions-framework app, under each test
configuration, answered exactly as the expected file says (patch operations, denial, warnings).

Expected files live in tests/data/responses/<config>/<review>.json with the patch decoded.
"""

from __future__ import annotations

import json

import pytest

from tests.support import CONFIGS, DATA, REGENERATE, asgi_client, decode_reply, load_review, review_names

CONFIG_NAMES = ["default", *sorted(p.stem for p in CONFIGS.glob("*.yaml"))]


@pytest.mark.parametrize("config_name", CONFIG_NAMES)
def test_recorded_reviews_get_the_expected_reply(monkeypatch: pytest.MonkeyPatch, config_name: str) -> None:
    config_path = None if config_name == "default" else CONFIGS / f"{config_name}.yaml"
    client = asgi_client(monkeypatch, config_path)
    expected_dir = DATA / "responses" / config_name
    mismatches = []
    for name in review_names():
        review = load_review(name)
        answer = client.post("/mutate?timeout=5s", json=review)
        assert answer.status_code == 200, (name, answer.text)
        assert answer.headers["content-type"].startswith("application/json")
        reply = answer.json()
        assert reply["apiVersion"] == review["apiVersion"]
        assert reply["response"]["uid"] == review["request"]["uid"]
        decoded = decode_reply(reply)
        expected_file = expected_dir / f"{name}.json"
        if REGENERATE:
            expected_dir.mkdir(parents=True, exist_ok=True)
            expected_file.write_text(json.dumps(decoded, indent=2, sort_keys=True) + "\n")
            continue
        assert expected_file.exists(), f"no expected reply for {name} under {config_name}"
        if decoded != json.loads(expected_file.read_text()):
            mismatches.append(name)
    assert not mismatches, f"replies differ from tests/data/responses/{config_name}: {mismatches}"


def test_every_review_has_an_expected_reply_in_every_config() -> None:
    for config_name in CONFIG_NAMES:
        have = {p.stem for p in (DATA / "responses" / config_name).glob("*.json")}
        assert have == set(review_names()), config_name
