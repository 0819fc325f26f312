"""The platform a user of CastSlice's knative-route overlay already has, installed on the real node
(realnode.py): Knative Serving from its release manifests (config/core of knative.dev/serving, as
``.ci/provision-cluster`` copied it from the module) with the images built there, Traefik v3's
Knative provider as the ingress (Envoy, and so Kourier, Contour and Istio, cannot be built here),
and, for the audit path, Knative Eventing with its channel-based broker on the in-memory channel
(config/core, config/channels/in-memory-channel and config/brokers/mt-channel-broker of
knative.dev/eventing).

What differs from an upstream install, and why:
  - images: ``ko://knative.dev/<serving|eventing>/cmd/<x>`` becomes
    ``dev.local/knative-<serving|eventing>-<x>:ci`` (loaded without a registry; Knative resolves
    no digest for dev.local);
  - Eventing's JobSink, RequestReply and PingSource workloads are left out (not the broker's;
    their images are not built);
  - CPU requests of the platform's own Pods are 10m: one 2-core node carries the platform, CastSlice
    three ways and the workloads; the limits are kept;
  - no HPAs (no metrics-server), no ``routing-serving-certs`` Certificate (system-internal TLS
    needs cert-manager, which cannot be built from the module proxy);
  - ``config-network``'s ingress class is Traefik's.

Traefik serves Knative's public routes on ``traefik`` (ClusterIP TRAEFIK_IP) and the cluster-local
ones on ``traefik-private`` (TRAEFIK_PRIVATE_IP), both on 80 and 443; every route answers HTTPS
(entrypoints with ``http.tls``), with the certificates of its TLS store: the file provider's
certificates, from Secrets in Traefik's namespace (``serve_certificate``).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import yaml

from .realnode import RealCluster

KNATIVE_NAMESPACE = "knative-serving"
EVENTING_NAMESPACE = "knative-eventing"
TRAEFIK_NAMESPACE = "traefik"
TRAEFIK_IP = "10.96.0.20"
TRAEFIK_PRIVATE_IP = "10.96.0.21"
INGRESS_CLASS = "traefik.ingress.networking.knative.dev"
PLATFORM_CPU_REQUEST = "10m"
ROLLOUT_SECONDS = 300.0
APPLY_ORDER = [
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "Role",
    "ClusterRoleBinding",
    "RoleBinding",
    "ConfigMap",
    "Secret",
]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _images(text: str, component: str) -> str:
    return re.sub(
        rf"ko://knative\.dev/{component}/cmd/([a-z_/]+)",
        lambda m: f"dev.local/knative-{component}-{m.group(1).replace('/', '-')}:ci",
        text,
    )


def _light(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU requests of every Deployment's containers lowered to PLATFORM_CPU_REQUEST."""
    for obj in objects:
        if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
            for container in obj["spec"]["template"]["spec"].get("containers", []):
                requests = container.setdefault("resources", {}).setdefault("requests", {})
                requests["cpu"] = PLATFORM_CPU_REQUEST
    return objects


def release_manifests(
    files: list[Path], component: str, skip: frozenset[str] = frozenset()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs, everything else) of release manifests as a module ships them, images local, ready to
    apply: the Namespace first, configuration before the Deployments that read it at start (Serving's
    autoscaler exits without config-network), the webhook registrations last (their Service must
    answer first). ``skip`` names objects (``Kind/name``) left out."""
    crds: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for path in files:
        for doc in yaml.safe_load_all(_images(path.read_text(), component)):
            if not doc or doc.get("kind") == "HorizontalPodAutoscaler":
                continue
            if f"{doc['kind']}/{doc['metadata']['name']}" in skip:
                continue
            (crds if doc["kind"] == "CustomResourceDefinition" else rest).append(doc)
    webhooks = [d for d in rest if d["kind"].endswith("WebhookConfiguration")]
    others = [d for d in rest if not d["kind"].endswith("WebhookConfiguration")]
    others.sort(key=lambda d: APPLY_ORDER.index(d["kind"]) if d["kind"] in APPLY_ORDER else len(APPLY_ORDER))
    return crds, _light(others) + webhooks


def serving_manifests(yaml_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs, everything else) of Knative Serving's core, ready to apply."""
    files = [
        path
        for path in sorted((yaml_dir / "serving-core").rglob("*.yaml"))
        if path.name != "300-knativecertificate.yaml"
    ]
    files += sorted((yaml_dir / "networking").glob("*.yaml")) + sorted((yaml_dir / "caching").glob("*.yaml"))
    crds, rest = release_manifests(files, "serving")
    for doc in rest:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "config-network":
            doc.setdefault("data", {})["ingress-class"] = INGRESS_CLASS
    return crds, rest


