"""``assert_enqueued``: what a block of application code enqueued, read from the jobs table.

Split from :mod:`sqla_queue.testing.helpers`, which re-exports these names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sqla_queue._binds import engine_with_options
from sqla_queue._identifiers import validate_task_name
from sqla_queue.checks import check_whole_number
from sqla_queue.models.tables import translated_schema

if TYPE_CHECKING:
    from sqla_queue.queue import Queue

__all__ = ["TRANSLATE", "EnqueuedJob", "EnqueuedJobs", "assert_enqueued"]

#: The execution option that chooses a tenant's schema.
TRANSLATE = "schema_translate_map"

_UNSET: Any = object()


@dataclass(frozen=True)
class EnqueuedJob:
    """A job that was enqueued inside an :func:`assert_enqueued` block."""

    id: int
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue_id: str | None
    priority: int
    scheduled_at: Any

    def __str__(self) -> str:
        """``#12 send_welcome(args=[1], kwargs={})``: for failure messages."""
        return f"#{self.id} {self.task}(args={self.args!r}, kwargs={self.kwargs!r})"


@dataclass
class EnqueuedJobs:
    """The jobs an :func:`assert_enqueued` block enqueued; filled when the block ends."""

    #: Every job enqueued in the block (whatever its task), in id order.
    all: list[EnqueuedJob] = field(default_factory=list)
    #: The ones that matched ``task``, ``args`` and ``kwargs``.
    matched: list[EnqueuedJob] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        """Ids of the matching jobs."""
        return [job.id for job in self.matched]

    def __len__(self) -> int:
        """How many jobs matched."""
        return len(self.matched)

    def __iter__(self) -> Iterator[EnqueuedJob]:
        """The matching jobs."""
        return iter(self.matched)


def _bind_parts(session: Session | Connection) -> tuple[Engine, Connection | None]:
    """The engine behind ``session`` and, if it holds a transaction, the connection in it."""
    if isinstance(session, Connection):
        held = session if session.in_transaction() else None
        return engine_with_options(session, "assert_enqueued"), held
    bind = session.get_bind()
    engine = bind.engine if isinstance(bind, Connection) else bind
    if not isinstance(engine, Engine):
        raise TypeError(f"assert_enqueued needs a session bound to an engine, got {bind!r}")
    # Only reuse the session's connection when a transaction is open: asking for it
    # otherwise would begin one behind the caller's back. The engine returned carries
    # the execution options (a tenant's schema_translate_map) of what the session uses.
    connection = session.connection() if session.in_transaction() else None
    return engine_with_options(connection or bind, "assert_enqueued"), connection


def _sequence_watermark(queue: Queue, engine: Engine) -> tuple[str, int]:
    """The jobs id sequence's name and its last value, read outside any transaction.

    A sequence is not transactional: every id handed out after this read is larger, even
    one given to a transaction that was already open, which a ``max(id)`` would miss.
    """
    jobs = queue.tables.jobs
    # The schema the engine's schema_translate_map (a tenant's) puts the table in.
    schema = translated_schema(jobs.schema, engine.get_execution_options().get(TRANSLATE))
    qualified = f"{schema}.{jobs.name}" if schema else jobs.name
    with engine.connect() as connection:
        sequence = connection.scalar(
            text("SELECT pg_get_serial_sequence(:table, 'id')"), {"table": _quote(qualified)}
        )
        if sequence is None:
            raise RuntimeError(f"{qualified}.id has no sequence: are the queue's tables created?")
        last = connection.scalar(
            text("SELECT pg_sequence_last_value(CAST(:seq AS regclass))"), {"seq": sequence}
        )
    return str(sequence), int(last or 0)


def _quote(qualified: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in qualified.split("."))


def _read_enqueued(queue: Queue, connection: Connection, after_id: int) -> list[EnqueuedJob]:
    jobs = queue.tables.jobs
    rows = connection.execute(
        select(
            jobs.c.id,
            jobs.c.task,
            jobs.c.payload,
            jobs.c.queue_id,
            jobs.c.priority,
            jobs.c.scheduled_at,
        )
        .where(jobs.c.id > after_id)
        .order_by(jobs.c.id)
    )
    return [
        EnqueuedJob(
            id=row.id,
            task=row.task,
            args=list(row.payload.get("args", [])),
            kwargs=dict(row.payload.get("kwargs", {})),
            queue_id=row.queue_id,
            priority=row.priority,
            scheduled_at=row.scheduled_at,
        )
        for row in rows
    ]


