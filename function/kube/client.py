"""The one client every process talks to the apiserver with, and its one error.

The reads that feed the cluster view stream through ``KubeClient.get`` (the list+watch,
``function/kube/watch.py``); everything else (a Lease for leader election, status by Server-Side
Apply, Events, Evictions, Pod patches, certgen's Secret, doctor's checks) goes through
``Api.request``. The kubernetes client's generated methods have no typed Server-Side Apply
(kubernetes-client/python #1430), take no custom ``Accept`` for PartialObjectMetadata, and their
signatures move between releases, so the client is used for what it is good at - credentials, TLS
and token refresh (its ``Configuration`` and urllib3 pool) - and the requests are a few lines here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlencode

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REQUEST_CONNECT_TIMEOUT = 5.0
"""A request's connect timeout: short, so a leader's renewal retries within its renew deadline."""
STREAM_CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class ApiResponse:
    status: int
    body: Mapping[str, Any] = field(default_factory=dict)
    text: str = ""
    """The body when it is not JSON (what a Service answers through the apiserver's proxy), cut
    to 300 characters."""

    @classmethod
    def parse(cls, status: int, data: bytes) -> ApiResponse:
        """The response to a request: its JSON body, or the text of a body that is not JSON."""
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            return cls(status, {}, data[:300].decode("utf-8", "replace"))
        return cls(status, parsed if isinstance(parsed, Mapping) else {})

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def message(self) -> str:
        """The apiserver's Status message (or the status code) for logs and errors."""
        text = (self.body.get("message") if isinstance(self.body, Mapping) else None) or self.text
        return f"HTTP {self.status}: {text}" if text else f"HTTP {self.status}"


class ApiError(RuntimeError):
    """A request the apiserver refused, ``what`` was asked named first; ``status`` tells a
    conflict (409) or a gone resourceVersion (410) from the rest."""

    def __init__(self, what: str, response: ApiResponse) -> None:
        super().__init__(f"{what}: {response.message()}")
        self.status = response.status
        self.response = response


class Api(Protocol):
    """One request to the apiserver with the process's credentials. ``body`` is sent as JSON
    (an apply patch is YAML, and JSON is YAML). Never raises for an HTTP status: the caller
    decides what a 404 or a 409 means; raises OSError-like errors when the server is unreachable."""

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> ApiResponse: ...


def collection_path(group: str, version: str, plural: str, namespace: str = "") -> str:
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    where = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    return f"{prefix}{where}/{plural}"


def object_path(group: str, version: str, plural: str, namespace: str, name: str, sub: str = "") -> str:
    path = f"{collection_path(group, version, plural, namespace)}/{quote(name, safe='')}"
    return f"{path}/{sub}" if sub else path


class KubeClient:
    """A process's one connection to the apiserver: the kubernetes client's ``Configuration``
    (credentials, TLS, token refresh) and one urllib3 pool. ``request`` is the ``Api`` the writers
    and programs call; ``get`` and ``interrupt`` are the ``Transport`` the list+watch streams over
    (``function/kube/watch.py``)."""

    def __init__(self, configuration: Any, user_agent: str = "castslice") -> None:
        from kubernetes.client.rest import RESTClientObject

        self.configuration = configuration
        self.user_agent = user_agent
        self._pool = RESTClientObject(configuration).pool_manager

    def _headers(self, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        return headers

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
        import urllib3

        headers = self._headers("application/json")
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = f"{self.configuration.host}{path}"
        if query:
            url += "?" + urlencode(dict(query))
        response = self._pool.request(
            method,
            url,
            body=data,
            headers=headers,
            retries=False,
            # ``timeout`` bounds the whole request, connecting included: a leader's renewal and
            # every write of a term are given only the time left in it (function/kube/elector.py).
            timeout=urllib3.Timeout(
                total=timeout, connect=min(REQUEST_CONNECT_TIMEOUT, timeout), read=timeout
            ),
        )
        return ApiResponse.parse(response.status, response.data)

    def get(self, path: str, query: Mapping[str, str], accept: str, read_timeout: float) -> Any:
        """A GET whose body is read as it arrives (a list page, a watch stream): the urllib3
        response, not yet read; the caller releases its connection."""
        import urllib3

        return self._pool.request(
            "GET",
            f"{self.configuration.host}{path}?{urlencode(dict(query))}",
            headers=self._headers(accept),
            preload_content=False,
            retries=False,
            timeout=urllib3.Timeout(connect=STREAM_CONNECT_TIMEOUT, read=read_timeout),
        )

    def interrupt(self, response: Any) -> None:
        """Unblock a thread reading ``response`` (a watch, when stopping)."""
        shutdown = getattr(response, "shutdown", None)  # urllib3 2.3+: unblocks a reader
        if callable(shutdown):
            shutdown()
        else:
            getattr(response, "close", lambda: None)()

    def renewed(self) -> KubeClient:
        """The same credentials on a new connection pool (for a forked process, whose inherited
        sockets belong to its parent)."""
        return KubeClient(self.configuration, self.user_agent)


def kube_client(
    environ: Mapping[str, str] | None = None, *, kubeconfig: str | None = None, user_agent: str = "castslice"
) -> KubeClient:
    """The client on this process's credentials (``function/kube/credentials.py``); raises
    NoCredentials naming what was looked for."""
    from function.kube.credentials import load_configuration

    return KubeClient(load_configuration(environ, kubeconfig), user_agent)
