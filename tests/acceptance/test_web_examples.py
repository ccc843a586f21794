"""examples/fastapi_app and examples/flask_app, driven over HTTP as a user's tests would.

These use the pytest plugin's fixtures (sqla_queue.testing.pytest_plugin), each class
pointing ``sqla_queue_app`` at its example's queue: a fresh database per test with the
example's tables, ``sqla_queue_drain`` and ``sqla_queue_assert_enqueued``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import Queue
from sqla_queue.testing.helpers import DrainResult, EnqueuedJobs

pytest.importorskip("fastapi")
pytest.importorskip("flask")
pytest.importorskip("httpx")

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # seconds; generous, the machine is shared

AssertEnqueued = Callable[..., Any]


def _poll(read: Callable[[], dict[str, Any]], until: Callable[[dict[str, Any]], bool]) -> Any:
    """Call ``read`` until ``until`` holds for its value; fail with the last one at the deadline."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = read()
        if until(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"still {value!r} after {DEADLINE:.0f} s")
        time.sleep(0.05)


class TestFastAPIExample:
    """The FastAPI app: enqueue in the request, an asyncio worker in the lifespan."""

    @pytest.fixture
    def sqla_queue_app(self) -> Queue:
        """The example's queue, for the plugin's fixtures."""
        from examples.fastapi_app.jobs import queue

        return queue

    def test_signup_job_runs_in_the_lifespan_worker(self, sqla_queue_database_url: str) -> None:
        from fastapi.testclient import TestClient

        from examples.fastapi_app.app import create_app

        app = create_app(sqla_queue_database_url)
        with TestClient(app) as client:
            created = client.post("/signup", json={"email": "ada@example.com"})
            assert created.status_code == 201, created.text
            job_id = created.json()["job_id"]
            job = _poll(
                lambda: client.get(f"/jobs/{job_id}").json(),
                lambda job: job["state"] == "succeeded",
            )
            assert job == {
                "id": job_id,
                "task": "send_welcome",
                "state": "succeeded",
                "attempts": 1,
                "result": "welcome mail sent to ada@example.com",
            }
            # A duplicate sign-up rolls back: no second user, and no second job.
            again = client.post("/signup", json={"email": "ada@example.com"})
            assert again.status_code == 409
            assert client.get(f"/jobs/{job_id + 1}").status_code == 404
            worker_task = app.state.worker_task
            assert not worker_task.done()
        # The lifespan's end stopped the worker gracefully: its task ended without error.
        assert worker_task.done()
        assert worker_task.exception() is None
        stats = worker_task.result()
        assert (stats.claimed, stats.succeeded, stats.failed) == (1, 1, 0)

    def test_dashboard_is_mounted_read_only(
        self, sqla_queue_database_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from fastapi.testclient import TestClient

        from examples.fastapi_app.app import create_app

        monkeypatch.delenv("ADMIN_TOKEN", raising=False)
        with TestClient(create_app(sqla_queue_database_url, run_worker=False)) as client:
            client.post("/signup", json={"email": "ada@example.com"})
            page = client.get("/queue/jobs")
            assert page.status_code == 200
            assert "send_welcome" in page.text
            # Without the admin token nobody may act: every action is refused.
            refused = client.post("/queue/jobs/1/cancel", data={})
            assert refused.status_code == 403

    def test_without_the_worker_the_test_drains(
        self,
        sqla_queue_database_url: str,
        sqla_queue_drain: Callable[..., DrainResult],
    ) -> None:
        from fastapi.testclient import TestClient

        from examples.fastapi_app.app import create_app

        with TestClient(create_app(sqla_queue_database_url, run_worker=False)) as client:
            job_id = client.post("/signup", json={"email": "bob@example.com"}).json()["job_id"]
            assert client.get(f"/jobs/{job_id}").json()["state"] == "pending"

            result = sqla_queue_drain()

            assert result.ids == [job_id]
            assert [job.result for job in result.jobs] == ["welcome mail sent to bob@example.com"]
            assert client.get(f"/jobs/{job_id}").json()["state"] == "succeeded"


class TestFlaskExample:
    """The Flask app: enqueue in the request, the worker in a process of its own."""

    @pytest.fixture
    def sqla_queue_app(self) -> Queue:
        """The example's queue, for the plugin's fixtures."""
        from examples.flask_app.jobs import queue

        return queue

    @pytest.fixture
    def client(self, sqla_queue_database_url: str) -> Iterator[Any]:
        """Flask's test client on the example app, on this test's database."""
        from examples.flask_app.app import create_app, session_factory

        app = create_app(sqla_queue_database_url)
        with app.test_client() as client:
            yield client
        engine = session_factory(app).kw["bind"]
        engine.dispose()

    def test_signup_job_runs_in_a_worker_process(
        self, client: Any, sqla_queue_database_url: str
    ) -> None:
        created = client.post("/signup", json={"email": "ada@example.com"})
        assert created.status_code == 201, created.get_data(as_text=True)
        user_id, job_id = created.json["user_id"], created.json["job_id"]
        assert client.get(f"/jobs/{job_id}").json["state"] == "pending"

        worker = subprocess.Popen(
            [sys.executable, "-m", "examples.flask_app.worker"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": sqla_queue_database_url},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            job = _poll(
                lambda: client.get(f"/jobs/{job_id}").json,
                lambda job: job["state"] == "succeeded",
            )
        finally:
            worker.terminate()  # SIGTERM: the worker's graceful stop
            output, _ = worker.communicate(timeout=DEADLINE)
        assert worker.returncode == 0, output
        assert "welcome mail to ada@example.com" in output
        assert job["result"] == "welcome mail sent to ada@example.com"
        assert client.get(f"/users/{user_id}").json == {
            "id": user_id,
            "email": "ada@example.com",
            "welcomed": True,
        }

    def test_signup_then_drain(
        self, client: Any, sqla_queue_drain: Callable[..., DrainResult]
    ) -> None:
        user_id = client.post("/signup", json={"email": "cy@example.com"}).json["user_id"]
        assert client.get(f"/users/{user_id}").json["welcomed"] is False

        result = sqla_queue_drain()

        assert result.tasks == ["send_welcome"]
        result.raise_failures()
        assert client.get(f"/users/{user_id}").json["welcomed"] is True

    def test_sign_up_enqueues_in_its_transaction(
        self,
        sqla_queue_session_factory: sessionmaker[Session],
        sqla_queue_assert_enqueued: AssertEnqueued,
    ) -> None:
        from examples.flask_app.jobs import User, sign_up

        with sqla_queue_session_factory() as session:
            found: EnqueuedJobs
            with sqla_queue_assert_enqueued(session, task="send_welcome", count=1) as found:
                user, job_id = sign_up(session, "dee@example.com")
            assert found.ids == [job_id]
            assert found.matched[0].args == [user.id]
            session.commit()
        with sqla_queue_session_factory() as session:
            # Rolled back: the user and the job go together.
            with sqla_queue_assert_enqueued(session, count=0):
                sign_up(session, "eve@example.com")
                session.rollback()
            assert session.scalars(select(User.email)).all() == ["dee@example.com"]
