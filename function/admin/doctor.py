"""``castslice doctor``: is CastSlice working on the cluster of the current kubeconfig? One line per
check, each failure with its fix, and an exit code for scripts (0: every check passed, 1: one
failed). The checks, in the order a broken install fails them:

1. registered: the MutatingWebhookConfiguration exists and sends Pod CREATEs;
2. caBundle: it is set, and the serving certificate (the Secret the webhook mounts, or what the
   URL serves) chains to it; so for every other webhook configuration the manifests install that
   is there (the PodMutation and GpuLease validating webhooks: with ``failurePolicy: Fail``, a
   caBundle that does not sign the certificate refuses every create of their kind);
3. reachable: from where the apiserver calls it (the Service through the apiserver's own proxy,
   or the URL);
4. ready: its /readyz answers 200 (its cluster view has listed what the configuration watches);
5. dry run: a server-side dry run of an opted-in Pod comes back sliced (the whole path, with
   ``failurePolicy: Ignore`` unable to hide a failure);
6. CRDs and RBAC: what the configuration watches exists, and the webhook's ServiceAccount may list
   and watch it (SubjectAccessReview);
7. GPU leases (with ``gpuLeases`` on): every admission policy of components/gpu-leases and its
   binding is there (the stamp policy naming the controller's ServiceAccount in this namespace),
   and the controller runs with a leader (its Lease held and renewed in time);
8. drift: stored Pods the webhook would change today (it did not see them: it was down, timed out,
   or they came before a policy; GPU Pods their namespace's lease does not count), judged as the
   controller's drift reconciler and ``castslice audit drift`` judge them (the same view, listed as
   the controller's watches list it, and the Pods in pages bounded in bytes).

The configuration is read from the ConfigMap the webhook's Deployment (or Knative Service) mounts,
or ``--config``.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import socket
import ssl
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from function.admin.certgen import api_error_line
from function.config_file import load_config_file
from function.contract import (
    CONTROL_LEASE_NAME,
    LEASE_POLICIES,
    MUTATING_CONFIGURATIONS,
    STAMP_POLICY,
    VALIDATING_CONFIGURATIONS,
)
from function.core.config import Config, ConfigError, parse_config, watches_for
from function.core.drift import Finding, Tally, findings, opted_out_in
from function.core.engine import Engine
from function.core.mutators.spot import NAMESPACES
from function.core.view import POD_FIELD_SELECTOR, merge_specs
from function.kube.client import Api, ApiError, collection_path, kube_client
from function.kube.pages import Pager
from function.kube.watch import ClusterWatcher

EXIT_OK, EXIT_FAILED = 0, 1
WEBHOOK_NAME = "pods.castslice.castops.io"
PROBE_POD = "castslice-doctor-probe"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False

    def lines(self) -> Iterator[str]:
        state = "ok" if self.ok else "warn" if self.warning else "FAIL"
        yield f"{state:<4}  {self.name}: {self.detail}"
        if self.fix and not self.ok:
            yield f"      fix: {self.fix}"


@dataclass
class Cluster:
    """The API client and what the checks found so far (later checks build on earlier ones)."""

    api: Api
    namespace: str
    configuration: Any = None
    hook: Any = None
    config: Config | None = None
    notes: list[str] = field(default_factory=list)

    def call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
    ) -> Any:
        """A raw API call: (status, decoded JSON body or text)."""
        response = self.api.request(method, path, body=body, query=dict(query or []), timeout=10)
        return response.status, response.text or response.body


# --- 1. registered --------------------------------------------------------------------------------
def registered(cluster: Cluster, name: str) -> Check:
    status, body = cluster.call(
        "GET", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    )
    fix = "kubectl apply -k knative/overlays/deployment, or helm install castslice charts/castslice"
    if status == 404:
        return Check("registered", False, f"no MutatingWebhookConfiguration {name}", fix)
    if status != 200:
        return Check(
            "registered", False, f"cannot read MutatingWebhookConfiguration {name}: HTTP {status}", fix
        )
    hooks = body.get("webhooks") or []
    hook = next((h for h in hooks if h.get("name") == WEBHOOK_NAME), hooks[0] if hooks else None)
    pods = hook is not None and any(
        "pods" in (rule.get("resources") or []) and "CREATE" in (rule.get("operations") or [])
        for rule in hook.get("rules") or []
    )
    if hook is None or not pods:
        return Check("registered", False, f"{name} sends no Pod CREATE to a webhook", fix)
    cluster.configuration, cluster.hook = body, hook
    client_config = hook["clientConfig"]
    service = {"port": 443, "path": "/", **(client_config.get("service") or {})}
    where = client_config.get("url") or "service {namespace}/{name}:{port}{path}".format(**service)
    return Check(
        "registered",
        True,
        f"{name} sends Pod CREATE to {where} (failurePolicy {hook.get('failurePolicy', 'Fail')}, "
        f"timeout {hook.get('timeoutSeconds', 10)}s)",
    )


# --- 2. caBundle ----------------------------------------------------------------------------------
def _bundle(hook: Any) -> list[x509.Certificate]:
    encoded = hook["clientConfig"].get("caBundle") or ""
    return x509.load_pem_x509_certificates(base64.b64decode(encoded)) if encoded else []


def _chains(cert: x509.Certificate, bundle: list[x509.Certificate]) -> bool:
    for ca in bundle:
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):
            continue
    return False


def _served_certificate(url: str) -> x509.Certificate:
    parts = urllib.parse.urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # read it, whatever it is
    address = (parts.hostname, parts.port or 443)
    with (
        socket.create_connection(address, timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=parts.hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def ca_bundle(cluster: Cluster, secret: str) -> Check:
    if cluster.hook is None:
        return Check("caBundle", False, "not checked: no webhook registered")
    return _ca_bundle(cluster, secret, "caBundle", cluster.hook, cluster.configuration)


def other_ca_bundles(cluster: Cluster, secret: str) -> list[Check]:
    """The caBundle of every other webhook configuration the manifests install and the cluster has."""
    checks = []
    for kind, names in (
        ("mutatingwebhookconfigurations", MUTATING_CONFIGURATIONS),
        ("validatingwebhookconfigurations", VALIDATING_CONFIGURATIONS),
    ):
        for name in names:
            if cluster.configuration is not None and name == (
                cluster.configuration.get("metadata") or {}
            ).get("name"):
                continue  # the Pod webhook's, checked above
            status, body = cluster.call("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
            if status == 404:
                continue  # its component is not installed
            what = f"caBundle {name}"
            if status != 200:
                checks.append(Check(what, False, f"cannot read {kind[:-1]} {name}: HTTP {status}"))
                continue
            for hook in body.get("webhooks") or ():
                check = _ca_bundle(cluster, secret, what, hook, body)
                check.detail = f"{hook.get('name')}: {check.detail}"
                checks.append(check)
    return checks


def _ca_bundle(cluster: Cluster, secret: str, name: str, hook: Any, configuration: Any) -> Check:
    try:
        bundle = _bundle(hook)
    except ValueError:
        return Check(name, False, "is not PEM certificates", "re-run the certificate's issuer (see below)")
    cert_manager = "cert-manager.io/inject-ca-from" in ((configuration or {}).get("metadata") or {}).get(
        "annotations", {}
    )
    fix = (
        f"cert-manager writes it: kubectl -n {cluster.namespace} describe certificate "
        "castslice-serving-cert, and the cainjector's log"
        if cert_manager
        else f"castslice certgen -n {cluster.namespace} (the Job of knative/components/certgen)"
    )
    if not bundle:
        return Check(name, False, "empty: the apiserver cannot trust the webhook", fix)
    url = hook["clientConfig"].get("url")
    try:
        if url:
            cert, source = _served_certificate(url), f"the certificate {url} serves"
        else:
            status, body = cluster.call("GET", f"/api/v1/namespaces/{cluster.namespace}/secrets/{secret}")
            if status != 200:
                return Check(
                    name,
                    False,
                    f"set, but Secret {cluster.namespace}/{secret} is missing (HTTP {status})",
                    fix,
                )
            cert = x509.load_pem_x509_certificate(base64.b64decode(body["data"]["tls.crt"]))
            source = f"Secret {cluster.namespace}/{secret}"
    except (OSError, KeyError, ValueError) as error:
        return Check(name, False, f"cannot read the serving certificate: {error}", fix)
    if not _chains(cert, bundle):
        return Check(name, False, f"does not sign {source}: the apiserver refuses the webhook's TLS", fix)
    return Check(name, True, f"signs {source} (valid until {cert.not_valid_after_utc:%Y-%m-%d})")


# --- 3. reachable and 4. ready --------------------------------------------------------------------
def _get(cluster: Cluster, path: str) -> tuple[int | None, str]:
    """GET ``path`` where the apiserver calls the webhook: the Service through the apiserver's
    proxy, or the URL itself (trusting the registration's caBundle)."""
    hook = cluster.hook
    url = hook["clientConfig"].get("url")
    if url is None:
        service = hook["clientConfig"]["service"]
        proxy = (
            f"/api/v1/namespaces/{service['namespace']}/services/https:{service['name']}:"
            f"{service.get('port', 443)}/proxy{path}"
        )
        status, body = cluster.call("GET", proxy)
        return status, body if isinstance(body, str) else json.dumps(body)
    parts = urllib.parse.urlsplit(url)
    bundle = base64.b64decode(hook["clientConfig"].get("caBundle") or "")
    with tempfile.NamedTemporaryFile("wb", suffix=".pem") as ca:
        ca.write(bundle)
        ca.flush()
        context = ssl.create_default_context(cafile=ca.name) if bundle else ssl.create_default_context()
    target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    try:
        with urllib.request.urlopen(target, context=context, timeout=5) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return None, str(getattr(error, "reason", error))


def reachable(cluster: Cluster) -> Check:
    if cluster.hook is None:
        return Check("reachable", False, "not checked: no webhook registered")
    status, detail = _get(cluster, "/healthz")
    fix = (
        f"kubectl -n {cluster.namespace} get pods,endpointslices -l app.kubernetes.io/name=castslice; "
        f"kubectl -n {cluster.namespace} logs deployment/castslice"
    )
    if status != 200:
        return Check(
            "reachable",
            False,
            f"/healthz from where the apiserver calls it: {status or 'no answer'} ({detail[:120]})",
            fix,
        )
    return Check("reachable", True, "/healthz answers 200 from where the apiserver calls it")


def ready(cluster: Cluster) -> Check:
    if cluster.hook is None:
        return Check("ready", False, "not checked: no webhook registered")
    status, detail = _get(cluster, "/readyz")
    if status != 200:
        return Check(
            "ready",
            False,
            f"/readyz: {status or 'no answer'} ({detail[:120]})",
            "its cluster view has not listed what the configuration watches: see the CRDs and RBAC "
            f"check below and kubectl -n {cluster.namespace} logs deployment/castslice",
        )
    return Check("ready", True, "/readyz answers 200")


# --- 5. the dry run -------------------------------------------------------------------------------
def dry_run(cluster: Cluster, namespace: str) -> Check:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": PROBE_POD,
            "annotations": {"castops.io/optimize": "true", "castops.io/workload-type": "inference"},
        },
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    status, body = cluster.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod, [("dryRun", "All")])
    if status not in (200, 201):
        message = body.get("message") if isinstance(body, dict) else str(body)
        return Check(
            "dry run",
            False,
            f"an opted-in Pod in {namespace} was refused: HTTP {status}: {message}",
            "read the message: a denial names what is wrong",
        )
    limits = body["spec"]["containers"][0].get("resources", {}).get("limits", {})
    if "nvidia.com/gpu" in limits:
        return Check(
            "dry run",
            False,
            f"an opted-in Pod in {namespace} came back unmutated "
            f"(nvidia.com/gpu: {limits['nvidia.com/gpu']})",
            "the call failed and failurePolicy let it through, or the namespace or Pod is excluded: see the "
            "checks above, the apiserver's log and apiserver_admission_webhook_fail_open_count",
        )
    got = ", ".join(f"{k}: {v}" for k, v in sorted(limits.items()))
    return Check("dry run", True, f"an opted-in Pod in {namespace} comes back with {got}")


