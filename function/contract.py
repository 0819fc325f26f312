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
VALIDATE_GPULEASES_PATH: Final = "/validate/gpuleases"
"""The validating webhook for PodMutation objects (knative/components/pod-mutations)."""
HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
DEFAULT_PORT: Final = 8080
"""Knative's default container port; the Procfile and manifests pass it as $PORT."""
LOCAL_HOST: Final = "127.0.0.1"
"""Where ``castslice serve`` and ``castslice control`` listen unless told otherwise: loopback, so a
laptop's plain-HTTP webhook is not offered on every interface. The image sets ``HOST=0.0.0.0``
(a container's own network), and every manifest passes ``--host 0.0.0.0`` itself."""
CONTROL_PORT: Final = 8081
"""``castslice control``'s /healthz, /readyz and /metrics, unless told otherwise: not
``castslice serve``'s 8080, so the two run side by side on one machine."""
MAX_BODY_BYTES: Final = 7 * 1024 * 1024
"""Larger bodies get 413: the apiserver's own request limit is 3 MiB, so 7 MiB is never legit."""
LARGE_REVIEWS_ENV: Final = "CASTSLICE_LARGE_REVIEWS"
"""``process``: large reviews are decided in a child process; anything else: on the event loop, as
any review. Unset, ``castslice serve`` offloads them (the child reads the worker's cluster view),
and functions-framework's ``mutate`` target does not; the Knative Functions instance never does."""
LARGE_BODY_BYTES: Final = 256 * 1024
"""Reviews with a larger body are decided in a separate process, off the event loop
(function/serve/offload.py)."""
LARGE_REVIEW_SECONDS: Final = 3.5
"""A large review not decided this long after it arrived is refused, saying why and to create the
Pod again (``Engine.undecided``): below the shipped registrations' 5 s timeout, so the apiserver
gets the webhook's own answer, recorded and audited, rather than applying failurePolicy (which
would admit the Pod past every policy) to a call that timed out."""
MAX_HEADER_BYTES: Final = 64 * 1024
"""Request line plus headers; more gets 431 and the connection closed. The apiserver sends < 1 KiB."""
HEADER_READ_SECONDS: Final = 5.0
"""From a request's first byte to the end of its headers; slower gets 408 and the connection closed."""
BODY_READ_SECONDS: Final = 10.0
"""From the end of the headers to the end of the body (3 MiB at 2.5 Mbit/s); slower gets 408.
Below the apiserver's longest webhook timeout (30 s), so a stalled client cannot hold a slot longer."""
WRITE_SECONDS: Final = 10.0
"""How long the server's send buffer may stay full (a client that sends requests and never reads
the replies, pipelined); then the connection is dropped, freeing what it holds."""
KEPT_ALIVE_IDLE_SECONDS: Final = 120.0
"""A connection kept alive after a reply, with no request in progress, is closed after this. Longer
than the apiserver's own idle limit (90 s: Go's http.DefaultTransport, whose value client-go's
transports keep), so the apiserver ends its idle connections itself: a server closing first races
with a review sent on that connection at the same moment, a POST the apiserver does not retry, and
the Pod is admitted unmutated (failurePolicy: Ignore). At shutdown too, an idle connection is left
to its client (function/serve/protocol.py ``shutdown``)."""
IDLE_KEEPALIVE_SECONDS: Final = KEPT_ALIVE_IDLE_SECONDS
"""A new connection that has not sent its first byte is closed after this: as long as a kept-alive
one, for the same reason. Go's transport keeps a connection it dialled for a request that another
connection served meanwhile in its idle pool, and sends a later review on it."""
SHUTDOWN_LINGER_SECONDS: Final = 2.0
"""After the FIN that ends a connection (at shutdown, or after a 408/431), how long the client's
late bytes are read and dropped before the socket closes: closing with bytes unread would reset."""
SHUTDOWN_DRAIN_SECONDS: Final = 5.0
"""After SIGTERM, how long ``castslice serve`` keeps accepting and answering (``/readyz`` 503, every
reply ``connection: close``) before it stops accepting: the Service keeps sending new connections to
a terminating Pod until the endpoint change reaches every node. ``CASTSLICE_DRAIN_SECONDS`` sets it."""
DRAIN_SECONDS_ENV: Final = "CASTSLICE_DRAIN_SECONDS"
MAX_JSON_DEPTH: Final = 254
"""Deepest nesting of arrays and objects in a request body (the whole AdmissionReview); deeper is
a 400. A real Pod is about 20 levels deep. 254 is the depth orjson's encoder can write, so every
body accepted can also be compared and serialized without recursion anywhere."""
MAX_QUOTED_CHARS: Final = 200
"""The longest piece of client input any error message (reply or log line) quotes."""

