"""Listing jobs for operators: what ``sqla-queue jobs`` shows, in one bounded query.

:func:`list_jobs` runs :func:`~sqla_queue.statements.listing.job_listing_statement` in the
caller's transaction (nothing here commits) and returns plain rows: the job's columns, its
state in one word (as :attr:`sqla_queue.Job.state` says it) and its last error. An app
that lists jobs with its own ORM uses ``select(queue.Job)`` and ``queue.jobs_about()``
instead; this is the same view without the mapped classes, for the command line.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sqla_queue.admin import check_job_ids
from sqla_queue.checks import check_row_limit
from sqla_queue.logic.payload import text_problem
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.listing import JOB_STATES, JobListingParams, job_listing_statement

__all__ = ["JOB_STATES", "JobRow", "list_jobs"]


@dataclass(frozen=True)
class JobRow:
    """One job as :func:`list_jobs` lists it."""

    id: int
    task: str
    #: ``queued``, ``succeeded``, ``failed`` or ``cancelled`` (``jobs.status``).
    status: str
    #: The status once finished; else ``running``, ``cancelling``, ``waiting``,
    #: ``scheduled``, ``pending`` or ``suspended`` (see :attr:`sqla_queue.Job.state`).
    state: str
    attempts: int
    max_attempts: int
    priority: int
    queue_id: str | None
    unique_key: str | None
    about_table: str | None
    about_key: str | None
    created_at: dt.datetime
    scheduled_at: dt.datetime
    finished_at: dt.datetime | None
    #: The last entry of the job's error history (``type``, ``message``, ...), if any.
    last_error: dict[str, Any] | None
    #: A suspended durable job's wait: ``sleep``, ``signal:<name>``,
    #: ``row:<condition>:<key>`` or ``version:<step>``; ``None`` for any other job.
    waits_for: str | None = None
    #: A suspended job's deadline; ``None`` when it waits without one (or is not suspended).
    until: dt.datetime | None = None

    @property
    def current_attempt(self) -> int:
        """The attempt the job is in, as its steps count it: a suspended job gave its
        attempt back (a wait is not an attempt), and resumes that same attempt when it
        wakes; any other job is in ``attempts``."""
        return self.attempts + 1 if self.state == "suspended" else self.attempts

    def as_json(self) -> dict[str, Any]:
        """The row as JSON-ready values (times in ISO 8601)."""
        values: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            values[name] = value.isoformat() if isinstance(value, dt.datetime) else value
        return values


def _text(option: str, value: object) -> str:
    """``value`` if it is a filter text PostgreSQL can compare (a string without NUL or
    lone surrogates); else ``TypeError`` or ``ValueError`` naming ``option``."""
    if not isinstance(value, str):
        raise TypeError(f"{option}: expected a string, got {value!r}")
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(f"{option} filter {value[:60]!r} {problem}")
    return value


def _texts(option: str, values: Iterable[str]) -> list[str]:
    """Each of ``values`` checked by :func:`_text`; a lone string, which would be read
    letter by letter, raises ``TypeError``."""
    if isinstance(values, str | bytes):
        raise TypeError(f"{option} must be a list of strings, got {values!r}")
    return [_text(option, value) for value in values]


def list_jobs(
    bind: Session | Connection,
    tables: QueueTables,
    *,
    limit: int,
    tasks: Iterable[str] = (),
    states: Iterable[str] = (),
    key: str | None = None,
    about_table: str | None = None,
    about_key: str | None = None,
    ids: Iterable[int] = (),
) -> list[JobRow]:
    """The newest ``limit`` jobs (by id) that pass every filter given.

    ``tasks``: any of these task names. ``states``: any of these words of
    :data:`JOB_STATES` (``queued`` means every live state). ``key``: the job's
    ``unique_key`` or ``queue_id``. ``about_table`` (and ``about_key``): linked to a row of
    that table (that row). ``ids``: one of these jobs. A wrong state, id or limit, a
    filter text PostgreSQL cannot compare (a NUL), or a lone string given for ``tasks``
    or ``states`` raises ``TypeError`` or ``ValueError`` before anything runs.
    """
    state_list = list(dict.fromkeys(_texts("states", states)))
    unknown = [s for s in state_list if s not in JOB_STATES]
    if unknown:
        raise ValueError(f"unknown job state {unknown[0]!r}; use one of {', '.join(JOB_STATES)}")
    if about_key is not None and about_table is None:
        raise ValueError("about_key needs about_table")
    task_list = _texts("tasks", tasks)
    for option, value in (("key", key), ("about_table", about_table), ("about_key", about_key)):
        if value is not None:
            _text(option, value)
    id_list = check_job_ids(ids)
    params: JobListingParams = {"limit": check_row_limit("the number of jobs to list", limit)}
    if task_list:
        params["tasks"] = task_list
    if key is not None:
        params["key"] = key
    if about_table is not None:
        params["about_table"] = about_table
    if about_key is not None:
        params["about_key"] = about_key
    if id_list:
        params["ids"] = id_list
    statement = job_listing_statement(
        tables,
        states=state_list,
        tasks=bool(task_list),
        key=key is not None,
        about=about_table is not None,
        about_key=about_key is not None,
        ids=bool(id_list),
    )
    connection = bind.connection() if isinstance(bind, Session) else bind
    rows = connection.execute(statement, dict(params)).all()
    return [JobRow(**row._asdict()) for row in rows]
