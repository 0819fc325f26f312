"""GPU slicing through Dynamic Resource Allocation: the ResourceClaimTemplates, named and planned.

With ``gpuSlicing.backend: dra`` an opted-in Pod gets one Pod-level claim made from a
ResourceClaimTemplate that asks for one device of the configured class and ``N x perSlice`` of
each configured capacity (NVIDIA's consumable ``shares``, HAMi's ``cores`` and ``memory``). One
template per slice count 1..K lives in every GPU namespace. Its name is computed here, from the
slice count and a digest of the template's spec, so the webhook (which names it in the Pod), the
controller (which keeps it present) and the CLI (which renders it for GitOps) agree without
talking to each other, and a configuration change gives new names (a template's spec is
immutable).

Everything here is pure: the configuration model, the rendering, the name, the records the view
keeps of templates and namespaces, and the plan that turns what exists into what should.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from function.core.configtypes import Strict
from function.core.pod import metadata_of
from function.core.quantity import QuantityError, parse_quantity, times
from function.core.rules import is_dns_label, is_dns_subdomain
from function.core.selectors import LabelSelector
from function.core.view import Record, WatchSpec

API_GROUP = "resource.k8s.io"
API_VERSION = "v1"
TEMPLATE_KIND = "ResourceClaimTemplate"
TEMPLATES_INDEX = "resourceclaimtemplates"
GPU_NAMESPACES_INDEX = "gpu-namespaces"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "castslice"
"""The controller owns exactly the templates carrying this label: it never touches any other, and
the templates the CLI renders for GitOps do not carry it (the GitOps tool owns those)."""
PART_OF_LABEL = "app.kubernetes.io/part-of"
SLICES_LABEL = "castops.io/slices"
DIGEST_ANNOTATION = "castops.io/template-digest"
STALE_SINCE_ANNOTATION = "castops.io/stale-since"
"""Written by the controller on a template of its own that the configuration no longer names (in
seconds since the epoch); the template is deleted once it has been stale for the grace period, so
that Pods admitted by webhook replicas still on the old configuration find it (see ``plan``)."""

REQUEST_NAME = "gpu"
"""The one device request in every template (the name containers could reference as claim/request)."""
MAX_TEMPLATES = 128
"""One template per slice count per namespace: a capacity cut finer than this is refused at load."""
DIGEST_LENGTH = 8

_CAPACITY_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}\Z"
)
"""A device capacity's name: a C identifier, optionally behind a DNS subdomain and "/"."""


# -- configuration ----------------------------------------------------------------------------------
class CapacityShare(Strict):
    """One device capacity a slice consumes: how much one slice takes, how much one device holds."""

    perSlice: str
    perDevice: str

    @field_validator("perSlice", "perDevice")
    @classmethod
    def _quantity(cls, value: str) -> str:
        try:
            amount = parse_quantity(value)
        except QuantityError:
            raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 1, 10, 2Gi)") from None
        if amount <= 0:
            raise ValueError(f"{value!r} must be above 0")
        return value

    def slices(self) -> int:
        """How many slices one device holds of this capacity."""
        return int(Fraction(parse_quantity(self.perDevice)) / Fraction(parse_quantity(self.perSlice)))


class DriverConfig(Strict):
    """The opaque driver configuration every claim carries (one per cluster: NVIDIA's driver
    refuses claims on one GPU whose configurations differ)."""

    driver: str
    parameters: dict[str, Any]

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"{value!r} is not a driver name (a DNS subdomain, e.g. gpu.nvidia.com)")
        return value


def _default_capacity() -> dict[str, CapacityShare]:
    return {"shares": CapacityShare(perSlice="1", perDevice="8")}


