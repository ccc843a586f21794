"""A durable job's own statements: its checkpoints, and its suspension (schema version 7).

Every statement here is sent by the job's handler through its own session (``ctx.session``),
in the transaction that holds the application's writes of the step, so that the
checkpoint and the writes commit together or not at all.

The fence is the same everywhere: the job's execution must still be ``running`` under this
attempt and this worker. A checkpoint takes the execution's row ``FOR SHARE`` while it
writes, so a reclaim (or a cancel) waits for the step's transaction instead of passing it;
``job_steps``' primary key then makes sure that a step is committed once, whichever
attempt gets there.

A wait locks the execution ``FOR UPDATE`` first, in a statement of its own, and tries the
job's signal lock without waiting; only then does it read whether what it waits for has come
(a signal, a row's state). A sender holds that lock, shared, until it commits, so a wait
that got it sees every signal sent before and is seen by every signal sent after; one that
did not suspends with a recheck soon (see :mod:`sqla_queue.statements.signals`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NotRequired, TypedDict

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    not_,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import QueueTables, StepKind
from sqla_queue.statements._common import SUSPENDED, seconds, still_running
from sqla_queue.statements.signals import signal_lock_key

__all__ = [
    "FOREVER_SQL",
    "NO_DEADLINE_YEAR",
    "CheckpointParams",
    "CursorParams",
    "FenceParams",
    "SuspendParams",
    "WaitParams",
    "advance_cursor_statement",
    "checkpoint_statement",
    "deadline_of",
    "execution_state_statement",
    "lock_execution_statement",
    "record_met_statement",
    "record_wait_statement",
    "restart_wait_statement",
    "steps_statement",
    "suspend_statement",
]

#: The year of the due time of a wait without a deadline: far enough never to come, and
#: still a date that every driver can read (``infinity`` is not a Python ``datetime``). A
#: due time in that year reads back as "no deadline" (see :func:`deadline_of`).
NO_DEADLINE_YEAR = 9999
FOREVER_SQL = f"timestamptz '{NO_DEADLINE_YEAR}-12-31 00:00:00+00'"


def deadline_of(due: dt.datetime) -> dt.datetime | None:
    """A suspended execution's due time as its deadline: ``None`` for no deadline."""
    return None if due.year >= NO_DEADLINE_YEAR else due


class FenceParams(TypedDict):
    """The execution a handler holds: its job, its attempt and its worker."""

    job: int
    held_attempt: int
    worker: uuid.UUID


class CheckpointParams(FenceParams):
    """A step's checkpoint: its name, kind and version, its result and compensation (JSON
    text, or ``None``)."""

    step: str
    step_kind: str
    step_version: int
    step_result: str | None
    step_compensate: str | None


class CursorParams(FenceParams):
    """A cursor's move: its name and version, the position it moved from and to (JSON)."""

    step: str
    step_kind: str
    step_version: int
    step_result: str
    expected: str


class WaitParams(FenceParams):
    """A wait's record: its name, and its deadline in seconds from now (``None``: none)."""

    step: str
    step_kind: str
    step_version: int
    timeout: float | None


class SuspendParams(FenceParams):
    """A suspension: what the job waits for, and the name of its recorded wait step
    (whose deadline is the due time; ``None``: no deadline)."""

    waits_for: str
    step: str | None
    #: Seconds until the job runs again to ask again, if sooner than the deadline (a
    #: signal's sender was in flight); leave it out otherwise.
    recheck: NotRequired[float | None]


def steps_statement(tables: QueueTables) -> Select[Any]:
    """The committed checkpoints of job ``job``, in commit order.

    Returns ``(name, kind, version, result, elapsed)``; ``elapsed`` says, by the database's
    clock, whether a wait's deadline has passed (``None`` for the other kinds, and for a
    wait without a deadline).
    """
    steps = tables.job_steps
    until = cast(steps.c.result["until"].astext, DateTime(timezone=True))
    elapsed = case(
        (steps.c.kind == StepKind.WAIT, until <= func.now()),
        else_=null(),
    )
    return (
        select(
            steps.c.name,
            steps.c.kind,
            steps.c.version,
            steps.c.result,
            elapsed.label("elapsed"),
        )
        .where(steps.c.job_id == bindparam("job", type_=BigInteger))
        .order_by(steps.c.seq)
    )


