"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright, against the demo
service under load. `.ci/run` installs both; without them this test fails and says what is missing.

Set ADAPTIVE_GATE_SCREENSHOT=path.png to keep the screenshot (the README's comes from here).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .helpers import image_bytes
from .servers import free_port, wait_until_healthy

CHROMIUM = "/usr/bin/chromium"
TOKEN = "dashboard-test-token-0123456789"
# As this machine's notes advise: no sandbox as root, no GPU, and none of Chromium's own traffic.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    # The log goes to a file: a pipe that nobody reads fills up under load and blocks the server.
    log_path = tmp_path / "demo.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "demo_service", "--port", str(port), "--model", "resnet18"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "ADAPTIVE_GATE_ADMIN_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, "the demo service")
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        log.close()
        assert TOKEN not in log_path.read_text()  # the token never reaches the log


class Load:
    """Eight clients posting images in a loop, in threads, until stopped (bounded in time and count)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(8)]

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            for i in range(2000):
                if self._stop.is_set():
                    return
                files = {"file": (f"{i}.png", image_bytes(size=(64 + i % 7, 64)))}
                self.codes.append(http.post("/predict", files=files).status_code)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def show_a_neighbour(demo_url: str, page: object) -> None:
    """For the README's picture only: more history, and a neighbour that takes most of the simulated
    card for a while (room for one image beside it), so the limit is seen to fall and come back."""
    wait = page.wait_for_timeout  # type: ignore[attr-defined]
    wait(20_000)
    httpx.put(f"{demo_url}/simulated-gpu/neighbour", params={"nbytes": 660 << 20}, timeout=10)
    wait(25_000)
    httpx.put(f"{demo_url}/simulated-gpu/neighbour", params={"nbytes": 0}, timeout=10)
    wait(25_000)


def test_dashboard_draws_the_live_gate_in_a_real_browser(demo_url: str, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (bash .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            # Protected: the page asks for the token and refuses a wrong one.
            response = page.goto(f"{demo_url}/gate/dashboard")
            assert response is not None and response.status == 401
            page.fill("#token", "not-the-token-at-all")
            page.click("button")
            page.wait_for_selector("text=That token was refused.")
            page.fill("#token", TOKEN)
            page.click("button")
            page.wait_for_function("Number(document.body.dataset.updates) >= 2", timeout=15_000)
            assert "cannot reach" not in page.inner_text("#error")
            chart = page.locator("#chart-load")
            idle_points = int(chart.get_attribute("data-points") or 0)
            assert page.inner_text("#in_flight") == "0"

            with Load(demo_url) as load:
                page.wait_for_function(
                    "Number(document.querySelector('#chart-load').dataset.maxInFlight) >= 2", timeout=60_000
                )
                page.wait_for_timeout(2500)  # a few more seconds of history under load
                if os.environ.get("ADAPTIVE_GATE_SCREENSHOT"):
                    show_a_neighbour(demo_url, page)
                busy = json.loads(chart.get_attribute("data-last") or "{}")
                busy_points = int(chart.get_attribute("data-points") or 0)
                page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            assert load.codes and set(load.codes) <= {200, 503}

            # The data changed: more history, in-flight drawn above zero, memory drawn.
            assert busy_points > idle_points
            assert busy["limit"] >= 1
            in_flight_path = page.locator("#chart-load path[data-name='in_flight']").get_attribute("d") or ""
            assert in_flight_path.count("V") >= 2  # steps up and down, not a flat line
            assert int(page.locator("#chart-memory").get_attribute("data-points") or 0) >= 2
            assert "MiB of" in page.inner_text("#memory-text")
            counters = page.inner_text("#counters")
            assert "completed" in counters and "event loop lag" in counters
        finally:
            browser.close()

    screenshot = tmp_path / "dashboard.png"
    assert screenshot.stat().st_size > 20_000  # a rendered page, not an empty one
    keep = os.environ.get("ADAPTIVE_GATE_SCREENSHOT")
    if keep:
        shutil.copy(screenshot, keep)
