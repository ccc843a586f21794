"""A workflow's status, and its cancel: read and steered from outside its jobs.

Both take a ``source`` as ``queue.cancel`` does (an engine, connection, session or session
factory, or their async twins), and open a connection of their own: the cancel commits at
once, so that no worker waits for the caller's transaction.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from sqla_queue._binds import own_async_connection, own_connection, tables_for
from sqla_queue._sqlstate import SERIALIZATION_FAILURE, sqlstate_of
from sqla_queue.admin import check_job_ids
from sqla_queue.conversation import Flow, Step, drive, drive_async
from sqla_queue.errors import WorkflowNotFoundError
from sqla_queue.models.tables import JobStatus, NodeState, QueueTables
from sqla_queue.statements.lifecycle import CancelOutcome, cancel_lock_timeout_sql, cancel_statement
from sqla_queue.statements.workflow_admin import (
    cancel_nodes_statement,
    cancel_undecided_statement,
    cancel_workflow_statement,
    lock_undecided_statement,
    released_queued_statement,
    workflow_edges_statement,
    workflow_nodes_statement,
    workflow_row_statement,
)
from sqla_queue.workflows.advance import ReleaseStatements, advance_flow

__all__ = [
    "CANCEL_ATTEMPTS",
    "CANCEL_LOCK_TIMEOUT",
    "NodeStatus",
    "WorkflowStatus",
    "cancel_jobs_flow",
    "cancel_workflow",
    "header_dict",
    "workflow_state",
    "workflow_status",
]

#: Longest wait, in seconds, of a workflow's cancel for a row lock.
CANCEL_LOCK_TIMEOUT = 10
#: ``deadlock detected``: PostgreSQL rolled the transaction back to break a lock cycle.
DEADLOCK_DETECTED = "40P01"
#: How many times a workflow's cancel runs its transaction when PostgreSQL rolls it back
#: to break a deadlock, before it lets the error through.
CANCEL_ATTEMPTS = 20


def header_dict(workflow: Any) -> dict[str, Any]:
    """A workflow's id, name, state, row and times as plain JSON-ready values: the head of
    a status's and of a listing's ``--json``."""
    return {
        "id": workflow.id,
        "name": workflow.name,
        "state": workflow.state,
        "about": list(workflow.about) if workflow.about else None,
        "created_at": workflow.created_at.isoformat(),
        "cancelled_at": workflow.cancelled_at.isoformat() if workflow.cancelled_at else None,
    }


def workflow_state(cancelled: bool, counts: Mapping[str, int]) -> str:
    """A workflow's state from its nodes counted by shown state: cancelled, running (a
    node's job has not ended), held, failed, or succeeded. The one rule behind
    :attr:`WorkflowStatus.state` and the listing's summaries.

    A blocked node always has a parent that has not ended (a blocked, held or queued
    node). So when no node's job is queued, every blocked node waits, through its
    ancestors, for a held one: the workflow is ``held``, however many blocked nodes follow
    the held one. Nothing can run until an operator requeues the held node's failed parent.
    """
    if cancelled:
        return "cancelled"
    if counts.get(JobStatus.QUEUED):
        return "running"
    if counts.get(NodeState.HELD):
        return "held"
    if counts.get(NodeState.BLOCKED):
        # Not reached while every blocked node has an open parent (see above); were a
        # node left blocked with none, it still has not ended.
        return "running"
    if counts.get(JobStatus.FAILED) or counts.get(JobStatus.CANCELLED):
        return "failed"
    return "succeeded"


@dataclass(frozen=True)
class NodeStatus:
    """One node of a workflow as it stands."""

    name: str
    job_id: int
    #: The node's :class:`~sqla_queue.models.tables.NodeState` value.
    state: str
    #: The job's task and status (None once the job was pruned from the history).
    task: str | None
    status: str | None
    attempts: int | None
    finished_at: dt.datetime | None
    policy: str
    quorum: int | None
    on_parent_failure: str
    #: The names of the node's parents.
    parents: list[str] = field(default_factory=list)

    @property
    def shown_state(self) -> str:
        """One word for the node: ``blocked``, ``held``, its job's status, or ``pruned``."""
        if self.state in NodeState.UNDECIDED:
            return self.state
        return self.status or "pruned"


