"""Unique jobs: taking a key, binding it to the new job, and replacing a queued holder.

A key is a row of ``unique_keys``, (task, key) its primary key: two enqueues of one key
meet on that row, and the second waits for the first's transaction. Who holds the key is
decided lazily, by the holder's own state, when someone else wants the key: the claim, the
completion and every other hot statement never touch the table, so tasks that do not use
keys pay nothing.

The holder's state is read from the statement's snapshot, while the key row itself is
read at its newest version (``ON CONFLICT DO UPDATE`` locks it and sees the last commit).
So the test is built to err only towards "still held": a holder that committed after the
snapshot (and is therefore invisible to it) holds; a holder that the snapshot sees as
queued holds even if it started meanwhile. The only ways to take a key are to see its
holder finished (or started, for scope ``queued``) in a snapshot, which no later commit can
undo, or to see the key bound to a job whose row is gone (pruned or deleted by hand).
A key whose ``job_id`` is NULL is free: only an enqueue that is taking it writes NULL, and
it holds the row locked until it binds the key or rolls back.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.dml import ReturningUpdate

from sqla_queue.models.tables import JobStatus, QueueTables, UniqueScope
from sqla_queue.statements._common import (
    PENDING,
    QUEUED,
    WAITING,
    seconds,
    state_literal,
)

__all__ = [
    "BindKeysParams",
    "ReplaceParams",
    "TakeKeysParams",
    "bind_keys_statement",
    "replace_statement",
    "take_keys_statement",
]


class TakeKeysParams(TypedDict):
    """Parameters of :func:`take_keys_statement`."""

    #: JSON array of ``{"task", "key", "seq"}`` objects, one per key, sorted by (task, key).
    keys: str


class BindKeysParams(TypedDict):
    """Parameters of :func:`bind_keys_statement`."""

    #: JSON array of ``{"task", "key", "job_id", "scope", "hold_seconds"}`` objects.
    keys: str


class ReplaceParams(TypedDict):
    """Parameters of :func:`replace_statement`."""

    #: JSON array of ``{"id", "payload", "run_at", "delay"}`` objects.
    rows: str


def _recordset(name: str, alias: str, *columns: Any) -> Any:
    return (
        func.jsonb_to_recordset(cast(bindparam(name, type_=Text), JSONB))
        .table_valued(*columns)
        .render_derived(name=alias, with_types=True)
    )


def _released(tables: QueueTables, held: Any) -> Any:
    """Whether the holder of the key row ``held`` (``job_id``, ``scope``,
    ``hold_seconds``) has let the key go, as the statement's snapshot sees it."""
    jobs = tables.jobs
    ex = tables.executions
    queued_scope = held.c.scope == state_literal(UniqueScope.QUEUED)
    holding = or_(
        and_(
            queued_scope,
            exists().where(ex.c.id == jobs.c.id, ex.c.state.in_([PENDING, WAITING])),
        ),
        and_(~queued_scope, jobs.c.status == QUEUED),
        and_(
            held.c.scope == state_literal(UniqueScope.FINISHED),
            jobs.c.status != state_literal(JobStatus.CANCELLED),
            jobs.c.finished_at > func.now() - seconds(held.c.hold_seconds),
        ),
    )
    # Visible and not holding: an invisible holder (committed after this snapshot) holds.
    let_go = exists().where(jobs.c.id == held.c.job_id, ~holding)
    # Gone: this snapshot already saw the key bound to the holder (the binding commits with
    # the holder's job row), yet the job row is not there: it was deleted (pruned).
    keys = tables.unique_keys
    seen_bound = exists().where(
        keys.c.task == held.c.task, keys.c.key == held.c.key, keys.c.job_id == held.c.job_id
    )
    gone = and_(seen_bound, ~exists().where(jobs.c.id == held.c.job_id))
    return or_(held.c.job_id.is_(None), let_go, gone)


def _wanted(alias: str) -> Any:
    return _recordset(
        "keys", alias, column("task", Text), column("key", Text), column("seq", BigInteger)
    )


