"""Enqueue: one statement that writes the job and its execution (and wakes workers).

Both builders read their rows from one JSON parameter through ``jsonb_to_recordset``, so a
single job and a batch of ten thousand compile to the same cached statement, and a batch
costs one round trip.

A large batch of plain jobs may take another road (see :mod:`sqla_queue.copying`): its ids
reserved by :data:`RESERVE_IDS`, its rows written by ``COPY`` into the columns
:data:`JOBS_COPY_COLUMNS` and :data:`EXECUTIONS_COPY_COLUMNS` (:func:`copy_sql`), and the
workers woken by :func:`notify_statement`.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    DateTime,
    Double,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.selectable import TextualSelect

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import ONE, PENDING, RUNNING, WAITING, due_at
from sqla_queue.statements.keys import started_elsewhere

__all__ = [
    "COPY_RELEASE",
    "COPY_ROLLBACK",
    "COPY_SAVEPOINT",
    "ENQUEUE_ROW_FIELDS",
    "EXECUTIONS_COPY_COLUMNS",
    "JOBS_COPY_COLUMNS",
    "RESERVE_IDS",
    "EnqueueParams",
    "EnqueueRow",
    "ReserveParams",
    "copy_sql",
    "enqueue_statement",
    "keyed_rows",
    "notify_statement",
]


class _OptionalRowFields(TypedDict, total=False):
    #: Left out when not set (a missing key reads as NULL): the job's unique key, copied
    #: to the job for listing (the key itself is taken in the unique_keys table).
    unique_key: str
    #: Left out when not set: the application row the job is about (see sqla_queue.links).
    about_table: str
    about_key: str


class EnqueueRow(_OptionalRowFields):
    """One JSON object of the ``rows`` parameter: one job to write.

    Its keys are :data:`ENQUEUE_ROW_FIELDS` (a unit test holds the two together); the
    optional ones (unique key, linked row) are left out of a plain job's row.
    """

    task: str
    #: ``{"args": [...], "kwargs": {...}}``, stored as the job's payload.
    payload: dict[str, Any]
    priority: int
    queue_id: str | None
    max_attempts: int
    #: An ISO 8601 timestamp with its offset; wins over ``delay``.
    run_at: str | None
    #: Seconds from the statement's clock (``now()``).
    delay: float | None
    #: The row's place in its call: ids follow it.
    seq: int


class EnqueueParams(TypedDict):
    """The parameters of :func:`enqueue_statement`."""

    #: JSON text: a list of :class:`EnqueueRow` objects.
    rows: str


#: The SQL type each row field is read as, in the record definition of ``rows``.
_ROW_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("task", Text),
    ("payload", JSONB),
    ("priority", Integer),
    ("queue_id", Text),
    ("max_attempts", Integer),
    ("run_at", DateTime(timezone=True)),
    ("delay", Double),
    ("seq", Integer),
    ("unique_key", Text),
    ("about_table", Text),
    ("about_key", Text),
)

#: Keys of each JSON object in the ``rows`` parameter: the columns the statement reads.
ENQUEUE_ROW_FIELDS = tuple(name for name, _ in _ROW_COLUMNS)


def enqueue_statement(tables: QueueTables, *, notify: bool, keyed: bool = True) -> Select[int]:
    """Build the enqueue statement.

    Parameters: :class:`EnqueueParams`; ``rows`` is JSON text, a list of
    :class:`EnqueueRow` objects (keys :data:`ENQUEUE_ROW_FIELDS`).
    ``run_at`` (an ISO timestamp) wins over ``delay`` (seconds on the database clock);
    ``seq`` numbers the rows so ids follow the caller's order.
    Returns the new job ids in the order of ``rows``.

    With ``keyed=False`` the statement leaves out everything a ``queue_id`` needs (the probes
    of each key's head and the order within the batch) and writes every execution
    ``pending``: for calls none of which has a ``queue_id``, which the caller checks. It
    saves about 0.08 ms of a one-job enqueue, a fifth of what the enqueue adds to a
    business transaction.

    With ``notify``, the statement also calls ``pg_notify`` once. PostgreSQL folds identical
    notifications of one transaction into one, so a transaction that enqueues many times
    still wakes the workers once, at commit, and a rolled-back one never does.
    """
    jobs = tables.jobs
    ex = tables.executions
    source = (
        func.jsonb_to_recordset(cast(bindparam("rows", type_=Text), JSONB))
        .table_valued(*(column(name, type_) for name, type_ in _ROW_COLUMNS))
        .render_derived(name="r", with_types=True)
    )
    execute_at = due_at(source.c.run_at, source.c.delay)
    # ORDER BY seq makes the identity values follow the caller's order, which is the
    # FIFO tie-break of a queue_id.
    new_jobs = (
        insert(jobs)
        .from_select(
            [
                "task",
                "payload",
                "priority",
                "queue_id",
                "max_attempts",
                "scheduled_at",
                "unique_key",
                "about_table",
                "about_key",
            ],
            select(
                source.c.task,
                source.c.payload,
                source.c.priority,
                source.c.queue_id,
                source.c.max_attempts,
                execute_at,
                source.c.unique_key,
                source.c.about_table,
                source.c.about_key,
            ).order_by(source.c.seq),
        )
        .returning(jobs.c.id, jobs.c.task, jobs.c.priority, jobs.c.queue_id, jobs.c.scheduled_at)
        .cte("new_jobs")
    )
    columns = ["id", "task", "priority", "queue_id", "state", "execute_at"]
    if keyed:
        rows = keyed_rows(tables, new_jobs)
    else:
        rows = select(
            new_jobs.c.id,
            new_jobs.c.task,
            new_jobs.c.priority,
            new_jobs.c.queue_id,
            PENDING,
            new_jobs.c.scheduled_at,
        )
    new_executions = insert(ex).from_select(columns, rows).returning(ex.c.id).cte("new_executions")
    ids = select(new_executions.c.id.label("id")).order_by(new_executions.c.id)
    if not notify:
        return ids
    wake = select(
        func.pg_notify(literal(tables.notify_channel, Text), literal("", Text)).label("n")
    ).cte("wake")
    # Cross-joining the one-row "wake" keeps pg_notify in the statement; it fires only
    # when at least one job was written (an empty batch notifies nobody).
    return (
        select(new_executions.c.id.label("id"))
        .select_from(new_executions.join(wake, true()))
        .order_by(new_executions.c.id)
    )


def keyed_rows(tables: QueueTables, new_jobs: Any) -> Select[Any]:
    """The executions of ``new_jobs``, each keyed one ``waiting`` or ``pending`` as it must be.

    ``new_jobs`` has the columns ``id``, ``task``, ``priority``, ``queue_id`` and
    ``scheduled_at`` (the due time); the result has ``id``, ``task``, ``priority``,
    ``queue_id``, the state and the due time, ready to insert. A requeue puts its jobs
    back in line through it too.

    A keyed job waits (outside the claim's indexes) behind its key's head: when one of
    the key's jobs has started and not finished (running, or back to pending after a
    retry, a reschedule, a hand-back or a reclaim: it keeps its place whatever its new
    due time), when one of the key's pending or running executions comes before it, when
    an earlier job of its key is in this batch, or when the key has no head but waiting
    jobs (a head finished and its successor is not promoted yet; promotion goes in order,
    so the new job takes its place among them). Each key needs two probes and a walk of
    its few pending and running rows: the head, first of those rows (queue_active_ix),
    whether one of them has started, and any one waiting row (waiting_ix), never a walk
    of the key's waiting backlog, which a hot key makes long. The rows found are locked
    KEY SHARE, which keeps the waiting job from being forgotten: the worker that finishes
    one of them cannot delete it while this transaction runs (it leaves it 'done'), so
    the key's next promotion happens after this job is visible. The lock blocks neither
    claims, nor heartbeats, nor requeues (all NO KEY UPDATE); a statement with no keyed
    row reads nothing here.
    """
    ex = tables.executions
    keys = (
        select(new_jobs.c.queue_id).where(new_jobs.c.queue_id.is_not(None)).distinct().cte("keys")
    )
    h = ex.alias("h")
    head = (
        select(h.c.execute_at)
        .where(h.c.queue_id == keys.c.queue_id, or_(h.c.state == PENDING, h.c.state == RUNNING))
        .order_by(h.c.execute_at, h.c.id)
        .limit(ONE)
        .with_for_update(of=h, read=True, key_share=True)
        .correlate_except(h)
        .lateral("head")
    )
    w = ex.alias("w")
    backlog = (
        select(w.c.execute_at)
        .where(w.c.queue_id == keys.c.queue_id, w.c.state == WAITING)
        .limit(ONE)
        .with_for_update(of=w, read=True, key_share=True)
        .correlate_except(w)
        .lateral("backlog")
    )
    ahead = (
        select(
            keys.c.queue_id,
            head.c.execute_at.label("head_at"),
            (backlog.c.execute_at.is_not(None)).label("has_waiting"),
            started_elsewhere(tables, keys.c.queue_id).label("started"),
        )
        .select_from(keys.outerjoin(head, true()).outerjoin(backlog, true()))
        .cte("ahead")
    )
    turn = func.row_number().over(
        partition_by=new_jobs.c.queue_id, order_by=(new_jobs.c.scheduled_at, new_jobs.c.id)
    )
    ranked = select(new_jobs, turn.label("turn")).subquery("ranked")
    state = case(
        (ranked.c.queue_id.is_(None), PENDING),
        (ranked.c.turn > 1, WAITING),
        (ahead.c.started, WAITING),
        (ahead.c.head_at <= ranked.c.scheduled_at, WAITING),
        (and_(ahead.c.head_at.is_(None), ahead.c.has_waiting), WAITING),
        else_=PENDING,
    )
    return select(
        ranked.c.id,
        ranked.c.task,
        ranked.c.priority,
        ranked.c.queue_id,
        state,
        ranked.c.scheduled_at,
    ).select_from(ranked.outerjoin(ahead, ahead.c.queue_id == ranked.c.queue_id))


class ReserveParams(TypedDict):
    """The parameters of :data:`RESERVE_IDS`."""

    #: The jobs table's name as the server resolves it: quoted, schema-qualified if needed.
    jobs: str
    #: How many ids to reserve.
    count: int


#: ``count`` new ids from the jobs table's identity sequence, as one text of decimal ids
#: separated by commas (in no promised order, with gaps where concurrent enqueues took
#: some), and the transaction's ``now()``. The ids are NULL when the role lacks ``USAGE``
#: on the sequence (the identity default needs no grant, an explicit ``nextval`` does), so
#: that the caller can write by the enqueue statement instead. One text, not a row per id:
#: a hundred thousand rows cost the client more to read than the server to make. The
#: sequence is looked up once (MATERIALIZED keeps the planner from repeating the lookup on
#: every row).
RESERVE_IDS: TextualSelect = (
    text(
        "WITH s AS MATERIALIZED ("
        "SELECT pg_get_serial_sequence(:jobs, 'id')::regclass AS seq) "
        "SELECT string_agg(nextval(s.seq)::text, ',') AS ids, now() AS now "
        "FROM s CROSS JOIN generate_series(1, :count) "
        "WHERE has_sequence_privilege(s.seq, 'USAGE')"
    )
    .bindparams(bindparam("jobs", type_=Text), bindparam("count", type_=Integer))
    .columns(column("ids", Text), column("now", DateTime(timezone=True)))
)

#: The jobs columns a COPY writes, in its rows' order; the others take their defaults
#: (``status`` queued, ``created_at`` now(), no attempts, no errors), as in the statement.
JOBS_COPY_COLUMNS = (
    "id",
    "task",
    "payload",
    "priority",
    "max_attempts",
    "scheduled_at",
    "about_table",
    "about_key",
)

#: The executions columns a COPY writes: every row ``pending`` (no ``queue_id``).
EXECUTIONS_COPY_COLUMNS = ("id", "task", "priority", "state", "execute_at")


#: The savepoint around a COPY enqueue's two COPYs, so that arguments found unstorable
#: while the rows stream undo them and leave the caller's transaction usable.
COPY_SAVEPOINT = text("SAVEPOINT sqla_queue_copy")
#: Undo the COPYs (after a failed one); :data:`COPY_RELEASE` then forgets the savepoint.
COPY_ROLLBACK = text("ROLLBACK TO SAVEPOINT sqla_queue_copy")
#: Keep the COPYs (or forget the savepoint after a rollback to it).
COPY_RELEASE = text("RELEASE SAVEPOINT sqla_queue_copy")


def copy_sql(table: str, columns: tuple[str, ...]) -> str:
    """``COPY table (columns) FROM STDIN`` in text format; ``table`` is quoted already."""
    return f"COPY {table} ({', '.join(columns)}) FROM STDIN"


def notify_statement(tables: QueueTables) -> Select[Any]:
    """Wake the workers of ``tables`` (at commit), as the enqueue statement does."""
    return select(func.pg_notify(literal(tables.notify_channel, Text), literal("", Text)))
