"""An in-memory apiserver for the controller's writes: objects by path, resourceVersions that
conflict as the real ones do, and every request recorded."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any

from function.kube.client import ApiResponse


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any, str]] = []
        self.version = 0
        self.down = False
        """True: every request fails as an unreachable server does."""
        self.handlers: dict[tuple[str, str], Callable[[Any, Mapping[str, str]], ApiResponse]] = {}
        """(method, path) -> a reply, for requests other than plain object CRUD."""
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> ApiResponse:
        with self._lock:
            self.requests.append((method, path, copy.deepcopy(body), content_type))
            if self.down:
                raise OSError("connection refused")
            handler = self.handlers.get((method, path))
            if handler is not None:
                return handler(body, query or {})
            if method == "GET":
                obj = self.objects.get(path)
                return (
                    ApiResponse(200, copy.deepcopy(obj))
                    if obj
                    else ApiResponse(404, {"message": "not found"})
                )
            if method == "POST":
                target = f"{path}/{body['metadata']['name']}"
                if target in self.objects:
                    return ApiResponse(409, {"message": "already exists"})
                return self._store(target, body)
            if method == "PUT":
                known = self.objects.get(path)
                if known is None:
                    return ApiResponse(404, {"message": "not found"})
                sent = body["metadata"].get("resourceVersion")
                if sent and sent != known["metadata"]["resourceVersion"]:
                    return ApiResponse(409, {"message": "the object has been modified"})
                return self._store(path, body)
            return ApiResponse(405, {"message": f"{method} not faked"})

    def _store(self, path: str, body: Any) -> ApiResponse:
        self.version += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[path] = obj
        return ApiResponse(201, copy.deepcopy(obj))