def take_keys_statement(tables: QueueTables) -> Select[Any]:
    """Lock each key row (creating the missing ones), and say which keys are free.

    Parameters: :class:`TakeKeysParams`. Returns ``(seq, job_id)`` per key, in ``seq``
    order: ``job_id`` is NULL where the key is free for this transaction to take (it must
    bind it with :func:`bind_keys_statement`), else the id of the job that holds it. Every
    key row stays locked until this transaction ends, so no other enqueue can take a key
    meanwhile. Rows are locked in (task, key) order, so two batches with overlapping keys
    cannot deadlock. A key row created here has a NULL ``job_id`` until it is bound; if
    the caller commits without binding it (a duplicate raised), the key stays free.
    """
    keys = tables.unique_keys
    wanted = _wanted("k")
    upsert = insert(keys).from_select(
        ["task", "key", "job_id", "scope"],
        select(
            wanted.c.task,
            wanted.c.key,
            cast(null(), BigInteger),
            state_literal(UniqueScope.ACTIVE),
        ).order_by(wanted.c.task, wanted.c.key),
    )
    # The no-op update locks the row and returns its newest version (ON CONFLICT DO
    # NOTHING would neither lock nor return it).
    held = (
        upsert.on_conflict_do_update(
            index_elements=[keys.c.task, keys.c.key], set_={"updated_at": func.now()}
        )
        .returning(keys.c.task, keys.c.key, keys.c.job_id, keys.c.scope, keys.c.hold_seconds)
        .cte("held")
    )
    again = _wanted("w")
    holder = case((_released(tables, held), cast(null(), BigInteger)), else_=held.c.job_id)
    return (
        select(again.c.seq, holder.label("job_id"))
        .select_from(again.join(held, and_(held.c.task == again.c.task, held.c.key == again.c.key)))
        .order_by(again.c.seq)
    )


def bind_keys_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Point each key this transaction took at its new job, with the job's scope.

    Parameters: :class:`BindKeysParams`; ``scope`` is ``queued``, ``active`` or
    ``finished`` (with ``hold_seconds``), or null: the key keeps its stored scope (a
    requeued job takes its key back as it was last taken).
    """
    keys = tables.unique_keys
    rows = _recordset(
        "keys",
        "b",
        column("task", Text),
        column("key", Text),
        column("job_id", BigInteger),
        column("scope", Text),
        column("hold_seconds", Double),
    )
    return (
        update(keys)
        .where(keys.c.task == rows.c.task, keys.c.key == rows.c.key)
        .values(
            job_id=rows.c.job_id,
            # No scope given (a requeue): the key keeps the one it was last taken with.
            scope=func.coalesce(rows.c.scope, keys.c.scope),
            hold_seconds=case(
                (rows.c.scope.is_(None), keys.c.hold_seconds), else_=rows.c.hold_seconds
            ),
            updated_at=func.now(),
        )
        .returning(keys.c.job_id)
    )


def replace_statement(tables: QueueTables) -> Select[Any]:
    """Give still-queued jobs new arguments and (for pending ones) a new due time.

    Parameters: :class:`ReplaceParams`. ``run_at`` wins over ``delay``; with neither, the
    due time is kept. A waiting job (behind its ``queue_id``'s head) keeps its place and
    due time. The execution row is locked first, so a job a worker is claiming right now
    is either replaced before the claim reads it, or not at all. Returns the ids replaced.
    """
    ex = tables.executions
    jobs = tables.jobs
    rows = _recordset(
        "rows",
        "r",
        column("id", BigInteger),
        column("payload", JSONB),
        column("run_at", DateTime(timezone=True)),
        column("delay", Double),
    )
    source = select(rows).cte("r").prefix_with("MATERIALIZED")
    due = func.coalesce(source.c.run_at, func.now() + seconds(source.c.delay), ex.c.execute_at)
    moved = (
        update(ex)
        .where(ex.c.id == source.c.id, ex.c.state.in_([PENDING, WAITING]))
        .values(execute_at=case((ex.c.state == PENDING, due), else_=ex.c.execute_at))
        .returning(ex.c.id, ex.c.execute_at)
        .cte("moved")
    )
    replaced = (
        update(jobs)
        .where(jobs.c.id == moved.c.id, jobs.c.id == source.c.id)
        .values(payload=source.c.payload, scheduled_at=moved.c.execute_at)
        .returning(jobs.c.id)
        .cte("replaced")
    )
    return select(replaced.c.id)


# Kept importable for the contract tests, which check the JSON keys each statement reads.
TAKE_KEY_FIELDS = ("task", "key", "seq")
BIND_KEY_FIELDS = ("task", "key", "job_id", "scope", "hold_seconds")
REPLACE_FIELDS = ("id", "payload", "run_at", "delay")
