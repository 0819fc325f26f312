"""GPU leases: the GpuLease object, its validation, what a Pod is charged, and the lease arithmetic.

Pure: no clock (the time comes with the view), no I/O. Shared by the webhook's ``gpuLeases``
mutator, the controller's lease reconciler and the offline commands, so all three count alike.

The unit is the milli-GPU (an int): a whole GPU is 1000, a time slice 1000 / replicas of its model
(rounded up), a MIG profile ``<g>g.<mem>gb`` g/7 of a GPU, a vGPU share ``count x max(memory %,
cores %)``. A Pod's charge is what the scheduler would reserve: ``max(sum(app) + sum(sidecars),
max over init containers of (init + sidecars started before it))``.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from typing import Any, NamedTuple

from function.core.budget import Budget, BudgetNow, budget_now, parse_hours
from function.core.families import ModelFamilies, expand, named_models
from function.core.pod import controller_of, metadata_of
from function.core.quantity import QuantityError, parse_quantity
from function.core.schedule import (
    MAX_OCCURRENCE,
    NO_ZONES,
    PERIODS,
    Recurrence,
    Span,
    ZoneTable,
    parse_cron,
    span_at,
    zone_of,
)
from function.core.selectors import Requirement, compile_selector, selector_problems, selects
from function.core.view import WatchSpec, name_of

GROUP, VERSION, PLURAL, KIND = "castops.io", "v1alpha1", "gpuleases", "GpuLease"
API_VERSION = f"{GROUP}/{VERSION}"

LEASE_LABEL = "castops.io/gpu-lease"
"""On a Pod the webhook charged: the name of its lease (the Pod watch selects on it)."""
CHOICE_ANNOTATION = "castops.io/gpu-lease"
"""Set by the user on a Pod (or its template): the lease to charge it to, by name."""
STATE_LABEL = "castops.io/gpu-lease-state"
"""``charged`` (counts as used), ``queued`` (gated: counts as queued), ``overflow`` (beyond the lease,
on spot: counts apart), ``audit`` (admitted by an Audit lease beyond its count: counts as used)."""
CHARGE_ANNOTATION = "castops.io/gpu-lease-charge"
"""The Pod's charge in milli-GPU, as a quantity: ``1000m`` for one whole GPU."""
DECISION_ANNOTATION = "castops.io/gpu-lease-decision"
"""The admission uid that charged the Pod: the webhook's ledger matches its own decisions by it."""
PRIORITY_ANNOTATION = "castops.io/gpu-lease-priority"
"""The Pod's spec.priority at admission (queued Pods are started by priority, then age)."""
ENDS_ANNOTATION = "castops.io/gpu-lease-ends"
"""When the lease's time for the Pod ends (the window's end, or the end of the current occurrence
of a recurring window; RFC 3339), readable by the Pod through the downward API. Written by the
webhook at admission and by the controller when it starts a queued Pod or the end moves."""
MODEL_ANNOTATION = "castops.io/gpu-lease-model"
"""On a Pod charged to a lease of several models or a family: the model it is charged as (the
Pod is pinned to it), counted against that model's cap (``spec.caps``) and shown per model in
the lease's status. Absent when the Pod may run on any of several uncapped models of the lease."""
GATE = "castops.io/gpu-lease"
"""The scheduling gate of a queued Pod; the controller removes it when the Pod fits the lease."""
FINALIZER = "castops.io/gpu-lease-release"
FORGED_ANNOTATION = "castops.io/gpu-lease-forged"
"""Written by the apiserver itself (the MutatingAdmissionPolicy ``castslice-gpulease-witness``,
which runs once, before any webhook) on a Pod created with stamp keys of its own: which keys the
creator wrote. The webhook and the ValidatingAdmissionPolicy refuse such a Pod; the webhook's own
stamp never carries it, whatever reinvocations follow."""
STAMP_LABELS = ("castops.io/gpu-lease", "castops.io/gpu-lease-state")
STAMP_ANNOTATIONS = (
    "castops.io/gpu-lease-charge",
    "castops.io/gpu-lease-decision",
    "castops.io/gpu-lease-priority",
    "castops.io/gpu-lease-ends",
    "castops.io/gpu-lease-model",
)
"""The keys only CastSlice writes (the choice annotation ``castops.io/gpu-lease`` is the user's)."""
REQUIRED_LABEL = "castops.io/gpu-leases"
REQUIRED_VALUE = "required"
"""The namespace label (set by the platform team: a tenant with ``edit`` cannot label its
namespace) under which every GPU Pod needs a lease of its model, with or without a GpuLease in it."""
CHARGE_LIMIT = 10**18
"""milli-GPU: a charge is never written above this (a quantity of 1e400 GPUs is 'more than any
lease' all the same, and stays a number every metric and message can show)."""

CHARGED, QUEUED, OVERFLOW, AUDIT = "charged", "queued", "overflow", "audit"
STATES = (CHARGED, QUEUED, OVERFLOW, AUDIT)


class Enforcement(StrEnum):
    Deny = "Deny"
    Queue = "Queue"
    Audit = "Audit"


class Overflow(StrEnum):
    none = "None"
    Preemptible = "Preemptible"


class ExpiryAction(StrEnum):
    StopAdmitting = "StopAdmitting"
    Evict = "Evict"


class Phase(StrEnum):
    Pending = "Pending"
    Active = "Active"
    Closed = "Closed"
    """A recurring window between two of its occurrences: nothing is admitted until it opens."""
    Exhausted = "Exhausted"
    """The budget of this period is spent: nothing is admitted until the next period."""
    Expired = "Expired"
    Released = "Released"
    Invalid = "Invalid"
    """A lease with problems (it skipped validation): nothing is charged to it."""


# -- the GpuLease object --------------------------------------------------------------------------
LABEL_VALUE_LIMIT = 63


def lease_label(name: str) -> str:
    """The value of LEASE_LABEL for the lease ``name``: the name itself when it is a label value
    (at most 63 characters), else its first 52 and a digest of the whole name (GpuLease names may
    be 253 long: every name works, and two long names sharing their start stay apart)."""
    if len(name) <= LABEL_VALUE_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:52].rstrip('-.')}-{digest}"


LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_DURATION = re.compile(r"^(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?\Z")
SPEC_FIELDS = (
    "gpuModel",
    "gpuModels",
    "caps",
    "count",
    "window",
    "duration",
    "podSelector",
    "priority",
    "enforcement",
    "overflow",
    "onExpiry",
    "budget",
)
DEFAULT_GRACE_SECONDS = 300
DEFAULT_NOTICE_SECONDS = 600
"""``onExpiry.noticeSeconds``: a charged Pod gets an Event this long before its lease ends (or
its eviction, when the budget is spent), so its job can checkpoint."""
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""A window's edges lie in [EARLIEST, LATEST): far enough from datetime's year 9999 that an end
plus the longest duration and grace is still a time (a lease meant to never end has no end)."""
MAX_DURATION_HOURS = 876_000
"""100 years: ``87600000h`` (a typo for 10 years) is refused rather than overflowing every
reader of the lease."""
MAX_GRACE_SECONDS = 2_592_000
"""30 days: ``onExpiry.gracePeriodSeconds`` at most (the CRD's maximum too)."""
MAX_PRIORITY = 2**31 - 1
"""``spec.priority`` is an int32, as a PriorityClass's value is."""
MAX_COUNT_MILLI = 10**12
MAX_BUDGET_HOURS = 10**9
"""``spec.budget.gpuHours`` at most (a thousand times the largest count for a year's hours)."""
MIN_PERIOD_SECONDS = 60
MAX_PERIOD_HOURS = 8784
"""``spec.budget.length`` from a minute to a leap year."""
_ZONE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,2}\Z")
_BUDGET_HOURS = re.compile(r"^[0-9]{1,10}(\.[0-9]{1,6})?\Z")


def parse_time(raw: Any) -> datetime | None:
    """An RFC 3339 date-time (``2026-11-27T18:00:00Z``) as an aware UTC datetime; None if invalid
    or outside [EARLIEST, LATEST) (``time_problem`` says which)."""
    if not isinstance(raw, str) or "T" not in raw.upper() or len(raw) > 64:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("z", "Z")).astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    if moment.tzinfo is None or not EARLIEST <= moment < LATEST:
        return None
    return moment


def time_problem(raw: Any) -> str | None:
    """Why ``raw`` is not a window edge (None: it is one)."""
    if parse_time(raw) is not None:
        return None
    shown = repr(raw)[:70]
    if isinstance(raw, str) and "T" in raw.upper() and len(raw) <= 64:
        try:
            datetime.fromisoformat(raw.replace("z", "Z")).astimezone(UTC)
        except (ValueError, OverflowError):
            pass
        else:
            return (
                f"{shown} is outside {until(EARLIEST)} .. {until(LATEST)} (a lease without end has "
                "no window.end and no duration)"
            )
    return f"{shown} is not an RFC 3339 date-time (2026-11-27T18:00:00Z)"


def parse_duration(raw: Any) -> timedelta | None:
    """``72h``, ``8h30m``, ``90m``, ``45s``: hours, minutes, seconds (Go's form, whole units);
    None when not that form, not positive, or longer than MAX_DURATION_HOURS."""
    if not isinstance(raw, str) or not raw or len(raw) > 32:
        return None
    match = _DURATION.match(raw)
    if match is None:
        return None
    seconds = int(match["h"] or 0) * 3600 + int(match["m"] or 0) * 60 + int(match["s"] or 0)
    if not 0 < seconds <= MAX_DURATION_HOURS * 3600:
        return None
    return timedelta(seconds=seconds)


