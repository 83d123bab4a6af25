"""Metric names in PromQL, for checking dashboards and alert rules against a node's /metrics.

Not a PromQL parser: string literals, label matchers, ranges, grouping clauses and Grafana
variables are cut away, then every identifier that is not a function call, an aggregation or
a keyword is a metric name. That is enough for the expressions in deploy/, and errs towards
reporting a name (a false alarm fails a test; a missed name would hide a broken panel).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: Series that Prometheus itself adds to every scrape: no node exports them.
SCRAPE_SERIES = frozenset(
    {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}
)

_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
    }
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLES = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads."""
    expr = _LABEL_VALUES.sub(r"\1", expr)  # Grafana's label_values(metric, label)
    for pattern in (_STRINGS, _VARIABLES, _MATCHERS, _RANGES, _GROUPING):
        expr = pattern.sub(" ", expr)
    return {
        name for name, call in _IDENT.findall(expr) if not call and name.lower() not in _KEYWORDS
    }


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[str]:
    """The PromQL of every panel target (rows' nested panels too) and query variable."""

    def panels(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield str(target["expr"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable.get("query")
            yield str(query.get("query", "") if isinstance(query, dict) else query or "")


def rule_exprs(rules: dict[str, Any]) -> Iterator[str]:
    """The expression of every alerting and recording rule of a Prometheus rules file."""
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            yield str(rule["expr"])


def exposed_names(exposition: str) -> set[str]:
    """Every series name a /metrics text offers: the samples it holds, and for each family
    the names its type defines (a labelled gauge with no sample yet still counts)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created"),
        "gauge": ("",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def unknown_names(exprs: Iterable[str], exposed: set[str]) -> dict[str, set[str]]:
    """Expression -> the metric names in it that neither the node nor a scrape provides."""
    missing: dict[str, set[str]] = {}
    for expr in exprs:
        names = metric_names(expr) - exposed - SCRAPE_SERIES
        if names:
            missing[expr] = names
    return missing
