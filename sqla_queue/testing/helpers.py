"""Helpers for testing an application that uses sqla_queue.

* :func:`drain` runs every due job inline, with a burst worker, and reports what ran, read
  back from the jobs table;
* :func:`assert_enqueued` checks that a block of code enqueued the jobs it should have;
* :func:`eager` runs the due jobs right after each commit of a session factory's sessions,
  for unit tests that want "enqueue" to mean "run now".

They work with any database that holds the queue's tables; the pytest plugin
(:mod:`sqla_queue.testing.pytest_plugin`) adds fixtures that provide one per test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, and_, event, exists, func, or_, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue._binds import engine_with_options
from sqla_queue._identifiers import validate_task_name
from sqla_queue.checks import check_whole_number
from sqla_queue.models.tables import ExecutionState, JobStatus, translated_schema

#: The execution option that chooses a tenant's schema.
TRANSLATE = "schema_translate_map"

if TYPE_CHECKING:
    from sqla_queue.queue import Queue
    from sqla_queue.worker.base import RunStats

__all__ = [
    "DrainResult",
    "Eager",
    "EnqueuedJob",
    "EnqueuedJobs",
    "RanJob",
    "assert_enqueued",
    "drain",
    "eager",
]

_UNSET: Any = object()


@dataclass(frozen=True)
class RanJob:
    """One job that a :func:`drain` ran, as the jobs table shows it afterwards."""

    id: int
    task: str
    #: The job's status after the drain: ``succeeded``, ``failed``, ``cancelled``, or
    #: ``queued`` when an attempt failed and a retry is scheduled.
    status: str
    #: Attempts so far, including those of earlier runs.
    attempts: int
    result: Any
    #: The error the drain's last attempt recorded (``type``, ``message``, ``traceback``,
    #: ...), or ``None`` when no attempt of this drain failed.
    error: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        """Whether no attempt of this drain failed."""
        return self.error is None


@dataclass(frozen=True)
class DrainResult:
    """What one :func:`drain` ran, in job id order, and the burst worker's counts."""

    jobs: tuple[RanJob, ...]
    stats: RunStats

    @property
    def ids(self) -> list[int]:
        """Ids of the jobs that ran."""
        return [job.id for job in self.jobs]

    @property
    def tasks(self) -> list[str]:
        """Task names of the jobs that ran, one per job."""
        return [job.task for job in self.jobs]

    @property
    def succeeded(self) -> list[RanJob]:
        """The jobs that ran and ended ``succeeded``."""
        return [job for job in self.jobs if job.status == JobStatus.SUCCEEDED]

    @property
    def failed(self) -> list[RanJob]:
        """The jobs at least one of whose attempts in this drain raised."""
        return [job for job in self.jobs if not job.ok]

    def raise_failures(self) -> None:
        """Raise ``AssertionError`` naming each job whose attempt failed, with its error."""
        __tracebackhide__ = True  # pytest: show the test's line, not this helper's
        if self.failed:
            raise AssertionError(_describe_failures(self.failed))


def _describe_failures(failed: Sequence[RanJob]) -> str:
    lines = [f"{len(failed)} job(s) failed:"]
    for job in failed:
        error = job.error or {}
        lines.append(
            f"  job {job.id} ({job.task}, now {job.status}): "
            f"{error.get('type', '?')}: {error.get('message', '')}"
        )
        trace = error.get("traceback")
        if trace:
            lines.extend("    " + line for line in str(trace).rstrip().splitlines())
    return "\n".join(lines)


def _engine_of(session_factory: sessionmaker[Session]) -> Engine:
    bind = session_factory.kw.get("bind")
    if isinstance(bind, Connection):
        # Its execution options (a tenant's schema_translate_map) hold for ours too.
        return engine_with_options(bind, "drain")
    if not isinstance(bind, Engine):
        raise TypeError(
            "a session factory bound to an engine is needed: sessionmaker(bind=engine), "
            f"got bind={bind!r}"
        )
    return bind