DISTRIBUTION: Final = "function"
"""The project's name on PyPI terms: Knative Functions' builder installs the project as
``function @ <path>`` and pip refuses any other name (the command is still ``castslice``)."""

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
LEASE_EVENT_TYPE_PREFIX: Final = "io.castops.castslice.gpulease"
LEASE_STEPS: Final = (
    "Activated",
    "OverCommitted",
    "Expired",
    "Released",
    "Invalid",
    "PodsOutliveLease",
    "Evicted",
    "EvictionBlocked",
    "FinalizerBlocks",
    "Queued",
    "Closed",
    "Exhausted",
    "PeriodClosed",
    "EndingSoon",
)
LEASE_EVENT_TYPES: Final = {step: f"{LEASE_EVENT_TYPE_PREFIX}.{step.lower()}.v1" for step in LEASE_STEPS}
"""One CloudEvent type per GpuLease step the lease controller emits, versioned: the lease's
lifecycle (a recurring window Closed, a budget Exhausted, and each budget period closed with its
GPU-hours: PeriodClosed, the chargeback record), and what it did or says to one of its Pods
(Evicted, EvictionBlocked, FinalizerBlocks, Queued, EndingSoon)."""
CONTROL_EVENT_SOURCE: Final = "/castslice/control"

# --- What the manifests install that certgen and doctor look after ------------------------------
LEASE_POLICIES: Final = (
    ("mutatingadmissionpolicies", "castslice-gpulease-witness"),
    ("validatingadmissionpolicies", "castslice-gpulease-stamp"),
    ("validatingadmissionpolicies", "castslice-gpulease-forged"),
    ("validatingadmissionpolicies", "castslice-gpulease-required"),
    ("validatingadmissionpolicies", "castslice-gpulease-templates"),
)
"""The admission policies components/gpu-leases installs (each with a binding of its name): the
apiserver's own enforcement of the stamp (tests/deploy keeps this in step)."""
STAMP_POLICY: Final = "castslice-gpulease-stamp"
"""The policy that names the controller's ServiceAccount (the only one that may ungate)."""

# --- The castslice command --------------------------------------------------------------------
EXIT_DENIED: Final = 1
"""``castslice mutate``: the webhook would deny at least one object."""
EXIT_BAD_INPUT: Final = 2
"""An input the command cannot read or judge (a file, a document, a configuration, a state file)."""
EXIT_INTERNAL: Final = 3
"""A bug: an exception escaped a program, or the engine answered with an internal error."""
EXIT_BROKEN_PIPE: Final = 141
"""128 + SIGPIPE: what a shell reports for a tool whose reader went away (``| head``)."""
ENGINE_VERSION: Final = "0.1.0"
"""The decision engine's version, in ``castslice --version`` and every decision event."""

# The defaults the parser of function/cli.py shows, here rather than in the programs: the parser
# is built for every command, and must not import a program (its imports) to state a default.
SERVE_TARGETS: Final = {"mutate": "the admission webhook", "audit": "the reference audit consumer"}
"""What ``castslice serve --target`` may name: functions-framework targets in function/func.py."""
CONTROL_LEASE_NAME: Final = "castslice-control"
"""The controller's leader-election Lease (knative/components/controller names it in its Role;
``castslice doctor`` reads who leads)."""
LEASE_SECONDS: Final = 15.0
RENEW_DEADLINE_SECONDS: Final = 10.0
RETRY_SECONDS: Final = 2.0
"""client-go's leader-election defaults: lease duration, renew deadline, retry period."""
WEBHOOK_TLS_SECRET: Final = "castslice-serving-tls"
WEBHOOK_SERVICE: Final = "castslice"
MUTATING_CONFIGURATIONS: Final = ("castslice",)
"""Every MutatingWebhookConfiguration the manifests install (tests/deploy keeps this in step)."""
VALIDATING_CONFIGURATIONS: Final = ("castslice-podmutations", "castslice-gpuleases")
"""Every ValidatingWebhookConfiguration the manifests install (components/pod-mutations,
components/gpu-leases), each calling the webhook's Service with the serving certificate: what
``castslice certgen`` writes the CA into, and ``castslice doctor`` checks, by default."""
CERT_RENEW_BEFORE_DAYS: Final = 30
AUDIT_DB_ENV: Final = "CASTSLICE_AUDIT_DB"
DEFAULT_AUDIT_DB: Final = "castslice-audit.sqlite3"
AUDIT_VIEWS: Final = ("summary", "list", "rejected", "drift")
AUDIT_BUCKETS: Final = {"minute": 16, "hour": 13, "day": 10}
"""Time-bucket widths as prefix lengths of the stored time (2025-01-31T12:34:...)."""
