"""Exceptions raised by sqla_queue.

Every error a user can trigger names what was wrong and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "CancelBlockedError",
    "DuplicateJobError",
    "InsufficientPrivilegeError",
    "InvalidIdentifierError",
    "IsolationLevelError",
    "JobCancelledError",
    "JobFailedError",
    "JobNotFoundError",
    "PayloadNotSerializableError",
    "QueueFull",
    "ResultTimeoutError",
    "SchemaMismatchError",
    "SignalTimeoutError",
    "SqlaQueueError",
    "StepNotCommittedError",
    "TaskAlreadyRegisteredError",
    "UnknownTaskError",
]


class SqlaQueueError(Exception):
    """Base class of every error sqla_queue raises on purpose."""


class InvalidIdentifierError(SqlaQueueError, ValueError):
    """A schema name, table prefix or task name is not acceptable."""


class UnknownTaskError(SqlaQueueError, LookupError):
    """A task name is neither registered with ``@queue.task`` nor declared."""


class TaskAlreadyRegisteredError(SqlaQueueError, ValueError):
    """Two handlers were registered under the same task name."""


class PayloadNotSerializableError(SqlaQueueError, TypeError):
    """A job's arguments cannot be stored as JSON; nothing was written."""


class SchemaMismatchError(SqlaQueueError, RuntimeError):
    """The database lacks objects that this version of sqla_queue needs."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class InsufficientPrivilegeError(SqlaQueueError, RuntimeError):
    """The connected role lacks a privilege the queue needs on its schema or tables.

    ``missing`` names each missing privilege (``SELECT on table app.sqla_queue_jobs``);
    the message also gives the ``GRANT`` statements that fix it.
    """

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class WorkerStoppedError(SqlaQueueError, RuntimeError):
    """The worker stopped because it cannot do its job, and retrying would not help.

    Raised by ``run()`` after a graceful stop (running handlers finished or handed back,
    every worker thread stopped). The message names what is wrong and how to fix it: a
    privilege the worker's role lacks, a table that is missing, or an outcome the database
    refused even as a plain failure.
    """


class DuplicateJobError(SqlaQueueError, ValueError):
    """An enqueue with ``on_duplicate="raise"`` found its unique key held by another job.

    ``job_id`` is the job that holds the key (``None`` when the duplicate was within the
    same ``enqueue_many`` batch, before anything was written); ``task`` and ``key`` name
    the key. Nothing of the call was written.
    """

    def __init__(self, message: str, *, task: str, key: str, job_id: int | None) -> None:
        super().__init__(message)
        self.task = task
        self.key = key
        self.job_id = job_id


class JobNotFoundError(SqlaQueueError, LookupError):
    """No job has this id (it never existed, or it was pruned)."""

    def __init__(self, message: str, *, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class WorkflowNotFoundError(SqlaQueueError, LookupError):
    """No workflow has this id in this queue."""

    def __init__(self, message: str, *, workflow_id: int) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id


class JobFailedError(SqlaQueueError, RuntimeError):
    """The awaited job failed for good; ``error`` is its last error entry.

    ``error`` holds ``type``, ``message`` and ``traceback`` of the last attempt's exception
    (as the worker recorded them), ``errors`` the whole history.
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: int,
        error: dict[str, object] | None,
        errors: list[dict[str, object]],
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.error = error
        self.errors = errors


class JobCancelledError(SqlaQueueError, RuntimeError):
    """The awaited job was cancelled: it will not produce a result."""

    def __init__(self, message: str, *, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class ResultTimeoutError(SqlaQueueError, TimeoutError):
    """The awaited job did not finish within the timeout; it is still queued or running."""

    def __init__(self, message: str, *, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class CancelBlockedError(SqlaQueueError, TimeoutError):
    """A cancel waited too long for a lock on the jobs' rows; nothing was cancelled.

    Workers hold those locks for milliseconds. The usual holder is the caller's own open
    transaction (it claimed, completed or updated the jobs): commit it, then cancel.
    """


class QueueFull(SqlaQueueError, RuntimeError):
    """An enqueue would take a bounded task past its ``max_pending``; nothing was written.

    ``task`` and ``max_pending`` name the bound, ``pending`` is how many of the task's
    jobs were pending when it was last counted (at most ``max_pending``; 0 for a call with
    more jobs than the bound, which is refused uncounted), ``requested`` how many this call
    wanted to add, and ``waited`` how many seconds it waited for room (0.0 without
    ``wait_if_full``).
    The caller's transaction is still usable: no statement failed, and rolling back or
    committing it is the caller's choice. Until it ends, it keeps the task's enqueue lock,
    so other enqueues of the task wait for it.
    """

    def __init__(
        self,
        message: str,
        *,
        task: str,
        max_pending: int,
        pending: int,
        requested: int,
        waited: float,
    ) -> None:
        super().__init__(message)
        self.task = task
        self.max_pending = max_pending
        self.pending = pending
        self.requested = requested
        self.waited = waited


class IsolationLevelError(SqlaQueueError, RuntimeError):
    """An enqueue of a bounded task ran in a transaction that cannot count exactly.

    The bound is exact because each enqueue counts the task's pending jobs in a snapshot
    taken after it got the task's lock, which sees every earlier enqueuer's commit. Under
    ``REPEATABLE READ`` or ``SERIALIZABLE`` the snapshot is the transaction's first one,
    taken earlier, so the count could miss them: enqueue bounded tasks in ``READ
    COMMITTED`` transactions (PostgreSQL's default). Nothing was written.
    """


class StepNotCommittedError(SqlaQueueError, RuntimeError):
    """A durable job's step (or cursor move, or wait) could not be committed, and its
    writes were rolled back.

    ``reason`` says why: ``"lost"`` (the job's execution was reclaimed by another worker,
    which runs it now), ``"cancelled"`` (someone cancelled the job: it commits no more
    steps), or ``"committed"`` (another attempt committed this step first). The attempt
    should stop: raising this error on ends it.
    """

    def __init__(self, message: str, *, job_id: int, step: str, reason: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.step = step
        self.reason = reason


class SignalTimeoutError(SqlaQueueError, TimeoutError):
    """``ctx.wait_for_signal`` (or ``ctx.wait_until``) reached its deadline first.

    Raised in the handler when the job wakes at the deadline; catch it to take another
    branch. The deadline was recorded when the wait began, so a replay raises it again.
    """

    def __init__(self, message: str, *, job_id: int, wait: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.wait = wait