class DraConfig(Strict):
    """``gpuSlicing.dra``: how a slice count becomes a ResourceClaimTemplate."""

    deviceClassName: str = "gpu.nvidia.com"
    capacity: dict[str, CapacityShare] = Field(default_factory=_default_capacity)
    """Per device capacity (NVIDIA: ``shares``; HAMi: ``cores`` and ``memory``): what one slice
    consumes and what one device holds. Name every capacity the device publishes without a request
    policy: an unnamed one would be consumed whole by every claim."""
    claimName: str = "castslice-gpu"
    """The Pod-level claim's name, which the GPU containers reference."""
    templatePrefix: str = "castslice-gpu"
    """Templates are named ``<templatePrefix>-<slices>-<digest>``."""
    config: DriverConfig | None = None
    templates: Literal["managed", "external"] = "managed"
    """managed: the controller keeps the templates present; external: you apply them (GitOps,
    ``castslice dra templates``) and the controller leaves them alone."""
    missingTemplate: Literal["deny", "warn"] = "deny"
    """A Pod whose template is not in its namespace: denied, or admitted with a warning (it stays
    Pending until the template exists, then starts)."""
    namespaceSelector: LabelSelector = Field(default_factory=LabelSelector)
    """The GPU namespaces the controller keeps templates in (default: every namespace but the
    excluded ones)."""
    staleTemplateSeconds: int = Field(default=300, ge=0)
    """How long the controller keeps a template of its own after the configuration stopped naming
    it: Pods admitted meanwhile by webhook replicas still on the old configuration need it."""

    @field_validator("deviceClassName")
    @classmethod
    def _class_name(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"{value!r} is not a DeviceClass name (a DNS subdomain, e.g. gpu.nvidia.com)")
        return value

    @field_validator("claimName")
    @classmethod
    def _claim_name(cls, value: str) -> str:
        if not is_dns_label(value):
            raise ValueError(
                f"{value!r} is not a Pod claim name (a DNS label: lower-case letters, digits and '-', "
                "at most 63 characters)"
            )
        return value

    @field_validator("templatePrefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        # <prefix>-<slices>-<digest> must be a DNS subdomain: the prefix leaves room for the rest.
        if not is_dns_subdomain(value) or len(value) > 253 - 4 - DIGEST_LENGTH - 2:
            raise ValueError(
                f"{value!r} is not a template name prefix (lower-case letters, digits, '-' and '.', "
                f"at most {253 - 4 - DIGEST_LENGTH - 2} characters)"
            )
        return value

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, value: dict[str, CapacityShare]) -> dict[str, CapacityShare]:
        if not value:
            raise ValueError("name at least one device capacity a slice consumes (NVIDIA: shares)")
        for name in value:
            if not _CAPACITY_NAME.match(name) or len(name) > 253 + 1 + 32:
                raise ValueError(f"{name!r} is not a device capacity name (e.g. shares, memory)")
        return value

    @model_validator(mode="after")
    def _holds_a_slice(self) -> DraConfig:
        for name, share in self.capacity.items():
            if share.slices() < 1:
                raise ValueError(
                    f"capacity.{name}: perSlice {share.perSlice} is more than perDevice {share.perDevice}"
                )
        if self.max_slices > MAX_TEMPLATES:
            raise ValueError(
                f"a device holds {self.max_slices} slices, which means {self.max_slices} templates per "
                f"namespace; at most {MAX_TEMPLATES}: raise perSlice"
            )
        strategy = _sharing_strategy(self.config)
        if strategy == "MPS" and "shares" in self.capacity:
            raise ValueError(
                "config: NVIDIA's driver refuses sharing strategy MPS on consumable shares; "
                "use TimeSlicing (or no config)"
            )
        return self

    @property
    def max_slices(self) -> int:
        """The largest slice count one device holds: the smallest over the capacities."""
        return min(share.slices() for share in self.capacity.values())

    def holds(self) -> str:
        """What a device holds, for messages: ``8 slices: shares 8, 1 per slice``."""
        parts = ", ".join(
            f"{name} {share.perDevice}, {share.perSlice} per slice" for name, share in self.capacity.items()
        )
        return f"{self.max_slices} slices: {parts}"


def _sharing_strategy(config: DriverConfig | None) -> object:
    if config is None:
        return None
    sharing = config.parameters.get("sharing")
    return sharing.get("strategy") if isinstance(sharing, Mapping) else None


