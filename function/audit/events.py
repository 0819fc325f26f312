"""One admission decision as one CloudEvent: a pure function of the request's audit facts
(function/admission/facts.py), the decision and the identity of the moment (event id, time), so
it is tested without a clock, a network or a queue. The controller's events (a lease's step, a Pod
found drifted) are ``Event``s given their id and time the same way (``wire_event``): every event
the project emits has the same attributes in the same order, one id format and one time format.

What goes in is chosen field by field, never copied wholesale from the Pod: the Pod's env values,
annotation values and spec can hold secrets, and an audit pipeline fans events out widely. The one
part of the Pod that can reach an event is the JSON Patch (it is what the webhook did); values in
it that sit where secrets live (env values, command and args) and were copied from the user's
Pod (the facts' ``secrets``) are replaced by ``[redacted]``, and so is every string a mutator
reports it copied out of the Pod's containers (a PodMutation ``copy`` of an env value into an
annotation), wherever it landed, and the names and keys of the Secrets an env list refers to. The
event says how many.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from cloudevents.http import CloudEvent

from function.admission.facts import AuditFacts, may_carry_secrets, secret_strings
from function.audit.sinks import WireEvent, compact_json
from function.contract import ENGINE_VERSION, EVENT_EXTENSIONS, EVENT_TYPES
from function.core.engine import Decision
from function.core.json_patch import Operation
from function.core.pod import cap_warning
from function.core.pointer import tokens

DATASCHEMA_URI: Final = (
    "https://raw.githubusercontent.com/castops/castslice/main/function/schemas/decision-event.v1.json"
)
"""The ``dataschema`` attribute and the schema's ``$id``. The file ships in the package
(function/schemas/), so consumers validate offline; the URI is where the same file is readable
over HTTP in the repository the image (ghcr.io/castops/castslice) is built from. The version is in
the file name, so the URI changes exactly when the schema changes incompatibly (CloudEvents asks
for that), not with every release."""

LEASE_DATASCHEMA_URI: Final = (
    "https://raw.githubusercontent.com/castops/castslice/main/function/schemas/gpulease-event.v1.json"
)
"""The ``dataschema`` of the lease controller's lifecycle events (function/schemas/ too)."""

CONTENT_TYPE: Final = "application/json"
SPEC_VERSION: Final = "1.0"
NO_MUTATORS: Final = "none"
"""Value of the ``mutators`` extension when no mutator acted. Not the empty string: a Knative
Trigger filter with an empty value matches every event, so "" could not be filtered on."""
REDACTED: Final = "[redacted]"
MAX_PATCH_BYTES: Final = 32 * 1024
"""A larger patch is left out of the event (with the reason), keeping events well under the
64 KiB many brokers accept. CastSlice's own patches are a few hundred bytes."""
MAX_TEXT: Final = 2048
"""Reasons and messages are cut here: an internal error's text is not ours to bound."""
MAX_IDENTITY: Final = 256
"""``request.uid``, the username and each group are cut here (a Kubernetes uid has 36 characters,
a ServiceAccount's username at most 317): the request is the client's, and a 6 MB uid must not
make a 6 MB event."""
MAX_GROUPS: Final = 32
"""The groups kept in an event; more are left out (the event keeps well under broker limits)."""

