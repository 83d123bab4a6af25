"""``chronoq console`` in a real headless Chromium over a live 3-node cluster with bearer tokens.

The console talks to the nodes only through the gRPC API; what its pages show is checked
against what the API itself answers (Status, tasks, schedules), and what its buttons do is
checked through the API afterwards: requeued dead letters run, a paused schedule stops
creating occurrences. A console holding a namespace's token sees that namespace only, a forged
cross-site POST changes nothing, and a node that goes away is shown while the pages keep
working through the others.

Screenshots go to ``$CHRONOQ_CONSOLE_SCREENSHOTS`` when set (the README's come from there:
``CHRONOQ_CONSOLE_SCREENSHOTS=docs/console``), else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from chronoq.client import Client
from chronoq.console.server import Console, ConsoleSettings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.local.cluster import ClusterSpec, LocalCluster
from chronoq.models import Lease, TaskState
from chronoq.redact import split_password

pytestmark = pytest.mark.timeout(300)  # generous: the machine may be loaded

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "Debian's chromium and chromium-driver are not installed "
        "(apt-get install -y chromium chromium-driver; .ci/run does it)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402

ADMIN_TOKEN = "console-admin-token-0123456789"
TEAM_TOKEN = "console-team-a-token-0123456789"
T = TypeVar("T")


class ConsoleThread:
    """Consoles and a client on an event loop in a thread, so WebDriver calls cannot stall them."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="console", daemon=True)
        self._thread.start()
        self.consoles: list[Console] = []
        self.client = self.run(self._client())

    async def _client(self) -> Client:
        return Client(self.address, token=ADMIN_TOKEN)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start_console(self, token: str, namespaces: tuple[str, ...]) -> Console:
        settings = ConsoleSettings(address=self.address, port=0, namespaces=namespaces,
                                   refresh=0.5, client_options={"token": token})
        console = Console(settings)
        self.consoles.append(console)
        self.run(console.start())
        return console

    def stop(self) -> None:
        for console in self.consoles:
            self.run(console.stop())
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class EvilPage:
    """A page on another origin that auto-submits a form POST to the console (classic CSRF)."""

    def __init__(self, target: str, body: dict[str, Any]) -> None:
        field_name = json.dumps(body)[:-1] + ', "x": "'
        page = (
            f'<form id="f" method="POST" action="{target}" enctype="text/plain">'
            f"<input name='{field_name}' value='\"}}'></form>"
            "<script>document.getElementById('f').submit()</script>"
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def until(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - a stale element while the page re-renders
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"{ADMIN_TOKEN}" = ["*"]\n"{TEAM_TOKEN}" = ["team-a"]\n')
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return path


@pytest.fixture
def cluster(
    tmp_path: Path, postgres: EmbeddedPostgres, template_db: str, etcd: Any, token_file: Path
) -> Iterator[LocalCluster]:
    database = f"console_{uuid.uuid4().hex[:10]}"
    dsn = postgres.create_database(database, template=template_db)
    spec = ClusterSpec(nodes=3, partitions=16, lease_ttl=2, tick_ms=50,
                       cluster=f"con{uuid.uuid4().hex[:8]}", durable=False,
                       extra_node_args=("--auth-tokens", str(token_file)))
    local = LocalCluster(tmp_path / "cluster", spec, postgres=postgres, etcd=etcd, dsn=dsn)
    try:
        local.start()
        yield local
    finally:
        local.stop()
        postgres.drop_database(database)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,1100",
                 f"--user-data-dir={tmp_path / 'chrome'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_console_over_a_live_cluster(cluster: LocalCluster, browser: Any, tmp_path: Path) -> None:
    shots = Path(os.environ.get("CHRONOQ_CONSOLE_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    side = ConsoleThread(",".join(cluster.addresses))
    try:
        drive(side, cluster, Pages(browser, shots))
    except AssertionError:
        browser.save_screenshot(str(tmp_path / "failure.png"))
        banner = browser.find_elements(By.ID, "banner")
        print("banner:", banner[0].text if banner else None, "url:", browser.current_url)
        raise
    finally:
        side.stop()


class Pages:
    """The browser, with waits and clicks that survive the pages' own refreshes."""

    def __init__(self, driver: Any, shots: Path) -> None:
        self.driver = driver
        self.shots = shots

    def get(self, url: str) -> None:
        self.driver.get(url)

    def els(self, selector: str) -> list[Any]:
        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def el(self, selector: str) -> Any:
        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def attr(self, selector: str, name: str) -> str | None:
        value: str | None = self.el(selector).get_attribute(name)
        return value

    def click(self, selector: str) -> None:
        """Click, again if the page re-rendered the element meanwhile."""
        until(f"a click on {selector}", lambda: self.el(selector).click() or True)

    def confirm(self) -> None:
        until("the confirmation", lambda: self.el("#confirm-yes").is_displayed())
        self.click("#confirm-yes")

    def shoot(self, name: str, width: int = 1400, mobile: bool = False) -> None:
        """A screenshot of the whole page, as tall as its content."""
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": min(int(height), 2400), "deviceScaleFactor": 1,
            "mobile": mobile})
        try:
            self.driver.save_screenshot(str(self.shots / f"{name}.png"))
        finally:
            if not mobile:
                self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def drive(side: ConsoleThread, cluster: LocalCluster, pages: Pages) -> None:
    client = side.client
    # Something to look at: tasks over the coming buckets, a few firing now, a JSON payload.
    payload = {"to": "ops@example.com", "subject": "console test", "n": 7}
    submitted = side.run(client.submit("emails", delay=timedelta(minutes=20),
                                       payload=json.dumps(payload).encode()))
    task_id = submitted.task.id
    side.run(client.submit_many([
        _new("reports", timedelta(seconds=i * 37), f'{{"report": {i}}}'.encode())
        for i in range(60)]))
    side.run(client.submit_many([  # firing while the overview samples
        _new("pings", timedelta(milliseconds=i * 10), b"ping") for i in range(300)]))
    console = side.start_console(ADMIN_TOKEN, ("default", "team-a"))
    base = console.origin

    pages.get(console.url)
    overview_shows_status(side, pages)
    shards_page_shows_the_map(side, pages, base, cluster)
    task_is_listed_with_its_payload(pages, base, task_id, payload)
    queue_limit_is_set(side, pages, base)
    requeued_dead_letters_run(side, pages, base)
    paused_schedule_stops(side, pages, base)
    forged_posts_are_refused(side, pages, base, task_id)
    overview_fits_a_phone(pages, base)
    namespace_token_sees_its_namespace(side, pages)
    node_loss_is_shown(cluster, pages, base, task_id)


def overview_shows_status(side: ConsoleThread, pages: Pages) -> None:
    """The overview shows the members and the ownership that Status returns."""
    until("the overview", lambda: pages.attr("body", "data-ready") == "true")

    def matches() -> bool:
        status = side.run(side.client.status())
        members = {m.node_id: m.owned_partitions for m in status.members}
        owners = {o.partition: (o.owner, o.fencing_token) for o in status.ownership}
        # One script reads the page at once: it re-renders every refresh.
        rows, grid = pages.driver.execute_script("""
            const rows = [...document.querySelectorAll('#members tr[data-node]')]
              .map((r) => [r.dataset.node, Number(r.dataset.owned)]);
            const grid = [...document.querySelectorAll('#partition-grid .cell')]
              .map((c) => [Number(c.dataset.partition), c.dataset.owner, Number(c.dataset.token)]);
            return [rows, grid];""")
        shown = {node: owned for node, owned in rows}
        cells = {partition: (owner, token) for partition, owner, token in grid}
        return shown == members and cells == owners and len(cells) == 16

    until("the overview to show Status's members and ownership", matches)
    until("the three members", lambda: {r.get_attribute("data-node") for r in pages.els(
        "#members tr[data-node]")} == {"node-0", "node-1", "node-2"})
    assert len(pages.els("#nodes tr[data-address]")) == 3 and not pages.els("#nodes tr.down")
    until("a chart of the coming buckets", lambda: pages.els("#chart-pending canvas"))
    time.sleep(2)  # a few samples for the throughput and lateness charts
    pages.shoot("overview")


def task_is_listed_with_its_payload(
    pages: Pages, base: str, task_id: str, payload: dict[str, Any]
) -> None:
    """A task submitted through the API is listed; its page shows the payload as JSON."""
    pages.get(f"{base}/tasks?namespace=default&queue=emails")
    until("the submitted task in the list",
          lambda: pages.attr(f"#tasks tr[data-id='{task_id}']", "data-state") == "scheduled")
    pages.shoot("tasks")
    pages.click(f"#tasks tr[data-id='{task_id}'] a")
    until("the task page", lambda: pages.attr("#payload", "data-view") == "json")
    until("the payload, pretty-printed", lambda: json.loads(pages.el("#payload").text) == payload)
    until("the state", lambda: pages.el("dd[data-field='state']").text == "scheduled")
    assert pages.els("#task-cancel") and not pages.els("#task-requeue")
    pages.shoot("task")


def queue_limit_is_set(side: ConsoleThread, pages: Pages, base: str) -> None:
    """The queues page counts by state and sets a dispatch limit."""
    pages.get(f"{base}/queues?namespace=default")
    until("the queue counts", lambda: pages.el(
        "#queues tr[data-queue='emails'] td[data-state='scheduled']").text == "1")
    pages.el("#limit-queue").send_keys("emails")
    pages.el("#limit-rate").send_keys("25")
    pages.click("#limit-form button")
    until("the limit", lambda: pages.attr(
        "#queues tr[data-queue='emails'] td[data-rate]", "data-rate") == "25")
    assert side.run(side.client.queue_limits())["emails"][0] == 25.0
    pages.shoot("queues")


def requeued_dead_letters_run(side: ConsoleThread, pages: Pages, base: str) -> None:
    """Three tasks fail for good; requeued from the dead letters page, they run again."""
    client = side.client
    side.run(client.submit_many([_new("flaky", timedelta(0), b"x", max_attempts=1)
                                 for _ in range(3)]))
    dead = side.run(_kill_tasks(client, "flaky", 3))
    pages.get(f"{base}/dead?namespace=default")
    until("the dead letters", lambda: {r.get_attribute("data-id")
                                       for r in pages.els("#tasks tr[data-id]")} == set(dead))
    pages.click("#select-all")
    until("all selected", lambda: pages.el("#selected-count").text == "3 selected")
    pages.shoot("dead")
    pages.click("#requeue-selected")
    pages.confirm()
    until("the requeue result", lambda: pages.attr("#bulk-result", "data-ok") == "3")
    ran = side.run(_run_tasks(client, "flaky", 3))
    assert sorted(ran) == sorted(dead)
    assert all(side.run(client.get(i)).state is TaskState.SUCCEEDED for i in dead)


def shards_page_shows_the_map(
    side: ConsoleThread, pages: Pages, base: str, cluster: LocalCluster
) -> None:
    """The shards page shows the map Status returns: one shard holding every partition, its
    DSN without the password."""
    status = side.run(side.client.status())
    assert status.shard_map is not None
    expected = {s.name: (s.health, s.partition_count) for s in status.shard_map.shards}
    assert expected == {"shard-0": ("ok", 16)}
    pages.get(f"{base}/shards")
    until("the shards page", lambda: pages.attr("body", "data-ready") == "true")
    until("the shard rows", lambda: {
        r.get_attribute("data-shard"): (r.get_attribute("data-health"),
                                        int(r.get_attribute("data-held")))
        for r in pages.els("#shards tr[data-shard]")} == expected)
    password = split_password(cluster.dsn)[1]
    assert password and password not in pages.driver.page_source
    assert "No moves." in pages.el("#moves-note").text
    pages.shoot("shards")


def paused_schedule_stops(side: ConsoleThread, pages: Pages, base: str) -> None:
    """Pausing a schedule from the page stops new occurrences."""
    client = side.client
    side.run(client.create_schedule("tick", "ticks", every=timedelta(seconds=1)))
    until("the schedule to create occurrences",
          lambda: side.run(client.get_schedule("tick")).created_total > 0)
    pages.get(f"{base}/schedules?namespace=default")
    until("the schedule row", lambda: pages.el("tr[data-name='tick'] button[data-action='pause']"))
    pages.shoot("schedules")
    pages.click("tr[data-name='tick'] button[data-action='pause']")
    until("the page to show it paused",
          lambda: pages.attr("tr[data-name='tick']", "data-paused") == "true")
    assert side.run(client.get_schedule("tick")).paused
    time.sleep(1.0)  # an occurrence materialised just before the pause commits first
    before = side.run(client.get_schedule("tick")).created_total
    count_before = len(side.run(client.list(queue="ticks", page_size=1000)).tasks)
    time.sleep(2.5)  # more than two intervals of the schedule
    assert side.run(client.get_schedule("tick")).created_total == before
    assert len(side.run(client.list(queue="ticks", page_size=1000)).tasks) == count_before


def forged_posts_are_refused(side: ConsoleThread, pages: Pages, base: str, task_id: str) -> None:
    """A form on another origin posting to the console is refused and changes nothing; so is
    a same-origin script's POST without the page's CSRF token."""
    evil = EvilPage(f"{base}/api/tasks/cancel", {"namespace": "default", "ids": [task_id]})
    try:
        pages.get(evil.url)
        until("the refusal", lambda: "cross-origin request" in pages.driver.page_source)
    finally:
        evil.stop()
    pages.get(f"{base}/tasks?namespace=default")
    status = pages.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/api/tasks/cancel', {method: 'POST', headers: {'Content-Type': 'application/json'},
              body: JSON.stringify({namespace: 'default', ids: [arguments[0]]})})
          .then((r) => done(r.status));""", task_id)
    assert status == 403
    assert side.run(side.client.get(task_id)).state is TaskState.SCHEDULED


def overview_fits_a_phone(pages: Pages, base: str) -> None:
    """At 390 px the overview needs no sideways scrolling (wide tables scroll in their card)."""
    pages.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                 {"width": 390, "height": 844, "deviceScaleFactor": 1,
                                  "mobile": True})
    try:
        pages.get(f"{base}/?namespace=default")
        until("the overview at phone width", lambda: pages.els("#partition-grid .cell"))
        time.sleep(0.5)
        assert pages.driver.execute_script("return document.documentElement.scrollWidth") <= 400
        pages.shoot("overview-phone", 390, mobile=True)
    finally:
        pages.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def namespace_token_sees_its_namespace(side: ConsoleThread, pages: Pages) -> None:
    """A console with team-a's token lists team-a's tasks; elsewhere it shows the refusal."""
    side.run(_submit_in(side.address, "team-a", "team-jobs"))
    team = side.start_console(TEAM_TOKEN, ("team-a",))
    team_base = team.origin.replace("127.0.0.1", "localhost")  # a host of its own: own cookie
    pages.get(team.url.replace("127.0.0.1", "localhost"))
    until("the team's overview", lambda: pages.els("#members tr[data-node]"))
    pages.get(f"{team_base}/tasks?namespace=team-a")
    until("the team's task", lambda: [r.get_attribute("data-queue")
                                      for r in pages.els("#tasks tr[data-id]")] == ["team-jobs"])
    pages.get(f"{team_base}/tasks?namespace=default")
    banner = until("the refusal", lambda: pages.el("#banner").is_displayed() and pages.el("#banner"))
    assert "Refused" in banner.text and '"default"' in banner.text
    assert not pages.els("#tasks tr[data-id]")
    pages.get(f"{team_base}/queues?namespace=default")
    until("the queues refusal", lambda: "Refused" in pages.el("#banner").text)


def node_loss_is_shown(cluster: LocalCluster, pages: Pages, base: str, task_id: str) -> None:
    """A node goes away: the overview shows it, the pages keep working through the others."""
    gone = cluster.nodes["node-2"]
    cluster.kill("node-2")
    pages.get(f"{base}/?namespace=default")
    until("the dead node shown",
          lambda: pages.attr(f"#nodes tr[data-address='{gone.address}']", "class") == "down")
    until("the member to leave",
          lambda: pages.attr("#members tr[data-node='node-2']", "data-gone") == "true")
    pages.get(f"{base}/tasks?namespace=default&queue=emails")
    until("the task list without node-2", lambda: pages.el(f"#tasks tr[data-id='{task_id}']"))


def _new(queue: str, delay: timedelta, payload: bytes, **fields: Any) -> Any:
    from chronoq.client import NewTask

    return NewTask(queue=queue, delay=delay, payload=payload, **fields)


async def _kill_tasks(client: Client, queue: str, count: int) -> list[str]:
    """Claim ``count`` tasks of ``queue`` and fail each for good: they go DEAD."""
    dead: list[str] = []
    deadline = time.monotonic() + 15
    while len(dead) < count and time.monotonic() < deadline:
        for task in await client.claim([queue], max_tasks=count, wait=timedelta(seconds=2)):
            await client.fail(Lease(task.id, task.attempt), "boom", fatal=True)
            dead.append(task.id)
    return dead


async def _run_tasks(client: Client, queue: str, count: int) -> list[str]:
    """Claim and complete ``count`` tasks of ``queue`` (a worker's work)."""
    ran: list[str] = []
    deadline = time.monotonic() + 15
    while len(ran) < count and time.monotonic() < deadline:
        for task in await client.claim([queue], max_tasks=count, wait=timedelta(seconds=2)):
            await client.complete(Lease(task.id, task.attempt))
            ran.append(task.id)
    return ran


async def _submit_in(address: str, namespace: str, queue: str) -> None:
    async with Client(address, namespace=namespace, token=ADMIN_TOKEN) as client:
        await client.submit(queue, delay=timedelta(minutes=5), payload=b"team")
