"""Mapped classes over the queue's tables, so the host can query jobs with its own Session."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy.orm import foreign, relationship
from sqlalchemy.orm import registry as Registry

from sqla_queue.models.tables import ExecutionState, JobStatus, QueueTables

__all__ = ["Job", "JobExecution", "WorkflowRecord", "map_classes", "mapped_class_names"]


class Job:
    """A durable job: what to run, with which arguments, and how it ended.

    Query it with the host's Session: ``session.scalars(select(queue.Job))``.
    """

    id: int
    task: str
    payload: dict[str, Any]
    priority: int
    queue_id: str | None
    status: str
    attempts: int
    max_attempts: int
    errors: list[dict[str, Any]]
    result: Any
    created_at: dt.datetime
    scheduled_at: dt.datetime
    finished_at: dt.datetime | None
    #: The unique key it was enqueued with (``task.options(unique_key=...)``).
    unique_key: str | None
    #: The application row it is about (``task.options(about=...)``): table and key.
    about_table: str | None
    about_key: str | None
    #: Someone waits (or waited) for its result with ``queue.result``.
    awaited: bool
    #: Its live execution while it is queued or running (``None`` once it finished). Load
    #: it with ``selectinload(queue.Job.execution)`` when listing many jobs.
    execution: JobExecution | None

    def __repr__(self) -> str:
        return f"<Job id={self.id} task={self.task!r} status={self.status!r}>"

    @property
    def is_finished(self) -> bool:
        """Whether the job reached a final status (succeeded, failed or cancelled)."""
        return self.status != JobStatus.QUEUED

    @property
    def last_error(self) -> dict[str, Any] | None:
        """The last attempt's error (``type``, ``message``, ``traceback``, ...), if any."""
        return self.errors[-1] if self.errors else None

    @property
    def state(self) -> str:
        """What to show for the job, one word: its final status once it finished, else
        ``running``, ``cancelling`` (running, asked to stop), ``waiting`` (behind its
        ``queue_id``), ``scheduled`` (due later) or ``pending`` (due now).

        Reads :attr:`execution` (one query per job unless it was loaded with the job).
        """
        if self.status != JobStatus.QUEUED:
            return self.status
        execution = self.execution
        if execution is None:
            return JobStatus.QUEUED
        if execution.state == ExecutionState.RUNNING:
            return "cancelling" if execution.cancel_requested else "running"
        if execution.state == ExecutionState.PENDING:
            now = dt.datetime.now(dt.UTC)
            return "scheduled" if execution.execute_at > now else "pending"
        return execution.state


class JobExecution:
    """The live row of a job while it is pending or running."""

    id: int
    task: str
    priority: int
    queue_id: str | None
    state: str
    execute_at: dt.datetime
    attempt: int
    reclaims: int
    worker_id: uuid.UUID | None
    alive_at: dt.datetime | None
    lease_seconds: float | None
    slot: int | None
    #: Someone cancelled the job while this execution ran (see ``queue.cancel``).
    cancel_requested: bool
    #: The job is a workflow's node: its completion also releases its dependents.
    workflow: bool
    #: What a suspended durable job waits for (schema version 7), else None.
    wait: str | None

    def __repr__(self) -> str:
        return f"<JobExecution id={self.id} task={self.task!r} state={self.state!r}>"


def mapped_class_names(tables: QueueTables) -> tuple[str, str]:
    """The names of one queue's mapped classes: ``Job[app.sqla_queue_]`` and its execution.

    A declarative registry keeps a string-lookup table of its classes by name and module,
    and warns (``SAWarning``) when a second class arrives under a name and module it has
    already seen. Naming each queue's classes after its schema and prefix keeps two queues
    on one Base apart, and keeps them from shadowing a host model called ``Job``.
    """
    where = f"{tables.schema}.{tables.prefix}" if tables.schema else tables.prefix
    return f"Job[{where}]", f"JobExecution[{where}]"


def map_classes(reg: Registry, tables: QueueTables) -> tuple[type[Job], type[JobExecution]]:
    """Map fresh subclasses of :class:`Job` and :class:`JobExecution` onto ``tables``.

    Fresh subclasses keep two queues in one registry (say, two schemas or two prefixes) from
    sharing a mapper; their names (:func:`mapped_class_names`) keep them from colliding in
    the registry's string-lookup table.
    """
    job_name, exec_name = mapped_class_names(tables)
    job_cls: type[Job] = type(job_name, (Job,), {"__module__": __name__})
    exec_cls: type[JobExecution] = type(exec_name, (JobExecution,), {"__module__": __name__})
    reg.map_imperatively(exec_cls, tables.executions)
    # No foreign key joins the two tables (see tables.py), so the join is spelled out.
    execution = relationship(
        exec_cls,
        primaryjoin=tables.jobs.c.id == foreign(tables.executions.c.id),
        viewonly=True,
        uselist=False,
    )
    reg.map_imperatively(job_cls, tables.jobs, properties={"execution": execution})
    return job_cls, exec_cls


class WorkflowRecord:
    """A workflow's row (schema version 6): its name and the application row it is about.

    Query it with the host's Session (``select(queue.WorkflowRecord)``), or list a row's
    workflows through ``queue.workflows_relationship(Order)``; its nodes' states come from
    ``queue.workflow_status``.
    """

    id: int
    name: str
    about_table: str | None
    about_key: str | None
    created_at: dt.datetime
    cancelled_at: dt.datetime | None

    def __repr__(self) -> str:
        return f"<WorkflowRecord id={self.id} name={self.name!r}>"


def map_workflow_class(reg: Registry, tables: QueueTables) -> type[WorkflowRecord]:
    """Map a fresh subclass of :class:`WorkflowRecord` onto ``tables.workflows`` (fresh, and
    named after the queue's tables, for the reason :func:`map_classes` gives)."""
    job_name, _ = mapped_class_names(tables)
    name = job_name.replace("Job", "WorkflowRecord", 1)
    cls: type[WorkflowRecord] = type(name, (WorkflowRecord,), {"__module__": __name__})
    reg.map_imperatively(cls, tables.workflows)
    return cls
