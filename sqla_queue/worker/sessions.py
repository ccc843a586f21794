"""The handler's own sessions: whether they can be transactional, how a transactional
task's completion joins them, and closing them after the run.

A ``transactional=True`` task commits its handler's writes with its job's completion, in
the handler's ``ctx.session``; :class:`InTransaction` holds the worker's statements for
that. Every session a handler opened through its context is closed when its run ends.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import PendingRollbackError
from sqlalchemy.ext.asyncio import AsyncSession

from sqla_queue._sqlstate import sqlstate_of
from sqla_queue.conversation import Flow
from sqla_queue.instrumentation import job_log_fields
from sqla_queue.logic.outcomes import ClaimedJob, Outcome, OutcomeKind, outcomes_json
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.decider.nodes import node_completion_flow
from sqla_queue.worker.failures import database_message
from sqla_queue.worker.plan import WorkerPlan

__all__ = [
    "IN_FAILED_TRANSACTION",
    "AbortedTransactionError",
    "InTransaction",
    "aborted_or",
    "check_transactional_binds",
    "close_abandoned_sessions",
    "close_async_sessions",
    "close_sync_sessions",
    "roll_back_sync",
]

log = logging.getLogger("sqla_queue.worker")

#: SQLSTATE of a statement sent in a transaction that an earlier error aborted.
IN_FAILED_TRANSACTION = "25P02"


class AbortedTransactionError(RuntimeError):
    """A transactional handler returned from a transaction that a database error it
    caught had aborted: nothing of it can commit, so the attempt fails."""


def check_transactional_binds(plan: WorkerPlan, session_factory: Any) -> None:
    """Refuse transactional tasks when the handlers' sessions would autocommit.

    A ``transactional=True`` task commits its handler's writes with its job's completion,
    or rolls both back. On an engine in ``AUTOCOMMIT`` every statement commits on its
    own, so a failed attempt's writes would stay.

    Raises:
        ValueError: naming the tasks and the fix, if ``session_factory``'s bind (engine,
            connection, or their async forms) is in ``AUTOCOMMIT`` by its
            ``create_engine(isolation_level=...)`` or its execution options.
    """
    how = _autocommit_by(getattr(session_factory, "kw", {}).get("bind"))
    if how is None:
        return
    tasks = sorted(name for name, task in plan.tasks.items() if task.transactional)
    if not tasks:
        return
    raise ValueError(
        f"transactional task(s) {', '.join(tasks)} cannot run on this session factory: its "
        f"engine is in AUTOCOMMIT ({how}), so each statement of a handler would commit on "
        "its own and a failed attempt's writes would stay. Give the worker a sessionmaker "
        "bound to an engine that is not in AUTOCOMMIT (create_engine(url), or "
        "engine.execution_options(isolation_level='READ COMMITTED')), or register the "
        "task(s) without transactional=True"
    )


def _autocommit_by(bind: Any) -> str | None:
    """How ``bind`` is put in AUTOCOMMIT, or None when it is not."""
    sync = getattr(bind, "sync_engine", None) or getattr(bind, "sync_connection", None) or bind
    if sync is None:
        return None
    options = sync.get_execution_options() if hasattr(sync, "get_execution_options") else {}
    if _is_autocommit(options.get("isolation_level")):
        return "execution_options(isolation_level='AUTOCOMMIT')"
    # Where create_engine(isolation_level=...) keeps the level it sets on each connection.
    dialect = getattr(sync, "dialect", None)
    if _is_autocommit(getattr(dialect, "_on_connect_isolation_level", None)):
        return "create_engine(..., isolation_level='AUTOCOMMIT')"
    return None


def _is_autocommit(level: Any) -> bool:
    return isinstance(level, str) and level.strip().upper() == "AUTOCOMMIT"


@dataclass(frozen=True)
class InTransaction:
    """How a transactional task's completion joins the handler's own transaction.

    The statements are the worker's: its planner guard and its fenced completion, sent
    for one outcome through the handler's ``ctx.session``. A completion the fence refuses
    (the execution was reclaimed) rolls the whole transaction back, the handler's writes
    included.
    """

    guard: Any
    statement: Any
    worker_id: uuid.UUID
    #: The plan's workflows and tables: a node's completion releases its dependents too.
    workflows: Any = None
    tables: Any = None

    #: The outcomes committed with the handler's writes: those of a handler that returned
    #: (a success, or a ``Reschedule`` it returned). Any other outcome rolls them back.
    KINDS = (OutcomeKind.SUCCEEDED, OutcomeKind.RESCHEDULE)

    def steps(self, outcome: Outcome) -> list[tuple[Any, dict[str, Any]]]:
        """The two statements to run in the handler's transaction, with parameters."""
        params = {"outcomes": outcomes_json([outcome]), "worker": self.worker_id}
        return [(self.guard, {}), (self.statement, params)]

    def after(self, job: ClaimedJob, context: JobContext[Any]) -> Flow[Any] | None:
        """What a node's applied completion does next in the handler's transaction: write
        its expansion, release its dependents. None for a job that is not a node."""
        if not job.workflow or self.workflows is None:
            return None
        expansion = context.expansion
        expansions = {job.id: expansion} if expansion is not None else {}
        return node_completion_flow(self.workflows, self.tables, [job.id], expansions)

    @staticmethod
    def applied(rows: Sequence[Any], job_id: int) -> bool:
        """Whether the completion's rows say it applied (commit) or was fenced (roll back)."""
        return any(row[0] == job_id for row in rows)


