"""FastAPI: request handlers submit tasks through the async client; a worker runs them.

    uvicorn --factory 'recipes.fastapi_app:create_app'        # CHRONOQ_TARGET=127.0.0.1:7070
    chronoq worker --module recipes.fastapi_app                 # serves every task below

One ``Client`` per process, opened and closed by the app's lifespan; handlers ``await`` the
submit helpers of the task definitions, whose defaults (queue, retries) live in one place.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from fastapi import FastAPI
from pydantic import BaseModel

from chronoq.client import Client, TaskContext, TaskRegistry

tasks = TaskRegistry()
HANDLERS = tasks  # what `chronoq worker --module` looks for

#: Stands in for a mail API in this recipe: what the handler "sent".
outbox: list[str] = []


@tasks.task(queue="welcome-emails", max_attempts=5, lease_timeout=timedelta(seconds=30))
async def send_welcome(ctx: TaskContext) -> None:
    outbox.append(ctx.data["email"])


class Signup(BaseModel):
    email: str


def create_app(target: str | None = None) -> FastAPI:
    target = target or os.environ.get("CHRONOQ_TARGET", "127.0.0.1:7070")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Client(target) as client:
            tasks.bind(client)
            yield
            tasks.bind(None)

    app = FastAPI(lifespan=lifespan)

    @app.post("/signup", status_code=202)
    async def signup(body: Signup) -> dict[str, str]:
        # The key makes a repeated request (a client retry) create no second email.
        submitted = await send_welcome.aschedule_in(
            timedelta(seconds=1),
            payload={"email": body.email},
            idempotency_key=f"welcome:{body.email}",
        )
        return {"task_id": submitted.task.id}

    return app
