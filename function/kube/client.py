"""The controller's writes to the apiserver: one small request function, and the calls built on it.

The reads come from the cluster view's watches (``function/kube/watch.py``); what a reconciler
writes (a Lease for leader election, status by Server-Side Apply, Events, Evictions, Pod patches)
goes through ``Api.request``. The kubernetes client's generated methods have no typed
Server-Side Apply (kubernetes-client/python #1430) and their signatures move between releases, so
as the view does, the client is used for credentials, TLS and token refresh (its
``Configuration`` and urllib3 pool) and the requests are a few lines here.
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


@dataclass(frozen=True)
class ApiResponse:
    status: int
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def message(self) -> str:
        """The apiserver's Status message (or the status code) for logs and errors."""
        text = self.body.get("message") if isinstance(self.body, Mapping) else None
        return f"HTTP {self.status}: {text}" if text else f"HTTP {self.status}"


class ApiError(RuntimeError):
    """A write the apiserver refused; ``status`` tells a conflict (409) from the rest."""

    def __init__(self, what: str, response: ApiResponse) -> None:
        super().__init__(f"{what}: {response.message()}")
        self.status = response.status


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


class KubeApi:
    """``Api`` over the kubernetes client's Configuration (in-cluster token or kubeconfig)."""

    def __init__(self, configuration: Any, user_agent: str = "castslice-control") -> None:
        from kubernetes.client.rest import RESTClientObject

        self.configuration = configuration
        self.user_agent = user_agent
        self._pool = RESTClientObject(configuration).pool_manager

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

        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
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
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
        )
        try:
            parsed = json.loads(response.data) if response.data else {}
        except ValueError:
            parsed = {"message": response.data[:300].decode("utf-8", "replace")}
        return ApiResponse(response.status, parsed if isinstance(parsed, Mapping) else {})


def kube_api(environ: Mapping[str, str] | None = None) -> KubeApi:
    """In-cluster credentials when running in a Pod, else $KUBECONFIG (the view's own rule)."""
    from function.kube.watch import kube_transport

    return KubeApi(kube_transport(environ).configuration)