def aborted_or(exc: Exception, caught: BaseException | None) -> BaseException:
    """Why a transactional handler's completion failed: ``exc``, or, when the handler had
    caught a database error (``caught``) that left its transaction aborted, that error.

    The completion's own statements then fail only because the transaction is aborted;
    naming them (the worker's planner guard) would point away from the handler.
    """
    aborted = isinstance(exc, PendingRollbackError) or sqlstate_of(exc) == IN_FAILED_TRANSACTION
    if caught is None or not aborted:
        return exc
    error = AbortedTransactionError(
        "the handler's transaction was aborted by an error it caught: "
        f"{database_message(caught)}; nothing it wrote in that transaction was committed. "
        "After catching a database error on ctx.session, roll the session back (or run the "
        "statement that may fail in session.begin_nested()), or let the error propagate"
    )
    error.__cause__ = caught
    return error


def roll_back_sync(session: Any, job: ClaimedJob) -> None:
    """Roll ``session`` back after its completion failed; a failure here is only logged."""
    try:
        session.rollback()
    except Exception:
        log.debug(
            "rolling back job %s's session failed",
            job.id,
            exc_info=True,
            extra=job_log_fields(job),
        )


def close_sync_sessions(ctx: JobContext[Any] | None, job: ClaimedJob) -> None:
    """Close the sessions a sync run opened through ``ctx`` (``job``'s context)."""
    for session in ctx._take_sessions() if ctx is not None else ():
        try:
            if isinstance(session, AsyncSession):
                # A def handler of an async worker: it could not await a statement, so its
                # session holds no connection, and its sync twin closes it without I/O
                # (AsyncSession.close would be a coroutine that nothing awaits).
                session.sync_session.close()
            else:
                session.close()
        except Exception:
            log.exception(
                "closing the handler's session of job %s failed",
                job.id,
                extra=job_log_fields(job),
            )


def close_abandoned_sessions(ctx: JobContext[Any] | None) -> None:
    """Close what an abandoned run's sessions let close without awaiting: a ``Session``.

    An ``AsyncSession`` cannot be closed from a coroutine that is being closed; its
    connection goes back to its pool when it is garbage-collected.
    """
    for session in ctx._take_sessions() if ctx is not None else ():
        if isinstance(session, AsyncSession):
            continue
        try:
            session.close()
        except Exception:
            log.debug("closing an abandoned handler's session failed", exc_info=True)


async def close_async_sessions(ctx: JobContext[Any] | None, job: ClaimedJob) -> None:
    """Close the sessions an async run opened through ``ctx``, awaiting an ``AsyncSession``."""
    for session in ctx._take_sessions() if ctx is not None else ():
        try:
            result = session.close()
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            log.exception(
                "closing the handler's session of job %s failed",
                job.id,
                extra=job_log_fields(job),
            )