def parse_count(raw: Any) -> int | None:
    """GPU-equivalents (``8``, ``0.5``, ``"2500m"``) -> milli-GPU; None when not a positive amount
    with at most milli precision (and at most MAX_COUNT_MILLI)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, float):
        raw = repr(raw)
    if isinstance(raw, str) and len(raw) > 32:
        return None
    if isinstance(raw, int) and not 0 < raw <= MAX_COUNT_MILLI:
        return None
    try:
        value = Fraction(parse_quantity(raw))
    except (QuantityError, ValueError, TypeError, OverflowError):
        return None
    milli = value * 1000
    if milli <= 0 or milli.denominator != 1 or milli > MAX_COUNT_MILLI:
        return None
    return int(milli)


def whole_number(raw: Any, low: int, high: int) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool) and low <= raw <= high


def lease_problems(
    obj: Any, zones: Mapping[str, ZoneTable] | None = None, families: ModelFamilies | None = None
) -> list[str]:
    """Every invalid field of a GpuLease, each named (what the CRD schema and CEL cannot check
    is checked here too, so a lease that skipped the schema is refused alike). With ``zones``
    (the edge's tz database) a time zone must be one it knows; without, one of the right form.
    With ``families`` (``gpuLeases.modelFamilies``) a cap must name one of the lease's models."""
    if not isinstance(obj, Mapping):
        return ["not an object"]
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return ["spec: required (gpuModel and count at least)"]
    problems = [
        f"spec.{key}: unknown field (known: {', '.join(SPEC_FIELDS)})"
        for key in spec
        if key not in SPEC_FIELDS
    ]
    problems.extend(model_problems(spec, families))
    if "count" not in spec:
        problems.append("spec.count: required, the GPU-equivalents leased (e.g. 8, or 0.5)")
    elif parse_count(spec.get("count")) is None:
        problems.append(
            f"spec.count: {repr(spec.get('count'))[:40]} is not a positive amount with at most 3 decimals"
        )
    window = spec.get("window")
    start = end = None
    if window is not None:
        if not isinstance(window, Mapping):
            problems.append("spec.window: must be an object with start and/or end")
        else:
            problems.extend(
                f"spec.window.{key}: unknown field (known: start, end, recurrence)"
                for key in window
                if key not in ("start", "end", "recurrence")
            )
            if "recurrence" in window:
                problems.extend(recurrence_problems(window["recurrence"], zones))
            for key in ("start", "end"):
                problem = time_problem(window[key]) if key in window else None
                if problem is not None:
                    problems.append(f"spec.window.{key}: {problem}")
            start, end = parse_time(window.get("start")), parse_time(window.get("end"))
            if start is not None and end is not None and end <= start:
                problems.append("spec.window.end: must be after spec.window.start")
    if "duration" in spec:
        if parse_duration(spec["duration"]) is None:
            problems.append(
                f"spec.duration: {repr(spec['duration'])[:40]} is not a positive duration of at most "
                f"{MAX_DURATION_HOURS}h (72h, 8h30m, 90m)"
            )
        if isinstance(window, Mapping) and "end" in window:
            problems.append("spec.duration: give spec.window.end or spec.duration, not both")
    problems.extend(selector_problems(spec.get("podSelector"), "spec.podSelector"))
    priority = spec.get("priority")
    if priority is not None and not whole_number(priority, -MAX_PRIORITY - 1, MAX_PRIORITY):
        problems.append(f"spec.priority: {repr(priority)[:40]} is not a whole number that fits an int32")
    for key, kind in (("enforcement", Enforcement), ("overflow", Overflow)):
        if key in spec and not _one_of(kind, spec[key]):
            problems.append(f"spec.{key}: {spec[key]!r} is not one of {', '.join(e.value for e in kind)}")
    expiry = spec.get("onExpiry")
    if expiry is not None:
        if not isinstance(expiry, Mapping):
            problems.append("spec.onExpiry: must be an object (action, gracePeriodSeconds)")
        else:
            problems.extend(
                f"spec.onExpiry.{key}: unknown field (known: action, gracePeriodSeconds, noticeSeconds)"
                for key in expiry
                if key not in ("action", "gracePeriodSeconds", "noticeSeconds")
            )
            notice = expiry.get("noticeSeconds")
            if notice is not None and not whole_number(notice, 0, MAX_GRACE_SECONDS):
                problems.append(
                    f"spec.onExpiry.noticeSeconds: {repr(notice)[:40]} is not a whole number "
                    f"from 0 to {MAX_GRACE_SECONDS} (30 days)"
                )
            if "action" in expiry and not _one_of(ExpiryAction, expiry["action"]):
                problems.append(
                    f"spec.onExpiry.action: {expiry['action']!r} is not one of StopAdmitting, Evict"
                )
            grace = expiry.get("gracePeriodSeconds")
            if grace is not None and not whole_number(grace, 0, MAX_GRACE_SECONDS):
                problems.append(
                    f"spec.onExpiry.gracePeriodSeconds: {repr(grace)[:40]} is not a whole number "
                    f"from 0 to {MAX_GRACE_SECONDS} (30 days)"
                )
    if "budget" in spec:
        problems.extend(budget_problems(spec["budget"], zones))
    return problems


MAX_MODELS = 16
"""``spec.gpuModels`` at most (a family of the configuration counts as one)."""


def _label_value_problem(raw: Any, where: str) -> str | None:
    if not isinstance(raw, str) or not raw:
        return f"{where}: {repr(raw)[:40]} is not a GPU model (a value of the model node label)"
    if len(raw) > LABEL_VALUE_LIMIT or not LABEL_VALUE.match(raw):
        return f"{where}: {raw[:70]!r} is not a label value (at most 63 of A-Z a-z 0-9 - _ .)"
    return None


def model_problems(spec: Mapping[str, Any], families: ModelFamilies | None = None) -> list[str]:
    """``spec.gpuModel`` (one model or a family) or ``spec.gpuModels`` (several), exactly one of
    them, and ``spec.caps`` (at most so many GPUs of one of those models)."""
    problems: list[str] = []
    listed = spec.get("gpuModels")
    if "gpuModel" in spec and "gpuModels" in spec:
        problems.append("spec.gpuModels: give spec.gpuModel or spec.gpuModels, not both")
    if "gpuModels" in spec:
        if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_MODELS:
            problems.append(
                f"spec.gpuModels: must be a list of 1 to {MAX_MODELS} GPU models or families "
                "(values of the model node label, or names in gpuLeases.modelFamilies)"
            )
        else:
            for at, name in enumerate(listed):
                problem = _label_value_problem(name, f"spec.gpuModels[{at}]")
                if problem:
                    problems.append(problem)
            if len(set(map(str, listed))) != len(listed):
                problems.append("spec.gpuModels: names a model twice")
    elif "gpuModel" not in spec or not spec.get("gpuModel"):
        problems.append(
            "spec.gpuModel: required (or spec.gpuModels), the value of the GPU model node label "
            "(e.g. NVIDIA-H100-80GB-HBM3) or a family of gpuLeases.modelFamilies"
        )
    else:
        problem = _label_value_problem(spec.get("gpuModel"), "spec.gpuModel")
        if problem:
            problems.append(problem)
    caps = spec.get("caps")
    if "caps" in spec:
        if not isinstance(caps, Mapping):
            problems.append("spec.caps: must be a map from a model of the lease to a count (NVIDIA-H200: 2)")
        else:
            covered = None
            if families is not None and not problems:
                names = listed if isinstance(listed, list) else [spec.get("gpuModel")]
                covered = expand((str(n) for n in names), families)
            for model, raw in caps.items():
                where = f"spec.caps.{model}"
                problem = _label_value_problem(model, where)
                if problem:
                    problems.append(problem)
                elif covered is not None and model not in covered:
                    problems.append(f"{where}: not one of the lease's models ({', '.join(covered)})")
                if parse_count(raw) is None:
                    problems.append(
                        f"{where}: {repr(raw)[:40]} is not a positive amount with at most 3 decimals"
                    )
    return problems


def parse_caps(raw: Any) -> tuple[tuple[str, int], ...]:
    """``spec.caps`` as (model, milli-GPU) pairs; the invalid ones left out."""
    if not isinstance(raw, Mapping):
        return ()
    found = []
    for model, amount in raw.items():
        milli = parse_count(amount)
        if isinstance(model, str) and milli is not None:
            found.append((model, milli))
    return tuple(sorted(found))


def display_model(spec: Mapping[str, Any]) -> str:
    """How a lease's models are shown (messages, metric labels): ``gpuModel``, or the names of
    ``gpuModels`` joined with ``|``."""
    listed = spec.get("gpuModels")
    if isinstance(listed, list):
        return "|".join(str(name) for name in listed)
    return str(spec.get("gpuModel") or "")


ZONE_EXAMPLES = "Europe/Berlin, America/New_York, UTC"


def zone_problem(raw: Any, where: str, zones: Mapping[str, ZoneTable] | None) -> str | None:
    if not isinstance(raw, str) or not _ZONE_NAME.match(raw) or len(raw) > 64:
        return f"{where}: {repr(raw)[:70]} is not an IANA time zone name ({ZONE_EXAMPLES})"
    if zones is not None and zone_of(zones, raw) is None:
        return f"{where}: {raw!r} is not a time zone the tz database knows ({ZONE_EXAMPLES})"
    return None


RECURRENCE_FIELDS = ("schedule", "duration", "timeZone")


def recurrence_problems(raw: Any, zones: Mapping[str, ZoneTable] | None) -> list[str]:
    where = "spec.window.recurrence"
    if not isinstance(raw, Mapping):
        return [f"{where}: must be an object (schedule, duration, timeZone)"]
    problems = [
        f"{where}.{key}: unknown field (known: {', '.join(RECURRENCE_FIELDS)})"
        for key in raw
        if key not in RECURRENCE_FIELDS
    ]
    cron = parse_cron(raw.get("schedule"))
    if isinstance(cron, str):
        problems.append(f"{where}.schedule: {cron} (e.g. '0 9 * * 1-5': weekdays at 09:00)")
    duration = parse_duration(raw.get("duration"))
    if duration is None or duration > MAX_OCCURRENCE:
        problems.append(
            f"{where}.duration: {repr(raw.get('duration'))[:40]} is not a positive duration of at most "
            f"{int(MAX_OCCURRENCE.total_seconds() // 3600)}h (9h, 30m, 45s): how long each occurrence is open"
        )
    if "timeZone" in raw:
        problem = zone_problem(raw["timeZone"], f"{where}.timeZone", zones)
        if problem:
            problems.append(problem)
    return problems


BUDGET_FIELDS = ("gpuHours", "period", "length", "timeZone")


def budget_problems(raw: Any, zones: Mapping[str, ZoneTable] | None) -> list[str]:
    where = "spec.budget"
    if not isinstance(raw, Mapping):
        return [f"{where}: must be an object (gpuHours, period, length, timeZone)"]
    problems = [
        f"{where}.{key}: unknown field (known: {', '.join(BUDGET_FIELDS)})"
        for key in raw
        if key not in BUDGET_FIELDS
    ]
    hours = raw.get("gpuHours")
    value = parse_hours(hours) if _budget_amount(hours) else None
    if value is None or not 0 < value <= MAX_BUDGET_HOURS:
        problems.append(
            f"{where}.gpuHours: {repr(hours)[:40]} is not a positive number of GPU-hours of at most "
            f"{MAX_BUDGET_HOURS} with at most 6 decimals (400, 0.05)"
        )
    period = raw.get("period")
    if period not in PERIODS:
        problems.append(f"{where}.period: {repr(period)[:40]} is not one of {', '.join(PERIODS)}")
    length = raw.get("length")
    if period in ("Fixed", "Rolling"):
        parsed = parse_duration(length)
        if parsed is None or not MIN_PERIOD_SECONDS <= parsed.total_seconds() <= MAX_PERIOD_HOURS * 3600:
            problems.append(
                f"{where}.length: {repr(length)[:40]} is not a duration from {MIN_PERIOD_SECONDS}s to "
                f"{MAX_PERIOD_HOURS}h (720h, 168h, 90m): required with period {period}"
            )
    elif length is not None:
        problems.append(f"{where}.length: only with period Fixed or Rolling (a calendar period has its own)")
    if "timeZone" in raw:
        if period in ("Fixed", "Rolling"):
            problems.append(f"{where}.timeZone: only with period Month, Week or Day (the calendar's zone)")
        else:
            problem = zone_problem(raw["timeZone"], f"{where}.timeZone", zones)
            if problem:
                problems.append(problem)
    return problems


def _budget_amount(raw: Any) -> bool:
    if isinstance(raw, bool):
        return False
    if isinstance(raw, int):
        return True
    return isinstance(raw, str) and bool(_BUDGET_HOURS.match(raw))


def parse_recurrence(raw: Any) -> Recurrence | None:
    if not isinstance(raw, Mapping):
        return None
    cron, duration = parse_cron(raw.get("schedule")), parse_duration(raw.get("duration"))
    zone = raw.get("timeZone")
    if isinstance(cron, str) or duration is None or duration > MAX_OCCURRENCE:
        return None
    return Recurrence(cron, duration, zone if isinstance(zone, str) else "")


def parse_budget(raw: Any) -> Budget | None:
    if not isinstance(raw, Mapping) or budget_problems(raw, None):
        return None
    hours = parse_hours(raw.get("gpuHours"))
    assert hours is not None
    zone = raw.get("timeZone")
    length = parse_duration(raw.get("length"))
    return Budget(hours, str(raw["period"]), length, zone if isinstance(zone, str) else "")


@dataclass(frozen=True)
class Lease:
    """What the view keeps of a GpuLease (slim: no status, no managed fields)."""

    namespace: str
    name: str
    uid: str
    model: str
    """``spec.gpuModel``, or ``spec.gpuModels`` joined with ``|`` (``display_model``)."""
    count: int
    """milli-GPU."""
    created: datetime | None
    start: datetime | None
    """The window's start: spec.window.start, else the creation time."""
    end: datetime | None
    """spec.window.end, else start + spec.duration; None: open-ended."""
    selector: tuple[Requirement, ...] = ()
    priority: int = 0
    enforcement: Enforcement = Enforcement.Deny
    overflow: Overflow = Overflow.none
    on_expiry: ExpiryAction = ExpiryAction.StopAdmitting
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    deleting: bool = False
    finalized: bool = False
    """Our finalizer is on it (the controller added it)."""
    generation: int = 0
    problems: tuple[str, ...] = ()
    """Invalid fields (a lease that skipped validation): nothing is charged to it."""
    version: str = field(default="", compare=False)
    """metadata.resourceVersion: the controller's status writes are made at it (a stale view's
    write is refused, never applied over a newer status)."""
    status: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The object's status as written (the controller computes the next one from it, so GPU-hours
    stay exact whoever leads)."""
    recurrence: Recurrence | None = None
    """spec.window.recurrence: open only from each start of the schedule for its duration."""
    budget: Budget | None = None
    notice_seconds: int = DEFAULT_NOTICE_SECONDS
    models: tuple[str, ...] = ()
    """The names the lease gives (``spec.gpuModels``, else ``(spec.gpuModel,)``), each a model or
    a family of the configuration: ``function.core.families.models_of`` expands them."""
    caps: tuple[tuple[str, int], ...] = ()
    """``spec.caps``: (model, milli-GPU) at most of that model within the count."""
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """What this record's methods worked out (a recurring window's current span, the budget at a
    moment): the record is replaced when the object changes, so nothing here outlives its inputs."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def label(self) -> str:
        """LEASE_LABEL's value on the Pods charged to it (``lease_label``)."""
        return lease_label(self.name)

    @property
    def charged_key(self) -> str:
        """The group of its charged Pods in CHARGED_PODS (and its key in the webhook's ledger)."""
        return f"{self.namespace}/{lease_label(self.name)}"

    def phase(self, now: datetime, zones: Mapping[str, ZoneTable] = NO_ZONES) -> Phase:
        if self.deleting:
            return Phase.Released
        if self.problems or self.zone_problems(zones):
            return Phase.Invalid
        if self.start is not None and now < self.start:
            return Phase.Pending
        if self.end is not None and now >= self.end:
            return Phase.Expired
        span = self.span(now, zones)
        if span is not None and not span.open:
            return Phase.Closed
        reading = self.budget_at(now, zones)
        if reading is not None and reading.exhausted:
            return Phase.Exhausted
        return Phase.Active

    def zone_problems(self, zones: Mapping[str, ZoneTable]) -> tuple[str, ...]:
        """Time zones the edge's tz database does not know (validation refuses them; a lease that
        skipped it is a lease with problems)."""
        found = []
        if self.recurrence is not None and zone_of(zones, self.recurrence.zone) is None:
            found.append(
                f"spec.window.recurrence.timeZone: {self.recurrence.zone!r} is not a known time zone"
            )
        if self.budget is not None and self.budget.zone and zone_of(zones, self.budget.zone) is None:
            found.append(f"spec.budget.timeZone: {self.budget.zone!r} is not a known time zone")
        return tuple(found)

    def span(self, now: datetime, zones: Mapping[str, ZoneTable] = NO_ZONES) -> Span | None:
        """Where ``now`` lies in the recurring window (None: no recurrence, or an unknown zone)."""
        if self.recurrence is None:
            return None
        zone = zone_of(zones, self.recurrence.zone)
        if zone is None:
            return None
        known = self.memo.get("span")
        if known is not None and known[0] is zone:
            span: Span = known[1]
            if (span.start is None or span.start <= now) and (span.end is None or now < span.end):
                return span
        span = span_at(self.recurrence, zone, now)
        self.memo["span"] = (zone, span)
        return span

    def budget_at(self, now: datetime, zones: Mapping[str, ZoneTable] = NO_ZONES) -> BudgetNow | None:
        """The budget at ``now`` from the lease's status (None: no budget, or an unknown zone)."""
        if self.budget is None:
            return None
        zone = zone_of(zones, self.budget.zone)
        anchor = self.start or self.created
        if zone is None or anchor is None or now < anchor:
            return None  # periods begin with the lease's window
        known = self.memo.get("budget")
        if known is not None and known[0] == now:
            reading: BudgetNow = known[1]
            return reading
        reading = budget_now(self.budget, self.status, zone, anchor, now)
        self.memo["budget"] = (now, reading)
        return reading

    def ends_at(self, now: datetime, zones: Mapping[str, ZoneTable] = NO_ZONES) -> datetime | None:
        """When the time a Pod admitted now may run ends: the current occurrence's end (a
        recurring window) or the window's end; None: open-ended."""
        span = self.span(now, zones)
        end = span.end if span is not None and span.open else None
        if self.end is not None and (end is None or self.end < end):
            return self.end
        return end

    def opens_at(self, now: datetime, zones: Mapping[str, ZoneTable] = NO_ZONES) -> datetime | None:
        """When a lease that does not admit now starts to (None: not before it ends)."""
        phase = self.phase(now, zones)
        moment: datetime | None = None
        if phase == Phase.Pending:
            moment = self.start
        elif phase == Phase.Closed:
            span = self.span(now, zones)
            moment = span.end if span is not None else None
        elif phase == Phase.Exhausted:
            reading = self.budget_at(now, zones)
            moment = reading.end if reading is not None else None
        if moment is not None and self.end is not None and moment >= self.end:
            return None
        return moment

    def matches(self, labels: Mapping[str, Any]) -> bool:
        return selects(self.selector, labels)


