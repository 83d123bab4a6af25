"""The lab's HTTP face: every request passes ``guard.LabGuard`` first, actions take and give
JSON, and refusals are logged without flooding the terminal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from aiohttp import web

from chronoq import errors, origins
from chronoq.lab import guard

log = logging.getLogger("chronoq.lab")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Action = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

#: At most one log line per this many seconds about refused requests.
REFUSAL_LOG_SECONDS = 10.0


class LabError(errors.ChronoqError):
    """The lab cannot do that now."""

    def __init__(self, message: str, status: int = 409) -> None:
        self.status = status  # the HTTP status the page gets
        super().__init__(message)



class RefusalLog:
    """Says that something knocked, at most once per ``REFUSAL_LOG_SECONDS``: a hostile page
    may send thousands of requests, the terminal must stay readable."""

    def __init__(self) -> None:
        self.refused = 0
        self._logged_at = -REFUSAL_LOG_SECONDS

    def add(self, request: web.Request, reason: str) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at < REFUSAL_LOG_SECONDS:
            return
        self._logged_at = now
        log.warning(
            "lab refused %s %r: %s (%d refused since the last such line)",
            request.method,
            request.path[:80],
            reason,
            self.refused,
        )
        self.refused = 0


def guarded(lab_guard: Callable[[], guard.LabGuard | None], refusals: RefusalLog) -> Any:
    """A middleware refusing, with 403 and the reason, what the guard does not let through
    (``lab_guard`` gives None while the lab starts: 503 then)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        current = lab_guard()
        if current is None:
            raise web.HTTPServiceUnavailable(text="the lab is starting")
        headers = request.headers
        reason = current.refusal(
            guard.Request(
                method=request.method,
                path=request.path,
                host=headers.get("Host"),
                origin=headers.get("Origin"),
                content_type=request.content_type if "Content-Type" in headers else None,
                secret=headers.get(guard.SECRET_HEADER),
                fetch_site=headers.get("Sec-Fetch-Site"),
            )
        )
        if reason is not None:
            refusals.add(request, reason)
            return web.json_response({"error": reason}, status=403)
        return await handler(request)

    return check


#: ``on_response_prepare``: every response keeps its page to the lab's own scripts, as text,
#: and out of other pages' frames (no clickjacking of its buttons).
secured = origins.with_headers(origins.SECURITY_HEADERS)


def json_action(action: Action) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A POST handler: a JSON object in, ``action``'s JSON out, errors as JSON with a status."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
            if not isinstance(body, dict):
                raise LabError("send a JSON object", 400)
            return web.json_response(await action(body))
        except ValueError as exc:  # a body that is not JSON
            return web.json_response({"error": f"bad request: {exc}"}, status=400)
        except LabError as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
        except (errors.ChronoqError, asyncpg.PostgresError, OSError, RuntimeError) as exc:
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)

    return handle


def int_field(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise LabError(f"{name}: give a whole number", 400)
    try:
        return int(value)
    except ValueError:
        raise LabError(f"{name}: {value!r} is not a whole number", 400) from None


def float_field(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise LabError(f"{name}: give a number", 400)
    try:
        return float(value)
    except ValueError:
        raise LabError(f"{name}: {value!r} is not a number", 400) from None


def str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise LabError(f"{name}: required", 400)
    return value