# --- 6. CRDs and RBAC -----------------------------------------------------------------------------
def configuration(cluster: Cluster, path: str | None) -> Check:
    if path:
        try:
            cluster.config = load_config_file(path)
        except (OSError, ConfigError) as error:
            return Check("configuration", False, f"{path}: {error}", "castslice config validate " + path)
        return Check("configuration", True, f"{path}")
    status, body = cluster.call("GET", f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments/castslice")
    if status != 200:
        # The knative-route overlays: the Knative Service's revision template mounts it.
        status, body = cluster.call(
            "GET", f"/apis/serving.knative.dev/v1/namespaces/{cluster.namespace}/services/castslice"
        )
    volumes = (
        body.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []) if status == 200 else []
    )
    name = next((v["configMap"]["name"] for v in volumes if "configMap" in v), None)
    if name is None:
        cluster.config = Config()
        return Check(
            "configuration",
            True,
            "no castslice Deployment or Knative Service mounting one here: the defaults assumed "
            "(--config FILE to name it)",
            warning=True,
        )
    status, body = cluster.call("GET", f"/api/v1/namespaces/{cluster.namespace}/configmaps/{name}")
    try:
        cluster.config = parse_config(yaml.safe_load(body["data"]["config.yaml"]), f"ConfigMap {name}")
    except (KeyError, TypeError, yaml.YAMLError, ConfigError) as error:
        return Check(
            "configuration",
            False,
            f"ConfigMap {cluster.namespace}/{name}: {error}",
            "castslice config validate",
        )
    return Check("configuration", True, f"ConfigMap {cluster.namespace}/{name}")


