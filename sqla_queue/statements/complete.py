"""The completion: one fenced statement per flushed batch of outcomes.

Parameters: ``outcomes`` (JSON text: a list of :meth:`Outcome.as_row` objects) and
``worker``. Each outcome only applies when the execution is still running under this
worker *and* this attempt; a worker whose job was reclaimed and claimed again writes
nothing. The statement returns the ids it did apply, so the caller can tell which were
fenced off.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    CompoundSelect,
    DateTime,
    Double,
    Integer,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from sqla_queue.logic.outcomes import OutcomeKind
from sqla_queue.models.tables import HistoryLayout, QueueTables
from sqla_queue.statements._common import (
    CANCELLED,
    DONE,
    FAILED,
    PENDING,
    QUEUED,
    SUCCEEDED,
    has_key,
    notify_waiters,
    seconds,
    state_literal,
    still_running,
)

__all__ = ["OUTCOME_COLUMNS", "CompleteParams", "complete_statement"]


class CompleteParams(TypedDict):
    """Parameters of the completion."""

    #: JSON array of :class:`~sqla_queue.logic.outcomes.OutcomeRow` objects.
    outcomes: str
    worker: uuid.UUID


#: The columns read from each ``outcomes`` element, with their SQL types: the keys of
#: :class:`~sqla_queue.logic.outcomes.OutcomeRow`, in order.
OUTCOME_COLUMNS = (
    column("id", BigInteger),
    column("attempt", Integer),
    column("kind", Text),
    column("result", JSONB),
    column("error", JSONB),
    column("execute_at", DateTime(timezone=True)),
    column("delay", Double),
)


def _kinds(kinds: tuple[OutcomeKind, ...]) -> list[object]:
    return [state_literal(k.value) for k in kinds]


def complete_statement(tables: QueueTables) -> CompoundSelect[int]:
    """Build the completion statement for ``tables``.

    * succeeded / failed: delete the execution (mark a keyed one ``done``, for the
      worker's next statement to delete), write the job's final status, result, error and
      ``finished_at``;
    * retry: execution back to pending at the retry time, the attempt kept (it counted),
      the error appended to the job's history;
    * reschedule / release: back to pending with the attempt given back.

    On a queue with ``history="none"`` a succeeded job's row is deleted instead of
    recorded, in the same statement and behind the same fence (see
    :func:`_erase_succeeded` for the rows it keeps).
    """
    ex = tables.executions
    jobs = tables.jobs
    rows = (
        func.jsonb_to_recordset(cast(bindparam("outcomes", type_=Text), JSONB))
        .table_valued(*OUTCOME_COLUMNS)
        .render_derived(name="r", with_types=True)
    )
    # Parsed once: inlined, the JSON would be re-read for every row it is joined with.
    outcome = select(rows).cte("o").prefix_with("MATERIALIZED")
    worker = bindparam("worker", type_=Uuid)
    # Both halves are needed, whatever the attempt counter does. Attempts go back (a
    # reschedule gives one back, a requeue starts again at 0), so another worker can hold
    # the row at the very attempt number a stale worker remembers: the worker tells them
    # apart. A worker can claim again a job it lost, at a later attempt: the attempt tells
    # them apart. One worker never holds two live attempts of a job at the same number: a
    # job it claims again replaces its earlier handler, whose outcome is dropped
    # (worker.decider.running), and its buffered outcomes are written before, or with,
    # its next claim. tests/integration/test_fences.py holds each case.
    fence = and_(
        ex.c.id == outcome.c.id,
        ex.c.attempt == outcome.c.attempt,
        ex.c.worker_id == worker,
        still_running(ex.c.state),
    )
    # A cancel request (schema version 4) ends the job whatever else the attempt asked
    # for, unless it succeeded: its work is done, and saying "cancelled" would hide that.
    # The branches split by kind only, never by the flag: a cancel that commits while this
    # statement waits for the row is read from the row's newest version, which PostgreSQL
    # re-reads for the row a branch already chose (a branch chosen by the flag as the
    # snapshot saw it would drop the outcome). So an attempt of a cancelled job that asked
    # to go back to pending is parked 'done' instead (the next sweep deletes it).
    final = outcome.c.kind.in_(_kinds(OutcomeKind.final()))
    finished = (
        delete(ex)
        .where(fence, final, ex.c.queue_id.is_(None))
        .returning(ex.c.id, ex.c.cancel_requested.label("cancel"), ex.c.workflow)
        .cte("finished")
    )
    # A finished keyed execution is marked 'done', not deleted: an enqueue in flight may
    # hold it (KEY SHARE) as the predecessor of its key's new waiting job, and a DELETE
    # would wait for that business transaction. The worker's next statement deletes the
    # done rows nobody holds (keys.clear_done_statement), then promotes the keys' next
    # jobs. Its seat is given up here, so a done row never holds capacity.
    parked = (
        update(ex)
        .where(fence, final, has_key(ex.c.queue_id))
        .values(state=DONE, worker_id=null(), alive_at=null(), slot=null())
        .returning(ex.c.id, ex.c.cancel_requested.label("cancel"), ex.c.workflow)
        .cte("parked")
    )
    next_run = func.coalesce(
        outcome.c.execute_at,
        func.now() + seconds(func.coalesce(outcome.c.delay, 0.0)),
    )
    requeued = (
        update(ex)
        .where(
            fence,
            outcome.c.kind.in_(_kinds(OutcomeKind.back_to_pending())),
        )
        .values(
            state=case((ex.c.cancel_requested, DONE), else_=PENDING),
            worker_id=null(),
            alive_at=null(),
            # Back to pending for a reason of its own: its next run is a fresh claim that
            # takes a seat again (only a reclaim keeps the seat).
            slot=null(),
            execute_at=next_run,
            attempt=case(
                (outcome.c.kind == state_literal(OutcomeKind.RETRY.value), ex.c.attempt),
                else_=ex.c.attempt - 1,
            ),
        )
        .returning(ex.c.id, ex.c.cancel_requested.label("cancel"), ex.c.workflow)
        .cte("requeued")
    )
    applied = union_all(
        select(finished.c.id, finished.c.cancel, finished.c.workflow),
        select(requeued.c.id, requeued.c.cancel, requeued.c.workflow),
        select(parked.c.id, parked.c.cancel, parked.c.workflow),
    ).subquery("applied")
    kind = outcome.c.kind
    cancelled = or_(
        kind == state_literal(OutcomeKind.CANCELLED.value),
        and_(applied.c.cancel, kind != state_literal(OutcomeKind.SUCCEEDED.value)),
    )
    ends = or_(kind.in_(_kinds(OutcomeKind.final())), cancelled)
    succeeded = kind == state_literal(OutcomeKind.SUCCEEDED.value)
    # A running job is queued; named, it keeps a partitioned table's update on the live
    # partition (the final status then moves the row to its time partition).
    job_row = and_(jobs.c.id == outcome.c.id, jobs.c.id == applied.c.id, jobs.c.status == QUEUED)
    recorded_where = [job_row, or_(kind.in_(_kinds(OutcomeKind.recorded())), applied.c.cancel)]
    if tables.history == HistoryLayout.NONE:
        # Named here, the deletion is rendered (and run) as the CTE "erased".
        # A workflow's node keeps its row: its dependents read its result through it.
        erased = _erase_succeeded(tables, job_row, and_(succeeded, ~applied.c.workflow))
        recorded_where.append(~exists().where(erased.c.id == jobs.c.id))
    recorded = (
        update(jobs)
        .where(*recorded_where)
        .values(
            status=case(
                (cancelled, CANCELLED),
                (kind == state_literal(OutcomeKind.SUCCEEDED.value), SUCCEEDED),
                (kind == state_literal(OutcomeKind.FAILED.value), FAILED),
                else_=jobs.c.status,
            ),
            result=case(
                (kind == state_literal(OutcomeKind.SUCCEEDED.value), outcome.c.result),
                else_=jobs.c.result,
            ),
            errors=case(
                (outcome.c.error.is_(None), jobs.c.errors),
                else_=jobs.c.errors.op("||")(func.jsonb_build_array(outcome.c.error)),
            ),
            attempts=outcome.c.attempt,
            finished_at=case((ends, func.now()), else_=jobs.c.finished_at),
        )
        # Someone waits for this job's result (queue.result): tell them it finished. The
        # CASE calls pg_notify only for awaited jobs, so no other completion pays for it.
        .returning(
            jobs.c.id,
            notify_waiters(tables, ends),
        )
        .cte("recorded")
    )
    # "recorded" is not read by the final SELECT; PostgreSQL runs data-modifying CTEs
    # regardless. Selecting from it keeps SQLAlchemy from dropping the unreferenced CTE.
    return union_all(
        select(finished.c.id),
        select(requeued.c.id),
        select(parked.c.id),
        select(recorded.c.id).where(literal_column("false")),
    )


def _erase_succeeded(
    tables: QueueTables, job_row: ColumnElement[bool], succeeded: ColumnElement[bool]
) -> CTE:
    """``history="none"``: delete the rows of the jobs that succeeded, returning their ids.

    A job whose result someone awaits (``queue.result``) keeps its row, recorded as on a
    plain history, and so does one with a unique key (its scope may hold the key for a
    while after the job finished, which only the row can tell). The flags are in this
    DELETE's own condition, which PostgreSQL checks again on the row's newest version when
    it had to wait for the row: a waiter that marks the job while this statement waits
    keeps the row. The update that records the kept ones is then chosen by what this
    DELETE returned, never by the flags as the snapshot saw them (a row the snapshot saw
    unawaited but a waiter kept would be neither deleted nor recorded). A workflow node's
    row is kept too (``succeeded`` says so): the release reads its result from it.
    """
    jobs = tables.jobs
    return (
        delete(jobs)
        .where(job_row, succeeded, jobs.c.awaited.is_(False), jobs.c.unique_key.is_(None))
        .returning(jobs.c.id)
        .cte("erased")
    )