# -- the templates ----------------------------------------------------------------------------------
def template_spec(config: DraConfig, slices: int) -> dict[str, Any]:
    """The ``spec`` of the template for ``slices`` slices (what the digest is taken over)."""
    exactly: dict[str, Any] = {
        "deviceClassName": config.deviceClassName,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {
            "requests": {
                name: times(share.perSlice, slices) for name, share in sorted(config.capacity.items())
            }
        },
    }
    devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
    if config.config is not None:
        devices["config"] = [
            {
                "requests": [REQUEST_NAME],
                "opaque": {"driver": config.config.driver, "parameters": config.config.parameters},
            }
        ]
    return {
        # The claims made from it say what they are (kubectl get resourceclaims -l castops.io/slices).
        "metadata": {"labels": {PART_OF_LABEL: MANAGED_BY_VALUE, SLICES_LABEL: str(slices)}},
        "spec": {"devices": devices},
    }


def digest(spec: Mapping[str, Any]) -> str:
    """A short digest of a template spec: sha256 of its canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LENGTH]


@dataclass(frozen=True)
class Template:
    slices: int
    name: str
    digest: str
    spec: dict[str, Any]
    milli_gpu: int = 0
    """The share of one device a claim made from it takes, in milli-GPU (rounded up): the
    largest over its capacities of slices x perSlice / perDevice."""

    def manifest(self, namespace: str, *, managed: bool) -> dict[str, Any]:
        """The object to apply; ``managed``: labelled as the controller's own."""
        labels = {PART_OF_LABEL: MANAGED_BY_VALUE, SLICES_LABEL: str(self.slices)}
        if managed:
            labels[MANAGED_BY_LABEL] = MANAGED_BY_VALUE
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": TEMPLATE_KIND,
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": labels,
                "annotations": {DIGEST_ANNOTATION: self.digest},
            },
            "spec": json.loads(json.dumps(self.spec)),
        }


def device_share(config: DraConfig, slices: int) -> Fraction:
    """The fraction of one device ``slices`` slices take (the largest over the capacities)."""
    return min(
        max(
            Fraction(parse_quantity(share.perSlice)) * slices / Fraction(parse_quantity(share.perDevice))
            for share in config.capacity.values()
        ),
        Fraction(1),
    )


def template(config: DraConfig, slices: int) -> Template:
    spec = template_spec(config, slices)
    spec_digest = digest(spec)
    share = device_share(config, slices)
    milli = -(-share.numerator * 1000 // share.denominator)
    return Template(slices, f"{config.templatePrefix}-{slices}-{spec_digest}", spec_digest, spec, milli)


def templates(config: DraConfig) -> tuple[Template, ...]:
    """Every template a GPU namespace holds: one per slice count 1..K."""
    return tuple(template(config, slices) for slices in range(1, config.max_slices + 1))


# -- what the view keeps ----------------------------------------------------------------------------
class TemplateRecord(NamedTuple):
    namespace: str
    name: str
    managed: bool
    """Labelled as the controller's own (MANAGED_BY_LABEL)."""
    stale_since: str = ""


def template_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def slim_template(obj: Mapping[str, Any]) -> TemplateRecord | None:
    metadata = metadata_of(obj)
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        return None
    stale = _map(metadata.get("annotations")).get(STALE_SINCE_ANNOTATION)
    return TemplateRecord(
        namespace,
        name,
        _map(metadata.get("labels")).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE,
        stale if isinstance(stale, str) else "",
    )


def key_of_template(obj: Mapping[str, Any]) -> str:
    metadata = metadata_of(obj)
    namespace, name = metadata.get("namespace"), metadata.get("name")
    return template_key(namespace, name) if isinstance(namespace, str) and isinstance(name, str) else ""


def _namespace_of(record: Record) -> str:
    return record.namespace if isinstance(record, TemplateRecord) else ""


TEMPLATES = WatchSpec(
    index=TEMPLATES_INDEX,
    group=API_GROUP,
    version=API_VERSION,
    plural="resourceclaimtemplates",
    kind=TEMPLATE_KIND,
    slim=slim_template,
    key=key_of_template,
    metadata_only=True,
    group_by=_namespace_of,
)
"""ResourceClaimTemplates' metadata, keyed ``namespace/name`` and grouped by namespace: the webhook
asks "is the template this Pod will use there?", the controller "which templates has this
namespace?"."""


class NamespaceState(NamedTuple):
    name: str
    labels: tuple[tuple[str, str], ...]
    terminating: bool


def slim_namespace_state(obj: Mapping[str, Any]) -> NamespaceState | None:
    metadata = metadata_of(obj)
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    labels = _map(metadata.get("labels"))
    return NamespaceState(
        name,
        tuple(sorted((str(key), str(value)) for key, value in labels.items())),
        metadata.get("deletionTimestamp") is not None,
    )


def _name_key(obj: Mapping[str, Any]) -> str:
    name = metadata_of(obj).get("name")
    return name if isinstance(name, str) else ""


GPU_NAMESPACES = WatchSpec(
    index=GPU_NAMESPACES_INDEX,
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    slim=slim_namespace_state,
    key=_name_key,
    namespaced=False,
    metadata_only=True,
)
"""Namespaces (name, labels, terminating), keyed by name: where the controller keeps templates."""


# -- the controller's plan --------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    """One change the controller makes: ``create`` a template, ``mark`` one of its own stale (an
    annotation), ``unmark`` one the configuration names again, or ``delete`` one stale long enough."""

    verb: Literal["create", "mark", "unmark", "delete"]
    namespace: str
    name: str
    manifest: Mapping[str, Any] | None = None
    """``create``: the template to create."""
    stamp: str = ""
    """``mark``: the STALE_SINCE_ANNOTATION value (seconds since the epoch)."""

    def describe(self) -> str:
        return f"{self.verb} {TEMPLATE_KIND} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    recheck_after: float | None
    """Seconds until a stale template's grace ends (plan again then), or None."""