def slim_lease(obj: Mapping[str, Any]) -> Lease | None:
    metadata = metadata_of(obj)
    uid = metadata.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    problems = tuple(lease_problems(obj))
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    created = parse_time(metadata.get("creationTimestamp"))
    window = spec.get("window") if isinstance(spec.get("window"), Mapping) else {}
    assert isinstance(window, Mapping)
    start = parse_time(window.get("start")) or created
    end = parse_time(window.get("end"))
    duration = parse_duration(spec.get("duration"))
    if end is None and duration is not None and start is not None:
        end = start + duration
    expiry = spec.get("onExpiry") if isinstance(spec.get("onExpiry"), Mapping) else {}
    assert isinstance(expiry, Mapping)
    finalizers = metadata.get("finalizers")
    generation = metadata.get("generation")
    status = obj.get("status")
    return Lease(
        namespace=sys.intern(str(metadata.get("namespace") or "")),
        name=str(metadata.get("name") or ""),
        uid=uid,
        model=display_model(spec),
        count=parse_count(spec.get("count")) or 0,
        created=created,
        start=start,
        end=end,
        selector=compile_selector(spec.get("podSelector")) if not problems else (),
        priority=_bounded(spec.get("priority"), -MAX_PRIORITY - 1, MAX_PRIORITY, 0),
        enforcement=_enum(Enforcement, spec.get("enforcement"), Enforcement.Deny),
        overflow=_enum(Overflow, spec.get("overflow"), Overflow.none),
        on_expiry=_enum(ExpiryAction, expiry.get("action"), ExpiryAction.StopAdmitting),
        grace_seconds=_bounded(expiry.get("gracePeriodSeconds"), 0, MAX_GRACE_SECONDS, DEFAULT_GRACE_SECONDS),
        deleting=metadata.get("deletionTimestamp") is not None,
        finalized=isinstance(finalizers, list) and FINALIZER in finalizers,
        generation=generation if isinstance(generation, int) else 0,
        problems=problems,
        version=str(metadata.get("resourceVersion") or ""),
        status=status if isinstance(status, Mapping) else {},
        recurrence=parse_recurrence(window.get("recurrence")) if not problems else None,
        budget=parse_budget(spec.get("budget")) if not problems else None,
        notice_seconds=_bounded(expiry.get("noticeSeconds"), 0, MAX_GRACE_SECONDS, DEFAULT_NOTICE_SECONDS),
        models=named_models(spec),
        caps=parse_caps(spec.get("caps")) if not problems else (),
    )


