"""What the dashboard needs of a queue, as a Protocol.

The dashboard sits below :class:`~sqla_queue.Queue` in the layers: it never imports it.
It asks for an object with these members instead, which a ``Queue`` has (structural
typing: ``Queue.dashboard`` passes itself, and the type checker holds the fit there). The
actions go through the queue's own methods, not the feature functions beneath them, so
that a page refuses what the CLI refuses (an unknown task, a limit out of range).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from sqla_queue.admin import RequeueReport
from sqla_queue.models.tables import QueueTables
from sqla_queue.status import QueueStatus

__all__ = ["DashboardQueue", "TaskLimitView"]


class TaskLimitView(Protocol):
    """A task's concurrency limit as the overview shows it (a ``Queue``'s ``TaskLimit``)."""

    @property
    def declared(self) -> int | None:
        """The limit declared in code, if any."""
        ...

    @property
    def stored(self) -> int | None:
        """The limit stored in the database, if any (it wins over the declared one)."""
        ...


class DashboardQueue(Protocol):
    """The members of a :class:`~sqla_queue.Queue` that the dashboard reads and calls.

    Every method gets the dashboard's own ``Connection`` (in a transaction it commits
    or rolls back), except :meth:`cancel`, which gets the bind itself.
    """

    @property
    def tables(self) -> QueueTables:
        """The queue's tables."""
        ...

    @property
    def tasks(self) -> Mapping[str, object]:
        """The tasks registered on the queue, by name."""
        ...

    def limits(self, session: Connection, /) -> Mapping[str, TaskLimitView]:
        """Every concurrency limit that applies, declared or stored, by task name."""
        ...

    def status(self, session: Connection, /) -> QueueStatus:
        """What the queue is doing now (``Queue.status``)."""
        ...

    def requeue(self, session: Connection, job_ids: Iterable[int], /) -> RequeueReport:
        """Put failed or cancelled jobs back in the queue (``Queue.requeue``)."""
        ...

    def cancel(self, source: Any, job_ids: Iterable[int], /) -> Any:
        """Cancel jobs, committing on its own (``Queue.cancel``): a dict of outcomes by
        id, or a coroutine of it for an async ``source``."""
        ...

    def job_steps(self, session: Connection, job_id: int, /) -> Any:
        """A durable job's committed steps, in commit order (``Queue.job_steps``)."""
        ...

    def signal(self, session: Connection, job_id: int, name: str, payload: Any = None, /) -> Any:
        """Send signal ``name`` to a durable job (``Queue.signal``): a ``Signalled``."""
        ...

    def pause(self, session: Connection, task: str, /) -> None:
        """Pause ``task`` for every worker (``Queue.pause``)."""
        ...

    def resume(self, session: Connection, task: str, /) -> None:
        """Resume a paused task (``Queue.resume``)."""
        ...

    def set_limit(self, session: Connection, task: str, limit: int | None, /) -> None:
        """Store or remove the concurrency limit of ``task`` (``Queue.set_limit``)."""
        ...
