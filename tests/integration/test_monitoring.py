"""Every metric the Grafana dashboard and the alert rules (deploy/) use exists on a real
node's /metrics: a renamed metric breaks this test, not an operator's dashboard."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import yaml

from tests.integration.conftest import NodeFactory
from tests.promql import dashboard_exprs, exposed_names, rule_exprs, unknown_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


async def test_dashboard_and_alert_metrics_exist_on_a_running_node(
    make_node: NodeFactory,
) -> None:
    node = await make_node(metrics_port=0)
    assert node.metrics_port
    exposed = exposed_names(await asyncio.to_thread(_scrape, node.metrics_port))
    assert "chronoq_tasks_fired_total" in exposed

    dashboard = json.loads((DEPLOY / "grafana" / "chronoq.json").read_text())
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [*dashboard_exprs(dashboard), *rule_exprs(rules)]
    assert len(exprs) > 20
    assert unknown_names(exprs, exposed) == {}
