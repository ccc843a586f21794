"""The queue's administrative SQL, run in one place: requeue, prune, limits, failed jobs.

:class:`~sqla_queue.Queue` (``requeue``, ``prune``, ``set_limit``, ``limits``) and the
``sqla-queue`` command line call these functions; none of them executes these statements
itself. Each function takes what the caller holds (a ``Session`` or ``Connection``, and for
requeue and prune their async twins too) and the queue's
:class:`~sqla_queue.models.QueueTables`. Every call joins the caller's transaction: nothing
here commits. Async binds get a coroutine of the result.

Values are checked here, before anything is executed, by the ``check_*`` functions
(a negative age, a limit or an id that the column cannot hold: :class:`ValueError` naming
the argument and the rule). ``Queue`` checks task names against its own registry before it
calls in. A role without the privilege to change limits gets
:class:`~sqla_queue.InsufficientPrivilegeError` naming the ``GRANT`` that fixes it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue._binds import AnyBind, tables_for
from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.checks import (
    INT4_MAX,
    INT8_MAX,
    INT8_MIN,
    check_in_range,
    check_row_limit,
    check_whole_number,
)
from sqla_queue.conversation import Flow, run_flow
from sqla_queue.durable.compensate import reopen_compensated_flow
from sqla_queue.errors import InsufficientPrivilegeError
from sqla_queue.logic.payload import encode_json
from sqla_queue.models.tables import JobStatus, NodeState, QueueTables
from sqla_queue.schema.manifest import ADMIN_LIMIT_PRIVILEGES, RequiredPrivilege
from sqla_queue.schema.verify import GRANTS_GUIDE, grant_statements
from sqla_queue.statements.admin import (
    FailedJobsParams,
    PruneParams,
    RequeueParams,
    failed_jobs_statement,
    prune_statement,
    requeue_keys_statement,
    requeue_statement,
)
from sqla_queue.statements.limits import (
    DeleteLimitParams,
    SetLimitParams,
    delete_limit_statement,
    set_limit_statement,
    stored_limits_statement,
)
from sqla_queue.statements.prune import LeftoversParams, prune_leftovers_statement
from sqla_queue.statements.unique import (
    BindKeysParams,
    TakeKeysParams,
    bind_keys_statement,
    take_keys_statement,
)
from sqla_queue.statements.workflow_admin import (
    lock_ruled_out_statement,
    lock_workflows_of_statement,
    resume_statement,
    rival_workflows_statement,
    unique_keys_of_statement,
)
from sqla_queue.statements.workflows import unique_workflow_key, workflow_lock_statement

__all__ = [
    "PRUNED_TABLES",
    "FailedJob",
    "Pruned",
    "RequeueReport",
    "add_counts",
    "check_age",
    "check_failed_limit",
    "check_job_ids",
    "check_limit",
    "failed_jobs",
    "operator_write_refused",
    "prune",
    "prune_leftovers_flow",
    "requeue",
    "set_limit",
    "stored_limits",
]

SyncBind = Session | Connection
AsyncBind = AsyncSession | AsyncConnection

# Ages beyond this prune what they would prune at any larger age (nothing finished before
# 1000 BC), and keep now() - age inside PostgreSQL's timestamp range (4713 BC on).
_PRUNE_HORIZON_SECONDS = 3000 * 365.25 * 86400


def check_limit(limit: object) -> int | None:
    """``limit`` as a concurrency limit to store, or ``None`` (remove the stored one).

    A limit is a whole number from 1 to :data:`~sqla_queue.checks.INT4_MAX` (the limits
    table's column is an ``integer``); anything else raises :class:`ValueError` naming it.
    """
    if limit is None:
        return None
    return check_in_range("a concurrency limit", limit, 1, INT4_MAX)


def check_job_ids(job_ids: Iterable[int]) -> list[int]:
    """The job ids of an iterable, each a whole number that a ``bigint`` holds.

    Each id is an ``int`` (any ``numbers.Integral`` but ``bool``), or a string of ASCII
    digits (ids often come from forms and command lines), converted with ``int``. A string
    or bytes given for the whole iterable, a float, a ``Decimal`` (``Decimal("2.9")`` must
    not become job 2), a bool, any other string, or an id beyond ``bigint`` raises
    :class:`TypeError` or :class:`ValueError` naming it. Every place that takes job ids
    (cancel, requeue, result, the job listing) checks them here.
    """
    if isinstance(job_ids, str | bytes) or not isinstance(job_ids, Iterable):
        raise TypeError(f"job_ids must be an iterable of job ids, got {job_ids!r}")
    return [_job_id(raw) for raw in job_ids]


# Digits only: int() would also take " 7", "1_000" and non-ASCII digits such as "٣".
_DIGITS = re.compile(r"-?[0-9]+")
# More significant digits than this cannot be a bigint (and are not worth converting).
_BIGINT_DIGITS = len(str(INT8_MAX))


def _job_id(raw: object) -> int:
    if isinstance(raw, str) and _DIGITS.fullmatch(raw):
        if len(raw.lstrip("-").lstrip("0")) > _BIGINT_DIGITS:
            raise ValueError(
                f"a job id must be from {INT8_MIN} to {INT8_MAX} (it is a PostgreSQL "
                f"bigint), got a number of {len(raw)} digits"
            )
        raw = int(raw)
    return check_whole_number("a job id", raw, INT8_MIN, INT8_MAX)


def check_age(older_than: object) -> float:
    """``older_than`` (a ``timedelta`` of zero or more) in seconds, for :func:`prune`.

    A negative age would select jobs that finish in the future, that is every finished
    job: it raises :class:`ValueError`. Ages beyond 3,000 years select what 3,000 years
    selects (nothing), and are capped so the database can compute ``now() - age``.
    """
    if not isinstance(older_than, dt.timedelta):
        raise TypeError(f"older_than must be a datetime.timedelta, got {older_than!r}")
    seconds = older_than.total_seconds()
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(
            f"older_than must not be negative, got {older_than!r}: a negative age "
            "would delete every finished job, including those that finished just now"
        )
    return min(seconds, _PRUNE_HORIZON_SECONDS)


def check_failed_limit(limit: object) -> int:
    """How many failed jobs :func:`failed_jobs` may list: a whole number from 1."""
    return check_row_limit("the number of failed jobs to list", limit)


@dataclass(frozen=True)
class FailedJob:
    """One failed job as :func:`failed_jobs` lists it."""

    id: int
    task: str
    attempts: int
    finished_at: dt.datetime | None
    #: The last entry of the job's error history (``type``, ``message``, ...), if any.
    last_error: dict[str, Any] | None


def _connection(bind: SyncBind) -> Connection:
    return bind.connection() if isinstance(bind, Session) else bind


class RequeueReport(list[int]):
    """What :func:`requeue` did: the list of ids requeued (in id order), and why the
    others that could have been were left alone.

    It is a ``list`` of the requeued ids, as requeue always returned, with two more
    attributes:

    * :attr:`refused`: the failed or cancelled jobs left alone because another job holds
      their unique key, each with the reason as a sentence (``"its unique key 'k' is
      held by job 12"``);
    * :attr:`held_by`: the same jobs, each with the id of the job that holds its key.

    A failed or cancelled workflow node left alone is in :attr:`refused` too, with why:
    its workflow was cancelled, it never ran (requeue the parent that ruled it out), or
    another live workflow of its name stands for its row (the rule of one live workflow
    per row and name, as a unique job's key).

    Ids in neither were not failed or cancelled (or no job has them): nothing to do.
    """

    refused: dict[int, str]
    held_by: dict[int, int]

    def __init__(
        self,
        requeued: Iterable[int] = (),
        held_by: dict[int, tuple[str, int]] | None = None,
        refused: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(requeued)
        held = held_by or {}
        self.held_by = {job_id: holder for job_id, (_, holder) in held.items()}
        self.refused = {
            job_id: f"its unique key {key!r} is held by job {holder}"
            for job_id, (key, holder) in held.items()
        }
        self.refused.update(refused or {})

    @property
    def requeued(self) -> list[int]:
        """The ids requeued, in id order (the list itself)."""
        return list(self)


@overload
def requeue(bind: SyncBind, tables: QueueTables, job_ids: Iterable[int]) -> RequeueReport: ...


@overload
def requeue(
    bind: AsyncBind, tables: QueueTables, job_ids: Iterable[int]
) -> Coroutine[Any, Any, RequeueReport]: ...


def requeue(
    bind: AnyBind, tables: QueueTables, job_ids: Iterable[int]
) -> RequeueReport | Coroutine[Any, Any, RequeueReport]:
    """Put failed or cancelled jobs back in the queue; a :class:`RequeueReport`.

    The ids are read and checked (:func:`check_job_ids`) before anything is executed, also
    for an async bind. A unique job takes its key again, under the same rules as an
    enqueue: while another job holds the key, the job is left as it is, and the report
    says which job holds it. A keyed job (``queue_id``) goes back in line behind its key's
    queued jobs. See :func:`~sqla_queue.statements.requeue_statement`.
    """
    ids = check_job_ids(job_ids)
    return run_flow(bind, _requeue_flow(tables, ids))


def _requeue_flow(tables: QueueTables, ids: list[int]) -> Flow[RequeueReport]:
    """Take the unique keys of the jobs to requeue, then requeue those that got theirs."""
    asked: RequeueParams = {"ids": ids}
    keyed = yield requeue_keys_statement(tables), asked
    # One job per key: the lowest id takes it, the others of the call meet it as holder.
    claimants: dict[tuple[str, str], int] = {}
    for row in keyed:
        claimants.setdefault((row.task, row.unique_key), row.id)
    held = yield from _take_keys(tables, claimants)
    for row in keyed:
        leader = claimants[(row.task, row.unique_key)]
        if row.id != leader:
            held[row.id] = (row.unique_key, held.get(leader, (row.unique_key, leader))[1])
    # A workflow's node is requeued only if it ran, and not in a cancelled workflow; its
    # workflow's row stays locked until the requeue commits (see resume_statement).
    nodes = yield lock_workflows_of_statement(tables), asked
    reasons = yield from _node_refusals(tables, nodes)
    refused = set(reasons)
    free: RequeueParams = {
        "ids": [job_id for job_id in ids if job_id not in held and job_id not in refused]
    }
    requeued = [int(row[0]) for row in (yield requeue_statement(tables), free)]
    # A durable job's compensated steps run again (see the durable jobs guide).
    yield from reopen_compensated_flow(tables, requeued)
    back = set(requeued)
    resumed: RequeueParams = {"ids": [row.job_id for row in nodes if row.job_id in back]}
    if resumed["ids"]:
        yield lock_ruled_out_statement(tables), resumed
        yield resume_statement(tables), resumed
    # Bound without a scope: each key keeps the one it was last taken with.
    bindings = [
        {"task": task, "key": key, "job_id": job_id, "scope": None, "hold_seconds": None}
        for (task, key), job_id in claimants.items()
        if job_id in back
    ]
    if bindings:
        bind: BindKeysParams = {"keys": encode_json(bindings)}
        yield bind_keys_statement(tables), bind
    return RequeueReport(requeued, held, reasons)


def _node_refusals(tables: QueueTables, nodes: Sequence[Any]) -> Flow[dict[int, str]]:
    """Why each failed or cancelled node among ``nodes`` (rows of
    :func:`~sqla_queue.statements.workflow_admin.lock_workflows_of_statement`) cannot be
    requeued, by job id. A node that never ran, or of a cancelled workflow, is refused; so
    is one whose workflow another live one of its name about its row stands in for: the
    requeue takes the unique workflows' lock of that row and name first, as a unique
    enqueue does, then looks."""
    reasons: dict[int, str] = {}
    ended = [row for row in nodes if row.status in (JobStatus.FAILED, JobStatus.CANCELLED)]
    for row in ended:
        node = f"it is node {row.name!r} of workflow {row.workflow_id}"
        if row.cancelled:
            reasons[row.job_id] = f"{node}, which was cancelled: its nodes stay as they are"
        elif row.state != NodeState.RELEASED:
            reasons[row.job_id] = (
                f"{node} and never ran: a parent it needed did not succeed (or it was "
                "cancelled while it waited); requeue that parent, and the workflow runs "
                "this node again"
            )
    open_ = {row.workflow_id for row in ended if row.job_id not in reasons}
    if not open_:
        return reasons
    asked = {"wfs": sorted(open_)}
    keyed = yield unique_keys_of_statement(tables), asked
    if not keyed:
        return reasons
    keys = sorted({unique_workflow_key(tables, *row[1:]) for row in keyed})
    for key in keys:
        yield workflow_lock_statement(), {"key": key}
    rivals = dict((yield rival_workflows_statement(tables), {"wfs": [r.id for r in keyed]}))
    for row in ended:
        rival = rivals.get(row.workflow_id)
        if row.job_id not in reasons and rival is not None:
            reasons[row.job_id] = (
                f"it is node {row.name!r} of workflow {row.workflow_id}, and workflow "
                f"{rival} of the same name about the same row is live: one live workflow "
                "per row and name, as a unique job's key (cancel that one, or let it end, "
                "then requeue)"
            )
    return reasons


def _take_keys(
    tables: QueueTables, claimants: dict[tuple[str, str], int]
) -> Flow[dict[int, tuple[str, int]]]:
    """Lock the claimants' keys; ``{job id: (key, holder)}`` of those another job holds.

    A key bound to the claimant itself (scope ``finished``, still within its hold) is
    its own to take back.
    """
    if not claimants:
        return {}
    wanted = list(claimants.items())
    rows = [{"task": task, "key": key, "seq": seq} for seq, ((task, key), _) in enumerate(wanted)]
    take: TakeKeysParams = {"keys": encode_json(rows)}
    holders = {int(seq): holder for seq, holder in (yield take_keys_statement(tables), take)}
    held: dict[int, tuple[str, int]] = {}
    for seq, ((_, key), job_id) in enumerate(wanted):
        holder = holders.get(seq)
        if holder is not None and int(holder) != job_id:
            held[job_id] = (key, int(holder))
    return held


#: The tables a prune removes rows from, by role (see :class:`Pruned`), in report order.
PRUNED_TABLES = (
    "jobs",
    "unique_keys",
    "job_steps",
    "job_signals",
    "workflows",
    "workflow_nodes",
    "workflow_edges",
)


class Pruned(int):
    """What a prune removed: the number of jobs deleted (the ``int`` itself, as prune
    always returned), and :attr:`removed`, the rows deleted from each table.

    :attr:`removed` maps each role of :data:`PRUNED_TABLES` (``jobs``, ``unique_keys``,
    ``job_steps``, ``job_signals``, ``workflows``, ``workflow_nodes``, ``workflow_edges``)
    to a count, zero included; :meth:`by_table` gives the same counts under the tables'
    names. On a partitioned history, :attr:`partitions` names the partitions dropped (or
    detached) too.
    """

    removed: dict[str, int]
    partitions: tuple[str, ...]

    def __new__(
        cls, removed: Mapping[str, int] | None = None, partitions: Iterable[str] = ()
    ) -> Pruned:
        """A report of ``removed`` (counts by table role; missing roles count zero)."""
        counts = {role: int((removed or {}).get(role, 0)) for role in PRUNED_TABLES}
        self = super().__new__(cls, counts["jobs"])
        self.removed = counts
        self.partitions = tuple(partitions)
        return self

    @property
    def total(self) -> int:
        """Every row removed, from every table."""
        return sum(self.removed.values())

    def by_table(self, tables: QueueTables) -> dict[str, int]:
        """:attr:`removed` keyed by ``tables``' table names instead of their roles."""
        return {getattr(tables, role).name: count for role, count in self.removed.items()}

    def __str__(self) -> str:
        # Printed, it is the number of jobs, as prune always returned.
        return int.__repr__(self)

    def __repr__(self) -> str:
        return f"Pruned({self.removed!r})"


def add_counts(into: dict[str, int], row: Any) -> None:
    """Add the counts of a prune statement's ``row`` (a column per table role) to ``into``."""
    for role, count in row._mapping.items():
        into[role] = into.get(role, 0) + int(count or 0)


@overload
def prune(
    bind: SyncBind, tables: QueueTables, *, older_than: dt.timedelta, include_failed: bool
) -> Pruned: ...


@overload
def prune(
    bind: AsyncBind, tables: QueueTables, *, older_than: dt.timedelta, include_failed: bool
) -> Coroutine[Any, Any, Pruned]: ...


def prune(
    bind: AnyBind, tables: QueueTables, *, older_than: dt.timedelta, include_failed: bool
) -> Pruned | Coroutine[Any, Any, Pruned]:
    """Delete finished jobs older than ``older_than``, and what they leave behind; a
    :class:`Pruned` (an ``int``: how many jobs were deleted, with the count per table).

    Failed jobs go only with ``include_failed``. With the jobs go the unique keys they
    hold and their durable steps and signals. Then, in the same transaction, the leftovers
    of jobs pruned before or deleted by ``history="none"``: steps and signals whose job's
    row is gone (once their newest is older than ``older_than``), and every workflow none
    of whose jobs has a row any more, with its nodes and edges (see
    :func:`~sqla_queue.statements.prune.prune_leftovers_statement`). A negative age raises
    :class:`ValueError` before anything is executed (see :func:`check_age`). See
    :func:`~sqla_queue.statements.prune_statement`.
    """
    params: PruneParams = {
        "older_than": check_age(older_than),
        "include_failed": bool(include_failed),
    }
    return run_flow(bind, _prune_flow(tables, params))


def _prune_flow(tables: QueueTables, params: PruneParams) -> Flow[Pruned]:
    removed: dict[str, int] = {}
    (row,) = yield prune_statement(tables), params
    add_counts(removed, row)
    yield from prune_leftovers_flow(tables, params["older_than"], removed)
    return Pruned(removed)


def prune_leftovers_flow(
    tables: QueueTables, older_than: float, removed: dict[str, int]
) -> Flow[None]:
    """Delete what pruned jobs left behind, ``older_than`` seconds old or more (see
    :func:`~sqla_queue.statements.prune.prune_leftovers_statement`); add the counts to
    ``removed``. Every layout's prune runs it last, in the prune's transaction."""
    leftovers: LeftoversParams = {"older_than": older_than}
    (row,) = yield prune_leftovers_statement(tables), leftovers
    add_counts(removed, row)


def set_limit(bind: SyncBind, tables: QueueTables, task: str, limit: int | None) -> None:
    """Store ``limit`` as the concurrency limit of ``task``; ``None`` deletes the stored one.

    ``limit`` is checked first (:func:`check_limit`). A role that may read the limits table
    but not write it (the application role of the deployment guide) gets
    :class:`~sqla_queue.InsufficientPrivilegeError` naming the ``GRANT`` that fixes it.
    """
    checked = check_limit(limit)
    connection = _connection(bind)
    try:
        if checked is None:
            deleted: DeleteLimitParams = {"task": task}
            connection.execute(delete_limit_statement(tables), deleted)
        else:
            stored: SetLimitParams = {"task": task, "concurrency_limit": checked}
            connection.execute(set_limit_statement(tables), stored)
    except DBAPIError as exc:
        if sqlstate_of(exc) != INSUFFICIENT_PRIVILEGE:
            raise
        raise operator_write_refused(
            connection,
            tables,
            exc,
            table=tables.limits.name,
            privileges=ADMIN_LIMIT_PRIVILEGES,
            doing="change a concurrency limit",
            needs=f"Changing limits needs {', '.join(ADMIN_LIMIT_PRIVILEGES)} on the limits "
            "table, beyond the application role's SELECT.",
        ) from exc


def operator_write_refused(
    connection: Connection,
    tables: QueueTables,
    exc: DBAPIError,
    *,
    table: str,
    privileges: tuple[str, ...],
    doing: str,
    needs: str,
) -> InsufficientPrivilegeError:
    """The error for a write that only the operator role may make (``doing``), refused for
    lack of ``privileges`` on ``table``: the cause, what is needed (``needs``), and the
    ``GRANT`` statements that fix it, on the schema the write touched (a tenant's, when
    ``connection`` has a ``schema_translate_map``)."""
    schema = tables_for(tables, connection).effective_schema or "<schema>"
    lacking = [RequiredPrivilege("table", table, privilege) for privilege in privileges]
    role = connection.engine.url.username or "<role>"
    grants = " ".join(grant_statements(lacking, schema, role))
    cause = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    return InsufficientPrivilegeError(
        f"cannot {doing}: {cause}. {needs} As the tables' owner, run: {grants} (the operator "
        f"role in {GRANTS_GUIDE}).",
        [need.describe(schema) for need in lacking],
    )


def stored_limits(bind: SyncBind, tables: QueueTables) -> dict[str, int]:
    """Every limit stored in the database, by task name (the values in code not included)."""
    rows = _connection(bind).execute(stored_limits_statement(tables)).all()
    return dict(rows)


def failed_jobs(bind: SyncBind, tables: QueueTables, *, limit: int) -> list[FailedJob]:
    """The ``limit`` most recently failed jobs, newest first (``limit``: 1 or more)."""
    params: FailedJobsParams = {"limit": check_failed_limit(limit)}
    rows = _connection(bind).execute(failed_jobs_statement(tables), params).all()
    return [
        FailedJob(
            id=row.id,
            task=row.task,
            attempts=row.attempts,
            finished_at=row.finished_at,
            last_error=row.last_error,
        )
        for row in rows
    ]
