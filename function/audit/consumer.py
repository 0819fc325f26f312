"""The reference consumer: check decision events against the shipped schema and keep them in SQLite.

It makes the subscribing side real (the ``audit`` function target, fed by a Knative Trigger) and
backs ``castslice audit``. Delivery is at least once (brokers and our own sender retry), so events
are keyed by (source, id) and a repeat is acknowledged without a second row.

An event that fails the checks is stored in the ``rejected`` table with what is wrong, and the
target answers 400: not retryable for a broker (retrying cannot fix it), so it goes to the
Trigger's dead-letter sink if one is set, and it is never lost here either.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

from cloudevents.conversion import to_dict
from cloudevents.http import CloudEvent

from function.audit.events import (
    DATASCHEMA_URI,
    EXTENSION_NAME,
    LEASE_DATASCHEMA_URI,
    NO_MUTATORS,
    format_time,
    subject_for,
)
from function.contract import (
    AUDIT_BUCKETS,
    EVENT_EXTENSIONS,
    EVENT_TYPES,
    LEASE_EVENT_TYPES,
    OUTCOMES,
)

SCHEMA_FILE: Final = "schemas/decision-event.v1.json"
LEASE_SCHEMA_FILE: Final = "schemas/gpulease-event.v1.json"
TYPE_OUTCOME: Final = {event_type: outcome for outcome, event_type in EVENT_TYPES.items()}
TYPE_STEP: Final = {event_type: step for step, event_type in LEASE_EVENT_TYPES.items()}
BUCKETS: Final = AUDIT_BUCKETS


@cache
def decision_schema(name: str = SCHEMA_FILE) -> dict[str, Any]:
    """A JSON Schema shipped with the package (function/schemas/), never fetched."""
    text = resources.files("function").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator(name: str = SCHEMA_FILE) -> Any:
    from jsonschema import Draft202012Validator  # imported when first needed: keeps the CLI quick

    return Draft202012Validator(decision_schema(name))


class InvalidEvent(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _envelope_problems(event: Mapping[str, Any], dataschema: str) -> list[str]:
    """What every CastSlice event must carry, whoever emits it."""
    problems: list[str] = []
    for name in ("id", "source", "type", "subject", "time"):
        if not isinstance(event.get(name), str) or not event.get(name):
            problems.append(f"attribute {name} is missing or empty")
    if event.get("specversion") != "1.0":
        problems.append(f"specversion must be 1.0 (got {event.get('specversion')!r})")
    if event.get("datacontenttype") != "application/json":
        problems.append(f"datacontenttype must be application/json (got {event.get('datacontenttype')!r})")
    if event.get("dataschema") != dataschema:
        problems.append(f"dataschema must be {dataschema} (got {event.get('dataschema')!r})")
    if _parse_time(event.get("time")) is None:
        problems.append(f"time {event.get('time')!r} is not an RFC 3339 timestamp")
    for name in event:
        if name != "data" and not EXTENSION_NAME.match(name):
            problems.append(f"attribute name {name!r} is not lower-case letters and digits (at most 20)")
    return problems


def _data_problems(data: Any, schema_file: str) -> list[str]:
    if not isinstance(data, dict):
        return ["data must be a JSON object"]
    return [
        f"data/{'/'.join(str(part) for part in error.absolute_path) or '(top)'}: {error.message[:300]}"
        for error in sorted(_validator(schema_file).iter_errors(data), key=lambda e: list(e.absolute_path))
    ]


def lease_event_problems(event: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a GpuLease lifecycle event (the lease controller's); [] when valid."""
    problems = _envelope_problems(event, LEASE_DATASCHEMA_URI)
    step = TYPE_STEP.get(str(event.get("type")))
    if step is None:
        problems.append(f"type {event.get('type')!r} is not a CastSlice GpuLease lifecycle type")
    problems += _data_problems(event.get("data"), LEASE_SCHEMA_FILE)
    if problems:
        return problems
    data: dict[str, Any] = event["data"]
    lease = data["lease"]
    if data["step"] != step:
        problems.append(f"type says {step} but data.step is {data['step']}")
    expected = {"subject": f"{lease['namespace']}/{lease['name']}", "podnamespace": lease["namespace"]}
    for name, value in expected.items():
        if event.get(name) != value:
            problems.append(f"attribute {name} is {event.get(name)!r} but data says {value!r}")
    return problems


def is_lease_event(event: Mapping[str, Any]) -> bool:
    return str(event.get("type", "")) in TYPE_STEP


