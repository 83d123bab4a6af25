"""deploy/: the Grafana dashboard, the Prometheus config and alert rules, and their compose
services. The metric names they use are checked against a real node's /metrics in
tests/integration/test_monitoring.py; here: the name extractor itself, the files' shape, and
the rules through `promtool` (Debian package `prometheus`) where it is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.promql import dashboard_exprs, metric_names, rule_exprs, unknown_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "chronoq.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = "promtool not found (apt-get install -y prometheus)"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return yaml.safe_load(ALERTS.read_text())  # type: ignore[no-any-return]


# ------------------------------------------------------------------ the extractor


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up == 0", {"up"}),
        (
            'histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="x", q=~"$q"}[5m]))) > 5',
            {"a_bucket"},
        ),
        ("sum(a) < max_over_time(sum(a)[1h:1m])", {"a"}),
        (
            "a and on (instance) sum by (instance) (rate(b_total[$__rate_interval])) > 0",
            {"a", "b_total"},
        ),
        (
            "rate(x:recorded:rate5m[5m] offset 1h) / ignoring(le) group_left c",
            {"x:recorded:rate5m", "c"},
        ),
        (
            'label_values(chronoq_owned_partitions{job="chronoq"}, instance)',
            {"chronoq_owned_partitions"},
        ),
        ('count(a{l="sum(b)"}) * 1e3 + 2', {"a"}),
    ],
)
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_dashboard_naming_a_missing_metric_fails_the_check() -> None:
    bad = {
        "panels": [
            {
                "type": "row",
                "panels": [
                    {"targets": [{"expr": "sum(rate(chronoq_tasks_fired_totl[5m]))"}]},
                ],
            },
            {"targets": [{"expr": "chronoq_owned_partitions"}]},
        ],
        "templating": {
            "list": [
                {"type": "query", "query": {"query": "label_values(chronoq_no_such, instance)"}},
            ]
        },
    }
    exposed = {"chronoq_tasks_fired_total", "chronoq_owned_partitions"}
    missing = unknown_names(dashboard_exprs(bad), exposed)
    assert missing == {
        "sum(rate(chronoq_tasks_fired_totl[5m]))": {"chronoq_tasks_fired_totl"},
        "label_values(chronoq_no_such, instance)": {"chronoq_no_such"},
    }
    # `up` comes from the scrape, not the node: allowed.
    assert unknown_names(['up{job="chronoq"} == 0'], set()) == {}


# ------------------------------------------------------------------ the files


def test_the_dashboard_covers_the_node_metrics(dashboard: dict[str, Any]) -> None:
    exprs = list(dashboard_exprs(dashboard))
    names = set().union(*(metric_names(e) for e in exprs))
    for wanted in (
        "chronoq_fire_lateness_seconds_bucket",
        "chronoq_tasks_fired_total",
        "chronoq_fire_rows_per_tick_bucket",
        "chronoq_owned_partitions",
        "chronoq_lease_losses_total",
        "chronoq_queue_depth",
        "chronoq_tasks_dead_total",
        "chronoq_loop_healthy",
        "chronoq_loop_restarts_total",
    ):
        assert wanted in names, f"the dashboard shows no {wanted}"
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["targets"] and all(t.get("expr") for t in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    assert dashboard["uid"] and dashboard["title"]


def test_every_alert_has_a_severity_and_a_summary(rules: dict[str, Any]) -> None:
    names = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] not in names, f"duplicate alert {rule['alert']}"
            names.add(rule["alert"])
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
    for topic in (
        "Late",
        "Backlog",
        "OwnershipGap",
        "Flapping",
        "LeaseLost",
        "DeadLetters",
        "LoopUnhealthy",
    ):
        assert any(topic in n for n in names), f"no alert about {topic}"
    assert len(list(rule_exprs(rules))) == len(names)


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_accepts_the_rules() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_the_alerts_fire_on_the_histories_they_are_for() -> None:
    """deploy/prometheus/alerts_test.yml: promtool's rule unit tests."""
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ALERTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_runs_prometheus_and_grafana_under_the_monitoring_profile() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services, configs = compose["services"], compose["configs"]
    mounted: dict[str, str] = {}
    for name in ("prometheus", "grafana"):
        svc = services[name]
        assert svc["profiles"] == ["monitoring"], f"{name}: opt-in"
        for c in svc["configs"]:
            source = ROOT / configs[c["source"]]["file"]
            assert source.is_file(), f"{name}: {source} missing"
            mounted[c["target"]] = source.relative_to(ROOT).as_posix()
    prometheus = yaml.safe_load(PROMETHEUS.read_text())
    for rule_file in prometheus["rule_files"]:
        assert mounted.get(rule_file) == "deploy/prometheus/alerts.yml", rule_file
    # The scrape targets are the nodes' metrics ports.
    [job] = prometheus["scrape_configs"]
    assert job["job_name"] == "chronoq", "the rules and the dashboard select job=chronoq"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    nodes = {
        f"{name}:{arg.split('=', 1)[1]}"
        for name, svc in services.items()
        for arg in svc.get("command", [])
        if str(arg).startswith("--metrics-port=")
    }
    assert nodes and targets == nodes
    # Grafana finds its data source and dashboard where the provisioning files say.
    dashboards = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "chronoq.yml").read_text()
    )
    path = dashboards["providers"][0]["options"]["path"]
    assert mounted[f"{path}/chronoq.json"] == "deploy/grafana/chronoq.json"
    sources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"
