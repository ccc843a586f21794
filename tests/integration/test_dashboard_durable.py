"""The dashboard on durable jobs, through Starlette's TestClient against a real database:
suspended jobs in the overview and the job list (what each waits for, until when), a
job's committed steps on its page, and the signal and cancel forms, which act only with
the host's auth and the page's CSRF token."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

with warnings.catch_warnings():
    # Starlette 1.x suggests another HTTP client for its TestClient; httpx still works.
    warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
    from starlette.testclient import TestClient

from sqla_queue.dashboard.durable_views import signal_payload
from sqla_queue.dashboard.params import RequestRefused
from tests.support.durable_app import queue
from tests.support.durable_checks import drain, outcome, suspend_three

pytestmark = pytest.mark.integration

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
JOBS = queue.tables.jobs


@pytest.fixture
def waiting(SessionLocal: sessionmaker[Session]) -> dict[str, int]:
    """After a burst: one job waits for signal ``approved``, one sleeps an hour, one
    succeeded with two steps."""
    return suspend_three(SessionLocal)


@pytest.fixture
def admin(engine: Engine) -> Iterator[TestClient]:
    """A client whose auth accepts every request."""
    with TestClient(queue.dashboard(engine, auth=lambda request: "ops")) as client:
        client.follow_redirects = False
        yield client


@pytest.fixture
def read_only(engine: Engine) -> Iterator[TestClient]:
    """A client of the dashboard without auth."""
    with TestClient(queue.dashboard(engine), follow_redirects=False) as client:
        yield client


def _token(client: TestClient, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    match = TOKEN.search(page.text)
    assert match is not None, "the page has no action form"
    return match.group(1)


def test_overview_and_list_show_suspended_jobs_and_their_waits(
    read_only: TestClient, waiting: dict[str, int]
) -> None:
    overview = read_only.get("/")
    assert overview.status_code == 200
    assert '<span class="big" id="total-suspended">2</span>' in overview.text
    row = re.search(r'<tr data-task="dj_signal">(.*?)</tr>', overview.text, re.S)
    assert row is not None
    assert re.search(r'<td class="num suspended"><a href="[^"]*state=suspended[^"]*">1</a>', row[1])

    page = read_only.get("/jobs", params={"state": "suspended"})
    assert page.status_code == 200
    listed = [int(x) for x in re.findall(r'<tr data-job="(\d+)"', page.text)]
    assert listed == [waiting["sleepy"], waiting["signal"]]
    assert "signal:approved, no deadline" in page.text
    assert re.search(r"sleep, until <span", page.text)
    assert '<span class="state state-suspended">suspended</span>' in page.text
    assert 'value="suspended" selected' in page.text


def test_job_page_lists_steps_and_the_wait(read_only: TestClient, waiting: dict[str, int]) -> None:
    done = read_only.get(f"/jobs/{waiting['steps']}")
    assert done.status_code == 200
    steps = re.findall(r'<tr data-step="([^"]+)">(.*?)</tr>', done.text, re.S)
    assert [name for name, _ in steps] == ["s0", "s1"]
    assert '<pre class="step-result">1</pre>' in steps[1][1]
    assert 'id="job-wait"' not in done.text

    sleepy = read_only.get(f"/jobs/{waiting['sleepy']}").text
    assert re.search(r'<p id="job-wait">Suspended: waits for <code>sleep</code>, until ', sleepy)
    assert re.search(r'<dd id="job-waits-for">sleep</dd>', sleepy)
    assert re.findall(r'<tr data-step="([^"]+)">', sleepy)[0] == "before"
    signal = read_only.get(f"/jobs/{waiting['signal']}").text
    assert '<dd id="job-until">no deadline</dd>' in signal
    # Read-only: no signal form, and the action is refused.
    assert 'id="signal-form"' not in signal
    refused = read_only.post(f"/jobs/{waiting['signal']}/signal", data={"name": "approved"})
    assert refused.status_code == 403


def test_signal_form_needs_the_token_then_wakes_the_job(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    admin: TestClient,
    waiting: dict[str, int],
) -> None:
    job = waiting["signal"]
    page = admin.get(f"/jobs/{job}").text
    form = re.search(r'<form method="post" action="([^"]+)" class="signal"', page)
    assert form is not None and form[1] == f"/jobs/{job}/signal"
    assert 'name="name" required maxlength="200" placeholder="approved" value="approved"' in page
    token = _token(admin, f"/jobs/{job}")
    url = f"/jobs/{job}/signal"
    fields = {"name": "approved", "payload": '{"by": "ops"}'}
    assert admin.post(url, data=fields).status_code == 403  # no token
    assert admin.post(url, data={**fields, "csrf_token": token[:-2] + "xx"}).status_code == 403
    foreign = admin.post(
        url, data={**fields, "csrf_token": token}, headers={"origin": "https://evil.test"}
    )
    assert foreign.status_code == 403
    bad = admin.post(url, data={**fields, "payload": "{nope", "csrf_token": token})
    assert bad.status_code == 400 and "not JSON" in bad.text
    assert admin.post(url, data={"name": " ", "csrf_token": token}).status_code == 400
    missing = admin.post("/jobs/987654321/signal", data={**fields, "csrf_token": token})
    assert missing.status_code == 404
    assert outcome(engine, job) == ("queued", None)

    sent = admin.post(url, data={**fields, "csrf_token": token})
    assert sent.status_code == 303
    assert sent.headers["location"] == f"/jobs/{job}?done=signal-woke"
    assert "Signal sent: the job was waiting for it" in admin.get(sent.headers["location"]).text
    again = admin.post(url, data={**fields, "csrf_token": token})
    assert again.headers["location"] == f"/jobs/{job}?done=signal-repeated"
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", {"by": "ops"})
    # A finished job shows no signal form any more.
    assert 'id="signal-form"' not in admin.get(f"/jobs/{job}").text


def test_cancel_a_suspended_job_from_its_page(
    engine: Engine, admin: TestClient, waiting: dict[str, int]
) -> None:
    job = waiting["sleepy"]
    page = admin.get(f"/jobs/{job}").text
    assert f'action="/jobs/{job}/cancel"' in page
    token = _token(admin, f"/jobs/{job}")
    assert admin.post(f"/jobs/{job}/cancel", data={}).status_code == 403
    assert outcome(engine, job)[0] == "queued"
    cancel = admin.post(f"/jobs/{job}/cancel", data={"csrf_token": token})
    assert cancel.status_code == 303
    assert cancel.headers["location"] == f"/jobs/{job}?done=cancel-cancelled"
    assert outcome(engine, job)[0] == "cancelled"
    after = admin.get(cancel.headers["location"]).text
    assert "Job cancelled" in after and 'id="job-wait"' not in after


@pytest.mark.parametrize(
    ("text", "value"),
    [("", None), ("  ", None), ("42", 42), ('{"a": [1, "b"]}', {"a": [1, "b"]}), ("null", None)],
)
def test_signal_payload_reads_json(text: str, value: Any) -> None:
    assert signal_payload(text) == value


@pytest.mark.parametrize("text", ["{nope", '"\\u0000"', "x" * 12_001])
def test_signal_payload_refuses_what_cannot_be_stored(text: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        signal_payload(text)
    assert refused.value.status == 400
