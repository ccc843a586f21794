"""The dashboard in a real headless browser (Debian's chromium, driven by Selenium).

Served by uvicorn on 127.0.0.1, like ``sqla-queue dashboard``; the test clicks through a
requeue of a failed job and the pause of a task, answers the confirmation dialogs, and
checks the database. Every page is shown at 1024 and 1400 px wide: none may scroll
sideways, and each is saved as a screenshot in the test's temporary directory (printed).
``SQLA_QUEUE_WRITE_DOCS_IMAGES=1`` also writes the guide's images
(docs/images/dashboard-*.png, at 1400 px); without it the tracked images are left alone.
Skipped, with the reason, when chromium or chromedriver is not installed
(``.ci/install_browser.sh`` installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.browser.dashboard_data import (
    LONG_ERROR,
    Seeded,
    add_history,
    is_paused,
    job_status,
    seed,
)
from tests.support.app import queue
from tests.support.running import wait_for

# Until the `browser` marker is registered in pyproject.toml, the acceptance tier's.
pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
#: Set to 1 to (re)write the guide's screenshots in docs/images.
WRITE_DOCS_IMAGES = os.environ.get("SQLA_QUEUE_WRITE_DOCS_IMAGES") == "1"
#: The widths every page must fit without scrolling sideways: a small laptop, a desktop.
WIDTHS = (1024, 1400)
#: The guide's screenshots (docs/guides/dashboard.md), taken at this width.
DOCS_WIDTH = 1400
DOCS_PAGES = frozenset({"overview", "jobs", "job", "workers"})

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


# The elements that end beyond the window's right edge (hidden by a clipping box, or
# past a scroll), but the text inside a <pre>, which scrolls in its own box on purpose.
_BEYOND_THE_RIGHT_EDGE = """
var edge = document.documentElement.clientWidth;
var out = [];
document.querySelectorAll("body *").forEach(function (e) {
  if (e.closest("pre")) { return; }
  var r = e.getBoundingClientRect();
  if (r.width > 0 && r.right > edge + 0.5) {
    out.push(e.tagName + (e.id ? "#" + e.id : "") + " " + (e.textContent || "").slice(0, 30));
  }
});
return out.slice(0, 5);
"""


def _fits_and_shot(driver: Any, shots: Path, name: str, height: int) -> None:
    """At each of :data:`WIDTHS`: the page fits the window's width (no sideways scroll),
    and a screenshot goes to ``shots`` (and, on request, the guide's to docs/images)."""
    for width in WIDTHS:
        driver.set_window_size(width, height)
        inner = driver.execute_script("return window.innerWidth")
        assert inner == width, f"the window is {inner} px wide, not {width}"
        scroll, client = driver.execute_script(
            "var e = document.documentElement; return [e.scrollWidth, e.clientWidth];"
        )
        beyond = driver.execute_script(_BEYOND_THE_RIGHT_EDGE) if scroll > client else []
        assert scroll <= client, (
            f"{name} scrolls sideways at {width} px: {scroll} > {client}; beyond the edge: {beyond}"
        )
        beyond = driver.execute_script(_BEYOND_THE_RIGHT_EDGE)
        assert not beyond, f"{name} at {width} px: cut off on the right: {beyond}"
        targets = [shots / f"dashboard-{name}-{width}.png"]
        if WRITE_DOCS_IMAGES and width == DOCS_WIDTH and name in DOCS_PAGES:
            IMAGES.mkdir(parents=True, exist_ok=True)
            targets.append(IMAGES / f"dashboard-{name}.png")
        for path in targets:
            assert driver.get_screenshot_as_file(str(path)), f"no screenshot written to {path}"
            assert path.stat().st_size > 10_000


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[Path]:
    """Where this run's screenshots go (the path is printed: look at them). Unless asked
    to, the run leaves the guide's tracked images as they were."""
    print(f"screenshots in {tmp_path}")
    before = _docs_images()
    yield tmp_path
    if not WRITE_DOCS_IMAGES:
        assert _docs_images() == before, (
            "docs/images changed without SQLA_QUEUE_WRITE_DOCS_IMAGES=1"
        )


def _docs_images() -> dict[str, tuple[int, int]]:
    return {
        path.name: (path.stat().st_mtime_ns, path.stat().st_size)
        for path in IMAGES.glob("dashboard-*.png")
    }


def _confirm(driver: Any, accept: bool) -> str:
    alert = WebDriverWait(driver, 10).until(lambda d: d.switch_to.alert)
    text = str(alert.text)
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return text


def test_click_through_actions_and_screenshots(
    engine: Engine, server: str, browser: Any, shots: Path
) -> None:
    # History first: the newest jobs, at the top of the list, are the seeded ones.
    assert add_history(engine) > 1000
    seeded: Seeded = seed(engine)
    failed = seeded.failed[0]

    browser.get(f"{server}/")
    assert browser.find_element(By.ID, "mode").text == "actions on · ops"
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart")
    # The seeded durable job waits: the overview shows the suspended card and column.
    assert browser.find_element(By.ID, "total-suspended").text == "1"
    assert browser.find_elements(By.CSS_SELECTOR, "#tasks td.suspended")
    _fits_and_shot(browser, shots, "overview", 900)
    for button in browser.find_elements(By.CSS_SELECTOR, "#tasks button"):
        assert button.is_displayed(), f"{button.text} is hidden"

    browser.get(f"{server}/jobs")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert len(rows) == 50
    assert browser.find_element(By.ID, "older")
    assert LONG_ERROR[:30] in browser.find_element(By.ID, "jobs").text
    _fits_and_shot(browser, shots, "jobs", 1000)
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
    _fits_and_shot(browser, shots, "workers", 500)

    browser.get(f"{server}/jobs/{seeded.running}")
    assert browser.find_element(By.ID, "job-attempts").text == "1 of 1, running now"
    _fits_and_shot(browser, shots, "job-running", 700)

    browser.get(f"{server}/jobs/{seeded.failed[-1]}")
    assert LONG_ERROR[:30] in browser.page_source
    _fits_and_shot(browser, shots, "job-long-error", 1100)

    browser.get(f"{server}/jobs?before=%C2%B2")
    assert "before must be a whole number" in browser.find_element(By.ID, "error").text
    _fits_and_shot(browser, shots, "refused", 500)

    browser.get(f"{server}/jobs/{failed}")
    assert "card declined (0)" in browser.page_source
    _fits_and_shot(browser, shots, "job", 1100)

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


def test_workflow_graph_is_visible_and_its_nodes_link_to_jobs(
    engine: Engine, server: str, browser: Any, shots: Path
) -> None:
    from sqlalchemy.orm import sessionmaker

    from sqla_queue.workflows import Workflow
    from tests.support.workflow_app import wf_fail, wf_value

    wf = Workflow("checkout")
    paid = wf.add(wf_value.call("paid"), name="charge")
    bad = wf.add(wf_fail.call("out of stock"), name="reserve")
    wf.add(wf_value.call("sent"), after=[paid, bad], name="ship")
    factory = sessionmaker(engine)
    with factory.begin() as session:
        handle = wf.enqueue(session)
    queue.worker(factory, concurrency=2).run(burst=True)

    browser.get(f"{server}/workflows")
    browser.find_element(By.CSS_SELECTOR, f'tr[data-workflow="{handle.id}"] a').click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "workflow-graph"))
    graph = browser.find_element(By.ID, "workflow-graph")
    assert graph.is_displayed() and graph.size["width"] > 300
    nodes = browser.find_elements(By.CSS_SELECTOR, "#workflow-graph g.node")
    assert {n.get_attribute("data-node") for n in nodes} == {"charge", "reserve", "ship"}
    # Filled by state: the failed node and its cancelled dependent differ from the rest.
    fills = {
        n.get_attribute("data-node"): browser.execute_script(
            "return getComputedStyle(arguments[0].querySelector('rect')).fill", n
        )
        for n in nodes
    }
    assert len(set(fills.values())) == 3, fills
    _fits_and_shot(browser, shots, "workflow", 700)

    browser.find_element(By.CSS_SELECTOR, 'g.node[data-node="ship"]').click()
    job = handle.jobs["ship"]
    WebDriverWait(browser, 10).until(lambda d: d.current_url.endswith(f"/jobs/{job}"))
    assert browser.find_element(By.ID, "job-state").text == "cancelled"
    link = browser.find_element(By.CSS_SELECTOR, "#job-workflow a")
    assert link.text == f"workflow {handle.id}"