def event_problems(event: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a structured-mode event dict (attributes and data); [] when valid.
    Decision events and the lease controller's lifecycle events are both CastSlice's."""
    if is_lease_event(event):
        return lease_event_problems(event)
    problems = _envelope_problems(event, DATASCHEMA_URI)
    outcome = TYPE_OUTCOME.get(str(event.get("type")))
    if outcome is None:
        problems.append(f"type {event.get('type')!r} is not a CastSlice decision type")
    for name in EVENT_EXTENSIONS:
        if not isinstance(event.get(name), str):
            problems.append(f"extension attribute {name} is missing")

    problems += _data_problems(event.get("data"), SCHEMA_FILE)
    if problems:
        return problems
    data: dict[str, Any] = event["data"]

    # The attributes repeat parts of data so Triggers can filter; they must agree.
    pod = data["pod"]
    acting = ",".join(m["mutator"] for m in data["mutators"] if m["action"] != "unchanged") or NO_MUTATORS
    expected = {
        "outcome": data["outcome"],
        "podnamespace": pod["namespace"],
        "mutators": acting,
        "subject": subject_for(pod["namespace"], pod["name"], pod["generateName"]),
    }
    if outcome is not None and outcome != data["outcome"]:
        problems.append(f"type says {outcome} but data.outcome is {data['outcome']}")
    for name, value in expected.items():
        if event.get(name) != value:
            problems.append(f"attribute {name} is {event.get(name)!r} but data says {value!r}")
    return problems


def as_event_dict(event: CloudEvent | Mapping[str, Any]) -> dict[str, Any]:
    return to_dict(event) if isinstance(event, CloudEvent) else dict(event)


@dataclass(frozen=True)
class Query:
    since: datetime | None = None
    until: datetime | None = None
    namespace: str | None = None
    outcome: str | None = None
    mutator: str | None = None
    """Events where this mutator acted (mutated or denied)."""
    limit: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        values: list[Any] = []
        if self.since is not None:
            clauses.append("e.time >= ?")
            values.append(format_time(self.since))
        if self.until is not None:
            clauses.append("e.time < ?")
            values.append(format_time(self.until))
        if self.namespace is not None:
            clauses.append("e.namespace = ?")
            values.append(self.namespace)
        if self.outcome is not None:
            clauses.append("e.outcome = ?")
            values.append(self.outcome)
        if self.mutator is not None:
            clauses.append(
                "EXISTS (SELECT 1 FROM event_mutators m WHERE m.source = e.source AND m.id = e.id"
                " AND m.mutator = ? AND m.action != 'unchanged')"
            )
            values.append(self.mutator)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", values


_SCHEMA_SQL: Final = """
CREATE TABLE IF NOT EXISTS events (
    source TEXT NOT NULL,
    id TEXT NOT NULL,
    type TEXT NOT NULL,
    outcome TEXT NOT NULL,
    namespace TEXT NOT NULL,
    pod TEXT NOT NULL,
    time TEXT NOT NULL,
    received_at TEXT NOT NULL,
    request_uid TEXT NOT NULL,
    allowed INTEGER NOT NULL,
    reason TEXT NOT NULL,
    mutators TEXT NOT NULL,
    config_digest TEXT NOT NULL,
    engine_version TEXT NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (source, id)
);
CREATE INDEX IF NOT EXISTS events_time ON events (time);
CREATE INDEX IF NOT EXISTS events_namespace ON events (namespace, time);
CREATE INDEX IF NOT EXISTS events_outcome ON events (outcome, time);
CREATE TABLE IF NOT EXISTS event_mutators (
    source TEXT NOT NULL,
    id TEXT NOT NULL,
    mutator TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (source, id, mutator)
);
CREATE TABLE IF NOT EXISTS lease_events (
    source TEXT NOT NULL,
    id TEXT NOT NULL,
    type TEXT NOT NULL,
    step TEXT NOT NULL,
    namespace TEXT NOT NULL,
    lease TEXT NOT NULL,
    time TEXT NOT NULL,
    received_at TEXT NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (source, id)
);
CREATE INDEX IF NOT EXISTS lease_events_lease ON lease_events (namespace, lease, time);
CREATE TABLE IF NOT EXISTS rejected (
    received_at TEXT NOT NULL,
    id TEXT,
    type TEXT,
    source TEXT,
    problems TEXT NOT NULL,
    event TEXT NOT NULL
);
"""


class AuditStore:
    """SQLite, one connection guarded by a lock (the ASGI target calls it from worker threads)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA_SQL)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing --------------------------------------------------------------------------------
    def accept(self, event: CloudEvent | Mapping[str, Any]) -> bool:
        """Store a valid event (True; False when this (source, id) is already stored). An invalid
        one goes to the rejected table and raises InvalidEvent."""
        document = as_event_dict(event)
        problems = event_problems(document)
        received = format_time(datetime.now(UTC))
        raw = json.dumps(document, separators=(",", ":"), ensure_ascii=False, default=str)
        if problems:
            with self._lock:
                self._db.execute(
                    "INSERT INTO rejected VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        received,
                        _str_or_none(document.get("id")),
                        _str_or_none(document.get("type")),
                        _str_or_none(document.get("source")),
                        json.dumps(problems),
                        raw,
                    ),
                )
            raise InvalidEvent(problems)
        if is_lease_event(document):
            return self._accept_lease_event(document, received, raw)
        data = document["data"]
        pod = data["pod"]
        moment = _parse_time(document["time"])
        assert moment is not None  # checked by event_problems
        row = (
            document["source"],
            document["id"],
            document["type"],
            data["outcome"],
            pod["namespace"],
            pod["name"] or pod["generateName"] or "",
            format_time(moment),
            received,
            data["request"]["uid"],
            int(data["allowed"]),
            data["reason"],
            document["mutators"],
            data["configDigest"],
            data["engineVersion"],
            raw,
        )
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._db.execute(
                    "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row
                )
                stored = cursor.rowcount == 1
                if stored:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO event_mutators VALUES (?, ?, ?, ?, ?)",
                        [
                            (document["source"], document["id"], m["mutator"], m["action"], m["reason"])
                            for m in data["mutators"]
                        ],
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return stored

    def _accept_lease_event(self, document: dict[str, Any], received: str, raw: str) -> bool:
        lease = document["data"]["lease"]
        moment = _parse_time(document["time"])
        assert moment is not None  # checked by lease_event_problems
        row = (
            document["source"],
            document["id"],
            document["type"],
            document["data"]["step"],
            lease["namespace"],
            lease["name"],
            format_time(moment),
            received,
            raw,
        )
        with self._lock:
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO lease_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row
            )
        return cursor.rowcount == 1

    # -- reading --------------------------------------------------------------------------------
    def lease_events(self, namespace: str | None = None, lease: str | None = None) -> list[dict[str, Any]]:
        """Stored GpuLease lifecycle events (as received), oldest first: a lease's history."""
        clauses, values = [], []
        for column, value in (("namespace", namespace), ("lease", lease)):
            if value is not None:
                clauses.append(f"{column} = ?")
                values.append(value)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        rows = self._rows(f"SELECT event FROM lease_events{where} ORDER BY time, id", values)
        return [json.loads(row["event"]) for row in rows]

    def _rows(self, sql: str, values: Iterable[Any]) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, list(values)))

    def events(self, query: Query = Query()) -> list[dict[str, Any]]:
        """Stored events (the structured CloudEvent as received), newest first."""
        where, values = query.where()
        sql = f"SELECT e.event FROM events e{where} ORDER BY e.time DESC, e.id"
        if query.limit is not None:
            sql += " LIMIT ?"
            values.append(query.limit)
        return [json.loads(row["event"]) for row in self._rows(sql, values)]

    def count(self, query: Query = Query()) -> int:
        where, values = query.where()
        return int(self._rows(f"SELECT COUNT(*) AS n FROM events e{where}", values)[0]["n"])

    def rejected(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM rejected ORDER BY received_at", ())
        return [{**dict(row), "problems": json.loads(row["problems"])} for row in rows]

    def summary(self, query: Query = Query(), bucket: str = "hour") -> dict[str, Any]:
        """Counts by outcome, by namespace, by mutator (each mutator's own action) and by time."""
        where, values = query.where()
        width = BUCKETS[bucket]
        outcome_columns = ", ".join(f"SUM(e.outcome = '{o}') AS {o}" for o in OUTCOMES)
        totals = self._rows(
            f"SELECT COUNT(*) AS total, MIN(e.time) AS first, MAX(e.time) AS last, {outcome_columns}"
            f" FROM events e{where}",
            values,
        )[0]
        by_namespace = self._rows(
            f"SELECT e.namespace AS namespace, COUNT(*) AS total, {outcome_columns} FROM events e{where}"
            " GROUP BY e.namespace ORDER BY total DESC, e.namespace",
            values,
        )
        by_time = self._rows(
            f"SELECT substr(e.time, 1, {width}) AS bucket, COUNT(*) AS total, {outcome_columns}"
            f" FROM events e{where} GROUP BY bucket ORDER BY bucket",
            values,
        )
        by_mutator = self._rows(
            "SELECT m.mutator AS mutator, COUNT(*) AS total,"
            " SUM(m.action = 'mutated') AS mutated, SUM(m.action = 'unchanged') AS unchanged,"
            " SUM(m.action = 'denied') AS denied"
            f" FROM event_mutators m JOIN events e ON m.source = e.source AND m.id = e.id{where}"
            " GROUP BY m.mutator ORDER BY m.mutator",
            values,
        )
        rejected = self._rows("SELECT COUNT(*) AS n FROM rejected", ())[0]["n"]

        def outcomes(row: sqlite3.Row) -> dict[str, int]:
            return {o: int(row[o] or 0) for o in OUTCOMES}

        return {
            "total": int(totals["total"]),
            "first": totals["first"],
            "last": totals["last"],
            "byOutcome": outcomes(totals),
            "byNamespace": [
                {"namespace": r["namespace"], "total": int(r["total"]), **outcomes(r)} for r in by_namespace
            ],
            "byMutator": [
                {
                    "mutator": r["mutator"],
                    "total": int(r["total"]),
                    "mutated": int(r["mutated"] or 0),
                    "unchanged": int(r["unchanged"] or 0),
                    "denied": int(r["denied"] or 0),
                }
                for r in by_mutator
            ],
            "byTime": {
                "bucket": bucket,
                "rows": [{"start": r["bucket"], "total": int(r["total"]), **outcomes(r)} for r in by_time],
            },
            "rejected": int(rejected),
        }


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
