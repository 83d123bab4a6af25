"""The framework recipes' views, with ``chronoq.testing`` in place of a node: what an
application's own tests look like ("this view scheduled that task"). The recipes' end-to-end
runs against a real node and worker are in tests/integration/test_recipes.py."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from chronoq.models import TaskState
from chronoq.testing import InMemoryClient, InMemorySyncClient


async def test_fastapi_signup_schedules_one_welcome_email() -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from recipes import fastapi_app

    fastapi_app.outbox.clear()
    client = InMemoryClient(handlers=fastapi_app.tasks)
    app = fastapi_app.create_app("unused:1")  # no lifespan here: nothing connects
    fastapi_app.tasks.bind(client)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            first = await http.post("/signup", json={"email": "zoë@example.com"})
            again = await http.post("/signup", json={"email": "zoë@example.com"})  # a retry
            bad = await http.post("/signup", json={"mail": "x"})
    finally:
        fastapi_app.tasks.bind(None)
    assert first.status_code == 202 and again.json() == first.json()
    assert bad.status_code == 422
    (task,) = client.assert_submitted(
        "welcome-emails", count=1, data={"email": "zoë@example.com"}, max_attempts=5
    )
    assert task.idempotency_key == "welcome:zoë@example.com"
    assert task.id == first.json()["task_id"]
    assert fastapi_app.outbox == []  # scheduled, not run
    await client.run_all()
    assert fastapi_app.outbox == ["zoë@example.com"]


def test_django_view_schedules_the_report_and_refuses_a_bad_body() -> None:
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
    client = InMemorySyncClient(handlers=django_views.tasks)
    django_views.tasks.bind(client)
    try:
        browser = DjangoClient()

        def post(body: str) -> Any:
            return browser.post("/reports/", body, content_type="application/json")

        ok = post(json.dumps({"user": "ada", "month": "2030-01"}))
        bad = post("not json")
    finally:
        django_views.tasks.bind(None)
    assert (ok.status_code, bad.status_code) == (202, 400)
    (task,) = client.assert_submitted("reports", count=1, data={"user": "ada", "month": "2030-01"})
    assert task.lease_timeout == timedelta(minutes=5) and task.id == ok.json()["task_id"]
    (run,) = client.run_all()
    assert run.task.state is TaskState.SUCCEEDED
    assert django_views.reports == [{"user": "ada", "month": "2030-01"}]
