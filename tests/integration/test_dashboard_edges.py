"""Hostile input to every view and parameter of the dashboard: 400 or 404, nothing written.

Each case goes through Starlette's TestClient (a refused page or action, never a 500, and
every queue table as it was); the whole list goes once more through a real uvicorn server,
whose log must hold no traceback (a GET needs no auth, so a 500 there is log spam anyone
can cause).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
    from starlette.testclient import TestClient
import httpx
import uvicorn

from sqla_queue.checks import INT4_MAX as INTEGER_MAX
from sqla_queue.checks import INT8_MAX as BIGINT_MAX
from tests.support.app import queue
from tests.support.running import wait_for

pytestmark = pytest.mark.integration

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
ARABIC_12 = "\u0661\u0662"  # "١٢": int() reads it as 12, PostgreSQL does not
SUPERSCRIPT_2 = "\u00b2"  # "²": str.isdigit() says yes, int() raises
HUGE = "9" * 5000  # int() refuses more than 4,300 digits
BEYOND_BIGINT = str(BIGINT_MAX + 1)


@dataclass(frozen=True)
class Case:
    """One hostile request and the status it must get."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)
    status: int = 400

    def __str__(self) -> str:
        shown = {k: (v if len(v) < 30 else f"{v[:10]}...{len(v)}") for k, v in self.query.items()}
        form = {k: (v if len(v) < 30 else f"{v[:10]}...{len(v)}") for k, v in self.form.items()}
        path = self.path if len(self.path) < 40 else f"{self.path[:30]}...{len(self.path)}"
        return f"{self.method} {path} {shown or ''}{form or ''}".strip()


def _get_jobs(status: int = 400, **query: str) -> Case:
    return Case("GET", "/jobs", query=query, status=status)


BAD_NUMBERS = [ARABIC_12, SUPERSCRIPT_2, HUGE, BEYOND_BIGINT, "0", "-1", "1e3", "0x10", "\x00"]

GET_CASES = [
    # The job list's text filters.
    _get_jobs(task="echo\x00"),
    _get_jobs(task="t" * 201),
    _get_jobs(key="\x00"),
    _get_jobs(key="report\x00-2024"),
    _get_jobs(key="k" * 513),
    _get_jobs(about="orders\x00"),
    _get_jobs(about="orders:\x00"),
    _get_jobs(about="\x00:42"),
    _get_jobs(about="orders:" + "k" * 513),
    _get_jobs(about="t" * 513 + ":42"),
    _get_jobs(about=":42"),
    _get_jobs(about="orders:"),
    _get_jobs(state="\x00"),
    _get_jobs(state="exploded"),
    _get_jobs(state="s" * 5000),
    # Its cursor.
    *[_get_jobs(before=value) for value in BAD_NUMBERS],
    # A job's page: an id that names no job.
    *[Case("GET", f"/jobs/{quote(value)}", status=404) for value in BAD_NUMBERS],
    Case("GET", "/jobs/999999", status=404),
]

POST_CASES = [
    # Requeue and cancel of ids that name no job.
    *[Case("POST", f"/jobs/{quote(value)}/requeue", status=404) for value in BAD_NUMBERS],
    *[Case("POST", f"/jobs/{quote(value)}/cancel", status=404) for value in BAD_NUMBERS],
    Case("POST", "/jobs/999999/cancel", status=404),
    Case("POST", "/jobs/999999/requeue", status=404),
    # Task actions: a task name that is not text PostgreSQL takes, or no task of the queue.
    *[
        Case("POST", f"/tasks/{quote(task)}/{action}", status=status)
        for action in ("pause", "resume", "limit")
        for task, status in (("\x00", 400), ("noop\x00", 400), ("t" * 201, 400), ("nosuch", 404))
    ],
    # The limit field.
    *[
        Case("POST", "/tasks/noop/limit", form={"limit": value})
        for value in [*BAD_NUMBERS, str(INTEGER_MAX + 1), "4\x00", " "]
        if value.strip()
    ],
]

CASES = GET_CASES + POST_CASES


