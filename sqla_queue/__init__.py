"""sqla_queue: a PostgreSQL job queue that lives inside your SQLAlchemy application.

>>> queue = Queue(Base)                       # tables join your metadata
>>> @queue.task
... def send_email(to: str) -> None: ...
>>> send_email.enqueue(session, to="a@b.c")   # inside your transaction
>>> queue.worker(SessionLocal).run()          # or: sqla-queue worker myapp.jobs:queue
"""

from sqla_queue.admin import RequeueReport
from sqla_queue.controls import RateLimit, TaskControl
from sqla_queue.daemons import DaemonBackoff, DaemonContext, DaemonStatus
from sqla_queue.durable import RowCondition, Signalled, StepRecord, SuspendedJob
from sqla_queue.errors import (
    CancelBlockedError,
    DuplicateJobError,
    InsufficientPrivilegeError,
    InvalidIdentifierError,
    IsolationLevelError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    PayloadNotSerializableError,
    QueueFull,
    ResultTimeoutError,
    SchemaMismatchError,
    SignalTimeoutError,
    SqlaQueueError,
    StepNotCommittedError,
    TaskAlreadyRegisteredError,
    UnknownTaskError,
    WorkerStoppedError,
    WorkflowNotFoundError,
)
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.logic.outcomes import Reschedule, Retry
from sqla_queue.models import SCHEMA_VERSION, Job, JobExecution, JobStatus
from sqla_queue.periodic import Schedule, ScheduleState
from sqla_queue.queue import Queue
from sqla_queue.spec import EnqueueOptions, JobSpec
from sqla_queue.statements.lifecycle import CancelOutcome
from sqla_queue.status import QueueStatus, TaskStatus, WorkerStatus
from sqla_queue.task import Task
from sqla_queue.worker import AsyncWorker, JobContext, RunStats, Worker, WorkerSettings
from sqla_queue.workflows import (
    NodeStatus,
    ParentError,
    Workflow,
    WorkflowHandle,
    WorkflowStatus,
    quorum,
)


def _version() -> str:
    """The installed distribution's version; pyproject.toml is its one source."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sqla-queue")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "SCHEMA_VERSION",
    "AsyncWorker",
    "CancelBlockedError",
    "CancelOutcome",
    "DaemonBackoff",
    "DaemonContext",
    "DaemonStatus",
    "DuplicateJobError",
    "EnqueueOptions",
    "InsufficientPrivilegeError",
    "InvalidIdentifierError",
    "IsolationLevelError",
    "Job",
    "JobCancelledError",
    "JobContext",
    "JobExecution",
    "JobFailedError",
    "JobNotFoundError",
    "JobSpec",
    "JobStatus",
    "NodeStatus",
    "ParentError",
    "PayloadNotSerializableError",
    "Queue",
    "QueueFull",
    "QueueStatus",
    "RateLimit",
    "RequeueReport",
    "Reschedule",
    "ResultTimeoutError",
    "Retry",
    "RetryPolicy",
    "RowCondition",
    "RunStats",
    "Schedule",
    "ScheduleState",
    "SchemaMismatchError",
    "SignalTimeoutError",
    "Signalled",
    "SqlaQueueError",
    "StepNotCommittedError",
    "StepRecord",
    "SuspendedJob",
    "Task",
    "TaskAlreadyRegisteredError",
    "TaskControl",
    "TaskStatus",
    "UnknownTaskError",
    "Worker",
    "WorkerSettings",
    "WorkerStatus",
    "WorkerStoppedError",
    "Workflow",
    "WorkflowHandle",
    "WorkflowNotFoundError",
    "WorkflowStatus",
    "__version__",
    "quorum",
]
