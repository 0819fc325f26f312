"""Smoke test of the container image (Containerfile), run with podman against $CASTSLICE_IMAGE.

CI builds the image with `.ci/build-image` (which exports CASTSLICE_IMAGE and CONTAINERS_CONF)
and sets CASTSLICE_IMAGE_REQUIRED=1, so a missing image fails here instead of skipping. Locally,
without CASTSLICE_IMAGE, the module is skipped:

    eval "$(.ci/build-image)" && python -m pytest tests/test_image.py

The container runs as the manifests run it: read-only root filesystem, HOME and TMPDIR on the
writable /var/tmp, no capabilities, `castslice serve`. It must answer /healthz, answer a recorded
AdmissionReview with its patch, write the decision event to its stdout, and stop on SIGTERM
within the Deployment's termination grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import DATA, decode_reply, load_review
from tests.support.audit import free_port, wait_for
from tests.support.manifests import kustomization_dirs, pod_specs, render

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("CASTSLICE_IMAGE", "").strip()
REQUIRED = os.environ.get("CASTSLICE_IMAGE_REQUIRED") == "1"
REVIEW = "default-slice-inference"
GRACE_SECONDS = 15  # with no client holding a connection, well within the overlays' grace period (135 s)

pytestmark = pytest.mark.skipif(
    not IMAGE and not REQUIRED,
    reason='no image: set CASTSLICE_IMAGE (eval "$(.ci/build-image)"); CI sets CASTSLICE_IMAGE_REQUIRED=1',
)


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def image() -> str:
    assert IMAGE, "CASTSLICE_IMAGE_REQUIRED=1 but CASTSLICE_IMAGE is not set: build it with .ci/build-image"
    assert shutil.which("podman"), "podman is not installed (.ci/build-image installs it)"
    assert podman("image", "exists", IMAGE).returncode == 0, f"image {IMAGE} is not in podman's store"
    return IMAGE


@dataclass
class Container:
    name: str
    port: int
    process: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self) -> list[dict[str, Any]]:
        lines = []
        for line in list(self.stdout):
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return [
            line["event"]
            for line in lines
            if isinstance(line, dict) and line.get("castslice") == "audit-event"
        ]


def _pump(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line.rstrip("\n"))


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[Container]:
    name = f"castslice-smoke-{uuid.uuid4().hex[:8]}"
    port = free_port()
    # Host network: CI machines have no working container network (as for `podman build`).
    command = [
        "podman", "run", "--rm", "--name", name, "--network", "host",
        "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--env", "HOME=/var/tmp", "--env", "TMPDIR=/var/tmp", "--env", "WORKERS=1",
        image, "serve", "--port", str(port),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    running = Container(name, port, process)
    for stream, into in ((process.stdout, running.stdout), (process.stderr, running.stderr)):
        threading.Thread(target=_pump, args=(stream, into), daemon=True).start()
    try:
        yield running
    finally:
        podman("rm", "--force", "--time", "0", name)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _healthy(container: Container) -> bool:
    assert container.process.poll() is None, "container exited:\n" + "\n".join(container.stderr[-30:])
    try:
        return httpx.get(f"{container.url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_image_runs_non_root_with_castslice_as_entrypoint(image: str) -> None:
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["castslice"]
    user = config["User"].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"USER must be a numeric non-root uid, got {config['User']!r}"
    # The home is writable by that user (gunicorn wants it); no compiler, no pip in the venv.
    probe = podman(
        "run", "--rm", "--network", "host", "--entrypoint", "sh", image, "-c",
        'id -u; test -w "$HOME" && echo home-writable; command -v castslice;'
        " for tool in gcc cc make pip; do command -v $tool; done; true",
    )  # fmt: skip
    lines = probe.stdout.split()
    assert probe.returncode == 0, probe.stderr
    assert lines[0] == user and "home-writable" in lines
    assert lines[2] == "/opt/castslice/bin/castslice"
    assert [
        line for line in lines[3:] if line.startswith("/opt/castslice") or "gcc" in line or "make" in line
    ] == []


def test_the_manifests_start_the_image_as_its_entrypoint(image: str) -> None:
    entrypoint = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]["Entrypoint"]
    checked = 0
    for overlay in kustomization_dirs():
        for _, spec in pod_specs(render(overlay)):
            for container in spec["containers"]:
                assert container["command"] == entrypoint, (overlay.name, container["name"])
                checked += 1
    assert checked >= 6  # webhook in 4 overlays, the audit consumer in the 2 with eventing


def test_container_answers_a_review_logs_the_event_and_stops_on_sigterm(container: Container) -> None:
    wait_for(lambda: _healthy(container), timeout=60, interval=0.25, what="/healthz of the container")

    review = load_review(REVIEW)
    answer = httpx.post(f"{container.url}/mutate?timeout=5s", json=review, timeout=10)
    assert answer.status_code == 200, answer.text
    expected = json.loads((DATA / "responses" / "default" / f"{REVIEW}.json").read_text())
    assert decode_reply(answer.json()) == expected

    uid = review["request"]["uid"]
    event = wait_for(
        lambda: next(
            (e for e in container.events() if e.get("data", {}).get("request", {}).get("uid") == uid), None
        ),
        timeout=10,
        what="the decision event on the container's stdout",
    )
    assert event["type"] == "io.castops.castslice.admission.mutated.v1"

    started = time.monotonic()
    assert podman("kill", "--signal", "TERM", container.name).returncode == 0
    try:
        code = container.process.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the container did not stop within {GRACE_SECONDS}s of SIGTERM")
    assert code == 0, f"exit code {code} after SIGTERM:\n" + "\n".join(container.stderr[-30:])
    assert time.monotonic() - started < GRACE_SECONDS