def _fence(tables: QueueTables) -> ColumnElement[bool]:
    ex = tables.executions
    return and_(
        ex.c.id == bindparam("job", type_=BigInteger),
        ex.c.attempt == bindparam("held_attempt", type_=Integer),
        still_running(ex.c.state),
        ex.c.worker_id == bindparam("worker", type_=Uuid),
    )


def _fenced_source(tables: QueueTables, result: ColumnElement[Any]) -> Select[Any]:
    """The row a checkpoint inserts, read from the fenced execution, which it keeps
    ``FOR SHARE`` until the step commits. A job someone cancelled commits no more steps."""
    ex = tables.executions
    return (
        select(
            ex.c.id,
            bindparam("step", type_=Text),
            bindparam("step_kind", type_=Text),
            bindparam("step_version", type_=Integer),
            ex.c.attempt,
            result,
        )
        .where(_fence(tables), not_(ex.c.cancel_requested))
        .with_for_update(of=ex, read=True)
    )


_INSERTED = ("job_id", "name", "kind", "version", "attempt", "result")


def checkpoint_statement(tables: QueueTables) -> ReturningInsert[Any]:
    """Commit a step's result with the step's writes: one statement, fenced.

    Parameters: :class:`CheckpointParams`. Returns the job's id if the step was written;
    no row if the execution is no longer this attempt's, was cancelled, or the step was
    committed already (the caller then rolls the step's writes back).
    """
    steps = tables.job_steps
    source = _fenced_source(tables, cast(bindparam("step_result", type_=Text), JSONB))
    source = source.add_columns(cast(bindparam("step_compensate", type_=Text), JSONB))
    return (
        insert(steps)
        .from_select([*_INSERTED, "compensate"], source)
        .on_conflict_do_nothing(index_elements=[steps.c.job_id, steps.c.name])
        .returning(steps.c.job_id)
    )


def advance_cursor_statement(tables: QueueTables) -> ReturningInsert[Any]:
    """Move a cursor with its batch's writes: one statement, fenced.

    Parameters: :class:`CursorParams` (``kind`` is ``cursor``). The stored position moves
    from ``expected`` to ``result`` only if it still is ``expected``: two attempts that
    process the same batch cannot both commit it. Returns the job's id if it moved.
    """
    steps = tables.job_steps
    source = _fenced_source(tables, cast(bindparam("step_result", type_=Text), JSONB))
    stmt = insert(steps).from_select(list(_INSERTED), source)
    return stmt.on_conflict_do_update(
        index_elements=[steps.c.job_id, steps.c.name],
        set_={
            "result": stmt.excluded.result,
            "attempt": stmt.excluded.attempt,
            "committed_at": func.now(),
        },
        where=steps.c.result == cast(bindparam("expected", type_=Text), JSONB),
    ).returning(steps.c.job_id)


def lock_execution_statement(tables: QueueTables) -> Select[Any]:
    """Lock the execution this attempt holds ``FOR UPDATE``, before a wait reads whether
    it may go on, and try the job's signal lock without waiting.

    Parameters: :class:`FenceParams`. Returns ``(id, cancel_requested, no_sender)``, or no
    row if the execution is no longer this attempt's. ``no_sender`` is false while a
    sender's transaction holds the signal lock: a signal it sends may not be visible yet.
    """
    ex = tables.executions
    free = func.pg_try_advisory_xact_lock(signal_lock_key(tables, ex.c.id))
    return (
        select(ex.c.id, ex.c.cancel_requested, free.label("no_sender"))
        .where(_fence(tables))
        .with_for_update(of=ex)
    )