def _bounded(raw: Any, low: int, high: int, default: int) -> int:
    """A whole number in [low, high], else ``default``: a lease that skipped validation still
    holds only values every reader can compute with."""
    return raw if whole_number(raw, low, high) else default


def _one_of(kind: Any, raw: Any) -> bool:
    return isinstance(raw, str) and raw in {e.value for e in kind}


def _enum(kind: Any, raw: Any, default: Any) -> Any:
    return kind(raw) if _one_of(kind, raw) else default


def namespace_of_lease(lease: Any) -> str:
    return lease.namespace if isinstance(lease, Lease) else ""


# -- charged Pods, as the view keeps them --------------------------------------------------------
class ChargedPod(NamedTuple):
    """A Pod carrying LEASE_LABEL, from metadata only (what the view holds per Pod: docs/leases.md,
    from tests/benchmarks/leases.py)."""

    namespace: str
    name: str
    uid: str
    lease: str
    """LEASE_LABEL's value: the lease's name, or ``lease_label`` of a long one."""
    state: str
    charge: int
    """milli-GPU."""
    decision: str
    priority: int
    created: str
    """metadata.creationTimestamp as written (RFC 3339 sorts as text)."""
    terminating: bool
    owner_kind: str = ""
    finalizers: tuple[str, ...] = ()
    """metadata.finalizers: what keeps a terminating Pod stored (and on its node) past its grace."""
    deleted_at: str = ""
    """metadata.deletionTimestamp as written: when a terminating Pod's grace period ends."""
    ends: str = ""
    """ENDS_ANNOTATION as written: when the Pod's lease time ends ("" none)."""
    model: str = ""
    """MODEL_ANNOTATION as written: the model of a family lease it is charged as ("" any)."""

    @property
    def lease_key(self) -> str:
        return f"{self.namespace}/{self.lease}"


