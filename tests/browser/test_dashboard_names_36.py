"""The dashboard at 1024 px with a shop's names (issue 36, §7), in headless chromium.

``collect_payment`` and ``print_shipping_label`` are one word each to their reader: no
page may break them inside ("collect_pay|ment"), and none may scroll sideways. The signal
form's labels sit on one line. A suspended job cancelled from its page says that its
compensations follow. Skipped, with the reason, when chromium or chromedriver is not
installed (``.ci/install_browser.sh`` installs them).
"""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.testing.databases import DatabaseFactory
from tests.support.operator36_app import collect_payment, print_shipping_label, queue
from tests.support.running import wait_for

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "no headless browser: chromium and chromedriver are not on PATH "
        "(run .ci/install_browser.sh: apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

QUIET = {"install_signal_handlers": False, "poll_interval": 0.05}
NAMES = ("collect_payment", "print_shipping_label", "refund_payment", "plain_task")


@pytest.fixture
def shop(db_factory: DatabaseFactory) -> Iterator[tuple[Engine, list[int]]]:
    """Two payments suspended after their charge, a failed label; the suspended ids."""
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        queue.create_all(connection)
    with Session(engine) as session, session.begin():
        payments = [collect_payment.enqueue(session, order) for order in (1, 2)]
        print_shipping_label.enqueue(session)
    queue.worker(sessionmaker(engine), **QUIET).run(burst=True)
    yield engine, payments
    engine.dispose()
    db_factory.drop(url)


@pytest.fixture
def server(shop: tuple[Engine, list[int]]) -> Iterator[str]:
    app = queue.dashboard(shop[0], auth=lambda request: "ops", refresh=None, title="shop")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=30)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--lang=en-US"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.set_window_size(1024, 900)
    try:
        yield driver
    finally:
        driver.quit()


# Each element showing one of the names: its text, and the characters after which its
# line breaks (a name may wrap after a separator, never inside a word).
_NAME_BREAKS = """
var names = arguments[0];
var out = [];
document.querySelectorAll("main *").forEach(function (e) {
  var others = Array.prototype.filter.call(e.children, function (c) {
    return c.tagName !== "WBR";
  });
  var text = e.textContent.trim();
  if (others.length || names.indexOf(text) < 0) { return; }
  var chars = [];
  var walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  for (var node = walker.nextNode(); node; node = walker.nextNode()) {
    for (var i = 0; i < node.data.length; i++) {
      var range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      var rect = range.getBoundingClientRect();
      if (rect.width > 0) { chars.push([node.data[i], Math.round(rect.top)]); }
    }
  }
  var breaks = [];
  for (var k = 1; k < chars.length; k++) {
    if (chars[k][1] > chars[k - 1][1]) { breaks.push(chars[k - 1][0] + "|" + chars[k][0]); }
  }
  out.push([text, breaks]);
});
return out;
"""


# The elements that end beyond the window's right edge (for the message of a failure).
_BEYOND = """
var edge = document.documentElement.clientWidth;
var out = [];
document.querySelectorAll("body *").forEach(function (e) {
  var r = e.getBoundingClientRect();
  if (r.width > 0 && r.right > edge + 0.5) {
    out.push(e.tagName + "." + e.className + " " + (e.textContent || "").slice(0, 30));
  }
});
return out.slice(0, 8);
"""


def _names_whole(driver: Any, page: str) -> list[str]:
    """The names the page shows, each checked to wrap only after a separator, and the
    page not to scroll sideways."""
    seen = driver.execute_script(_NAME_BREAKS, list(NAMES))
    assert seen, f"{page}: no task name found"
    for name, breaks in seen:
        inside = [pair for pair in breaks if pair[0] not in "_.:-"]
        assert not inside, f"{page} at 1024 px breaks {name!r} inside a word: {inside}"
    scroll, client = driver.execute_script(
        "var e = document.documentElement; return [e.scrollWidth, e.clientWidth];"
    )
    beyond = driver.execute_script(_BEYOND) if scroll > client else []
    assert scroll <= client, f"{page} scrolls sideways at 1024 px: {scroll} > {client}: {beyond}"
    return [name for name, _ in seen]


def test_no_page_breaks_a_task_name_inside_at_1024_px(server: str, browser: Any) -> None:
    browser.get(f"{server}/")
    assert set(_names_whole(browser, "overview")) == set(NAMES)
    browser.get(f"{server}/jobs")
    assert {"collect_payment", "print_shipping_label"} <= set(_names_whole(browser, "jobs"))
    browser.get(f"{server}/jobs?state=suspended")
    _names_whole(browser, "suspended jobs")


def test_the_signal_form_s_labels_line_up(
    server: str, browser: Any, shop: tuple[Engine, list[int]]
) -> None:
    browser.get(f"{server}/jobs/{shop[1][0]}")
    form = browser.find_element(By.ID, "signal-form")
    labels = form.find_elements(By.TAG_NAME, "label")
    assert len(labels) == 2
    tops = browser.execute_script(
        "return Array.prototype.map.call(arguments[0].querySelectorAll('label'),"
        " function (l) { return l.getBoundingClientRect().top; });",
        form,
    )
    fields = [
        browser.find_element(By.CSS_SELECTOR, "#signal-form input[name=name]").rect["y"],
        browser.find_element(By.CSS_SELECTOR, "#signal-form textarea").rect["y"],
    ]
    assert abs(tops[0] - tops[1]) < 1, tops
    assert abs(fields[0] - fields[1]) < 1, fields
    # The prefilled name is the signal the job waits for.
    name = browser.find_element(By.CSS_SELECTOR, "#signal-form input[name=name]")
    assert name.get_attribute("value") == "payment_received"


def test_cancelling_a_suspended_job_says_its_compensations_follow(
    server: str, browser: Any, shop: tuple[Engine, list[int]]
) -> None:
    job = shop[1][1]
    browser.get(f"{server}/jobs/{job}")
    buttons = list(browser.find_elements(By.CSS_SELECTOR, "#job-actions button"))
    cancel = next(b for b in buttons if b.text == "Cancel")
    cancel.click()
    WebDriverWait(browser, 10).until(lambda d: d.switch_to.alert).accept()
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "notice"))
    assert "Job cancelled" in browser.find_element(By.ID, "notice").text
    follow = browser.find_element(By.ID, "compensations-follow").text
    assert follow.startswith("1 compensation of its committed steps follows")
