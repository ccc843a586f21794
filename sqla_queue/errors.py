"""Exceptions raised by sqla_queue.

Every error a user can trigger names what was wrong and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "InsufficientPrivilegeError",
    "InvalidIdentifierError",
    "PayloadNotSerializableError",
    "SchemaMismatchError",
    "SqlaQueueError",
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
