"""Names the function shares with the outside world.

Everything a manifest, a broker trigger or a test must agree with lives here, so that the
Knative manifests, the MutatingWebhookConfiguration and the code cannot drift apart silently:
tests load the manifests and compare them with these constants.
"""

from __future__ import annotations

from typing import Final

# --- HTTP surface -------------------------------------------------------------------------
MUTATE_PATHS: Final = ("/mutate", "/")
"""The apiserver posts AdmissionReviews here (the webhook uses /mutate; / is an alias)."""
WEBHOOK_PATH: Final = "/mutate"
VALIDATE_PODMUTATIONS_PATH: Final = "/validate/podmutations"
"""The validating webhook for PodMutation objects (knative/components/pod-mutations)."""
HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
DEFAULT_PORT: Final = 8080
"""Knative's default container port; the Procfile and manifests pass it as $PORT."""
MAX_BODY_BYTES: Final = 7 * 1024 * 1024
"""Larger bodies get 413: the apiserver's own request limit is 3 MiB, so 7 MiB is never legit."""

# --- Configuration ------------------------------------------------------------------------
CONFIG_ENV: Final = "CASTSLICE_CONFIG"
CONFIG_MOUNT_PATH: Final = "/etc/castslice/config.yaml"
"""Where the Knative Service mounts the ConfigMap (CASTSLICE_CONFIG points here)."""

# --- Cluster-facing names -----------------------------------------------------------------
FUNCTION_NAMESPACE: Final = "castslice-system"
OPT_OUT_LABEL: Final = "castops.io/webhook"
OPT_OUT_VALUE: Final = "ignore"
"""A Pod or namespace labelled castops.io/webhook=ignore is never mutated."""
DEFAULT_EXCLUDED_NAMESPACES: Final = (
    FUNCTION_NAMESPACE,
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "knative-serving",
    "knative-eventing",
    "kourier-system",
    "istio-system",
    "ingress-nginx",
    "cert-manager",
)

# --- Audit events (CloudEvents) -----------------------------------------------------------
EVENT_TYPE_PREFIX: Final = "io.castops.castslice.admission"
OUTCOMES: Final = ("mutated", "unchanged", "denied", "error")
EVENT_TYPES: Final = {outcome: f"{EVENT_TYPE_PREFIX}.{outcome}.v1" for outcome in OUTCOMES}
"""One CloudEvent type per admission outcome, versioned."""
EVENT_EXTENSIONS: Final = ("outcome", "podnamespace", "mutators")
"""Extension attributes every decision event carries, for broker Trigger filters."""
DEFAULT_EVENT_SOURCE: Final = "/castslice/webhook"