def install_serving(cluster: RealCluster) -> None:
    crds, rest = serving_manifests(cluster.assets.yaml)
    cluster.apply(crds)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd", "--all")
    # The caching Image objects name CRDs created just above; a second pass settles them.
    cluster.apply(rest)
    for name in ("controller", "webhook", "activator", "autoscaler"):
        cluster.wait_rollout(KNATIVE_NAMESPACE, f"deployment/{name}", ROLLOUT_SECONDS)


EVENTING_DEPLOYMENTS = (
    "eventing-controller",
    "eventing-webhook",
    "imc-controller",
    "imc-dispatcher",
    "mt-broker-controller",
    "mt-broker-ingress",
    "mt-broker-filter",
)
EVENTING_SKIPPED = frozenset(
    {
        # Not the broker's: the JobSink, RequestReply and PingSource workloads, whose images are not
        # built (their CRDs and roles stay, as in the release).
        "Deployment/job-sink",
        "Service/job-sink",
        "StatefulSet/request-reply",
        "Service/request-reply",
        "Deployment/pingsource-mt-adapter",
    }
)


def eventing_manifests(yaml_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs, everything else) of Knative Eventing's core, the in-memory channel and the
    channel-based broker (the release's eventing-core, in-memory-channel and mt-channel-broker),
    ready to apply."""
    files: list[Path] = []
    for part in ("eventing-core", "in-memory-channel", "mt-channel-broker"):
        files += sorted((yaml_dir / part).rglob("*.yaml"))
    return release_manifests(files, "eventing", EVENTING_SKIPPED)


def install_eventing(cluster: RealCluster) -> None:
    crds, rest = eventing_manifests(cluster.assets.yaml)
    cluster.apply(crds)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd", "--all")
    cluster.apply(rest)
    for name in EVENTING_DEPLOYMENTS:
        cluster.wait_rollout(EVENTING_NAMESPACE, f"deployment/{name}", ROLLOUT_SECONDS)


def traefik_manifests() -> list[dict[str, Any]]:
    ns = TRAEFIK_NAMESPACE
    labels = {"app.kubernetes.io/name": "traefik"}
    args = [
        "--global.checknewversion=false",
        "--global.sendanonymoususage=false",
        "--log.level=INFO",
        "--ping=true",
        "--ping.entrypoint=ping",
        "--entrypoints.ping.address=:9000",
        "--entrypoints.web.address=:8080",
        "--entrypoints.websecure.address=:8443",
        "--entrypoints.websecure.http.tls=true",
        "--entrypoints.private.address=:8081",
        "--entrypoints.privatesecure.address=:8444",
        "--entrypoints.privatesecure.http.tls=true",
        "--experimental.knative=true",
        "--providers.knative=true",
        "--providers.knative.publicentrypoints=web,websecure",
        "--providers.knative.privateentrypoints=private,privatesecure",
        "--providers.knative.publicservice.name=traefik",
        f"--providers.knative.publicservice.namespace={ns}",
        "--providers.knative.privateservice.name=traefik-private",
        f"--providers.knative.privateservice.namespace={ns}",
        "--providers.file.directory=/etc/traefik/dynamic",
        "--providers.file.watch=true",
    ]
    ports = {"web": 8080, "websecure": 8443, "private": 8081, "privatesecure": 8444}

    def service(name: str, ip: str, plain: str, secure: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "clusterIP": ip,
                "selector": labels,
                "ports": [
                    {"name": "http", "port": 80, "targetPort": ports[plain]},
                    {"name": "https", "port": 443, "targetPort": ports[secure]},
                ],
            },
        }

    return [
        # The webhook's path runs through Traefik: CastSlice never sits in front of its own ingress.
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"castops.io/webhook": "ignore"}},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "traefik", "namespace": ns}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "castslice-platform:traefik"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "secrets", "endpoints"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["networking.internal.knative.dev"],
                    "resources": ["ingresses"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["networking.internal.knative.dev"],
                    "resources": ["ingresses/status"],
                    "verbs": ["update", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "castslice-platform:traefik"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "castslice-platform:traefik",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "traefik", "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "traefik-dynamic", "namespace": ns},
            "data": {"tls.yaml": yaml.safe_dump({"tls": {"certificates": []}})},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "traefik", "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "traefik",
                        "containers": [
                            {
                                "name": "traefik",
                                "image": "dev.local/traefik:ci",
                                "imagePullPolicy": "Never",
                                "args": args,
                                "ports": [{"name": n, "containerPort": p} for n, p in ports.items()],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ping", "port": 9000},
                                    "periodSeconds": 2,
                                },
                                "resources": {
                                    "requests": {"cpu": PLATFORM_CPU_REQUEST, "memory": "64Mi"},
                                    "limits": {"memory": "512Mi"},
                                },
                                "securityContext": {
                                    "runAsNonRoot": True,
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [
                                    {"name": "dynamic", "mountPath": "/etc/traefik/dynamic"},
                                    {"name": "certs", "mountPath": "/etc/traefik/certs"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "dynamic", "configMap": {"name": "traefik-dynamic"}},
                            # serve_certificate() makes it a projected volume of certificate Secrets.
                            {"name": "certs", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        service("traefik", TRAEFIK_IP, "web", "websecure"),
        service("traefik-private", TRAEFIK_PRIVATE_IP, "private", "privatesecure"),
    ]


def install_traefik(cluster: RealCluster) -> None:
    cluster.apply(traefik_manifests())
    cluster.wait_rollout(TRAEFIK_NAMESPACE, "deployment/traefik", ROLLOUT_SECONDS)


def serve_certificate(cluster: RealCluster, namespace: str, secret: str) -> None:
    """The platform's step for a route whose TLS the application brings (knative-route-host): the
    Secret's certificate copied into Traefik's namespace and added to its TLS store, Traefik
    rolled to read it. Kourier, Contour and Istio take it from a DomainMapping's spec.tls; Traefik's
    Knative provider has no DomainMapping."""
    data = json.loads(cluster.kubectl("-n", namespace, "get", "secret", secret, "-o", "json"))["data"]
    copy = f"{namespace}-{secret}"
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": copy, "namespace": TRAEFIK_NAMESPACE},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": data["tls.crt"], "tls.key": data["tls.key"]},
            }
        ]
    )
    deployment = json.loads(
        cluster.kubectl("-n", TRAEFIK_NAMESPACE, "get", "deployment", "traefik", "-o", "json")
    )
    spec = deployment["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "certs")
    sources = volume.get("projected", {}).get("sources", [])
    volume.clear()
    volume.update({"name": "certs", "projected": {"sources": sources}})
    if not any(s.get("secret", {}).get("name") == copy for s in sources):
        sources.append(
            {
                "secret": {
                    "name": copy,
                    "items": [
                        {"key": "tls.crt", "path": f"{copy}.crt"},
                        {"key": "tls.key", "path": f"{copy}.key"},
                    ],
                }
            }
        )
    certificates = [
        {
            "certFile": f"/etc/traefik/certs/{s['secret']['name']}.crt",
            "keyFile": f"/etc/traefik/certs/{s['secret']['name']}.key",
        }
        for s in sources
    ]
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "traefik-dynamic", "namespace": TRAEFIK_NAMESPACE},
                "data": {"tls.yaml": yaml.safe_dump({"tls": {"certificates": certificates}})},
            }
        ]
    )
    cluster.kubectl(
        "-n",
        TRAEFIK_NAMESPACE,
        "patch",
        "deployment",
        "traefik",
        "--type=json",
        "-p",
        json.dumps(
            [
                {"op": "replace", "path": "/spec/template/spec/volumes", "value": spec["volumes"]},
            ]
        ),
    )
    cluster.kubectl("-n", TRAEFIK_NAMESPACE, "rollout", "restart", "deployment/traefik")
    cluster.wait_rollout(TRAEFIK_NAMESPACE, "deployment/traefik", ROLLOUT_SECONDS)


def secret_ca(cluster: RealCluster, namespace: str, secret: str) -> bytes:
    data = json.loads(cluster.kubectl("-n", namespace, "get", "secret", secret, "-o", "json"))["data"]
    return base64.b64decode(data["ca.crt"])
