"""Django: a view submits a task through the blocking ``SyncClient``; a worker runs it.

    # settings.py / AppConfig.ready():  recipes.django_views.connect(settings.CHRONOQ_TARGET)
    # urls.py:                          path("reports/", request_report)
    # worker process:                   tasks.run_worker(settings.CHRONOQ_TARGET)
    #                                   (or: chronoq worker --module recipes.django_views)

One ``SyncClient`` per process serves every request thread: no event loop in the views.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.http import require_POST

from chronoq.client import SyncClient, TaskContext, TaskRegistry

tasks = TaskRegistry()
HANDLERS = tasks  # what `chronoq worker --module` looks for

#: Stands in for a report store in this recipe: what the handler "built".
reports: list[dict[str, str]] = []


@tasks.task(queue="reports", max_attempts=3, lease_timeout=timedelta(minutes=5))
def build_report(ctx: TaskContext) -> None:
    # A plain function: the worker runs it in a thread, so it may block (ORM, files).
    reports.append(ctx.data)


def connect(target: str) -> SyncClient:
    """Open the process's client and let the task helpers use it (call once, at startup)."""
    client = SyncClient(target)
    tasks.bind(client)
    return client


@require_POST
def request_report(request: HttpRequest) -> JsonResponse:
    try:
        body = json.loads(request.body)
        user, month = str(body["user"]), str(body["month"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": 'send {"user": ..., "month": "YYYY-MM"}'}, status=400)
    submitted = build_report.schedule(payload={"user": user, "month": month})
    return JsonResponse({"task_id": submitted.task.id}, status=202)


urlpatterns = [path("reports/", request_report)]