def parse_charge(raw: Any) -> int:
    """CHARGE_ANNOTATION's value -> milli-GPU (0 when missing or not a quantity)."""
    if not isinstance(raw, str):
        return 0
    if raw.endswith("m") and 1 < len(raw) <= 16 and raw[:-1].isascii() and raw[:-1].isdigit():
        return int(raw[:-1])  # what the webhook writes (charge_text): no Fraction on every review
    try:
        value = Fraction(parse_quantity(raw)) * 1000
    except QuantityError:
        return 0
    return min(max(math.ceil(value), 0), CHARGE_LIMIT)


def charge_text(milli: int) -> str:
    return f"{milli}m"


def slim_charged_pod(obj: Mapping[str, Any]) -> ChargedPod | None:
    status = obj.get("status")
    if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
        return None
    metadata = metadata_of(obj)
    uid = metadata.get("uid")
    labels = metadata.get("labels")
    if not isinstance(uid, str) or not uid or not isinstance(labels, Mapping):
        return None
    lease = labels.get(LEASE_LABEL)
    if not isinstance(lease, str) or not lease:
        return None
    annotations = metadata.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    state = labels.get(STATE_LABEL)
    priority = annotations.get(PRIORITY_ANNOTATION)
    try:
        priority_value = int(priority) if isinstance(priority, str) else 0
    except ValueError:
        priority_value = 0
    return ChargedPod(
        namespace=sys.intern(str(metadata.get("namespace") or "")),
        name=str(metadata.get("name") or ""),
        uid=uid,
        lease=sys.intern(lease),
        state=sys.intern(state) if state in STATES else CHARGED,
        charge=parse_charge(annotations.get(CHARGE_ANNOTATION)),
        decision=str(annotations.get(DECISION_ANNOTATION) or ""),
        priority=priority_value,
        created=str(metadata.get("creationTimestamp") or ""),
        terminating=metadata.get("deletionTimestamp") is not None,
        owner_kind=controller_of(metadata).kind,
        finalizers=_finalizers(metadata.get("finalizers")),
        deleted_at=str(metadata.get("deletionTimestamp") or ""),
        ends=sys.intern(str(annotations.get(ENDS_ANNOTATION) or "")),
        model=sys.intern(str(annotations.get(MODEL_ANNOTATION) or "")),
    )


def _finalizers(raw: Any) -> tuple[str, ...]:
    return tuple(sys.intern(f) for f in raw if isinstance(f, str)) if isinstance(raw, list) else ()


def charged_pod_key(obj: Mapping[str, Any]) -> str:
    """The index key: the Pod's uid, which only the apiserver writes. Never the decision
    annotation: a Pod carrying a copy of another's (readable with ``kubectl get pod -o yaml``)
    would replace that Pod's record, and deleting the copy would erase the real charge."""
    uid = metadata_of(obj).get("uid")
    return uid if isinstance(uid, str) else ""


def by_lease(record: Any) -> str:
    return record.lease_key if isinstance(record, ChargedPod) else ""


def tally_charge(record: Any) -> tuple[int, ...]:
    """(used, queued, overflow) milli-GPU and Pods of one charged Pod, summed per lease by the view."""
    if not isinstance(record, ChargedPod):
        return (0, 0, 0, 0)
    if record.state == QUEUED:
        return (0, record.charge, 0, 1)
    if record.state == OVERFLOW:
        return (0, 0, record.charge, 1)
    return (record.charge, 0, 0, 1)


LEASES = WatchSpec(
    index="gpuleases",
    group=GROUP,
    version=VERSION,
    plural=PLURAL,
    kind=KIND,
    slim=slim_lease,
    group_by=namespace_of_lease,
)
"""GpuLeases, whole (the spec is needed), grouped by namespace."""

CHARGED_PODS = WatchSpec(
    index="gpu-lease-pods",
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    metadata_only=True,
    slim=slim_charged_pod,
    key=charged_pod_key,
    group_by=by_lease,
    label_selector=LEASE_LABEL,
    field_selector="status.phase!=Succeeded,status.phase!=Failed",
    tally=tally_charge,
)
"""Only the Pods charged to a lease (label selector): the watch costs nothing for other Pods.
Grouped by ``namespace/lease`` with the (used, queued, overflow, pods) sums kept by the view."""


class RequiredNamespace(NamedTuple):
    """A namespace labelled ``castops.io/gpu-leases: required``."""

    name: str
    uid: str


def slim_required_namespace(obj: Mapping[str, Any]) -> RequiredNamespace | None:
    """A Namespace carrying REQUIRED_LABEL=required (the watch selects on it; a state file read
    offline holds every namespace, so the label is checked here too)."""
    metadata = metadata_of(obj)
    labels = metadata.get("labels")
    name, uid = metadata.get("name"), metadata.get("uid")
    if not isinstance(labels, Mapping) or labels.get(REQUIRED_LABEL) != REQUIRED_VALUE:
        return None
    if not isinstance(name, str) or not name:
        return None
    return RequiredNamespace(name, uid if isinstance(uid, str) else "")


LEASE_NAMESPACES = WatchSpec(
    index="gpu-lease-namespaces",
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    namespaced=False,
    metadata_only=True,
    slim=slim_required_namespace,
    key=name_of,
    label_selector=f"{REQUIRED_LABEL}={REQUIRED_VALUE}",
)
"""The lease-required namespaces, by name (a label-selected watch: a handful of objects)."""


@dataclass(frozen=True)
class Usage:
    used: int = 0
    queued: int = 0
    overflow: int = 0
    pods: int = 0

    def plus(self, other: Usage) -> Usage:
        return Usage(
            self.used + other.used,
            self.queued + other.queued,
            self.overflow + other.overflow,
            self.pods + other.pods,
        )


def usage_from(sums: tuple[int, ...]) -> Usage:
    return Usage(*sums[:4]) if len(sums) >= 4 else Usage()


def gpus(milli: int) -> str:
    """milli-GPU as GPU-equivalents for people: 8, 0.5, 2.125 (integer arithmetic: any size)."""
    if milli < 0:
        return "-" + gpus(-milli)
    whole, rest = divmod(min(milli, CHARGE_LIMIT), 1000)
    return str(whole) if not rest else f"{whole}.{rest:03d}".rstrip("0")