def _describe_expectation(
    task: str | None, count: int | None, args: Any, kwargs: Mapping[str, Any] | None
) -> str:
    what = f"job(s) of task {task!r}" if task is not None else "job(s)"
    if args is not _UNSET:
        what += f" with args {list(args)!r}"
    if kwargs is not None:
        what += f" with kwargs {dict(kwargs)!r}"
    amount = "at least 1" if count is None else str(count)
    return f"expected {amount} {what} enqueued in the block"


def assert_enqueued(
    queue: Queue,
    session: Session | Connection,
    *,
    task: str | None = None,
    count: int | None = None,
    args: Sequence[Any] = _UNSET,
    kwargs: Mapping[str, Any] | None = None,
) -> contextlib.AbstractContextManager[EnqueuedJobs]:
    """Check that the code in the ``with`` block enqueued the expected jobs.

    ``with assert_enqueued(queue, session, task="send_welcome", kwargs={"user_id": 1}):``
    fails with ``AssertionError`` at the end of the block unless it enqueued exactly
    ``count`` matching jobs (at least one when ``count`` is not given; ``count=0`` asserts
    that none was). The message lists every job the block enqueued.

    The jobs are read from the jobs table at the end of the block, through ``session``'s
    own transaction when one is open, so jobs it has not committed yet count, and jobs
    of a transaction that rolled back inside the block do not. A job counts when its id
    was handed out after the block began: jobs that other connections committed
    meanwhile count too, so narrow with ``task=`` when something else enqueues.

    Args:
        queue: the application's queue.
        session: the ``Session`` or ``Connection`` the code under test enqueues through.
        task: only jobs of this task name match.
        count: how many matching jobs there must be.
        args: the matching jobs' positional arguments, exactly (as stored: JSON values).
        kwargs: the matching jobs' keyword arguments, exactly.

    Returns:
        The context manager of the block, which yields an :class:`EnqueuedJobs`, filled
        when the block ends, for further checks.

    Raises:
        TypeError, ValueError: at the call, before the block runs, for an expectation that
            no job could meet: a ``count`` that is not a whole number from 0 (``1.5``,
            ``True``, ``-1``), a ``task`` that is not a task name, ``args`` that are not a
            list or tuple, ``kwargs`` that are not a mapping with string keys.
    """
    __tracebackhide__ = True  # pytest: show the test's line, not this helper's
    _check_expectation(task, count, args, kwargs)
    return _enqueued_block(queue, session, task=task, count=count, args=args, kwargs=kwargs)


def _check_expectation(task: object, count: object, args: object, kwargs: object) -> None:
    """Refuse what no enqueued job could match: the assertion would fail, or pass, for a
    reason that has nothing to do with the code under test."""
    if count is not None:
        check_whole_number("assert_enqueued: count", count, 0, None)
    if task is not None:
        validate_task_name(task)  # type: ignore[arg-type]
    if args is not _UNSET and not isinstance(args, list | tuple):
        raise TypeError(
            f"assert_enqueued: args must be a list or tuple of positional arguments, got {args!r}"
        )
    if kwargs is not None and (
        not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs)
    ):
        raise TypeError(
            f"assert_enqueued: kwargs must be a mapping of keyword arguments by name, "
            f"got {kwargs!r}"
        )


@contextlib.contextmanager
def _enqueued_block(
    queue: Queue,
    session: Session | Connection,
    *,
    task: str | None,
    count: int | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
) -> Iterator[EnqueuedJobs]:
    __tracebackhide__ = True  # pytest: show the test's line, not this helper's
    engine, _ = _bind_parts(session)
    _, watermark = _sequence_watermark(queue, engine)
    found = EnqueuedJobs()
    yield found
    engine, connection = _bind_parts(session)
    if connection is not None:
        found.all = _read_enqueued(queue, connection, watermark)
    else:
        with engine.connect() as own:
            found.all = _read_enqueued(queue, own, watermark)
    found.matched = [
        job
        for job in found.all
        if (task is None or job.task == task)
        and (args is _UNSET or job.args == list(args))
        and (kwargs is None or job.kwargs == dict(kwargs))
    ]
    ok = len(found.matched) >= 1 if count is None else len(found.matched) == count
    if not ok:
        listed = "\n".join(f"  {job}" for job in found.all) or "  (none)"
        raise AssertionError(
            f"{_describe_expectation(task, count, args, kwargs)}, found "
            f"{len(found.matched)}. Jobs enqueued in the block:\n{listed}"
        )


# -- eager ------------------------------------------------------------------------------------