@dataclass(frozen=True)
class WorkflowStatus:
    """A workflow and each of its nodes.

    ``state`` is ``cancelled`` (someone cancelled it), ``running`` (a node's job has not
    ended), ``held`` (no job is queued or running, and a node, with every blocked node
    after it, waits for an operator to requeue its failed parent), ``failed`` (it ended
    with a node failed or ruled out) or ``succeeded``.
    """

    id: int
    name: str
    about: tuple[str, str] | None
    created_at: dt.datetime
    cancelled_at: dt.datetime | None
    nodes: list[NodeStatus]

    @property
    def state(self) -> str:
        """The workflow's state, derived from its nodes (see the class docstring)."""
        return workflow_state(self.cancelled_at is not None, Counter(self.shown_states))

    @property
    def shown_states(self) -> list[str]:
        """Each node's :attr:`NodeStatus.shown_state`, in node order."""
        return [node.shown_state for node in self.nodes]

    def node(self, name: str) -> NodeStatus:
        """The node named ``name``; ``KeyError`` if the workflow has none."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        """The status as plain JSON-ready values (the CLI's ``--json``)."""
        return {
            **header_dict(self),
            "nodes": [
                {
                    "name": n.name,
                    "job_id": n.job_id,
                    "state": n.shown_state,
                    "task": n.task,
                    "attempts": n.attempts,
                    "parents": n.parents,
                    "policy": n.policy,
                    "quorum": n.quorum,
                    "on_parent_failure": n.on_parent_failure,
                }
                for n in self.nodes
            ],
        }


def status_flow(tables: QueueTables, workflow_id: int) -> Flow[WorkflowStatus]:
    """Read ``workflow_id``'s row, nodes and edges.

    Raises :class:`~sqla_queue.errors.WorkflowNotFoundError` if it does not exist.
    """
    params = {"wf": workflow_id}
    found = yield Step(workflow_row_statement(tables), params)
    if not found:
        raise WorkflowNotFoundError(
            f"no workflow {workflow_id} in this queue", workflow_id=workflow_id
        )
    row = found[0]
    nodes = yield Step(workflow_nodes_statement(tables), params)
    edges = yield Step(workflow_edges_statement(tables), params)
    names = {n.job_id: n.name for n in nodes}
    parents: dict[int, list[str]] = {}
    for child, parent, _ in edges:
        parents.setdefault(child, []).append(names.get(parent, str(parent)))
    about = (row.about_table, row.about_key) if row.about_key is not None else None
    return WorkflowStatus(
        id=row.id,
        name=row.name,
        about=about,
        created_at=row.created_at,
        cancelled_at=row.cancelled_at,
        nodes=[
            NodeStatus(
                name=n.name,
                job_id=n.job_id,
                state=n.state,
                task=n.task,
                status=n.status,
                attempts=n.attempts,
                finished_at=n.finished_at,
                policy=n.policy,
                quorum=n.quorum,
                on_parent_failure=n.on_parent_failure,
                parents=parents.get(n.job_id, []),
            )
            for n in nodes
        ],
    )


def _one_id(workflow_id: object) -> int:
    return check_job_ids([workflow_id])[0]  # type: ignore[list-item]


def workflow_status(source: Any, tables: QueueTables, workflow_id: int) -> Any:
    """The :class:`WorkflowStatus` of ``workflow_id`` (a coroutine for an async source)."""
    wanted = _one_id(workflow_id)
    if _is_async(source):
        return _status_async(source, tables, wanted)
    with own_connection(source, "queue.workflow_status") as connection, connection.begin():
        return drive(connection, status_flow(tables_for(tables, connection), wanted))


async def _status_async(source: Any, tables: QueueTables, workflow_id: int) -> WorkflowStatus:
    async with (
        own_async_connection(source, "queue.workflow_status") as connection,
        connection.begin(),
    ):
        flow = status_flow(tables_for(tables, connection), workflow_id)
        return await drive_async(connection, flow)


def cancel_jobs_flow(
    tables: QueueTables, release: ReleaseStatements, ids: Sequence[int]
) -> Flow[dict[int, str]]:
    """Cancel the jobs ``ids`` (``queue.cancel``), nodes waiting for parents included, and
    advance their workflows; ``{id: CancelOutcome value}``."""
    asked = {"ids": list(ids)}
    waiting = {row[0] for row in (yield Step(cancel_nodes_statement(tables), asked))}
    rows = yield Step(cancel_statement(tables), asked)
    outcomes = {
        int(job_id): CancelOutcome.CANCELLED if job_id in waiting else str(outcome)
        for job_id, outcome in rows
    }
    ended = [i for i, outcome in outcomes.items() if outcome == CancelOutcome.CANCELLED]
    if ended:
        yield from advance_flow(release, ended)
    return outcomes


def _cancel_released_flow(
    tables: QueueTables, params: dict[str, int], seen: set[int]
) -> Flow[tuple[list[int], int]]:
    """Cancel the queued jobs of ``wf``'s released nodes not in ``seen`` (added to it);
    ``(ids cancelled, how many running ones were asked to stop)``."""
    rows = yield Step(released_queued_statement(tables), params)
    queued = [row[0] for row in rows if row[0] not in seen]
    seen.update(queued)
    ended: list[int] = []
    requested = 0
    if queued:
        for job_id, outcome in (yield Step(cancel_statement(tables), {"ids": queued})):
            if outcome == CancelOutcome.CANCELLED:
                ended.append(job_id)
            elif outcome == CancelOutcome.REQUESTED:
                requested += 1
    return ended, requested


def cancel_workflow_flow(
    tables: QueueTables, release: ReleaseStatements, workflow_id: int
) -> Flow[dict[str, int]]:
    """Cancel ``workflow_id``; ``{"cancelled": jobs ended, "requested": running ones asked
    to stop}``. :class:`~sqla_queue.errors.WorkflowNotFoundError` if it does not exist.

    Locks are taken in the order a completion takes them: the released jobs' executions
    and rows first, then the undecided nodes in id order (as a release locks the nodes it
    decides). A completion that releases a node while the cancel waits for its job is
    seen by a second look at the released jobs, after the nodes are cancelled: from then
    on no node of the workflow can be released.
    """
    params = {"wf": workflow_id}
    if not (yield Step(cancel_workflow_statement(tables), params)):
        raise WorkflowNotFoundError(
            f"no workflow {workflow_id} in this queue", workflow_id=workflow_id
        )
    seen: set[int] = set()
    ended, requested = yield from _cancel_released_flow(tables, params, seen)
    # Statements of their own: they see what a requeue that held the row committed, and
    # what a completion that the cancel above waited for released.
    yield Step(lock_undecided_statement(tables), params)
    ended += [row[0] for row in (yield Step(cancel_undecided_statement(tables), params))]
    more, asked = yield from _cancel_released_flow(tables, params, seen)
    ended += more
    requested += asked
    if ended:
        yield from advance_flow(release, ended)
    return {"cancelled": len(ended), "requested": requested}


def _retry_delay(attempt: int) -> float:
    """How long a cancel waits before its next attempt after a deadlock."""
    return float(min(1.0, 0.02 * 2**attempt) * (0.5 + random.random()))


def _deadlocked(exc: BaseException, attempt: int) -> bool:
    """Whether ``exc`` is a deadlock (or serialization failure) that one more attempt of
    the cancel may get past."""
    retryable = sqlstate_of(exc) in (DEADLOCK_DETECTED, SERIALIZATION_FAILURE)
    return retryable and attempt < CANCEL_ATTEMPTS


def cancel_workflow(
    source: Any, tables: QueueTables, workflow_id: int, *, notify: bool = True
) -> Any:
    """Cancel ``workflow_id`` in a short transaction of its own (see
    :func:`cancel_workflow_flow`); a coroutine for an async source.

    It waits at most :data:`CANCEL_LOCK_TIMEOUT` seconds for a row another transaction
    holds (a completion releasing one of its nodes, say): the two take turns, and a node
    is either released and then cancelled as a job, or cancelled before it is released.
    Should PostgreSQL still find it in a deadlock with a worker's cascade (two cascades
    that cross can wait for each other), the cancel's transaction is rolled back whole
    and run again, up to :data:`CANCEL_ATTEMPTS` times: the caller never sees the deadlock.
    """
    wanted = _one_id(workflow_id)
    if _is_async(source):
        return _cancel_async(source, tables, wanted, notify)
    attempt = 1
    while True:
        try:
            with (
                own_connection(source, "queue.cancel_workflow") as connection,
                connection.begin(),
            ):
                connection.exec_driver_sql(cancel_lock_timeout_sql(CANCEL_LOCK_TIMEOUT))
                translated = tables_for(tables, connection)
                release = ReleaseStatements(translated, notify=notify)
                done: dict[str, int] = drive(
                    connection, cancel_workflow_flow(translated, release, wanted)
                )
                return done
        except DBAPIError as exc:
            if not _deadlocked(exc, attempt):
                raise
        time.sleep(_retry_delay(attempt))
        attempt += 1


async def _cancel_async(
    source: Any, tables: QueueTables, workflow_id: int, notify: bool
) -> dict[str, int]:
    attempt = 1
    while True:
        try:
            async with (
                own_async_connection(source, "queue.cancel_workflow") as connection,
                connection.begin(),
            ):
                await connection.exec_driver_sql(cancel_lock_timeout_sql(CANCEL_LOCK_TIMEOUT))
                translated = tables_for(tables, connection)
                release = ReleaseStatements(translated, notify=notify)
                flow = cancel_workflow_flow(translated, release, workflow_id)
                done: dict[str, int] = await drive_async(connection, flow)
                return done
        except DBAPIError as exc:
            if not _deadlocked(exc, attempt):
                raise
        await asyncio.sleep(_retry_delay(attempt))
        attempt += 1


def _is_async(source: object) -> bool:
    return isinstance(source, AsyncEngine | AsyncConnection | AsyncSession | async_sessionmaker)
