"""Helpers shared by the test modules: recorded reviews, the real functions-framework app."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from function.core.podmutation.compiled import CompiledMutation, InvalidMutation

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
REVIEWS = DATA / "admission-reviews"
CONFIGS = DATA / "configs"
FUNC_SOURCE = ROOT / "function" / "func.py"

REGENERATE = os.environ.get("CASTSLICE_REGENERATE") == "1"
"""Set to rewrite expected files from current behaviour; review the diff before committing."""


def review_names() -> list[str]:
    return sorted(p.stem for p in REVIEWS.glob("*.json"))


def load_review(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REVIEWS / f"{name}.json").read_text())
    return data


def decode_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply with its base64 patch decoded to operations, for exact comparison."""
    response = dict(reply["response"])
    if "patch" in response:
        response["patch"] = json.loads(base64.b64decode(response["patch"], validate=True))
    return {**reply, "response": response}


def asgi_client(monkeypatch: Any, config_path: Path | None = None, **env: str) -> Any:
    """A TestClient over the real functions-framework ASGI app, built as `castslice serve` builds it
    (function/serve/asgi.py: reviews reach the bare endpoint, everything else functions-framework)."""
    from starlette.testclient import TestClient

    from function.serve.asgi import serving_app

    if config_path is None:
        monkeypatch.delenv("CASTSLICE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CASTSLICE_CONFIG", str(config_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return TestClient(serving_app("mutate"))


def served_webhook(client: Any) -> Any:
    """The WebhookHttp an ``asgi_client`` serves (built now, from the environment then, if no
    request has built it yet)."""
    return client.app.reviews.start()


_A_POD_NAMED_P: Any = object()
"""``pod_review``'s default metadata (``None`` is a value a test may want in the object)."""


def pod_review(
    metadata: Any = _A_POD_NAMED_P,
    *,
    name: str | None = None,
    namespace: str | None = "ml",
    user: Any = None,
    dry_run: bool | None = None,
) -> Any:
    """A Pod CREATE AdmissionReview (uid ``u-1``) around ``metadata`` (default: a Pod named p),
    written as the apiserver sends one and parsed as the webhook parses it. ``name`` and ``dry_run``
    are left out when None, as is ``namespace``; ``user`` is the userInfo (default: alice, in the
    groups devs and ml)."""
    from function.admission.wire import parse_review

    request: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "userInfo": user if user is not None else {"username": "alice", "groups": ["devs", "ml"]},
        "object": {
            "kind": "Pod",
            "metadata": {"name": "p"} if metadata is _A_POD_NAMED_P else metadata,
            "spec": {"containers": []},
        },
    }
    for key, value in (("name", name), ("namespace", namespace), ("dryRun", dry_run)):
        if value is not None:
            request[key] = value
    envelope = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return parse_review(json.dumps(envelope).encode())


class PodGroupView:
    """A cluster view with one group of the ``pods`` index, ``owner_uid`` -> ``members``, a plain dict:
    records of any shape, counted in the order the test gives them."""

    available = True

    def __init__(self, owner_uid: str, members: Mapping[str, Any]) -> None:
        self.owner_uid, self.members = owner_uid, members

    def index(self, name: str) -> Mapping[str, Any]:
        return {}

    def group(self, name: str, key: str) -> Mapping[str, Any]:
        return self.members if (name, key) == ("pods", self.owner_uid) else {}

    def synced(self, name: str) -> bool:
        return True


def pm(
    name: str, spec: dict[str, Any], generation: int = 1, api: str = "castops.io/v1alpha1"
) -> dict[str, Any]:
    """A PodMutation object as the apiserver stores it (ours by default; ``api`` for CAST AI's)."""
    return {
        "apiVersion": api,
        "kind": "PodMutation",
        "metadata": {"name": name, "generation": generation, "uid": f"uid-{name}"},
        "spec": spec,
    }


def compiled_mutation(spec: dict[str, Any], name: str = "m") -> CompiledMutation:
    """A valid PodMutation (ours, generation 1) with ``spec``, compiled as the view compiles it."""
    from function.core.podmutation.compiled import CompiledMutation, compile_object

    compiled = compile_object(pm(name, spec))
    assert isinstance(compiled, CompiledMutation), compiled
    return compiled


def mutation_records(objects: Iterable[Mapping[str, Any]]) -> dict[str, CompiledMutation | InvalidMutation]:
    """PodMutation objects as the view's index holds them (compiled, keyed by uid, as the watch keys
    them): a StaticView's ``podmutations`` index."""
    from function.core.podmutation.compiled import compile_object

    return {compiled.uid: compiled for compiled in map(compile_object, objects)}