def record_wait_statement(tables: QueueTables) -> ReturningInsert[Any]:
    """Record the deadline of a wait that begins (once: a replay keeps the first one).

    Parameters: :class:`WaitParams` (``kind`` is ``wait``). The deadline is the database's
    ``now()`` plus ``timeout`` seconds (``{"until": null}`` without one).
    """
    steps = tables.job_steps
    # NULL without a timeout: the sum is NULL, and so is the deadline.
    until = func.now() + seconds(cast(bindparam("timeout", type_=Double), Double))
    source = _fenced_source(tables, func.jsonb_build_object(literal_column("'until'"), until))
    return (
        insert(steps)
        .from_select(list(_INSERTED), source)
        .on_conflict_do_nothing(index_elements=[steps.c.job_id, steps.c.name])
        .returning(steps.c.job_id)
    )


def restart_wait_statement(tables: QueueTables) -> ReturningInsert[Any]:
    """Begin a wait again, with a fresh deadline: a retry of the job after an attempt
    whose wait timed out (the timeout is the attempt's, not the job's).

    Parameters: :class:`WaitParams`. As :func:`record_wait_statement`, but the recorded
    wait is replaced: its deadline is ``timeout`` seconds from now, and its attempt this
    one. Returns the job's id if it was written.
    """
    steps = tables.job_steps
    until = func.now() + seconds(cast(bindparam("timeout", type_=Double), Double))
    source = _fenced_source(tables, func.jsonb_build_object(literal_column("'until'"), until))
    stmt = insert(steps).from_select(list(_INSERTED), source)
    return stmt.on_conflict_do_update(
        index_elements=[steps.c.job_id, steps.c.name],
        set_={
            "result": stmt.excluded.result,
            "attempt": stmt.excluded.attempt,
            "committed_at": func.now(),
        },
    ).returning(steps.c.job_id)


def record_met_statement(tables: QueueTables) -> ReturningInsert[Any]:
    """Record how a wait ended (``step_result``: ``{"met": true, "value": ...}``, or
    ``{"timed_out": true}``), so that a replay of the job goes the same way without asking
    again: a row that met a condition may have changed since, a signal may have come after
    the deadline. Parameters: :class:`CheckpointParams` (no compensation). Returns the
    job's id if it was written."""
    steps = tables.job_steps
    source = _fenced_source(tables, cast(bindparam("step_result", type_=Text), JSONB))
    stmt = insert(steps).from_select(list(_INSERTED), source)
    return stmt.on_conflict_do_update(
        index_elements=[steps.c.job_id, steps.c.name],
        set_={"result": stmt.excluded.result, "committed_at": func.now()},
    ).returning(steps.c.job_id)


def suspend_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Suspend the execution: out of every claim index, with no worker and no seat.

    Parameters: :class:`SuspendParams`. It becomes ``suspended``, waiting for ``wait``
    until the deadline recorded by wait step ``step`` (forever without one), or until
    ``recheck`` seconds from now if that is sooner (a wait that could not tell yet whether
    what it waits for has come: the job runs again then and asks again). The attempt the
    claim counted is given back: a wait is not an attempt. Returns ``(id, execute_at)`` if
    it was suspended.
    """
    ex = tables.executions
    steps = tables.job_steps
    recorded = (
        select(cast(steps.c.result["until"].astext, DateTime(timezone=True)))
        .where(
            steps.c.job_id == ex.c.id,
            steps.c.name == bindparam("step", type_=Text),
        )
        .scalar_subquery()
    )
    return (
        update(ex)
        .where(_fence(tables))
        .values(
            state=SUSPENDED,
            wait=bindparam("waits_for", type_=Text),
            # LEAST ignores a NULL: without a recheck, the deadline alone.
            execute_at=func.least(
                func.coalesce(recorded, literal_column(FOREVER_SQL)),
                func.now() + seconds(bindparam("recheck", None, type_=Double)),
            ),
            attempt=ex.c.attempt - 1,
            worker_id=null(),
            alive_at=null(),
            slot=null(),
        )
        .returning(ex.c.id, ex.c.execute_at)
    )


def execution_state_statement(tables: QueueTables) -> Select[Any]:
    """Why a fenced statement found nothing: the execution of ``job`` as it is now.

    Returns ``(state, attempt, worker_id, cancel_requested)``, or no row if the job has no
    execution any more.
    """
    ex = tables.executions
    return select(ex.c.state, ex.c.attempt, ex.c.worker_id, ex.c.cancel_requested).where(
        ex.c.id == bindparam("job", type_=BigInteger)
    )