def _worker_factory(session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    """The session factory to give the drain's worker: ``session_factory`` itself when it
    is bound to an engine. One bound to a connection cannot serve a worker (it opens
    connections of its own, see :func:`~sqla_queue.worker.pools.refuse_connection_bind`):
    the worker gets a factory of the same kind bound to the connection's engine with the
    connection's execution options, so the jobs run in the connection's tenant."""
    if not isinstance(session_factory.kw.get("bind"), Connection):
        return session_factory
    kw = {**session_factory.kw, "bind": _engine_of(session_factory)}
    # The new factory's class derives from the caller's: its session events (eager's
    # after_commit hook among them) hold for the handlers' sessions too.
    return sessionmaker(class_=session_factory.class_, **kw)


@dataclass(frozen=True)
class _Snapshot:
    """The attempts and error counts of the unfinished jobs, and the highest job id."""

    max_id: int
    open_jobs: dict[int, tuple[int, int]]


def _snapshot(queue: Queue, connection: Connection) -> _Snapshot:
    jobs = queue.tables.jobs
    max_id = connection.scalar(select(func.coalesce(func.max(jobs.c.id), 0)))
    rows = connection.execute(
        select(jobs.c.id, jobs.c.attempts, func.jsonb_array_length(jobs.c.errors)).where(
            jobs.c.status == JobStatus.QUEUED
        )
    )
    return _Snapshot(int(max_id or 0), {row[0]: (row[1], row[2]) for row in rows})


def _ran_since(queue: Queue, connection: Connection, before: _Snapshot) -> list[RanJob]:
    jobs = queue.tables.jobs
    watched = list(before.open_jobs)
    rows = connection.execute(
        select(
            jobs.c.id,
            jobs.c.task,
            jobs.c.status,
            jobs.c.attempts,
            jobs.c.result,
            jobs.c.errors,
        )
        .where(or_(jobs.c.id > before.max_id, jobs.c.id.in_(watched)))
        .order_by(jobs.c.id)
    )
    ran: list[RanJob] = []
    for row in rows:
        attempts_before, errors_before = before.open_jobs.get(row.id, (0, 0))
        # A job ran if it has more attempts than before; one that is merely new, or was
        # cancelled before it started, did not.
        if row.attempts <= attempts_before:
            continue
        errors = row.errors or []
        error = errors[-1] if len(errors) > errors_before else None
        ran.append(RanJob(row.id, row.task, row.status, row.attempts, row.result, error))
    return ran


def drain(
    queue: Queue,
    session_factory: sessionmaker[Session],
    *,
    tasks: Sequence[str] | None = None,
    **settings: Any,
) -> DrainResult:
    """Run every job that is due now, in this process, and return what ran.

    A burst worker (``queue.worker(session_factory, ...).run(burst=True)``) runs the jobs,
    so they go through the same claim, handlers, retries and acknowledgements as in
    production, including jobs that the handlers enqueue and that are due at once. Jobs
    scheduled for later (a ``delay``, a retry's backoff) stay queued. What ran is read back
    from the jobs table afterwards: every job with more attempts than before the drain.

    Args:
        queue: the application's queue.
        session_factory: a ``sessionmaker`` bound to an engine; handlers with
            ``pass_context=True`` get their ``ctx.session`` from it. One bound to a
            ``Connection`` works too: the jobs run on new connections of its engine, with
            the connection's execution options (a tenant's ``schema_translate_map``), and
            handlers' sessions are bound to those. Jobs the connection has not committed
            are not seen: commit before draining.
        tasks: only run these tasks (default: every registered task).
        settings: other :class:`~sqla_queue.WorkerSettings`. The defaults here differ from
            a production worker's: ``concurrency=1`` (jobs run one after another, in
            claim order), ``listen=False`` and ``install_signal_handlers=False``.

    Returns:
        The jobs that ran, in id order, with their status afterwards, and the worker's
        :class:`~sqla_queue.RunStats`. Call :meth:`DrainResult.raise_failures` to fail a
        test on any failed attempt.
    """
    engine = _engine_of(session_factory)
    options: dict[str, Any] = {
        "concurrency": 1,
        "listen": False,
        "install_signal_handlers": False,
        **settings,
    }
    if tasks is not None:
        if isinstance(tasks, str | bytes):
            # list("noop") would be four one-letter task names.
            raise TypeError(f"drain: tasks must be a list of task names, got {tasks!r}")
        options["tasks"] = list(tasks)
    with engine.connect() as connection:
        before = _snapshot(queue, connection)
    stats = queue.worker(_worker_factory(session_factory), **options).run(burst=True)
    with engine.connect() as connection:
        ran = _ran_since(queue, connection, before)
    return DrainResult(tuple(ran), stats)


# -- assert_enqueued --------------------------------------------------------------------------


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


@dataclass
class Eager:
    """Runs the due jobs after each commit of a session factory's sessions.

    Made by :func:`eager`; its :attr:`runs` keep every drain's result.
    """

    queue: Queue
    session_factory: sessionmaker[Session]
    settings: dict[str, Any]
    #: The result of each drain, one per commit that left jobs due.
    runs: list[DrainResult] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _draining: bool = field(default=False, repr=False)

    @property
    def jobs(self) -> list[RanJob]:
        """Every job that ran eagerly so far, in the order the drains ran them."""
        return [job for run in self.runs for job in run.jobs]

    @property
    def failed(self) -> list[RanJob]:
        """The jobs with a failed attempt."""
        return [job for job in self.jobs if not job.ok]

    def raise_failures(self) -> None:
        """Raise ``AssertionError`` naming each job whose attempt failed, with its error."""
        __tracebackhide__ = True  # pytest: show the test's line, not this helper's
        if self.failed:
            raise AssertionError(_describe_failures(self.failed))

    def after_commit(self, session: Session) -> None:
        """The ``after_commit`` hook: drain if the commit left jobs due.

        The session itself can run no SQL at this point, so the check and the drain use
        connections of their own. A handler's own ``ctx.session`` commit, inside the drain,
        does not start another one: the running burst worker picks up what it enqueues.
        """
        with self._lock:
            if self._draining:
                return
            self._draining = True
        try:
            if self._anything_due():
                self.runs.append(drain(self.queue, self.session_factory, **self.settings))
        finally:
            with self._lock:
                self._draining = False

    def _anything_due(self) -> bool:
        executions = self.queue.tables.executions
        due = exists().where(
            and_(
                executions.c.state == ExecutionState.PENDING,
                executions.c.execute_at <= func.now(),
            )
        )
        with _engine_of(self.session_factory).connect() as connection:
            return bool(connection.scalar(select(due)))


@contextlib.contextmanager
def eager(
    queue: Queue,
    session_factory: sessionmaker[Session],
    *,
    raise_failures: bool = True,
    **settings: Any,
) -> Iterator[Eager]:
    """Inside the block, each commit of ``session_factory``'s sessions runs the due jobs.

    After a session made by ``session_factory`` commits, every job that is due runs at
    once, in this thread, through :func:`drain` (a burst worker), before ``commit()``
    returns. A rolled-back transaction runs nothing: its jobs never existed. The hook is
    removed when the block ends, so it cannot leak into other tests.

    A failing handler cannot raise out of ``commit()``: SQLAlchemy forbids it (the
    session would be left unusable). Its failure is recorded instead, and the block
    raises ``AssertionError`` listing the failed jobs when it ends, unless
    ``raise_failures=False`` (then inspect :attr:`Eager.failed`).

    Args:
        queue: the application's queue.
        session_factory: the ``sessionmaker`` the code under test uses, bound to an
            engine or a connection (see :func:`drain`); only its sessions trigger a
            drain, and handlers get their ``ctx.session`` from it.
        raise_failures: fail at the end of the block if any job's attempt failed.
        settings: worker settings for the drains (see :func:`drain`).

    Yields:
        The :class:`Eager` hook, whose ``runs`` and ``jobs`` show what ran.
    """
    __tracebackhide__ = True  # pytest: show the test's line, not this helper's
    _engine_of(session_factory)  # a clear error now rather than at the first commit
    hook = Eager(queue, session_factory, dict(settings))
    event.listen(session_factory, "after_commit", hook.after_commit)
    try:
        yield hook
    finally:
        event.remove(session_factory, "after_commit", hook.after_commit)
    if raise_failures:
        hook.raise_failures()