def gpu_float(milli: int) -> float:
    """milli-GPU as a float GPU count for a metric (bounded: a float holds it)."""
    return max(min(milli, CHARGE_LIMIT), -CHARGE_LIMIT) / 1000


@lru_cache(maxsize=1024)
def until(moment: datetime | None) -> str:
    """A window's edge as people read it; cached, since every answer about a lease names its end
    (strftime of an aware datetime is a large part of a decision otherwise)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else "no end"


GPU_RESOURCE_PREFIXES = (
    "nvidia.com/gpu",
    "nvidia.com/mig-",
    "amd.com/gpu",
    "gpu.intel.com/",
    "habana.ai/",
    "huawei.com/Ascend",
    "cambricon.com/",
    "iluvatar.ai/",
    "hygon.com/",
    "metax-tech.com/",
    "mthreads.com/",
    "enflame.com/",
)
"""Extended resources that are GPUs (NVIDIA's whole GPUs, time slices, MIG profiles and HAMi's
vGPU memory and cores all start ``nvidia.com/gpu`` or ``nvidia.com/mig-``; other vendors' device
plugins). The ValidatingAdmissionPolicy ``castslice-gpulease-required`` lists the same prefixes
(``tests/deploy`` keeps the two in step): in a lease-required namespace a Pod asking for one of
them needs the webhook's charge. A resource gpuLeases does not know how to charge is refused there."""


@dataclass(frozen=True)
class ChargeUnits:
    """How resources turn into milli-GPU (the ``gpuLeases`` configuration)."""

    whole: tuple[str, ...] = ("nvidia.com/gpu",)
    shared: str = "nvidia.com/gpu-shared"
    shared_replicas: int = 8
    shared_replicas_by_model: Mapping[str, int] = field(default_factory=dict)
    mig_prefix: str = "nvidia.com/mig-"
    mig_slices: int = 7
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    memory: str = "nvidia.com/gpumem"
    memory_mib_by_model: Mapping[str, int] = field(default_factory=dict)
    claim_templates: Mapping[str, int] = field(default_factory=dict)
    """ResourceClaimTemplate name -> milli-GPU one claim made from it takes (gpuSlicing's dra
    backend declares its templates: a fraction of one device of its class)."""

    def charges(self, name: str) -> bool:
        """Whether ``name`` is a resource this charge knows how to count."""
        return (
            name in self.whole
            or name in (self.shared, self.memory, self.memory_percentage, self.cores)
            or name.startswith(self.mig_prefix)
        )

    def is_gpu(self, name: str) -> bool:
        return name.startswith(GPU_RESOURCE_PREFIXES) or self.charges(name)


_MIG = re.compile(r"^(?P<g>\d+)g\.\d+gb\Z")
MAPPING = (dict, Mapping)
"""For isinstance on the charge's hot path: a Pod's parts are dicts, found without the ABC check."""


def _amount(resources: Mapping[str, Any], name: str) -> Fraction | int:
    """A resource's quantity, exact; 0 when missing, not a quantity or negative."""
    raw = resources.get(name)
    if raw is None:
        return 0
    try:
        value = parse_quantity(raw)
    except QuantityError:
        return 0
    return value if value > 0 else 0


def _asked(container: Mapping[str, Any]) -> Mapping[str, Any]:
    """limits and requests together (extended resources have both, equal; a template may carry one)."""
    resources = container.get("resources")
    if not isinstance(resources, MAPPING):
        return {}
    limits, requests = resources.get("limits"), resources.get("requests")
    asked: Mapping[str, Any] = limits if isinstance(limits, MAPPING) else {}
    if isinstance(requests, MAPPING) and requests:
        asked = {**requests, **asked} if asked else requests
    return asked


def _vgpu_share(asked: Mapping[str, Any], units: ChargeUnits, model: str) -> Fraction | int:
    """The share of each device a HAMi vGPU container holds: the larger of its memory and its
    cores. HAMi gives a container that names no memory size or percentage the device's whole
    memory (docs/vgpu.md), so ``gpucores: 1`` alone is a whole GPU, not 1 %; a memory size is a
    share of the model's memory (``memoryMiBByModel``), a whole GPU when the model is not known."""
    memory = _amount(asked, units.memory)
    if memory:
        model_memory = units.memory_mib_by_model.get(model)
        memory_share = Fraction(memory) / model_memory if model_memory else Fraction(1)
    else:
        percentage = _amount(asked, units.memory_percentage)
        memory_share = Fraction(percentage) / 100 if percentage else Fraction(1)
    cores = Fraction(_amount(asked, units.cores)) / 100
    share: Fraction = min(max(memory_share, cores), Fraction(1))
    return share


def container_charge(container: Mapping[str, Any], units: ChargeUnits, model: str) -> int:
    """milli-GPU one container asks for. Exact (integers and Fractions, never a float): any
    quantity the apiserver accepts is an answer, not an error."""
    asked = _asked(container)
    if not asked:
        return 0
    total: Fraction | int = 0
    vgpu = units.memory_percentage in asked or units.cores in asked or units.memory in asked
    named = [name for name in units.whole if name in asked]
    count: Fraction | int = sum(_amount(asked, name) for name in named)
    if vgpu:
        if not named:
            count = 1  # HAMi adds one device to a container naming memory or cores alone
        total += count * _vgpu_share(asked, units, model)
    else:
        total += count
    if units.shared in asked:
        replicas = units.shared_replicas_by_model.get(model, units.shared_replicas)
        total += Fraction(_amount(asked, units.shared)) / max(replicas, 1)
    for name in asked:
        if isinstance(name, str) and name.startswith(units.mig_prefix):
            match = _MIG.match(name[len(units.mig_prefix) :])
            slices = int(match["g"]) if match else units.mig_slices
            total += _amount(asked, name) * Fraction(min(slices, units.mig_slices), units.mig_slices)
    return min(math.ceil(total * 1000), CHARGE_LIMIT)


def depends_on_model(pod: Mapping[str, Any], units: ChargeUnits) -> bool:
    """Whether the Pod's charge depends on the GPU model (time slices, a vGPU memory size)."""
    spec = pod.get("spec")
    if not isinstance(spec, MAPPING):
        return False
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or ():
            if isinstance(container, MAPPING):
                asked = _asked(container)
                if units.shared in asked or units.memory in asked:
                    return True
    return False