def crds_and_rbac(cluster: Cluster, account: str) -> list[Check]:
    config = cluster.config or Config()
    specs = watches_for(config)
    if not specs:
        return [Check("CRDs and RBAC", True, "the configuration watches nothing: none needed")]
    checks = []
    user = f"system:serviceaccount:{cluster.namespace}:{account}"
    for spec in specs:
        what = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
        if spec.group not in ("", "apps", "batch", "resource.k8s.io"):
            status, _ = cluster.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{what}")
            if status != 200:
                checks.append(
                    Check(
                        f"CRD {what}",
                        False,
                        "missing (the configuration watches it)",
                        "apply the component that ships it (knative/components/pod-mutations, ...)",
                    )
                )
                continue
        denied = []
        for verb in ("list", "watch"):
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user,
                    "groups": ["system:serviceaccounts"],
                    "resourceAttributes": {"group": spec.group, "resource": spec.plural, "verb": verb},
                },
            }
            status, body = cluster.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
            if status not in (200, 201) or not body.get("status", {}).get("allowed"):
                denied.append(verb)
        if denied:
            checks.append(
                Check(
                    f"RBAC {what}",
                    False,
                    f"{user} may not {' or '.join(denied)} it",
                    "add the component that grants it, before components/settings "
                    "(knative/components/cluster-view, pod-mutations, ...)",
                )
            )
        else:
            checks.append(Check(f"RBAC {what}", True, f"{account} may list and watch it"))
    return checks


