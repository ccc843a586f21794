"""The web app: ``uvicorn examples.fastapi_app.app:app`` (reads ``DATABASE_URL``).

* ``POST /signup`` creates a user and enqueues the welcome mail in the same transaction;
* ``GET /jobs/{job_id}`` shows a job's state;
* an asyncio worker runs in the app's event loop, started and stopped by the lifespan;
* the queue's dashboard is mounted at ``/queue``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import selectinload

from examples.fastapi_app.jobs import User, create_tables, queue, send_welcome

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1/postgres"


class SignUp(BaseModel):
    """The body of ``POST /signup``."""

    email: str


def is_admin(request: Request) -> bool:
    """Whether a request may take the dashboard's actions: it carries ``$ADMIN_TOKEN``.

    A stand-in for the app's own authentication; with no token configured, nobody may.
    """
    token = os.environ.get("ADMIN_TOKEN")
    if not token:
        return False
    return secrets.compare_digest(request.headers.get("x-admin-token", ""), token)


def create_app(database_url: str | None = None, *, run_worker: bool = True) -> FastAPI:
    """Build the app on ``database_url`` (default: ``$DATABASE_URL``).

    With ``run_worker`` (the default), the lifespan runs an asyncio worker beside the
    requests; without, jobs wait for a worker elsewhere (``sqla-queue worker``) or a test's
    drain.
    """
    url = database_url or os.environ.get("DATABASE_URL", DEFAULT_URL)

    # Creating an engine connects to nothing yet: the lifespan opens and disposes it.
    engine = create_async_engine(url, pool_size=5)
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as connection:
            await connection.run_sync(create_tables)
        worker_task: asyncio.Task[Any] | None = None
        if run_worker:
            # uvicorn owns SIGINT/SIGTERM and ends the lifespan on them; the worker then
            # stops from here, finishing (or handing back) the jobs it is running.
            worker = queue.async_worker(sessions, concurrency=4, install_signal_handlers=False)
            worker_task = asyncio.create_task(worker.run(), name="sqla_queue worker")
            app.state.worker = worker
        app.state.worker_task = worker_task
        try:
            yield
        finally:
            if worker_task is not None:
                app.state.worker.stop()
                await worker_task
            await engine.dispose()

    app = FastAPI(title="sqla_queue FastAPI example", lifespan=lifespan)
    app.state.sessions = sessions
    # The queue's dashboard at /queue. Anyone who reaches it may look; only requests that
    # is_admin accepts may act (requeue, cancel, pause). Guard /queue as you guard the
    # rest of your admin pages.
    app.mount("/queue", queue.dashboard(sessions, auth=is_admin))

    @app.post("/signup", status_code=201)
    async def signup(body: SignUp, request: Request) -> dict[str, int]:
        """Create the user and enqueue the welcome mail, in one transaction."""
        sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
        try:
            async with sessions.begin() as session:
                user = User(email=body.email)
                session.add(user)
                await session.flush()  # assigns user.id; a duplicate email fails here
                job_id = await send_welcome.enqueue(session, user.id, email=user.email)
        except IntegrityError:
            # Rolled back: no user, and no job either.
            raise HTTPException(409, f"{body.email} has already signed up") from None
        return {"user_id": user.id, "job_id": job_id}

    @app.get("/jobs/{job_id}")
    async def job_state(job_id: int, request: Request) -> dict[str, Any]:
        """A job's state, as the queue's ``Job`` model shows it."""
        sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
        async with sessions() as session:
            job = await session.scalar(
                select(queue.Job)
                .where(queue.Job.id == job_id)
                .options(selectinload(queue.Job.execution))
            )
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return {
            "id": job.id,
            "task": job.task,
            "state": job.state,
            "attempts": job.attempts,
            "result": job.result,
        }

    return app


#: For ``uvicorn examples.fastapi_app.app:app``.
app = create_app()
