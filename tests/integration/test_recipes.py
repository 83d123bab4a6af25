"""The framework recipes (recipes/) end to end against a real node: a FastAPI app and a Django
view submit tasks, and a worker built from the same task definitions runs them.

FastAPI, httpx and Django are test extras only; without them these tests skip.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from chronoq.client import Client
from chronoq.client.handlers import import_handlers
from chronoq.models import TaskState
from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)


async def until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def live(make_node: NodeFactory) -> Node:
    return await make_node()  # system clock: the worker sees tasks come due


async def test_fastapi_app_submits_and_its_worker_runs(live: Node) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from recipes import fastapi_app

    fastapi_app.outbox.clear()
    app = fastapi_app.create_app(live.address)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            first = await http.post("/signup", json={"email": "zoë@example.com"})
            again = await http.post("/signup", json={"email": "zoë@example.com"})  # a retry
            bad = await http.post("/signup", json={"mail": "x"})
    assert first.status_code == 202, first.text
    assert again.json() == first.json()  # the idempotency key: one task
    assert bad.status_code == 422

    async with Client(live.address) as client:
        task = await client.get(first.json()["task_id"])
        assert (task.queue, task.max_attempts) == ("welcome-emails", 5)  # the task's defaults
        worker = fastapi_app.tasks.worker(client, claim_wait=timedelta(milliseconds=200))
        run = asyncio.create_task(worker.run())
        try:
            await until(lambda: fastapi_app.outbox == ["zoë@example.com"])
        finally:
            worker.stop()
            await run
        assert (await client.get(task.id)).state is TaskState.SUCCEEDED


async def test_django_view_submits_through_the_sync_client(live: Node) -> None:
    pytest.importorskip("django")
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            ROOT_URLCONF="recipes.django_views",
            ALLOWED_HOSTS=["testserver"],
            SECRET_KEY="recipe-test",
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            DATABASES={},
        )
    import django
    from django.test import Client as DjangoClient

    django.setup()
    from recipes import django_views

    django_views.reports.clear()
    sync = await asyncio.to_thread(django_views.connect, live.address)
    stop = threading.Event()
    worker = asyncio.create_task(
        asyncio.to_thread(
            django_views.tasks.run_worker,
            live.address,
            stop=stop,
            claim_wait=timedelta(milliseconds=200),
        )
    )
    try:
        browser = DjangoClient()

        def post(body: str) -> Any:
            return browser.post("/reports/", body, content_type="application/json")

        ok = await asyncio.to_thread(post, json.dumps({"user": "ada", "month": "2030-01"}))
        bad = await asyncio.to_thread(post, "not json")
        assert ok.status_code == 202, ok.content
        assert bad.status_code == 400
        await until(lambda: django_views.reports == [{"user": "ada", "month": "2030-01"}])
        task = await asyncio.to_thread(sync.get, ok.json()["task_id"])
        assert task.lease_timeout == timedelta(minutes=5)
    finally:
        stop.set()
        stats = await asyncio.wait_for(worker, 20)
        await asyncio.to_thread(sync.close)
        django_views.tasks.bind(None)
    assert stats.succeeded == 1


def test_recipes_serve_the_worker_command() -> None:
    """``chronoq worker --module recipes.fastapi_app`` finds the registered tasks."""
    pytest.importorskip("fastapi")
    assert list(import_handlers("recipes.fastapi_app")) == ["welcome-emails"]
