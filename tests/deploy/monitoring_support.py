"""What the monitoring tests share (tests/deploy/test_monitoring.py, and the operations end-to-end
module, which holds the rules and the dashboard to the running processes): the alerts of the
rendered PrometheusRule, the metric names the rules and the dashboard query, and the series names a
scrape of /metrics can store."""

from __future__ import annotations

import re
from typing import Any


def alerts(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


METRIC = re.compile(r"\b((?:castslice|apiserver)_[a-z0-9_]+)\b")


def queried_names(rules: dict[str, Any], dashboard: dict[str, Any]) -> set[str]:
    expressions = [rule["expr"] for rule in alerts(rules).values()]
    expressions += [
        target["expr"]
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]
    return {name for expression in expressions for name in METRIC.findall(expression)}


def served_names(text: str) -> set[str]:
    """The series names a scrape of this text can store, from its ``# TYPE`` lines: a labelled
    family with no sample yet (no drift found, no event delivered yet) is declared all the same.
    A histogram stores its _bucket, _sum and _count series."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names