# --- 7. GPU leases -------------------------------------------------------------------------------
def gpu_leases(cluster: Cluster) -> list[Check]:
    config = cluster.config or Config()
    if not config.section("gpuLeases").enabled:
        return []
    checks = []
    missing = []
    for plural, name in LEASE_POLICIES:
        for kind in (plural, f"{plural[:-3]}ybindings"):
            status, body = cluster.call("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
            if status != 200:
                missing.append(f"{kind[:-1]} {name}")
            elif kind == plural and name == STAMP_POLICY:
                account = f"system:serviceaccount:{cluster.namespace}:castslice-control"
                names = json.dumps((body.get("spec") or {}).get("variables") or [])
                if account not in names:
                    checks.append(
                        Check(
                            "stamp policy",
                            False,
                            f"{name} does not name {account}: the controller cannot start queued Pods",
                            "list components/settings after components/gpu-leases (it fills the namespace)",
                        )
                    )
    if missing:
        checks.append(
            Check(
                "lease policies",
                False,
                f"missing: {', '.join(missing)} (the apiserver does not hold the stamp to anything)",
                "kubectl apply -k your overlay with components/gpu-leases",
            )
        )
    else:
        checks.append(
            Check("lease policies", True, f"{len(LEASE_POLICIES)} admission policies and their bindings")
        )
    checks.append(controller_leads(cluster))
    return checks


def controller_leads(cluster: Cluster) -> Check:
    """The controller's Lease is held and was renewed within its duration (by the apiserver's clock
    as written, against ours: a skew of seconds only)."""
    fix = f"kubectl -n {cluster.namespace} get pods -l app.kubernetes.io/component=controller; their logs"
    path = f"/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/leases/{CONTROL_LEASE_NAME}"
    status, body = cluster.call("GET", path)
    if status == 404:
        return Check(
            "controller",
            False,
            "no castslice-control Lease: the controller never ran (leases neither expire nor release)",
            "add components/controller to your overlay",
        )
    if status != 200:
        return Check(
            "controller", False, f"cannot read Lease {cluster.namespace}/{CONTROL_LEASE_NAME}: HTTP {status}"
        )
    spec = body.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    renewed = str(spec.get("renewTime") or "")
    seconds = int(spec.get("leaseDurationSeconds") or 0)
    try:
        age = (datetime.datetime.now(datetime.UTC) - datetime.datetime.fromisoformat(renewed)).total_seconds()
    except ValueError:
        age = float("inf")
    if not holder or age > seconds:
        return Check(
            "controller",
            False,
            f"no leader: Lease {CONTROL_LEASE_NAME} held by {holder or 'nobody'}, renewed {age:.0f}s ago "
            f"(duration {seconds}s)",
            fix,
        )
    return Check("controller", True, f"{holder} leads (renewed {age:.0f}s ago, duration {seconds}s)")


# --- 8. drift -------------------------------------------------------------------------------------
def _created(obj: dict[str, Any]) -> datetime.datetime:
    stamp = str(obj["metadata"].get("creationTimestamp") or "1970-01-01T00:00:00Z")
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def drift(cluster: Cluster, since: datetime.timedelta | None = None) -> Check:
    """Every stored Pod (created within ``since`` when given) judged as the controller's drift
    reconciler judges it: over the view its watches keep (listed here the same way), the Pods in
    pages bounded in bytes."""
    config = cluster.config or Config()
    specs = merge_specs((*watches_for(config), NAMESPACES))
    # Not judged over a view that cannot list, as the controller never does (no work before its
    # watches have listed): one probe per resource with doctor's own credentials, rather than a
    # watcher retrying a missing CRD for 60 s. The CRD and RBAC lines above say what to fix.
    for spec in specs:
        status, _ = cluster.call(
            "GET", collection_path(spec.group, spec.version, spec.plural), query=[("limit", "1")]
        )
        if status != 200:
            what = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
            return Check("drift", False, f"not judged: cannot list {what} (HTTP {status})", warning=True)
    watcher = ClusterWatcher(specs, cluster.api)  # type: ignore[arg-type]
    watcher.start()
    try:
        if not watcher.wait_synced(60):
            return Check(
                "drift",
                False,
                "cannot list what the judgement needs within 60 s",
                "doctor needs list on pods and what the configuration watches",
            )
        view = watcher.snapshot()
    finally:
        watcher.stop()
    now = datetime.datetime.now(datetime.UTC)
    pager = Pager(cluster.api, "/api/v1/pods", {"fieldSelector": POD_FIELD_SELECTOR})
    engine, tally = Engine(config), Tally()
    found: list[Finding] = []
    opted_out = opted_out_in(view)
    while not pager.done:
        try:
            page = pager.next()
        except (ApiError, OSError) as error:
            return Check("drift", False, f"cannot list the Pods: {error}", "doctor needs list on pods")
        if since is not None:
            page = [pod for pod in page if _created(pod) >= now - since]
        found += findings(engine, page, view, tally, opted_out, now)
    which = f"created in the last {since.total_seconds() / 3600:g}h" if since is not None else "stored"
    if not found:
        return Check("drift", True, f"none of the {tally.judged} Pod(s) {which} would be changed today")
    names = ", ".join(f"{f.namespace}/{f.name}" for f in found[:5]) + (" ..." if len(found) > 5 else "")
    uncharged = f"; {tally.uncharged} uncharged by their namespace's GPU lease" if tally.uncharged else ""
    return Check(
        "drift",
        False,
        f"{len(found)} of {tally.judged} Pod(s) {which} were admitted without it ({names}){uncharged}",
        "recreate them (kubectl rollout restart for a workload's); "
        "castslice audit drift --cluster STATE.yaml says what it would change",
        warning=True,
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        api = kube_client(kubeconfig=args.kubeconfig, user_agent="castslice-doctor")
    except Exception as error:  # noqa: BLE001  (no kubeconfig: one line, exit 1)
        print(f"FAIL  kubeconfig: {error}", file=out)
        return EXIT_FAILED
    cluster = Cluster(api, args.namespace)
    since = datetime.timedelta(hours=args.since_hours) if args.since_hours else None
    steps: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        ("registered", lambda: registered(cluster, args.webhook)),
        ("caBundle", lambda: ca_bundle(cluster, args.secret)),
        ("caBundles", lambda: other_ca_bundles(cluster, args.secret)),
        ("reachable", lambda: reachable(cluster)),
        ("ready", lambda: ready(cluster)),
        ("dry run", lambda: dry_run(cluster, args.probe_namespace)),
        ("configuration", lambda: configuration(cluster, args.config)),
        ("CRDs and RBAC", lambda: crds_and_rbac(cluster, args.service_account)),
        ("GPU leases", lambda: gpu_leases(cluster)),
        ("drift", lambda: drift(cluster, since)),
    ]
    failed = False
    for name, step in steps:
        try:
            result = step()
        except Exception as error:  # noqa: BLE001  (a check that cannot run is a failed check)
            result = Check(name, False, api_error_line(error))
        for check in result if isinstance(result, list) else [result]:
            failed |= not check.ok and not check.warning
            for line in check.lines():
                print(line, file=out)
    return EXIT_FAILED if failed else EXIT_OK
