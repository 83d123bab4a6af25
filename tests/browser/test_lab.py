"""The lab page in a real headless Chromium, over a live 3-node cluster on the virtual clock.

The page is driven like a person would (type, click, wait for the figures to change) and
what it shows is checked against the store itself: pending count, the tasks an advance of the
clock fired, the new owner after a kill (the fence row), and no double firing. It is opened
at the URL the lab prints, whose fragment carries the run's key; without it, nothing shows.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.lab.server import Lab
from chronoq.local.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.timeout(150)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SCREENSHOT = Path("/tmp/chronoq-lab.png")

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "Debian's chromium and chromium-driver are not installed "
        "(apt-get install -y chromium chromium-driver; .ci/run does it)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


class LabThread:
    """The lab's event loop in a thread, so blocking WebDriver calls cannot stall it."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="lab", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise RuntimeError(f"lab did not start: {self._error!r}")

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        lab = Lab(self.cluster, port=0, concurrency=16)
        try:
            await lab.start()
            self.url = lab.url
            self._ready.set()
            await self._stop.wait()
        finally:
            await lab.stop()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def sql(postgres: EmbeddedPostgres, database: str, query: str) -> list[list[str]]:
    out = postgres.run_sql(query, database)
    return [line.split("|") for line in out.strip().splitlines() if line]


def until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except StaleElementReferenceException:  # the page redrew that part meanwhile
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def cluster(
    tmp_path: Path, postgres: EmbeddedPostgres, template_db: str, etcd: Any
) -> Iterator[tuple[LocalCluster, str]]:
    database = f"lab_{uuid.uuid4().hex[:10]}"
    dsn = postgres.create_database(database, template=template_db)
    spec = ClusterSpec(nodes=3, partitions=16, lease_ttl=2, tick_ms=50, virtual_clock=True,
                       cluster=f"lab{uuid.uuid4().hex[:8]}", durable=False)
    local = LocalCluster(tmp_path / "cluster", spec, postgres=postgres, etcd=etcd, dsn=dsn)
    try:
        local.start()
        yield local, database
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
                 "--disable-component-update", "--disable-sync", "--window-size=1400,2200",
                 f"--user-data-dir={tmp_path / 'chrome'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_lab_page_shows_what_the_store_holds(
    cluster: tuple[LocalCluster, str], browser: Any, postgres: EmbeddedPostgres
) -> None:
    local, database = cluster
    lab = LabThread(local)
    lab.start()
    try:
        drive(lab.url, browser, postgres, database)
    finally:
        lab.stop()


def drive(url: str, page: Any, postgres: EmbeddedPostgres, database: str) -> None:
    def el(selector: str) -> Any:
        return page.find_element(By.CSS_SELECTOR, selector)

    def number(selector: str, attribute: str = "data-value") -> int:
        return int(el(selector).get_attribute(attribute) or -1)

    def store_count(where: str) -> int:
        return int(sql(postgres, database, f"SELECT count(*) FROM tasks_with_history WHERE {where}")[0][0])

    page.get(url)
    until("the page's first render", lambda: el("body").get_attribute("data-ready") == "true")
    assert len(page.find_elements(By.CSS_SELECTOR, "#partition-grid .cell")) == 16
    until("three owners", lambda: {c.get_attribute("data-owner") for c in
                                   page.find_elements(By.CSS_SELECTOR, "#partition-grid .cell")}
          == {"node-0", "node-1", "node-2"})

    # Add load: the pending figure is the store's COUNT (taken between two equal readings).
    box = el("#load-count")
    box.clear()
    box.send_keys("20000")
    el("#load-button").click()
    until("the load", lambda: el("#load-progress").get_attribute("data-done") == "true")

    def pending_matches() -> bool:
        before = number("#pending")
        stored = store_count("state = 0")
        return before == stored == number("#pending") and stored > 19_000

    until("the page's pending count to equal the store's", pending_matches)

    # Advance one minute: the due bucket fires at once; the page says how many, as the store.
    el("#advance-button").click()
    result = until("the advance", lambda: el("#advance-result").get_attribute("data-to")
                   and number("#advance-result", "data-due") > 0
                   and number("#advance-result", "data-fired")
                   == number("#advance-result", "data-due") and el("#advance-result"))
    start, end = result.get_attribute("data-from"), result.get_attribute("data-to")
    datetime.fromisoformat(start), datetime.fromisoformat(end)  # valid instants
    window = f"run_at > '{start}' AND run_at <= '{end}'"
    assert number("#advance-result", "data-due") == store_count(window)
    assert number("#advance-result", "data-fired") == store_count(f"{window} AND state <> 0")
    until("the advanced tasks to be executed",
          lambda: number("#advance-result", "data-executed") == store_count(window), 30)
    assert store_count(f"{window} AND state = 3") == store_count(window)

    # The scans ran for real: the naive one read every row, the bucketed one the due rows plus
    # one index probe per (partition, bucket, namespace) lane it shares the batch across: at
    # most one lane per due row, and one per partition whose current bucket is not due yet.
    naive = el("#scans tr[data-when='next minute'][data-scan='naive']")
    bucketed = el("#scans tr[data-when='next minute'][data-scan='bucketed']")
    assert int(naive.get_attribute("data-examined")) >= 20_000
    due = int(bucketed.get_attribute("data-due"))
    assert due <= int(bucketed.get_attribute("data-examined")) <= 2 * due + 16

    # Kill the owner of partition 0: another node takes it over with a newer token. (The grid
    # is a second old and ownership may rebalance meanwhile: the victim is whoever owned the
    # partition at the click; its token is at least the one the grid showed.)
    old_token = int(el("#partition-grid .cell[data-partition='0']").get_attribute("data-token"))
    el("#kill-button").click()
    takeover = until("the takeover", lambda: el("#takeover").get_attribute("data-new-owner")
                     and el("#takeover"))
    new_owner = takeover.get_attribute("data-new-owner")
    new_token = int(takeover.get_attribute("data-new-token"))
    victim = takeover.get_attribute("data-victim")
    assert victim in {"node-0", "node-1", "node-2"} and victim != new_owner
    assert new_token > old_token
    until("the grid to show the new owner", lambda: el(
        "#partition-grid .cell[data-partition='0']").get_attribute("data-owner") == new_owner)
    until("the fence row to carry the new owner's token", lambda: sql(
        postgres, database, "SELECT owner, token FROM partition_fences WHERE partition = 0"
    ) == [[new_owner, str(new_token)]])
    assert el(f"#nodes tr[data-node='{victim}']").get_attribute("class") == "dead"

    # Fire again under the new owners; no partition ever saw its token go back.
    el("#advance-button").click()
    until("the second advance", lambda: el("#advance-result").get_attribute("data-from") != start
          and number("#advance-result", "data-fired") == number("#advance-result", "data-due"))
    regressions = sql(postgres, database, """
        SELECT count(*) FROM (
            SELECT fire_token, max(fire_token) OVER (
                PARTITION BY partition ORDER BY fired_at, fire_token
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_max
            FROM tasks_with_history WHERE fire_token IS NOT NULL) f
        WHERE fire_token < before_max""")
    assert regressions == [["0"]]
    until("the double-firing counter", lambda: number("#double-firings") == 0
          and int(el("#double-firings").text) == 0)
    page.save_screenshot(str(SCREENSHOT))

    # The address without the key that `chronoq lab` printed gets nothing from the lab.
    page.get(url.split("#", 1)[0])
    until("the page to say it lacks the key", lambda: "lacks the lab's key" in el("#message").text)
    assert el("body").get_attribute("data-ready") is None