def gpu_namespaces(
    config: DraConfig, excluded: Iterable[str], namespaces: Iterable[NamespaceState]
) -> list[str]:
    """The namespaces that should hold the templates, sorted."""
    skip = frozenset(excluded)
    return sorted(
        ns.name
        for ns in namespaces
        if not ns.terminating and ns.name not in skip and config.namespaceSelector.matches(dict(ns.labels))
    )


def plan(
    config: DraConfig,
    excluded: Iterable[str],
    namespaces: Iterable[NamespaceState],
    existing: Iterable[TemplateRecord],
    now: float,
) -> Plan:
    """What to do so that every GPU namespace holds every template of ``config``: create what is
    missing; of the templates the controller owns and the configuration no longer names, mark them
    stale, and delete them ``staleTemplateSeconds`` later. A template it does not own is never
    touched: one with a wanted name counts as present (applied by GitOps, say)."""
    wanted = templates(config)
    namespaces = list(namespaces)
    # A terminating namespace takes its templates with it: nothing to create or clean up there.
    closing = {state.name for state in namespaces if state.terminating}
    by_key = {template_key(t.namespace, t.name): t for t in existing}
    actions: list[Action] = []
    desired: set[str] = set()
    for namespace in gpu_namespaces(config, excluded, namespaces):
        for item in wanted:
            key = template_key(namespace, item.name)
            desired.add(key)
            found = by_key.get(key)
            if found is None:
                actions.append(Action("create", namespace, item.name, item.manifest(namespace, managed=True)))
            elif found.managed and found.stale_since:
                actions.append(Action("unmark", namespace, item.name))
    recheck: float | None = None
    grace = float(config.staleTemplateSeconds)
    for key, record in sorted(by_key.items()):
        if key in desired or not record.managed or record.namespace in closing:
            continue
        since = _seconds(record.stale_since)
        left = grace if since is None else since + grace - now
        if left <= 0:
            actions.append(Action("delete", record.namespace, record.name))
            continue
        if since is None:
            actions.append(Action("mark", record.namespace, record.name, stamp=f"{now:.0f}"))
        recheck = left if recheck is None else min(recheck, left)
    return Plan(tuple(actions), recheck)


def _seconds(text: str) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None  # not ours to trust: marked again, the grace starts over
