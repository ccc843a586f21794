"""The dashboard in a real headless browser (Debian's chromium, driven by Selenium).

Served by uvicorn on 127.0.0.1, like ``sqla-queue dashboard``; the test clicks through a
requeue of a failed job and the pause of a task, answers the confirmation dialogs, and
checks the database. It saves the screenshots of the guide (docs/images/dashboard-*.png).
Skipped, with the reason, when chromium or chromedriver is not installed
(``.ci/install_browser.sh`` installs them).
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.browser.dashboard_data import Seeded, add_history, is_paused, job_status, seed
from tests.support.app import queue
from tests.support.running import wait_for

# Until the `browser` marker is registered in pyproject.toml, the acceptance tier's.
pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "no headless browser: chromium and chromedriver are not on PATH "
        "(run .ci/install_browser.sh: apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")

from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def server(engine: Engine) -> Iterator[str]:
    """The dashboard (auth: everyone is ``ops``) on a free port; its base URL."""
    app = queue.dashboard(engine, auth=lambda request: "ops", refresh=None, title="shop jobs")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=30)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless chromium through the system's chromedriver (nothing is downloaded)."""
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str, height: int) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1400, height)
    path = IMAGES / f"dashboard-{name}.png"
    assert driver.get_screenshot_as_file(str(path)), f"no screenshot written to {path}"
    assert path.stat().st_size > 10_000


def _confirm(driver: Any, accept: bool) -> str:
    alert = WebDriverWait(driver, 10).until(lambda d: d.switch_to.alert)
    text = str(alert.text)
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return text


def test_click_through_actions_and_screenshots(engine: Engine, server: str, browser: Any) -> None:
    # History first: the newest jobs, at the top of the list, are the seeded ones.
    assert add_history(engine) > 1000
    seeded: Seeded = seed(engine)
    failed = seeded.failed[0]

    browser.get(f"{server}/")
    assert browser.find_element(By.ID, "mode").text == "actions on · ops"
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart")
    _shot(browser, "overview", 900)

    browser.get(f"{server}/jobs")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert len(rows) == 50
    assert browser.find_element(By.ID, "older")
    _shot(browser, "jobs", 1000)
    browser.find_element(By.CSS_SELECTOR, "#filters select[name=state]").send_keys("failed")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    WebDriverWait(browser, 10).until(lambda d: "state=failed" in d.current_url)
    shown = {
        int(r.get_attribute("data-job"))
        for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")
    }
    assert set(seeded.failed) <= shown

    browser.get(f"{server}/workers")
    assert "4242" in browser.find_element(By.ID, "workers").text
    _shot(browser, "workers", 500)

    browser.get(f"{server}/jobs/{failed}")
    assert "card declined (0)" in browser.page_source
    _shot(browser, "job", 1100)

    # Requeue: a dismissed confirmation changes nothing; an accepted one requeues.
    button = browser.find_element(By.CSS_SELECTOR, "#job-actions button")
    assert button.text == "Requeue"
    button.click()
    assert "Requeue job" in _confirm(browser, accept=False)
    time.sleep(0.5)
    assert job_status(engine, failed) == "failed"
    browser.find_element(By.CSS_SELECTOR, "#job-actions button").click()
    _confirm(browser, accept=True)
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "notice"))
    assert "Job requeued" in browser.find_element(By.ID, "notice").text
    assert job_status(engine, failed) == "queued"

    # Pause a task from the overview.
    browser.get(f"{server}/")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-task="noop"]')
    pause = [b for b in row.find_elements(By.TAG_NAME, "button") if b.text == "Pause"]
    assert pause, "no Pause button on the noop row"
    pause[0].click()
    assert "Pause task noop" in _confirm(browser, accept=True)
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "notice"))
    assert "Task paused" in browser.find_element(By.ID, "notice").text
    assert is_paused(engine, "noop")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-task="noop"]')
    assert "paused" in row.find_element(By.CSS_SELECTOR, "td.task-state").text
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
