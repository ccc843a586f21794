"""Helpers for testing an application that uses sqla_queue.

* :func:`drain` runs every due job inline, with a burst worker, and reports what ran, read
  back from the jobs table, in the order it ran (a workflow's nodes with their names);
* :func:`assert_enqueued` checks that a block of code enqueued the jobs it should have;
* :func:`eager` runs the due jobs right after each commit of a session factory's sessions,
  for unit tests that want "enqueue" to mean "run now";
* :func:`fire_timers` and :func:`signal` move a suspended durable job on without waiting:
  its sleep ends now, or its signal arrives (``drain(..., fire_timers=True)`` fires the
  timers itself, until no job is left asleep).

They work with any database that holds the queue's tables; the pytest plugin
(:mod:`sqla_queue.testing.pytest_plugin`) adds fixtures that provide one per test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine, and_, event, exists, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue._binds import engine_with_options
from sqla_queue.instrumentation import check_observers
from sqla_queue.models.tables import ExecutionState, JobStatus
from sqla_queue.testing.enqueued import EnqueuedJob, EnqueuedJobs, assert_enqueued
from sqla_queue.testing.run_order import RunOrder

if TYPE_CHECKING:
    from sqla_queue.durable import Signalled, SuspendedJob
    from sqla_queue.queue import Queue
    from sqla_queue.worker.base import RunStats
    from sqla_queue.workflows.results import WorkflowHandle

__all__ = [
    "DrainResult",
    "Eager",
    "EnqueuedJob",
    "EnqueuedJobs",
    "RanJob",
    "assert_enqueued",
    "drain",
    "eager",
    "fire_timers",
    "signal",
]

#: How many times ``drain(fire_timers=True)`` fires the timers before it gives up: a
#: handler that sleeps in an endless loop would otherwise drain for ever.
MAX_TIMER_ROUNDS = 100


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
    #: The workflow the job is a node of, and its node name (``None`` for a plain job).
    workflow_id: int | None = None
    node: str | None = None

    @property
    def ok(self) -> bool:
        """Whether no attempt of this drain failed."""
        return self.error is None


def _nodes_of(jobs: Sequence[RanJob], workflow: WorkflowHandle | int) -> dict[str, RanJob]:
    """``jobs``' nodes of ``workflow`` (a handle or its id) by node name, in ``jobs``' order."""
    wanted = workflow if isinstance(workflow, int) else workflow.id
    nodes: dict[str, RanJob] = {}
    for job in jobs:
        if job.workflow_id == wanted and job.node is not None:
            # A node that ran again (a retry in a later drain) takes its latest place.
            nodes.pop(job.node, None)
            nodes[job.node] = job
    return nodes


@dataclass(frozen=True)
class DrainResult:
    """What one :func:`drain` ran, in the order it ran, and the burst worker's counts."""

    jobs: tuple[RanJob, ...]
    stats: RunStats
    #: The durable jobs left suspended after the drain, soonest due first: what each
    #: waits for (``sleep``, ``signal:<name>``, ...), and until when.
    suspended: tuple[SuspendedJob, ...] = ()

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

    def workflow(self, workflow: WorkflowHandle | int) -> dict[str, RanJob]:
        """The nodes of ``workflow`` (its handle or id) that ran, by node name, in the
        order they ran; nodes an expansion added are included, under their own names.

        A node that never ran (cancelled by a failed parent, held, not due yet) is
        absent: ``queue.workflow_status`` shows every node's state.
        """
        return _nodes_of(self.jobs, workflow)

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
    jobs, nodes = queue.tables.jobs, queue.tables.workflow_nodes
    watched = list(before.open_jobs)
    rows = connection.execute(
        select(
            jobs.c.id,
            jobs.c.task,
            jobs.c.status,
            jobs.c.attempts,
            jobs.c.result,
            jobs.c.errors,
            nodes.c.workflow_id,
            nodes.c.name.label("node"),
        )
        .select_from(jobs.outerjoin(nodes, nodes.c.job_id == jobs.c.id))
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
        ran.append(
            RanJob(
                row.id,
                row.task,
                row.status,
                row.attempts,
                row.result,
                error,
                workflow_id=row.workflow_id,
                node=row.node,
            )
        )
    return ran


def drain(
    queue: Queue,
    session_factory: sessionmaker[Session],
    *,
    tasks: Sequence[str] | None = None,
    fire_timers: bool = False,
    **settings: Any,
) -> DrainResult:
    """Run every job that is due now, in this process, and return what ran.

    A burst worker (``queue.worker(session_factory, ...).run(burst=True)``) runs the jobs,
    so they go through the same claim, handlers, retries and acknowledgements as in
    production, including jobs that the handlers enqueue and that are due at once. A
    workflow runs to its end: each node its parents release, and each node an expansion
    adds, is claimed by the same run. Jobs scheduled for later (a ``delay``, a retry's
    backoff) stay queued. What ran is read back from the jobs table afterwards: every job
    with more attempts than before the drain.

    Args:
        queue: the application's queue.
        session_factory: a ``sessionmaker`` bound to an engine; handlers with
            ``pass_context=True`` get their ``ctx.session`` from it. One bound to a
            ``Connection`` works too: the jobs run on new connections of its engine, with
            the connection's execution options (a tenant's ``schema_translate_map``), and
            handlers' sessions are bound to those. Jobs the connection has not committed
            are not seen: commit before draining.
        tasks: only run these tasks (default: every registered task).
        fire_timers: drive durable jobs through their waits with a deadline: once
            nothing is due, end every such wait now (a sleep ends, a wait with a
            ``timeout`` times out) and run again, until no suspended job has a deadline.
            Jobs that wait without one (a signal, a row, an operator) stay suspended:
            send the signal (:func:`signal`) and drain again.
        settings: other :class:`~sqla_queue.WorkerSettings`. The defaults here differ from
            a production worker's: ``concurrency=1`` (jobs run one after another, in
            claim order), ``listen=False`` and ``install_signal_handlers=False``.

    Returns:
        The jobs that ran, in the order their last attempt of the drain ended (as the
        worker reported them), with their status afterwards and, for a workflow's node,
        its workflow and node name; the worker's :class:`~sqla_queue.RunStats` (summed
        over the runs with ``fire_timers``); and the durable jobs left suspended. Call
        :meth:`DrainResult.raise_failures` to fail a test on any failed attempt.
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
    order = RunOrder()
    options["observers"] = (*check_observers(options.get("observers", ())), order)
    with engine.connect() as connection:
        before = _snapshot(queue, connection)
    factory = _worker_factory(session_factory)
    stats = queue.worker(factory, **options).run(burst=True)
    rounds = 0
    while fire_timers and (timed := _timed_jobs(queue, engine)):
        rounds += 1
        if rounds > MAX_TIMER_ROUNDS:
            raise AssertionError(
                f"drain(fire_timers=True): jobs {timed} were still asleep after "
                f"{MAX_TIMER_ROUNDS} rounds of fired timers; does a handler sleep in an "
                "endless loop?"
            )
        with engine.begin() as connection:
            queue.fire_timers(connection, timed)
        stats = _added(stats, queue.worker(factory, **options).run(burst=True))
    with engine.connect() as connection:
        ran = _ran_since(queue, connection, before)
        suspended = _suspended(queue, connection)
    return DrainResult(tuple(order.sort(ran)), stats, tuple(suspended))


def _suspended(queue: Queue, connection: Connection) -> list[SuspendedJob]:
    return cast("list[SuspendedJob]", queue.suspended_jobs(connection, limit=_SUSPENDED_SHOWN))


#: The most suspended jobs a drain reports (a test holds few).
_SUSPENDED_SHOWN = 1000


def _timed_jobs(queue: Queue, engine: Engine) -> list[int]:
    """The suspended jobs with a due time: asleep, or waiting with a deadline. A wait
    without one (a signal, a row, an operator) has no timer to fire."""
    with engine.connect() as connection:
        return [job.id for job in _suspended(queue, connection) if job.until is not None]


def _added(first: RunStats, second: RunStats) -> RunStats:
    """The counts of two runs, field by field."""
    sums = {
        f.name: getattr(first, f.name) + getattr(second, f.name) for f in dataclasses.fields(first)
    }
    return type(first)(**sums)


def fire_timers(
    queue: Queue, session_factory: sessionmaker[Session], job_ids: Sequence[int] | None = None
) -> list[int]:
    """End the sleeps and wait deadlines of suspended durable jobs now, and commit.

    :meth:`Queue.fire_timers <sqla_queue.Queue.fire_timers>` in a transaction of its own,
    on a session of ``session_factory`` (so eager mode runs the woken jobs at its commit).
    A sleeping job is due at once; a wait with a deadline times out when the job runs
    (:class:`~sqla_queue.errors.SignalTimeoutError`). ``job_ids``: only these jobs
    (``None``: every suspended job). Returns the ids of the jobs it woke; run them with
    :func:`drain`.
    """
    ids = None if job_ids is None else list(job_ids)
    with session_factory.begin() as session:
        return cast("list[int]", queue.fire_timers(session, ids))


def signal(
    queue: Queue,
    session_factory: sessionmaker[Session],
    job_id: int,
    name: str,
    payload: Any = None,
) -> Signalled:
    """Send signal ``name`` with ``payload`` to job ``job_id``, and commit.

    :meth:`Queue.signal <sqla_queue.Queue.signal>` in a transaction of its own, on a
    session of ``session_factory`` (so eager mode runs the woken job at its commit). The
    job, if it waits for the signal, is due at once: run it with :func:`drain`.
    """
    with session_factory.begin() as session:
        return cast("Signalled", queue.signal(session, job_id, name, payload))


# -- assert_enqueued --------------------------------------------------------------------------


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

    def workflow(self, workflow: WorkflowHandle | int) -> dict[str, RanJob]:
        """The nodes of ``workflow`` (its handle or id) that ran eagerly, by node name, in
        the order they ran (see :meth:`DrainResult.workflow`)."""
        return _nodes_of(self.jobs, workflow)

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