def _snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every queue table (the workers' beats aside: none runs here)."""
    with engine.connect() as connection:
        return {
            table.name: sorted(
                (tuple(map(repr, row)) for row in connection.execute(select(table))), key=str
            )
            for table in queue.tables.all
        }


@pytest.fixture
def jobs(engine: Engine) -> list[int]:
    """A few queued jobs, one keyed and one linked, so a hostile filter has rows to miss."""
    with sessionmaker(engine).begin() as session:
        return [
            queue.enqueue(session, "noop"),
            queue.enqueue(session, "noop", queue_id="acct-1"),
            queue.enqueue(session, "echo", {"value": 1}, unique_key="report-2024"),
        ]


def _token(client: Any, prefix: str = "") -> str:
    page = client.get(f"{prefix}/")
    assert page.status_code == 200, page.text
    match = TOKEN.search(page.text)
    assert match is not None
    return match.group(1)


def _send(client: Any, case: Case, token: str, prefix: str = "") -> Any:
    if case.method == "GET":
        return client.get(prefix + case.path, params=case.query)
    return client.post(prefix + case.path, data={"csrf_token": token, **case.form})


@pytest.mark.parametrize("case", CASES, ids=str)
def test_hostile_input_is_refused_and_writes_nothing(
    engine: Engine, jobs: list[int], case: Case
) -> None:
    before = _snapshot(engine)
    # A GET needs no auth: it is sent without.
    auth = None if case.method == "GET" else (lambda request: "ops")
    app = queue.dashboard(engine, auth=auth)
    with TestClient(app, follow_redirects=False, raise_server_exceptions=False) as client:
        token = _token(client) if case.method == "POST" else ""
        response = _send(client, case, token)
        assert response.status_code == case.status, response.text[:2000]
        # A short reason, on a dashboard page, never the whole input echoed back.
        error = re.search(r'<p class="error" role="alert" id="error">([^<]*)</p>', response.text)
        assert error is not None, response.text[:2000]
        assert 10 < len(error.group(1)) < 400
    assert _snapshot(engine) == before


def test_the_list_keeps_the_valid_cases(engine: Engine, jobs: list[int]) -> None:
    """The parser refuses no value the pages themselves produce."""
    app = queue.dashboard(engine, page_size=1)
    with TestClient(app, follow_redirects=False) as client:
        for query in (
            {"task": " noop ", "state": "PENDING"},
            {"key": "acct-1"},
            {"key": "report-2024"},
            {"about": "orders"},
            {"before": str(BIGINT_MAX)},
            {"before": f" {jobs[-1]} "},
            {"task": "", "key": "", "about": "", "before": ""},
        ):
            assert client.get("/jobs", params=query).status_code == 200, query
        assert str(jobs[1]) in client.get("/jobs", params={"key": "acct-1"}).text
        assert client.get(f"/jobs/{jobs[0]}").status_code == 200
        assert client.get(f"/jobs/00{jobs[0]}").status_code == 200
        for page in ("/", "/workers", "/jobs"):
            assert client.get(page, params={"done": "\x00" + "x" * 5000}).status_code == 200


@pytest.mark.parametrize(
    ("field", "origin"),
    [("token\x00", None), ("token", "http://[::1"), ("token", "http://testserver:port")],
    ids=["nul-in-token", "origin-not-a-url", "origin-bad-port"],
)
def test_a_forged_form_or_origin_is_refused(
    engine: Engine, jobs: list[int], field: str, origin: str | None
) -> None:
    before = _snapshot(engine)
    app = queue.dashboard(engine, auth=lambda request: "ops")
    with TestClient(app, follow_redirects=False, raise_server_exceptions=False) as client:
        token = _token(client)
        data = {"csrf_token": field.replace("token", token)}
        headers = {} if origin is None else {"origin": origin}
        response = client.post("/tasks/noop/pause", data=data, headers=headers)
        assert response.status_code == 403, response.text[:2000]
    assert _snapshot(engine) == before


@pytest.fixture
def served(engine: Engine) -> Iterator[str]:
    """The dashboard (auth: everyone is ``ops``) under uvicorn, logging to the root logger
    (``log_config=None``), so ``caplog`` sees what an operator's log would hold."""
    app = queue.dashboard(engine, auth=lambda request: "ops")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, log_level="info", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=30)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_no_traceback_in_the_server_log(
    engine: Engine, jobs: list[int], served: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = _snapshot(engine)
    caplog.set_level(logging.INFO)
    with httpx.Client(base_url=served, follow_redirects=False, timeout=30) as client:
        token = _token(client)
        statuses = {str(case): _send(client, case, token).status_code for case in CASES}
    assert statuses == {str(case): case.status for case in CASES}
    logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not logged, [f"{r.name}: {r.getMessage()}" for r in logged]
    assert _snapshot(engine) == before