def claims_charge(pod: Mapping[str, Any], units: ChargeUnits) -> int:
    """milli-GPU of the Pod's ResourceClaims made from templates this charge knows (a Pod-level
    claim is allocated once, whichever containers use it)."""
    if not units.claim_templates:
        return 0
    spec = pod.get("spec")
    total = 0
    for claim in (spec.get("resourceClaims") if isinstance(spec, MAPPING) else None) or ():
        template = claim.get("resourceClaimTemplateName") if isinstance(claim, MAPPING) else None
        if isinstance(template, str):
            total += units.claim_templates.get(template, 0)
    return total


def pod_charge(pod: Mapping[str, Any], units: ChargeUnits, model: str = "") -> int:
    """The Pod's milli-GPU as the scheduler reserves it: app containers and sidecars together,
    or the largest init container (with the sidecars started before it), whichever is more; plus
    its ResourceClaims of known templates."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, MAPPING) else {}
    app = sum(
        container_charge(c, units, model) for c in spec.get("containers") or () if isinstance(c, MAPPING)
    )
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or ():
        if not isinstance(container, MAPPING):
            continue
        charge = container_charge(container, units, model)
        if container.get("restartPolicy") == "Always":
            sidecars += charge
        else:
            init_peak = max(init_peak, charge + sidecars)
    return min(max(app + sidecars, init_peak) + claims_charge(pod, units), CHARGE_LIMIT)


class GpuAsk(NamedTuple):
    """What GPUs a Pod asks for, whatever the charge makes of them."""

    resources: tuple[str, ...] = ()
    """GPU resources asked with an amount above 0 (GPU_RESOURCE_PREFIXES or a charged name)."""
    uncharged: tuple[str, ...] = ()
    """Of those, the ones no charge unit counts (another vendor's GPUs)."""
    claims: tuple[str, ...] = ()
    """Pod-level ResourceClaims made from a template the charge knows."""
    unknown_claims: tuple[str, ...] = ()
    """Every other Pod-level claim, described (``gpu (ResourceClaim my-claim)``): what it holds
    cannot be read at admission."""

    @property
    def asks(self) -> bool:
        return bool(self.resources or self.claims or self.unknown_claims)


NO_ASK = GpuAsk()


def gpu_ask(pod: Mapping[str, Any], units: ChargeUnits) -> GpuAsk:
    spec = pod.get("spec")
    if not isinstance(spec, MAPPING):
        return NO_ASK
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or ():
            if not isinstance(container, MAPPING):
                continue
            asked = _asked(container)
            for name in asked:
                if isinstance(name, str) and units.is_gpu(name) and _amount(asked, name):
                    names.add(name)
    known: list[str] = []
    unknown: list[str] = []
    for claim in spec.get("resourceClaims") or ():
        if not isinstance(claim, MAPPING):
            unknown.append("(not a claim)")
            continue
        name = str(claim.get("name") or "")
        template, claim_name = claim.get("resourceClaimTemplateName"), claim.get("resourceClaimName")
        if isinstance(template, str) and template in units.claim_templates:
            known.append(name)
        elif isinstance(template, str):
            unknown.append(f"{name} (ResourceClaimTemplate {template})")
        else:
            unknown.append(f"{name} (ResourceClaim {claim_name})")
    if not names and not known and not unknown:
        return NO_ASK
    resources = tuple(sorted(names))
    return GpuAsk(
        resources,
        tuple(name for name in resources if not units.charges(name)),
        tuple(known),
        tuple(unknown),
    )


# -- the GPU models a Pod may run on ------------------------------------------------------------
class Models(NamedTuple):
    """The models a Pod may be scheduled on: ``only`` these, or (``only`` None) any but ``excluded``."""

    only: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()

    def allows(self, model: str) -> bool:
        return model in self.only if self.only is not None else model not in self.excluded

    @property
    def exactly(self) -> str | None:
        """The one model the Pod may run on, or None."""
        return next(iter(self.only)) if self.only is not None and len(self.only) == 1 else None

    @property
    def constrained(self) -> bool:
        return self.only is not None or bool(self.excluded)

    def both(self, other: Models) -> Models:
        if self.only is not None and other.only is not None:
            return Models(self.only & other.only)
        if self.only is not None:
            return Models(self.only - other.excluded)
        if other.only is not None:
            return Models(other.only - self.excluded)
        return Models(None, self.excluded | other.excluded)

    def either(self, other: Models) -> Models:
        if self.only is not None and other.only is not None:
            return Models(self.only | other.only)
        if self.only is not None:
            return Models(None, other.excluded - self.only)
        if other.only is not None:
            return Models(None, self.excluded - other.only)
        return Models(None, self.excluded & other.excluded)

    def describe(self) -> str:
        if self.only is not None:
            return ", ".join(sorted(self.only)) if self.only else "no GPU model (a node without the label)"
        if self.excluded:
            return "any model but " + ", ".join(sorted(self.excluded))
        return "any model"


ANY_MODEL = Models()
NO_MODEL = Models(frozenset())


def _term_models(term: Any, label: str) -> Models:
    """One required node selector term: its expressions on the model label, ANDed."""
    if not isinstance(term, MAPPING):
        return ANY_MODEL
    expressions = term.get("matchExpressions") or ()
    if not expressions and not term.get("matchFields"):
        return NO_MODEL  # an empty term matches no node
    models = ANY_MODEL
    for expression in expressions if isinstance(expressions, list) else ():
        if not isinstance(expression, MAPPING) or expression.get("key") != label:
            continue
        operator = expression.get("operator")
        values = expression.get("values")
        named = frozenset(str(v) for v in values) if isinstance(values, list) else frozenset()
        if operator == "In":
            models = models.both(Models(named))
        elif operator == "NotIn":
            models = models.both(Models(None, named))
        elif operator == "DoesNotExist":
            models = models.both(NO_MODEL)
        # Exists (any model), Gt and Lt (numbers, not models): no narrower than any model.
    return models


def pod_models(pod: Mapping[str, Any], label: str) -> Models:
    """The models a Pod may run on, as the scheduler reads it: its nodeSelector AND the union
    of its required node affinity terms (each term the AND of its expressions)."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, MAPPING) else {}
    models = ANY_MODEL
    selector = spec.get("nodeSelector")
    if isinstance(selector, MAPPING) and label in selector:
        models = Models(frozenset((str(selector[label]),)))
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, MAPPING) else None
    required = (
        node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, MAPPING) else None
    )
    terms = required.get("nodeSelectorTerms") if isinstance(required, MAPPING) else None
    if isinstance(terms, list) and terms:
        union: Models | None = None
        for term in terms:
            models_of_term = _term_models(term, label)
            union = models_of_term if union is None else union.either(models_of_term)
        assert union is not None
        models = models.both(union)
    return models
