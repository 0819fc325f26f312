"""Where a process finds the apiserver and its credentials: the one rule every program follows.

In a Pod (``KUBERNETES_SERVICE_HOST`` set and the ServiceAccount token mounted): the in-cluster
configuration. Elsewhere: a kubeconfig (the one named, else ``$KUBECONFIG``, else
``~/.kube/config``), as kubectl finds it. The kubernetes client loads either into a
``Configuration``: the server, TLS material, client certificates, a bearer token it re-reads when
an in-cluster token nears expiry. Each process loads it once and builds its one client on it
(``function/kube/client.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

POOL_CONNECTIONS = 32
"""Connections the client keeps to the apiserver: each watch holds one for as long as it streams
and the writes share the rest, so the client's default (5 per core) would drop connections on a
controller with many watches and workers."""


class NoCredentials(RuntimeError):
    """Neither a mounted ServiceAccount token nor a usable kubeconfig: the program cannot reach the
    apiserver (the user's setup to fix, named in the message)."""


def load_configuration(environ: Mapping[str, str] | None = None, kubeconfig: str | None = None) -> Any:
    """The kubernetes client's ``Configuration`` for this process (see the module's rule).
    ``kubeconfig`` names a file (``castslice doctor --kubeconfig``); ``environ`` (default
    os.environ) is read for the in-cluster variables and ``KUBECONFIG``."""
    from kubernetes import client, config

    environ = os.environ if environ is None else environ
    configuration = client.Configuration()
    try:
        if environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig or environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )
    except (config.ConfigException, OSError) as error:
        where = kubeconfig if kubeconfig else environ.get("KUBECONFIG", "")
        named = f"--kubeconfig {where!r}" if kubeconfig else f"KUBECONFIG={where!r}"
        raise NoCredentials(
            f"no credentials for the apiserver: no mounted ServiceAccount token ({IN_CLUSTER_TOKEN}) "
            f"and no usable kubeconfig ({named}): {error}"
        ) from error
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, POOL_CONNECTIONS)
    return configuration
