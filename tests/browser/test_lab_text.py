"""Names the lab shows are text, never markup: in a real headless Chromium, over a live cluster.

Owner names come from etcd, which other local accounts could write: the lab's state is made
to carry a hostile owner, victim, node and event name (``<img src=x onerror=...>``) and the
page must show each as the characters it is, create no element from it and run none of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from chronoq.lab.server import Lab
from chronoq.local.cluster import LocalCluster
from tests.browser.test_lab import LabThread, browser, cluster, until  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(150)

from selenium.webdriver.common.by import By  # noqa: E402 - after test_lab's skip

HOSTILE = '<img src=x onerror="window.__pwned=1">'


def _hostile(real: Callable[[Lab], dict[str, Any]]) -> Callable[[Lab], dict[str, Any]]:
    def snapshot(self: Lab) -> dict[str, Any]:
        state = real(self)
        if state.get("nodes"):
            state["nodes"] = [{**state["nodes"][0], "node_id": HOSTILE}, *state["nodes"][1:]]
        state["ownership"] = [{**o, "owner": HOSTILE} for o in state.get("ownership", [])]
        state["takeover"] = {
            "victim": HOSTILE, "partition": 0, "old_token": 1, "new_owner": HOSTILE,
            "new_token": 2, "seconds": 1.0, "all_reowned_s": None, "lost": 1,
        }
        state["events"] = [{"at": time.time() * 1000, "kind": HOSTILE, "text": HOSTILE}]
        return state

    return snapshot


def test_hostile_names_show_as_text(
    cluster: tuple[LocalCluster, str], browser: Any, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(Lab, "snapshot", _hostile(Lab.snapshot))
    local, _ = cluster
    lab = LabThread(local)
    lab.start()
    try:
        page = browser
        page.get(lab.url)
        until("the page's first render",
              lambda: page.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
        until("the hostile takeover", lambda: page.find_element(By.ID, "new-owner").text)

        def text(selector: str) -> str:
            return str(page.find_element(By.CSS_SELECTOR, selector).text)

        assert text("#new-owner") == HOSTILE  # the characters, as they are
        assert text("#takeover").startswith(f"Killed {HOSTILE} (partition 0")
        assert HOSTILE in text("#nodes tbody")
        assert text("#events li .kind") == HOSTILE and text("#events li").endswith(HOSTILE)
        assert page.find_elements(By.TAG_NAME, "img") == []  # no element made of the data
        assert page.execute_script("return window.__pwned === undefined")
        owner = page.find_element(By.CSS_SELECTOR, "#partition-grid .cell")
        assert owner.get_attribute("data-owner") == HOSTILE
    finally:
        lab.stop()
