"""The queue's durable-job methods: signals, conditions, and the operators' tools.

A mixin of :class:`~sqla_queue.Queue`, kept apart so the queue stays a thin façade: each
method hands a flow of :mod:`sqla_queue.durable.admin` to the caller's session or
connection, in its transaction (nothing here commits).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue._binds import on_connection, tables_for
from sqla_queue.conversation import Flow, run_flow
from sqla_queue.durable import admin
from sqla_queue.durable.admin import (
    AdminStatements,
    Signalled,
    StepRecord,
    StepVersion,
    SuspendedJob,
)
from sqla_queue.durable.checks import (
    check_durable_name,
    check_job_id,
    check_job_id_list,
    check_listing_limit,
    check_step_version,
)
from sqla_queue.durable.conditions import RowCondition
from sqla_queue.models.tables import QueueTables

__all__ = ["DurableMethods"]

Bind = Session | Connection | AsyncSession | AsyncConnection
T = TypeVar("T")


class DurableMethods:
    """Durable jobs of this queue (see the "Durable jobs" guide)."""

    tables: QueueTables

    def _durable_flow(self, bind: Bind, make: Any) -> Any:
        """Run ``make(statements)``'s flow on ``bind``, with its tenant's statements."""

        def use(connection: Any) -> Any:
            tables = tables_for(self.tables, connection)
            flow: Flow[Any] = make(AdminStatements.of(tables))
            return run_flow(connection, flow)

        return on_connection(bind, use)

    def signal(
        self, session: Bind, job_id: int, name: str, payload: Any = None
    ) -> Signalled | Coroutine[Any, Any, Signalled]:
        """Send signal ``name`` (with a JSON ``payload``) to job ``job_id``, in
        ``session``'s transaction; a :class:`~sqla_queue.durable.Signalled` (a coroutine
        of it for an async bind).

        The job finds it in ``ctx.wait_for_signal(name)`` whether it waits already (it
        wakes when this transaction commits) or begins to wait later. One signal per name
        and job: a second one of the same name is not stored (``stored`` is ``False``).
        Raises :class:`~sqla_queue.errors.JobNotFoundError` for an unknown job.
        """
        # Checked before anything is sent: 1.5 must not signal job 2, and a name the
        # database cannot store must not abort the caller's transaction.
        job_id = check_job_id(job_id)
        check_durable_name(name, "signal")
        encoded = admin.encode_signal_payload(name, payload)
        result: Signalled | Coroutine[Any, Any, Signalled] = self._durable_flow(
            session, lambda s: admin.signal_flow(s.durable, job_id, name, encoded)
        )
        return result

    def condition(
        self, entity: type[Any], clause: ColumnElement[bool], *, name: str | None = None
    ) -> RowCondition:
        """A condition on rows of the mapped class ``entity`` for ``ctx.wait_until``:
        ``queue.condition(Order, Order.status == "approved")``.

        Declare it at import time, beside your models: from then on, every ORM flush in
        this process that changes a column the condition reads wakes the jobs waiting on
        that row, in the flush's transaction, if the condition holds. ``name`` (default:
        derived from the clause) is part of what waiting jobs store: keep it stable.
        """
        if name is not None:
            check_durable_name(name, "condition")
        return RowCondition(self.tables, entity, clause, name)

    def suspended_jobs(
        self, session: Bind, *, task: str | None = None, limit: int = 100
    ) -> list[SuspendedJob] | Coroutine[Any, Any, list[SuspendedJob]]:
        """The suspended jobs (of ``task``), soonest due first: what each waits for, and
        until when."""
        if task is not None and not isinstance(task, str):
            raise TypeError(f"task must be a task's name or None, got {task!r}")
        limit = check_listing_limit(limit, "suspended jobs")
        result: list[SuspendedJob] | Coroutine[Any, Any, list[SuspendedJob]]
        result = self._durable_flow(
            session, lambda s: admin.suspended_flow(s, task=task, limit=limit)
        )
        return result

    def job_steps(
        self, session: Bind, job_id: int
    ) -> list[StepRecord] | Coroutine[Any, Any, list[StepRecord]]:
        """Job ``job_id``'s committed steps, cursors and waits, in commit order."""
        job_id = check_job_id(job_id)
        result: list[StepRecord] | Coroutine[Any, Any, list[StepRecord]]
        result = self._durable_flow(session, lambda s: admin.job_steps_flow(s, job_id))
        return result

    def step_versions(
        self, session: Bind
    ) -> list[StepVersion] | Coroutine[Any, Any, list[StepVersion]]:
        """The stored step versions of the queued durable jobs, by task and step."""
        result: list[StepVersion] | Coroutine[Any, Any, list[StepVersion]]
        result = self._durable_flow(session, admin.step_versions_flow)
        return result

    def migrate_steps(
        self, session: Bind, *, task: str, step: str, from_version: int, to_version: int
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Declare the stored ``step`` of ``task``'s queued jobs, committed by version
        ``from_version`` of the code, valid for ``to_version``, and wake the jobs that
        waited for it; their ids. See the durable jobs guide on versions."""
        if not isinstance(task, str) or not task:
            raise ValueError(f"task must be a task's name, got {task!r}")
        check_durable_name(step, "step")
        check_step_version(from_version)
        check_step_version(to_version)
        result: list[int] | Coroutine[Any, Any, list[int]] = self._durable_flow(
            session,
            lambda s: admin.migrate_steps_flow(
                s, task=task, step=step, from_version=from_version, to_version=to_version
            ),
        )
        return result

    def fire_timers(
        self, session: Bind, job_ids: Sequence[int] | None = None
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """End the sleeps and wait deadlines of suspended jobs (``job_ids``; ``None``:
        all) now and wake them; their ids. For tests and operators: a sleeping job runs
        at once, and a wait with a deadline times out."""
        ids = check_job_id_list(job_ids)
        result: list[int] | Coroutine[Any, Any, list[int]]
        result = self._durable_flow(session, lambda s: admin.fire_flow(s, ids))
        return result
