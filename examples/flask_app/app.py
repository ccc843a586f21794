"""The web app: ``flask --app examples.flask_app.app run`` (reads ``DATABASE_URL``).

* ``POST /signup`` creates a user and enqueues the welcome mail in the same transaction;
* ``GET /jobs/<job_id>`` shows a job's state, ``GET /users/<user_id>`` the user.

Jobs run in a separate worker process: see :mod:`examples.flask_app.worker`.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, jsonify, request
from flask.typing import ResponseReturnValue
from sqlalchemy import create_engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from examples.flask_app.jobs import User, create_tables, queue, sign_up

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1/postgres"


def create_app(database_url: str | None = None) -> Flask:
    """Build the app on ``database_url`` (default: ``$DATABASE_URL``)."""
    url = database_url or os.environ.get("DATABASE_URL", DEFAULT_URL)
    engine = create_engine(url, pool_size=5)
    with engine.begin() as connection:
        create_tables(connection)
    sessions = sessionmaker(engine)

    app = Flask(__name__)
    app.extensions["sqlalchemy_sessions"] = sessions

    @app.post("/signup")
    def signup() -> ResponseReturnValue:
        """Create the user and enqueue the welcome mail, in one transaction."""
        body: dict[str, Any] = request.get_json(force=True)
        email = str(body.get("email", ""))
        try:
            with sessions.begin() as session:
                user, job_id = sign_up(session, email)
                user_id = user.id
        except IntegrityError:
            # Rolled back: no user, and no job either.
            return jsonify(error=f"{email} has already signed up"), 409
        return jsonify(user_id=user_id, job_id=job_id), 201

    @app.get("/jobs/<int:job_id>")
    def job_state(job_id: int) -> ResponseReturnValue:
        """A job's state, as the queue's ``Job`` model shows it."""
        with sessions() as session:
            job = session.scalar(
                select(queue.Job)
                .where(queue.Job.id == job_id)
                .options(selectinload(queue.Job.execution))
            )
            if job is None:
                abort(404)
            return jsonify(
                id=job.id, task=job.task, state=job.state, attempts=job.attempts, result=job.result
            )

    @app.get("/users/<int:user_id>")
    def user_state(user_id: int) -> ResponseReturnValue:
        """A user, and whether the welcome mail went out."""
        with sessions() as session:
            user: User | None = session.get(User, user_id)
            if user is None:
                abort(404)
            return jsonify(id=user.id, email=user.email, welcomed=user.welcomed)

    # The dashboard is an ASGI app and Flask speaks WSGI: run it beside this app with
    # `sqla-queue dashboard` rather than inside it (see README.md).
    return app


def session_factory(app: Flask) -> sessionmaker[Session]:
    """The app's ``sessionmaker``, for scripts and tests."""
    sessions: sessionmaker[Session] = app.extensions["sqlalchemy_sessions"]
    return sessions
