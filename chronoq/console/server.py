"""The console's web server: pages, a JSON API over ``ClusterLink``, and the guard.

Pages are one HTML shell each (the page's name, the CSRF token and the namespaces in its
``<body>``); ``static/console.js`` fills them from the JSON API and refreshes them by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from chronoq import errors, origins
from chronoq.console import guard
from chronoq.console.link import MAX_BULK_IDS, ClusterLink, TaskFilter
from chronoq.console.payload import DEFAULT_SHOWN_BYTES, PayloadView, show_payload
from chronoq.console.views import parse_state
from chronoq.durations import parse_instant
from chronoq.limits import MAX_NAME, MAX_PAGE_TOKEN, MAX_TASK_ID, check_name
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.signals import stop_event

log = logging.getLogger("chronoq.console")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
#: Seconds between Status polls (and the overview's refresh).
DEFAULT_REFRESH = 2.0
MIN_REFRESH, MAX_REFRESH = 0.5, 60.0
#: Largest request body: a bulk action's ids.
MAX_BODY_BYTES = 64 * 1024
#: Namespaces offered in the page's selector at most (any other can be typed).
MAX_NAMESPACES = 64
#: Refusals are logged at most once per this many seconds (a hostile page may send many).
REFUSAL_LOG_SECONDS = 10.0
#: The pages, by path: (name, title).
PAGES = {
    "/": ("overview", "Overview"),
    "/queues": ("queues", "Queues"),
    "/tasks": ("tasks", "Tasks"),
    "/task": ("task", "Task"),
    "/dead": ("dead", "Dead letters"),
    "/schedules": ("schedules", "Schedules"),
    "/shards": ("shards", "Shards"),
}
#: HTTP status of each remote error, as the page shows it.
HTTP_STATUS: Mapping[type[errors.ChronoqError], int] = {
    errors.AccessDenied: 403,
    errors.NotFound: 404,
    errors.BadRequest: 400,
    errors.InvalidArgument: 400,
    errors.PreconditionFailed: 409,
    errors.ResourceExhausted: 429,
    errors.Unavailable: 503,
}
_SECURITY_HEADERS = {**origins.SECURITY_HEADERS, "Cache-Control": "no-store"}

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Action = Callable[[dict[str, Any]], Awaitable[Any]]


class BadInput(errors.ChronoqError):
    """A request to the console is malformed."""


@dataclass(frozen=True, kw_only=True)
class ConsoleSettings:
    """What ``chronoq console`` serves, and which cluster it talks to."""

    address: str = "127.0.0.1:7070"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    namespaces: tuple[str, ...] = (DEFAULT_NAMESPACE,)
    refresh: float = DEFAULT_REFRESH
    client_options: Mapping[str, Any] = field(default_factory=dict)  # token, TLS

    def __post_init__(self) -> None:
        if not MIN_REFRESH <= self.refresh <= MAX_REFRESH:
            raise errors.ConfigError(f"refresh: between {MIN_REFRESH:g} and {MAX_REFRESH:g} s")
        if not 1 <= len(self.namespaces) <= MAX_NAMESPACES:
            raise errors.ConfigError(f"namespaces: give 1 to {MAX_NAMESPACES}")
        for namespace in self.namespaces:
            check_name("namespace", namespace)


class Console:
    """The web console: ``start`` opens the gRPC channels (in the running loop), polls the
    cluster and serves; ``stop`` ends all three."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self._link: ClusterLink | None = None
        self.url = ""
        self.origin = ""
        self._guard: guard.ConsoleGuard | None = None
        self._session_key = guard.new_secret()
        self._csrf = guard.new_secret()
        self._runner: web.AppRunner | None = None
        self._poller: asyncio.Task[None] | None = None
        self._refused = 0
        self._refusal_logged_at = -REFUSAL_LOG_SECONDS

    @property
    def link(self) -> ClusterLink:
        if self._link is None:
            raise errors.ConfigError("the console is not started")
        return self._link

    async def start(self) -> None:
        self._link = ClusterLink(self.settings.address, self.settings.client_options)
        await self.link.poll()
        self._poller = asyncio.create_task(self._poll(), name="chronoq-console-poll")
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.settings.host, self.settings.port).start()
        host, port = self._runner.addresses[0][:2]
        self._guard = guard.ConsoleGuard(
            session_key=self._session_key, csrf_token=self._csrf, bound_host=host, port=port
        )
        self.origin = f"http://{guard.url_host(host)}:{port}"
        self.url = f"{self.origin}{guard.LOGIN_PATH}?key={self._session_key}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._link is not None:
            await self._link.close()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh)
            try:
                await self.link.poll()
            except Exception:  # the poller must outlive any one bad answer
                log.exception("console: polling the cluster failed")

    # ------------------------------------------------------------------ web

    def _app(self) -> web.Application:
        static = Path(str(resources.files("chronoq.console").joinpath("static")))

        @web.middleware
        async def check(request: web.Request, handler: _Handler) -> web.StreamResponse:
            return await self._check(request, handler)

        app = web.Application(middlewares=[check], client_max_size=MAX_BODY_BYTES)
        # Every response, errors and static files too.
        app.on_response_prepare.append(origins.with_headers(_SECURITY_HEADERS))
        for path in PAGES:
            app.router.add_get(path, self._page)
        app.router.add_get(guard.LOGIN_PATH, self._login)
        app.router.add_static(guard.STATIC_PREFIX, static)
        app.router.add_get("/api/overview", self._get(lambda q: self._overview()))
        app.router.add_get("/api/queues", self._get(lambda q: self.link.queues(_ns(q))))
        app.router.add_get("/api/tasks", self._get(lambda q: self.link.tasks(_filter(q))))
        app.router.add_get("/api/dead", self._get(lambda q: self.link.tasks(_filter(q, dead=True))))
        app.router.add_get("/api/task", self._get(self._task))
        app.router.add_get("/api/schedules", self._get(lambda q: self.link.schedules(_ns(q))))
        app.router.add_get("/api/shards", self._get(lambda q: self._shards()))
        app.router.add_post("/api/queues/limit", self._post(self._set_limit))
        app.router.add_get(
            "/api/queues/settings", self._get(lambda q: self.link.queue_settings(_ns(q)))
        )
        for action in ("pause", "resume"):
            app.router.add_post(f"/api/queues/{action}", self._post(self._queue(action)))
        app.router.add_post("/api/tasks/cancel", self._post(self._cancel))
        app.router.add_post("/api/tasks/requeue", self._post(self._requeue))
        for action in ("pause", "resume", "delete"):
            app.router.add_post(f"/api/schedules/{action}", self._post(self._schedule(action)))
        return app

    async def _check(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Refuse what ``guard.ConsoleGuard`` does not let through, with its reason."""
        if self._guard is None:
            raise web.HTTPServiceUnavailable(text="the console is starting")
        headers = request.headers
        refusal = self._guard.refusal(
            guard.Request(
                method=request.method,
                path=request.path,
                host=headers.get("Host"),
                origin=headers.get("Origin"),
                fetch_site=headers.get("Sec-Fetch-Site"),
                content_type=request.content_type if "Content-Type" in headers else None,
                session=request.cookies.get(guard.SESSION_COOKIE),
                csrf=headers.get(guard.CSRF_HEADER),
            )
        )
        if refusal is not None:
            self._log_refusal(request, refusal.reason)
            if request.path.startswith("/api/"):
                response: web.StreamResponse = web.json_response(
                    {"error": refusal.reason}, status=refusal.status
                )
            else:
                response = web.Response(text=refusal.reason, status=refusal.status)
        else:
            response = await handler(request)
        return response

    def _log_refusal(self, request: web.Request, reason: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_at < REFUSAL_LOG_SECONDS:
            return
        self._refusal_logged_at = now
        log.warning(
            "console refused %s %r: %s (%d refused since the last such line)",
            request.method, request.path[:80], reason, self._refused,
        )
        self._refused = 0

    async def _login(self, request: web.Request) -> web.StreamResponse:
        """The printed link: set the session cookie and go to the overview."""
        assert self._guard is not None
        if not self._guard.key_matches(request.query.get("key")):
            return web.Response(
                text="wrong or missing key: open the URL that chronoq console printed", status=401
            )
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(
            guard.SESSION_COOKIE, self._session_key, httponly=True, samesite="Strict", path="/"
        )
        return response

    async def _page(self, request: web.Request) -> web.Response:
        name, title = PAGES[request.path]
        return web.Response(text=self._shell(name, title), content_type="text/html")

    def _shell(self, name: str, title: str) -> str:
        nav = "".join(
            f'<a href="{path}" data-nav="{page}"'
            f'{" aria-current=page" if page == name else ""}>{label}</a>'
            for path, (page, label) in PAGES.items()
            if page != "task"
        )
        data = html.escape(json.dumps(list(self.settings.namespaces)))
        return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{self._csrf}">
<title>{html.escape(title)} · chronoq console</title>
<link rel="stylesheet" href="/static/uPlot.min.css">
<link rel="stylesheet" href="/static/console.css">
</head>
<body data-page="{name}" data-namespaces="{data}" data-refresh="{self.settings.refresh:g}">
<header><span class="brand">chronoq</span><nav>{nav}</nav>
<label class="ns">namespace <input id="namespace" list="namespaces" autocomplete="off"
 spellcheck="false" maxlength="{MAX_NAME}"><datalist id="namespaces"></datalist></label>
<span id="conn" class="conn"></span></header>
<div id="banner" class="banner" hidden></div>
<main id="main"></main>
<script src="/static/uPlot.iife.min.js"></script>
<script src="/static/console.js"></script>
</body></html>
"""

    def _get(
        self, fetch: Callable[[Mapping[str, str]], Awaitable[Any]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return await _answer(lambda: fetch(request.query))

        return handle

    def _post(self, action: _Action) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except ValueError:
                return web.json_response({"error": "send a JSON object"}, status=400)
            if not isinstance(body, dict):
                return web.json_response({"error": "send a JSON object"}, status=400)
            return await _answer(lambda: action(body))

        return handle

    async def _overview(self) -> dict[str, Any]:
        return self.link.overview()

    async def _shards(self) -> dict[str, Any]:
        return self.link.shards()

    async def _task(self, query: Mapping[str, str]) -> dict[str, Any]:
        try:
            view = PayloadView(query.get("view", "auto"))
        except ValueError:
            raise BadInput("view: one of auto, text, json, hex") from None
        limit = _int(query.get("limit"), "limit", DEFAULT_SHOWN_BYTES)
        detail, payload = await self.link.task(_ns(query), _id(query.get("id", "")))
        shown = show_payload(payload, view, limit)
        return {
            **detail,
            "payload": {
                "view": shown.view.value,
                "text": shown.text,
                "size": shown.size,
                "cut": shown.cut,
                "note": shown.note,
            },
        }

    async def _set_limit(self, body: dict[str, Any]) -> dict[str, Any]:
        queue = check_name("queue", _text(body, "queue"))
        rate, burst = _number(body, "rate"), _number(body, "burst", 0.0)
        await self.link.set_limit(_ns(body), queue, rate, burst)
        return {"queue": queue, "rate": rate, "burst": burst}

    async def _cancel(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"results": await self.link.cancel(_ns(body), _ids(body))}

    async def _requeue(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"results": await self.link.requeue(_ns(body), _ids(body))}

    def _queue(self, action: str) -> _Action:
        async def act(body: dict[str, Any]) -> Any:
            return await self.link.queue_action(_ns(body), _text(body, "queue"), action)

        return act

    def _schedule(self, action: str) -> _Action:
        async def act(body: dict[str, Any]) -> Any:
            return await self.link.schedule_action(_ns(body), _text(body, "name"), action)

        return act


async def _answer(produce: Callable[[], Awaitable[Any]]) -> web.Response:
    """``produce``'s result as JSON; a chronoq error as ``{"error"}`` with its HTTP status."""
    try:
        return web.json_response(await produce())
    except errors.ChronoqError as exc:
        return web.json_response({"error": exc.message}, status=http_status(exc))
    except ValueError as exc:
        return web.json_response({"error": str(exc)}, status=400)


def http_status(exc: errors.ChronoqError) -> int:
    """The HTTP status a page gets for ``exc``: the first of its classes in ``HTTP_STATUS``;
    else 502 for what a node answered, 400 for what the console itself refused."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 502 if isinstance(exc, errors.RemoteError) else 400

# ---------------------------------------------------------------------- request fields


def _ns(source: Mapping[str, Any]) -> str:
    value = source.get("namespace") or DEFAULT_NAMESPACE
    if not isinstance(value, str):
        raise BadInput("namespace: give a name")
    return check_name("namespace", value)


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadInput(f"{name}: required")
    return value


def _id(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TASK_ID:
        raise BadInput(f"id: give a task id of at most {MAX_TASK_ID} characters")
    return value


def _ids(body: Mapping[str, Any]) -> list[str]:
    ids = body.get("ids")
    if not isinstance(ids, list) or not ids:
        raise BadInput("ids: give a list of task ids")
    if len(ids) > MAX_BULK_IDS:
        raise BadInput(f"ids: at most {MAX_BULK_IDS} at once")
    return list(dict.fromkeys(_id(i) for i in ids))


def _number(body: Mapping[str, Any], name: str, default: float | None = None) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadInput(f"{name}: give a number")
    try:
        number = float(value)
    except ValueError:
        raise BadInput(f"{name}: {str(value)[:32]!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise BadInput(f"{name}: give a number >= 0")
    return number


def _int(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit() or len(value) > 9:
        raise BadInput(f"{name}: give a whole number")
    return int(value)


def _instant(value: str | None, name: str) -> datetime | None:
    return parse_instant(value, field=name) if value else None


def _filter(query: Mapping[str, str], *, dead: bool = False) -> TaskFilter:
    token = query.get("page_token", "")
    if len(token) > MAX_PAGE_TOKEN:
        raise BadInput("page_token: too long")
    queue = query.get("queue") or None
    return TaskFilter(
        namespace=_ns(query),
        queue=check_name("queue", queue) if queue else None,
        state=None if dead else parse_state(query.get("state", "")),
        start=_instant(query.get("from"), "from"),
        end=_instant(query.get("to"), "to"),
        page_token=token,
        page_size=_int(query.get("page_size"), "page_size", 50),
        dead=dead,
    )


# ---------------------------------------------------------------------- the command


def run(settings: ConsoleSettings, announce: Callable[[str], None] = print) -> None:
    """Serve the console until SIGINT/SIGTERM."""
    asyncio.run(_serve(settings, announce))


async def _serve(settings: ConsoleSettings, announce: Callable[[str], None]) -> None:
    console = Console(settings)
    stop = stop_event()
    try:
        await console.start()
    except OSError as exc:  # the port is taken
        await console.stop()
        raise errors.ConfigError(
            f"cannot serve on {settings.host}:{settings.port}: {exc.strerror}"
        ) from None
    announce(f"chronoq console: {console.url}  (Ctrl-C stops it)")
    announce("  the link carries this run's key: open it as printed, do not share it")
    if not _is_loopback(settings.host):
        announce(f"  serving on {settings.host}: anyone with the link acts with your token")
    try:
        await stop.wait()
    finally:
        await console.stop()


def _is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost")


__all__: Sequence[str] = ["Console", "ConsoleSettings", "run"]
