"""Reference handlers the benchmark serves beside CastSlice, in the same run, so its figures are
ratios that hold on any machine (tests/benchmarks/webhook.py). Not part of the webhook.

``naive``: what one would write by hand as a functions-framework function (Flask, the default
server): parse the review, slice an opted-in Pod's GPUs, build the JSON Patch, answer. No proof,
no rules check, no audit event, no validation of the envelope.

``floor``: functions-framework's ASGI server doing the least a webhook can: parse the body and
allow. Nothing built on functions-framework's ASGI stack answers faster.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import flask
import functions_framework
from functions_framework import aio
from starlette.requests import Request
from starlette.responses import Response

PRESETS = {"training": 4, "inference": 2, "batch": 2, "dev": 1}


def _naive_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if annotations.get("castops.io/optimize") != "true":
        return []
    slices = str(
        annotations.get("castops.io/slice-ratio")
        or PRESETS.get(annotations.get("castops.io/workload-type", ""), 1)
    )
    ops = []
    for index, container in enumerate(pod.get("spec", {}).get("containers", [])):
        for section in ("limits", "requests"):
            quantities = (container.get("resources") or {}).get(section) or {}
            if "nvidia.com/gpu" in quantities:
                base = f"/spec/containers/{index}/resources/{section}"
                ops.append({"op": "remove", "path": f"{base}/nvidia.com~1gpu"})
                ops.append({"op": "add", "path": f"{base}/nvidia.com~1gpu-shared", "value": slices})
    return ops


@functions_framework.http
def naive(request: flask.Request) -> flask.Response:
    review = json.loads(request.get_data())
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    ops = _naive_patch(review["request"]["object"])
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    body = json.dumps({"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response})
    return flask.Response(body, 200, content_type="application/json")


@aio.http
async def floor(request: Request) -> Response:
    review = json.loads(await request.body())
    body = json.dumps(
        {
            "apiVersion": review["apiVersion"],
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
    )
    return Response(body, 200, media_type="application/json")
