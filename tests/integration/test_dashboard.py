"""The web dashboard through Starlette's TestClient, against a real database.

Every page renders with data; filters and keyset pagination; without ``auth`` nothing can
be changed (no form, POST refused); with it, an action happens only with the page's CSRF
token, and then the database shows it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

with warnings.catch_warnings():
    # Starlette 1.x suggests another HTTP client for its TestClient; httpx still works.
    warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
    from starlette.testclient import TestClient
from starlette.applications import Starlette
from starlette.routing import Mount

from sqla_queue.dashboard.chart import axis_ticks, bar_chart
from sqla_queue.dashboard.csrf import COOKIE_NAME, CsrfSigner
from tests.browser.dashboard_data import LONG_ERROR, Seeded, is_paused, job_status, seed
from tests.support.app import queue
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def seeded(engine: Engine) -> Seeded:
    """The queue filled by :func:`tests.browser.dashboard_data.seed`."""
    return seed(engine)


def _client(app: Any) -> Iterator[TestClient]:
    with TestClient(app, follow_redirects=False) as client:
        yield client


@pytest.fixture
def read_only(engine: Engine) -> Iterator[TestClient]:
    """A client of the dashboard without auth."""
    yield from _client(queue.dashboard(engine))


@pytest.fixture
def admin(engine: Engine) -> Iterator[TestClient]:
    """A client of the dashboard whose auth accepts every request as ``ops``."""
    yield from _client(queue.dashboard(engine, auth=lambda request: "ops"))


def _token(client: TestClient, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    match = TOKEN.search(page.text)
    assert match is not None, "the page has no action form"
    return match.group(1)


def _ids(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr data-job="(\d+)"', html)]


def test_every_page_renders_with_data(read_only: TestClient, seeded: Seeded) -> None:
    overview = read_only.get("/")
    assert overview.status_code == 200
    for task in ("echo", "boom", "noop"):
        assert f'<tr data-task="{task}">' in overview.text
    assert '<svg class="chart"' in overview.text
    # 4 noop jobs due now; the delayed one is scheduled, the claimed one running.
    assert '<span class="big" id="total-pending">4</span>' in overview.text

    jobs = read_only.get("/jobs")
    assert jobs.status_code == 200
    every = [*seeded.failed, *seeded.succeeded, *seeded.pending, seeded.linked, seeded.unique]
    assert set(every) | {seeded.scheduled, seeded.running, seeded.suspended} == set(_ids(jobs.text))
    assert _ids(jobs.text) == sorted(_ids(jobs.text), reverse=True)

    failed = read_only.get(f"/jobs/{seeded.failed[0]}")
    assert failed.status_code == 200
    assert "card declined (0)" in failed.text
    assert "Traceback (most recent call last)" in failed.text
    assert "ValueError" in failed.text

    linked = read_only.get(f"/jobs/{seeded.linked}")
    assert "orders:42" in linked.text
    assert "&#34;receipt&#34;" in linked.text  # the result, as JSON
    unique = read_only.get(f"/jobs/{seeded.unique}")
    assert "report-2024-06" in unique.text

    workers = read_only.get("/workers")
    assert workers.status_code == 200
    assert '<td class="num">4242</td>' in workers.text

    assert read_only.get("/jobs/999999").status_code == 404


def test_filters(read_only: TestClient, seeded: Seeded) -> None:
    def ids(**query: str) -> set[int]:
        response = read_only.get("/jobs", params=query)
        assert response.status_code == 200, response.text
        return set(_ids(response.text))

    assert ids(state="failed") == set(seeded.failed)
    assert ids(task="boom") == set(seeded.failed)
    assert ids(task="noop", state="pending") == set(seeded.pending)
    assert ids(state="scheduled") == {seeded.scheduled}
    assert ids(key="report-2024-06") == {seeded.unique}
    assert ids(about="orders:42") == {seeded.linked}
    assert ids(about="orders") == {seeded.linked}
    assert ids(task="echo", state="failed") == set()
    bad = read_only.get("/jobs", params={"state": "exploded"})
    assert bad.status_code == 400
    assert "Unknown state" in bad.text


def _walk(client: TestClient, path: str) -> list[list[int]]:
    """Follow the ``older`` links from ``path``; the ids of each page."""
    pages = []
    url: str | None = path
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.text
        pages.append(_ids(response.text))
        older = re.search(r'<a href="([^"]+)" id="older"', response.text)
        url = older.group(1).replace("&amp;", "&") if older else None
        assert len(pages) < 50
    return pages


def test_keyset_pagination(engine: Engine) -> None:
    with sessionmaker(engine).begin() as session:
        plain = [queue.enqueue(session, "noop") for _ in range(7)]
        keyed = [queue.enqueue(session, "noop", queue_id="acct-9") for _ in range(5)]
    app = queue.dashboard(engine, page_size=3)
    with TestClient(app) as client:
        pages = _walk(client, "/jobs")
        assert [len(p) for p in pages] == [3, 3, 3, 3]
        flat = [i for p in pages for i in p]
        assert flat == sorted([*plain, *keyed], reverse=True)
        # The key filter walks unique keys and queue_ids separately: page 2 continues.
        pages = _walk(client, "/jobs?key=acct-9")
        assert [i for p in pages for i in p] == sorted(keyed, reverse=True)
        assert [len(p) for p in pages] == [3, 2]
        assert "before=" in client.get("/jobs?key=acct-9").text


def test_read_only_shows_no_form_and_refuses_posts(
    engine: Engine, read_only: TestClient, seeded: Seeded
) -> None:
    for path in ("/", "/jobs", f"/jobs/{seeded.failed[0]}", f"/jobs/{seeded.pending[0]}"):
        page = read_only.get(path)
        assert 'method="post"' not in page.text
        assert "read-only" in page.text
    job = seeded.failed[0]
    refused = read_only.post(f"/jobs/{job}/requeue", data={"csrf_token": "x"})
    assert refused.status_code == 403
    assert read_only.post("/tasks/noop/pause", data={}).status_code == 403
    assert job_status(engine, job) == "failed"
    assert not is_paused(engine, "noop")
    # An auth that says no is the same as none.
    app = queue.dashboard(engine, auth=lambda request: False)
    with TestClient(app) as client:
        assert 'method="post"' not in client.get(f"/jobs/{job}").text
        assert client.post(f"/jobs/{job}/requeue", data={}).status_code == 403
    assert job_status(engine, job) == "failed"


def test_csrf_missing_or_invalid_changes_nothing(
    engine: Engine, admin: TestClient, seeded: Seeded
) -> None:
    job = seeded.failed[0]
    token = _token(admin, f"/jobs/{job}")
    url = f"/jobs/{job}/requeue"
    assert admin.post(url, data={}).status_code == 403
    assert admin.post(url, data={"csrf_token": token[:-2] + "xx"}).status_code == 403
    # A cookie signed with another secret: forged, or planted by a sibling site.
    other_token, other_cookie = CsrfSigner("another secret, 16+ bytes").new_cookie()
    own_cookie = admin.cookies[COOKIE_NAME]
    admin.cookies.set(COOKIE_NAME, other_cookie)
    assert admin.post(url, data={"csrf_token": other_token}).status_code == 403
    admin.cookies.delete(COOKIE_NAME)
    assert admin.post(url, data={"csrf_token": token}).status_code == 403
    admin.cookies.set(COOKIE_NAME, own_cookie)
    foreign = admin.post(url, data={"csrf_token": token}, headers={"origin": "https://evil.test"})
    assert foreign.status_code == 403
    assert job_status(engine, job) == "failed"

    done = admin.post(url, data={"csrf_token": token})
    assert done.status_code == 303
    assert done.headers["location"] == f"/jobs/{job}?done=requeued"
    assert job_status(engine, job) == "queued"
    assert "Job requeued" in admin.get(done.headers["location"]).text


def test_task_actions_and_cancel(engine: Engine, admin: TestClient, seeded: Seeded) -> None:
    overview = admin.get("/")
    assert "actions on · ops" in overview.text
    token = _token(admin, "/")
    assert admin.post("/tasks/noop/pause", data={"csrf_token": token}).status_code == 303
    assert is_paused(engine, "noop")
    assert "state-paused" in admin.get("/").text
    assert admin.post("/tasks/noop/resume", data={"csrf_token": token}).status_code == 303
    assert not is_paused(engine, "noop")

    limit = admin.post("/tasks/noop/limit", data={"csrf_token": token, "limit": "4"})
    assert limit.headers["location"] == "/?done=limit-set"
    with engine.connect() as connection:
        assert queue.limits(connection)["noop"].stored == 4
    assert admin.post("/tasks/noop/limit", data={"csrf_token": token, "limit": ""}).is_redirect
    with engine.connect() as connection:
        assert "noop" not in queue.limits(connection)
    wrong = admin.post("/tasks/noop/limit", data={"csrf_token": token, "limit": "0"})
    assert wrong.status_code == 400
    unknown = admin.post("/tasks/nosuchtask/pause", data={"csrf_token": token})
    assert unknown.status_code == 404
    assert not is_paused(engine, "nosuchtask")

    job = seeded.pending[0]
    cancel = admin.post(f"/jobs/{job}/cancel", data={"csrf_token": token})
    assert cancel.headers["location"] == f"/jobs/{job}?done=cancel-cancelled"
    assert job_status(engine, job) == "cancelled"


def test_mounted_under_a_prefix_with_a_sessionmaker(
    engine: Engine, SessionLocal: sessionmaker[Session], seeded: Seeded
) -> None:
    host = Starlette(
        routes=[Mount("/queue", queue.dashboard(SessionLocal, auth=lambda request: True))]
    )
    with TestClient(host, follow_redirects=False) as client:
        page = client.get(f"/queue/jobs/{seeded.failed[1]}")
        assert page.status_code == 200
        assert 'href="/queue/static/dashboard.css"' in page.text
        assert client.get("/queue/static/dashboard.css").status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        token = TOKEN.search(page.text)
        assert token is not None
        assert "Path=/queue" in page.headers["set-cookie"]
        done = client.post(
            f"/queue/jobs/{seeded.failed[1]}/requeue", data={"csrf_token": token.group(1)}
        )
        assert done.headers["location"].startswith(f"/queue/jobs/{seeded.failed[1]}")
    assert job_status(engine, seeded.failed[1]) == "queued"


def test_async_session_factory_and_async_auth(
    engine: Engine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    with sessionmaker(engine).begin() as session:
        job = queue.enqueue(session, "noop")

    async def auth(request: Any) -> str | None:
        return "alice" if request.headers.get("x-user") == "alice" else None

    app = queue.dashboard(AsyncSessionLocal, auth=auth)
    with TestClient(app, follow_redirects=False) as client:
        assert "read-only" in client.get("/").text
        client.headers["x-user"] = "alice"
        assert "actions on · alice" in client.get("/").text
        assert str(job) in client.get("/jobs").text
        token = _token(client, f"/jobs/{job}")
        assert client.post(f"/jobs/{job}/cancel", data={"csrf_token": token}).status_code == 303
        assert client.get("/workers").status_code == 200
    assert job_status(engine, job) == "cancelled"


def test_bad_options_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="page_size"):
        queue.dashboard(engine, page_size=0)
    with pytest.raises(TypeError, match="sessionmaker"):
        queue.dashboard("postgresql://nowhere")
    with pytest.raises(TypeError, match="auth"):
        queue.dashboard(engine, auth="admin")


def _fact(html: str, name: str) -> str:
    match = re.search(rf'<dd id="job-{name}">(.*?)</dd>', html)
    assert match is not None, f"no {name} on the page"
    return match.group(1)


def _attempts_cell(html: str, job: int) -> str:
    row = re.search(rf'<tr data-job="{job}">(.*?)</tr>', html, re.S)
    assert row is not None, f"job {job} is not listed"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    return cells[3]


def test_a_running_job_shows_its_running_attempt(engine: Engine) -> None:
    factory = sessionmaker(engine)
    with factory.begin() as session:
        job = queue.enqueue(session, "sleepy", {"seconds": 60})
    app = queue.dashboard(engine)
    worker = queue.worker(factory, tasks=["sleepy"], poll_interval=0.1)
    with TestClient(app) as client, worker_thread(worker):
        wait_for(lambda: '<dd id="job-state">running</dd>' in client.get(f"/jobs/{job}").text)
        page = client.get(f"/jobs/{job}").text
        assert "state-running" in page
        assert _fact(page, "attempts") == "1 of 1, running now"
        assert "queued" not in page
        assert _attempts_cell(client.get("/jobs").text, job) == "1/1"
    # The graceful stop ended it (it is cooperative): that attempt, and no other, counts.
    with TestClient(app) as client:
        page = client.get(f"/jobs/{job}").text
        assert _fact(page, "state") == "succeeded"
        assert _fact(page, "attempts") == "1 of 1"


def test_a_retried_job_shows_the_attempts_made(engine: Engine, seeded: Seeded) -> None:
    with sessionmaker(engine).begin() as session:
        job = queue.enqueue(session, "flaky", {"failures": 5})
    worker = queue.worker(sessionmaker(engine), tasks=["flaky"], poll_interval=0.1)
    with TestClient(queue.dashboard(engine)) as client:
        with worker_thread(worker):
            wait_for(lambda: _fact(client.get(f"/jobs/{job}").text, "state") == "failed")
        page = client.get(f"/jobs/{job}").text
        assert _fact(page, "attempts") == "4 of 4"
        assert _attempts_cell(client.get("/jobs").text, job) == "4/4"
        running = client.get(f"/jobs/{seeded.running}").text
        assert _fact(running, "state") == "running"
        assert _fact(running, "attempts") == "1 of 1, running now"
        listed = client.get("/jobs").text
        assert _attempts_cell(listed, seeded.running) == "1/1"
        assert _attempts_cell(listed, seeded.pending[0]) == "0/1"
        assert LONG_ERROR[:40] in listed


@pytest.mark.parametrize(
    ("peak", "labels"),
    [
        (0, [0, 1]),
        (1, [0, 1]),
        (3, [0, 1, 2, 3]),
        (5, [0, 1, 2, 3, 4, 5]),
        (7, [0, 2, 4, 6, 8]),
        (42, [0, 10, 20, 30, 40, 50]),
        (1234, [0, 500, 1000, 1500]),
    ],
)
def test_the_chart_axis_reads_whole_counts_where_the_bars_end(peak: int, labels: list[int]) -> None:
    import datetime as dt

    assert axis_ticks(peak) == labels
    counts = [peak, 1, 0]
    svg = str(bar_chart(counts, dt.datetime.now(dt.UTC), label="test"))
    axis = re.findall(
        r'<text class="axis" x="42" y="([\d.]+)" text-anchor="end">([\d,]+)</text>', svg
    )
    assert [int(text.replace(",", "")) for _, text in axis] == labels
    gridline = {int(text.replace(",", "")): float(y) - 4 for y, text in axis}
    bars = re.findall(r'<rect class="bar" x="[\d.]+" y="([\d.]+)"', svg)
    assert len(bars) == len([n for n in counts if n])
    # Each bar's top sits on the line of its count, when a line has that count.
    for count, top in zip([n for n in counts if n], bars, strict=True):
        if count in gridline:
            assert abs(float(top) - gridline[count]) < 0.2, (count, top, gridline)


def test_a_requeue_refused_for_a_held_unique_key_says_why(
    engine: Engine, admin: TestClient
) -> None:
    factory = sessionmaker(engine)
    with factory.begin() as session:
        first = queue.enqueue(session, "echo", {"value": 1}, unique_key="nightly")
    assert queue.cancel(engine, [first]) == {first: "cancelled"}
    with factory.begin() as session:
        second = queue.enqueue(session, "echo", {"value": 2}, unique_key="nightly")

    token = _token(admin, f"/jobs/{first}")
    refused = admin.post(f"/jobs/{first}/requeue", data={"csrf_token": token})
    assert refused.status_code == 409
    error = re.search(r'<p class="error" role="alert" id="error">([^<]*)</p>', refused.text)
    assert error is not None
    assert error.group(1) == (
        f"Job {first} was not requeued: its unique key &#39;nightly&#39; is held by job {second}."
    )
    held_by = re.search(r'<p id="held-by">.*?</p>', refused.text, re.S)
    assert held_by is not None and f'<a href="/jobs/{second}">job {second}</a>' in held_by.group()
    assert job_status(engine, first) == "cancelled"
    assert job_status(engine, second) == "queued"

    # Once the holder is gone, the same button requeues it.
    assert queue.cancel(engine, [second]) == {second: "cancelled"}
    done = admin.post(f"/jobs/{first}/requeue", data={"csrf_token": token})
    assert done.headers["location"] == f"/jobs/{first}?done=requeued"
    assert job_status(engine, first) == "queued"


def test_a_task_that_is_gone_can_still_be_resumed(engine: Engine, admin: TestClient) -> None:
    # Paused by an older release of the app, which had a task this one no longer has.
    with engine.begin() as connection:
        connection.execute(queue.tables.controls.insert().values(task="retired", paused=True))
    assert "retired" not in queue.tasks
    token = _token(admin, "/")
    assert 'data-task="retired"' in admin.get("/").text
    done = admin.post("/tasks/retired/resume", data={"csrf_token": token})
    assert done.headers["location"] == "/?done=resumed"
    assert not is_paused(engine, "retired")
    # A name the queue never had is not stored, and says so.
    unknown = admin.post("/tasks/nosuchtask/resume", data={"csrf_token": token})
    assert unknown.status_code == 404
    assert "This queue has no task &#39;nosuchtask&#39;." in unknown.text