EXTENSION_NAME: Final = re.compile(r"^[a-z0-9]{1,20}$")
_CORE_ATTRIBUTES: Final = frozenset(
    {"id", "source", "specversion", "type", "datacontenttype", "dataschema", "subject", "time", "data"}
)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, microseconds always present so stored times sort as text."""
    moment = moment.astimezone(UTC)
    if moment.year < 1000:  # strftime does not pad such a year (glibc); keep its text
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # The same text as that strftime, in a third of the time (this runs for every event).
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031 - the fastest formatting here
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
    )


def subject_for(namespace: str, name: str | None, generate_name: str | None) -> str:
    return f"namespaces/{namespace}/pods/{name or generate_name or ''}"


def mutators_attribute(decision: Decision) -> str:
    """The mutators that acted (mutated or denied), in engine order, comma-separated."""
    return ",".join(decision.acting_mutators) or NO_MUTATORS


def parse_extension_overrides(raw: str | None) -> dict[str, str]:
    """Knative's ``K_CE_OVERRIDES`` (``{"extensions": {...}}``), checked: Knative only ever sets
    extensions, and one may not replace an attribute the contract gives a meaning to."""
    if raw is None or not raw.strip():
        return {}
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"K_CE_OVERRIDES is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValueError("K_CE_OVERRIDES must be a JSON object")
    extensions = document.get("extensions", {})
    extensions = {} if extensions is None else extensions
    if not isinstance(extensions, dict):
        raise ValueError("K_CE_OVERRIDES.extensions must be an object")
    overrides: dict[str, str] = {}
    for name, value in extensions.items():
        if value is None:
            continue  # an unset extension, not the string "null"
        if not isinstance(name, str) or not EXTENSION_NAME.fullmatch(name):
            raise ValueError(f"K_CE_OVERRIDES: {name!r} is not a CloudEvents attribute name")
        if name in _CORE_ATTRIBUTES or name in EVENT_EXTENSIONS:
            raise ValueError(f"K_CE_OVERRIDES may not override the {name!r} attribute")
        overrides[name] = value if isinstance(value, str) else json.dumps(value)
    return overrides


# -- what the data holds ----------------------------------------------------------------------------
def _capped(text: str) -> str:
    return text if len(text) <= MAX_IDENTITY else text[: MAX_IDENTITY - 3] + "..."


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _at_secret_position(path: tuple[str, ...]) -> bool:
    """.../env/<i>/value, or an entry of .../command or .../args."""
    if (
        len(path) >= 3
        and path[-3] == "env"
        and (path[-2].isdigit() or path[-2] == "-")
        and path[-1] == "value"
    ):
        return True
    return len(path) >= 2 and path[-2] in ("command", "args") and (path[-1].isdigit() or path[-1] == "-")


def _names_a_secret(path: tuple[str, ...]) -> bool:
    """.../secretKeyRef/name or key (an env var read from a Secret), .../secretRef/name (envFrom)."""
    return len(path) >= 2 and (
        (path[-2] == "secretKeyRef" and path[-1] in ("name", "key"))
        or (path[-2] == "secretRef" and path[-1] == "name")
    )


def _redacted_value(
    value: Any, path: tuple[str, ...], secrets: AbstractSet[str], copied: AbstractSet[str] = frozenset()
) -> tuple[Any, int]:
    if isinstance(value, str):
        hit = value in copied or _names_a_secret(path) or (_at_secret_position(path) and value in secrets)
        return (REDACTED, 1) if hit else (value, 0)
    if isinstance(value, dict):
        count = 0
        result: dict[str, Any] = {}
        for key, item in value.items():
            result[key], found = _redacted_value(item, (*path, str(key)), secrets, copied)
            count += found
        return result, count
    if isinstance(value, list):
        count = 0
        items: list[Any] = []
        for index, item in enumerate(value):
            redacted, found = _redacted_value(item, (*path, str(index)), secrets, copied)
            items.append(redacted)
            count += found
        return items, count
    return value, 0


def _redacted_ops(
    patch: Sequence[Operation], secrets: AbstractSet[str], copied: AbstractSet[str] = frozenset()
) -> tuple[list[Operation], int]:
    result: list[Operation] = []
    total = 0
    for op in patch:
        copy = dict(op)
        if "value" in copy:
            path = tokens(str(copy.get("path", "")))
            copy["value"], found = _redacted_value(copy["value"], path, secrets, copied)
            total += found
        result.append(copy)
    return result, total


def copied_strings(decision: Decision) -> frozenset[str]:
    """The strings the decision's mutators copied out of the Pod's containers (they may sit
    anywhere in the patch), of the mutators whose work was sent."""
    return frozenset(s for part in decision.decisions if not part.shadow for s in part.copied)


def redact_patch(
    patch: tuple[Operation, ...] | list[Operation], pod: Any, copied: AbstractSet[str] = frozenset()
) -> tuple[list[Operation], int]:
    """The patch with env values and command/args entries that came from ``pod`` replaced, the
    names of referenced Secrets, and every string in ``copied`` wherever it sits.

    A value CastSlice itself sets (an env var it adds, a label) is kept: only strings also present
    at a secret-bearing place of the user's Pod, or reported copied, are replaced, so ordinary
    patches stay exact."""
    return _redacted_ops(patch, secret_strings(pod), copied)


def compact_json_size(value: Any) -> int:
    """``len(json.dumps(value, separators=(",", ":")))``: the size MAX_PATCH_BYTES is about."""
    return len(json.dumps(value, separators=(",", ":")))


def _over_patch_limit(patch: Sequence[Operation]) -> int | None:
    """The patch's compact_json_size when it is over MAX_PATCH_BYTES, else None.

    The stdlib encoder costs microseconds per event on the admission path, and only a size over
    the limit is ever shown. orjson writes the same JSON except that it writes non-ASCII as UTF-8
    (2-4 bytes where the stdlib writes a 6- or 12-character escape), NaN and the infinities as
    null and exponents without "+" or leading zeros: the stdlib's text is never more than 3 times
    orjson's bytes. So a patch whose orjson bytes are within a third of the limit is under it,
    and only a larger one (or one orjson cannot write) is measured exactly.
    """
    try:
        quick = len(orjson.dumps(patch))
    except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a key that is not a string
        quick = MAX_PATCH_BYTES
    if quick * 3 <= MAX_PATCH_BYTES:
        return None
    size = compact_json_size(patch)
    return size if size > MAX_PATCH_BYTES else None


def _data(
    facts: AuditFacts,
    decision: Decision,
    config_digest: str,
    decided_at: datetime,
    engine_version: str,
    copy_patch: bool,
) -> dict[str, Any]:
    """event_data; with ``copy_patch`` false an unredacted patch is the decision's own operations
    (the caller serializes the data at once and never hands it out)."""
    copied = copied_strings(decision)
    patch: Sequence[Operation]
    if facts.secrets or copied or may_carry_secrets(decision.patch):
        patch, redactions = _redacted_ops(decision.patch, facts.secrets, copied)
    else:
        patch, redactions = ([dict(op) for op in decision.patch] if copy_patch else decision.patch), 0
    omitted: str | None = None
    size = _over_patch_limit(patch)
    if size is not None:
        patch, redactions = [], 0
        omitted = f"patch of {size} bytes is larger than the {MAX_PATCH_BYTES}-byte limit for events"
    return {
        "request": {"uid": _capped(facts.uid), "operation": facts.operation, "apiVersion": facts.api_version},
        "user": {
            "username": _capped(facts.username),
            "groups": [_capped(group) for group in facts.groups[:MAX_GROUPS]],
        },
        "pod": facts.pod.as_dict(),
        "outcome": decision.outcome,
        "allowed": decision.allowed,
        "reason": _bounded(decision.reason),
        "mutators": [{**part.as_dict(), "reason": _bounded(part.reason)} for part in decision.decisions],
        "patch": patch,
        "patchRedactions": redactions,
        "patchOmitted": omitted,
        "warnings": [cap_warning(w) for w in decision.warnings],
        "denial": None if decision.denial is None else _bounded(decision.denial),
        "configDigest": config_digest,
        "engineVersion": engine_version,
        "decidedAt": format_time(decided_at),
        "durationSeconds": round(max(facts.duration_seconds, 0.0), 9),
    }


def event_data(
    facts: AuditFacts,
    decision: Decision,
    *,
    config_digest: str,
    decided_at: datetime,
    engine_version: str = ENGINE_VERSION,
) -> dict[str, Any]:
    """The ``data`` of the event; decision-event.v1.json is its schema."""
    return _data(facts, decision, config_digest, decided_at, engine_version, copy_patch=True)


def event_attributes(
    *,
    event_id: str,
    source: str,
    event_type: str,
    subject: str,
    time: str,
    dataschema: str | None,
    filters: Mapping[str, str],
    extensions: Mapping[str, str] | None,
) -> dict[str, str]:
    """The attributes of every event the project emits, in one order: K_CE_OVERRIDES' extensions,
    the CloudEvents attributes, then ``filters``, what Trigger filters see (they never see data)."""
    attributes = {
        **(extensions or {}),
        "specversion": SPEC_VERSION,
        "id": event_id,
        "source": source,
        "type": event_type,
        "subject": subject,
        "time": time,
        "datacontenttype": CONTENT_TYPE,
    }
    if dataschema is not None:
        attributes["dataschema"] = dataschema
    attributes.update(filters)
    return attributes


def _attributes(
    data: Mapping[str, Any],
    decision: Decision,
    event_id: str,
    source: str,
    extensions: Mapping[str, str] | None,
) -> dict[str, str]:
    pod = data["pod"]
    return event_attributes(
        event_id=event_id,
        source=source,
        event_type=EVENT_TYPES[decision.outcome],
        subject=subject_for(pod["namespace"], pod["name"], pod["generateName"]),
        time=data["decidedAt"],
        dataschema=DATASCHEMA_URI,
        # contract.EVENT_EXTENSIONS
        filters={
            "outcome": decision.outcome,
            "podnamespace": pod["namespace"],
            "mutators": mutators_attribute(decision),
        },
        extensions=extensions,
    )


def build_event(
    facts: AuditFacts,
    decision: Decision,
    *,
    event_id: str,
    decided_at: datetime,
    source: str,
    config_digest: str,
    engine_version: str = ENGINE_VERSION,
    extensions: Mapping[str, str] | None = None,
) -> CloudEvent:
    """The CloudEvent for one decision. ``extensions`` are K_CE_OVERRIDES (already checked)."""
    data = event_data(
        facts, decision, config_digest=config_digest, decided_at=decided_at, engine_version=engine_version
    )
    return CloudEvent(_attributes(data, decision, event_id, source, extensions), data)


def build_wire_event(
    facts: AuditFacts,
    decision: Decision,
    *,
    event_id: str,
    decided_at: datetime,
    source: str,
    config_digest: str,
    engine_version: str = ENGINE_VERSION,
    extensions: Mapping[str, str] | None = None,
) -> WireEvent:
    """``WireEvent.of(build_event(...))`` without the CloudEvent in between: what the recorder
    queues on the admission path, where building the object and reading it back cost more than
    the event itself. The same attributes in the same order and the same data bytes."""
    data = _data(facts, decision, config_digest, decided_at, engine_version, copy_patch=False)
    return WireEvent(event_id, _attributes(data, decision, event_id, source, extensions), compact_json(data))


@dataclass(frozen=True)
class Event:
    """An event the project emits besides a decision (a lease's step, a Pod found drifted): what
    it says. The recorder that emits it gives it its id and time (``wire_event``)."""

    type: str
    source: str
    subject: str
    data: Mapping[str, Any]
    dataschema: str | None = None
    filters: Mapping[str, str] = field(default_factory=dict)
    """Attributes Trigger filters see, after the CloudEvents ones."""
    time: datetime | None = None
    """When it happened, if not when it is emitted."""
    id: str | None = None
    """Its id when it must be the same whoever emits it, however often (a GpuLease budget period's
    chargeback record: the lease's uid and the period's start); else the recorder gives one."""


def wire_event(
    event: Event, *, event_id: str, time: datetime, extensions: Mapping[str, str] | None = None
) -> WireEvent:
    """``event`` as it is queued and sent: its id, its time (``event.time``, else ``time``) in the
    one time format, the attributes in the one order."""
    attributes = event_attributes(
        event_id=event_id,
        source=event.source,
        event_type=event.type,
        subject=event.subject,
        time=format_time(event.time or time),
        dataschema=event.dataschema,
        filters=event.filters,
        extensions=extensions,
    )
    return WireEvent(event_id, attributes, compact_json(event.data))
