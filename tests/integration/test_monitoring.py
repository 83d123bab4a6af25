"""Every metric the Grafana dashboard and the alert rules (deploy/) use exists on a real
node's /metrics: a renamed metric breaks this test, not an operator's dashboard."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chronoq.cardinality import OTHER
from chronoq.client import Client, NewTask
from chronoq.node.metrics import SCRAPE_CACHE
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


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


async def test_queue_series_stay_bounded_however_many_queues_tenants_create(
    make_node: NodeFactory,
) -> None:
    """5,000 queue names (the attack at 100,000: 100,022 series, an 18 MB page) make at most
    ``metrics_queues`` pairs of their own plus the aggregates, and a small page."""
    node = await make_node(metrics_port=0, metrics_queues=20)
    assert node.metrics_port and node.depth is not None
    later = datetime.now(UTC) + timedelta(minutes=10)
    async with Client(node.address, namespace="tenant", timeout=30) as client:
        await client.submit_ids([NewTask(queue=f"q{i}", run_at=later) for i in range(5000)])
        await client.submit_ids([NewTask(queue="busy", run_at=later) for _ in range(30)])
    await node.depth.poll()
    text = await asyncio.to_thread(_scrape, node.metrics_port)
    depth = _series(text, "chronoq_queue_depth")
    assert 0 < len(depth) <= 3 * (2 * 20 + 1)  # states x (pairs of their own + aggregates)
    assert any('queue="busy"' in line for line in depth)  # the busiest keeps its own series
    other = [line for line in depth if f'queue="{OTHER}"' in line]
    assert len(other) == 1 and other[0].endswith(" 4981.0")  # 5,030 - 49 of their own
    assert len(text.encode()) < 64 * 1024


class _Probe(Collector):
    """Counts collections and notes the threads they ran in."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.threads.add(threading.get_ident())
        yield GaugeMetricFamily("chronoq_probe", "A test's probe.", value=1)


async def test_scrape_loops_render_off_the_event_loop_and_at_most_once_a_second(
    make_node: NodeFactory,
) -> None:
    """Hammering /metrics costs the node one rendering per SCRAPE_CACHE, in the HTTP
    server's threads: never on the event loop, however many scrapers ask."""
    node = await make_node(metrics_port=0)
    assert node.metrics_port
    probe = _Probe()
    node.metrics.add_collector(probe)
    probe.threads.clear()  # registering collects once, to learn the names
    before = node.metrics.page.renders
    started = time.monotonic()
    pages = await asyncio.gather(
        *(asyncio.to_thread(_scrape, node.metrics_port) for _ in range(40))
    )
    elapsed = time.monotonic() - started
    assert all("chronoq_probe 1.0" in page for page in pages)
    renders = node.metrics.page.renders - before
    assert 1 <= renders <= 1 + elapsed / SCRAPE_CACHE
    assert threading.get_ident() not in probe.threads  # the event loop's thread never renders
