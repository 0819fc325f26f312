"""A small stand-in apiserver for the view's list+watch: real HTTP, chunked watch streams.

It speaks just enough of the Kubernetes list/watch protocol (pagination with continue tokens,
resourceVersion, bookmarks, 410 Gone as a status and as an ERROR event, dropped connections) to
drive ``function.kube.watch.ClusterWatcher`` through a real urllib3 connection, and counts every request
it receives, so tests and the benchmark can assert who asked what and when. The e2e tests run the
same watcher against a real kube-apiserver.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.support.kubeconfig import write_kubeconfig

if TYPE_CHECKING:
    from function.kube.client import KubeClient


@dataclass(frozen=True)
class Seen:
    path: str
    query: dict[str, str]
    accept: str
    authorization: str


def make_pod(
    name: str, owner_uid: str = "", *, namespace: str = "default", placement: str = ""
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}
    if owner_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"rs-{owner_uid[:8]}",
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if placement:
        metadata["labels"] = {"castops.io/placement": placement}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up on a watch stream (stop, interrupt) is normal here, not a failure.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeApiServer:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}  # path -> uid -> object
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, path, type, object)
        self.version = 100
        self.oldest = 0  # a watch from below this resourceVersion is 410 Gone
        self.gone_as_event = False
        self.fail: list[int] = []  # statuses to answer the next requests with
        self.expire_continue = 0  # answer this many continue requests with 410
        self.bookmark_every_event = False
        self.seen: list[Seen] = []
        self._generation = 0  # bumping it ends every open watch stream
        self._sorted: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        server = _QuietServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, name="fake-apiserver", daemon=True)

    # -- state ------------------------------------------------------------------------------------
    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def put(self, path: str, obj: dict[str, Any], *, notify: bool = True) -> None:
        with self.lock:
            obj = self._stamp(obj)
            uid = obj["metadata"]["uid"]
            kind = "MODIFIED" if uid in self.objects.setdefault(path, {}) else "ADDED"
            self.objects[path][uid] = obj
            if notify:
                self.events.append((self.version, path, kind, obj))
                self.lock.notify_all()

    def load(self, path: str, objects: list[dict[str, Any]]) -> None:
        """Many objects at once, as if created long ago (no watch history)."""
        with self.lock:
            store = self.objects.setdefault(path, {})
            for obj in objects:
                self.version += 1
                obj["metadata"]["resourceVersion"] = str(self.version)
                store[obj["metadata"]["uid"]] = obj
            self.oldest = self.version

    def delete(self, path: str, uid: str, *, notify: bool = True) -> None:
        with self.lock:
            obj = self._stamp(self.objects[path].pop(uid))
            if notify:
                self.events.append((self.version, path, "DELETED", obj))
                self.lock.notify_all()

    def compact(self) -> None:
        """Forget the watch history (as etcd compaction does): older resourceVersions are Gone."""
        with self.lock:
            self.events.clear()
            self.version += 1
            self.oldest = self.version

    def drop_watches(self) -> None:
        """End every open watch stream (as an apiserver restart does)."""
        with self.lock:
            self._generation += 1
            self.lock.notify_all()

    def sorted_items(self, path: str) -> list[dict[str, Any]]:
        """The objects in name order, sorted once per resourceVersion (paging 100k objects in
        pages of 500 must not sort 200 times)."""
        cached = self._sorted.get(path)
        if cached is None or cached[0] != self.version:
            items = sorted(self.objects.get(path, {}).values(), key=lambda o: o["metadata"]["name"])
            cached = self._sorted[path] = (self.version, items)
        return cached[1]

    def requests(self, verb: str = "") -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if not verb or ("watch" in s.query) == (verb == "watch")]

    # -- HTTP -------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _json(self, status: int, payload: Any) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, payload: Any) -> None:
                data = json.dumps(payload).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                with fake.lock:
                    fake.seen.append(
                        Seen(
                            parts.path,
                            query,
                            self.headers.get("Accept", ""),
                            self.headers.get("Authorization", ""),
                        )
                    )
                    failing = fake.fail.pop(0) if fake.fail else 0
                if failing:
                    self._json(failing, {"kind": "Status", "code": failing, "message": "injected failure"})
                    return
                if "watch" in query:
                    self._watch(parts.path, query)
                else:
                    self._list(parts.path, query)

            def _list(self, path: str, query: dict[str, str]) -> None:
                with fake.lock:
                    if query.get("continue") and fake.expire_continue:
                        fake.expire_continue -= 1
                        self._json(410, {"kind": "Status", "code": 410, "reason": "Expired"})
                        return
                    items = fake.sorted_items(path)
                    start, _, version = (query.get("continue") or f"0::{fake.version}").partition("::")
                    limit = int(query.get("limit") or len(items) or 1)
                    page = items[int(start) : int(start) + limit]
                    following = int(start) + limit
                    token = f"{following}::{version}" if following < len(items) else ""
                    kind = (
                        "PartialObjectMetadataList"
                        if "PartialObjectMetadataList" in self.headers.get("Accept", "")
                        else "List"
                    )
                self._json(
                    200,
                    {
                        "kind": kind,
                        "metadata": {"resourceVersion": version, "continue": token},
                        "items": page,
                    },
                )

            def _watch(self, path: str, query: dict[str, str]) -> None:
                since = int(query.get("resourceVersion") or 0)
                with fake.lock:
                    gone = since < fake.oldest
                    generation = fake._generation
                if gone and not fake.gone_as_event:
                    self._json(410, {"kind": "Status", "code": 410, "reason": "Expired"})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    if gone:
                        self._chunk(
                            {
                                "type": "ERROR",
                                "object": {
                                    "kind": "Status",
                                    "code": 410,
                                    "message": "too old resource version",
                                },
                            }
                        )
                    else:
                        self._stream(path, since, generation)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    return

            def _stream(self, path: str, since: int, generation: int) -> None:
                sent = since
                while True:
                    with fake.lock:
                        pending = [e for e in fake.events if e[0] > sent and e[1] == path]
                        if not pending:
                            if fake._generation != generation:
                                return
                            fake.lock.wait(0.2)
                            continue
                    for version, _, kind, obj in pending:
                        self._chunk({"type": kind, "object": obj})
                        sent = version
                        if fake.bookmark_every_event:
                            self._chunk(
                                {
                                    "type": "BOOKMARK",
                                    "object": {"kind": "Pod", "metadata": {"resourceVersion": str(version)}},
                                }
                            )

        return Handler

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@contextmanager
def fake_apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def transport_for(url: str, token: str = "") -> KubeClient:
    """The real KubeClient, pointed at ``url`` (plain HTTP, optional bearer token)."""
    from kubernetes import client

    from function.kube.client import KubeClient

    configuration = client.Configuration()
    configuration.host = url
    if token:
        configuration.api_key["authorization"] = f"Bearer {token}"
    return KubeClient(configuration)


def kubeconfig_for(url: str, path: Path) -> Path:
    return write_kubeconfig(path, url, "fake", {"token": "t"})
