"""The operator's views of workflows: the recent ones in a few words each, one in full,
and the workflow a job belongs to.

Every function here reads in the caller's transaction (a ``Connection`` or ``Session``,
or their async twins: a coroutine then) and commits nothing: ``sqla-queue workflows`` and
the dashboard read a list and a workflow in one short transaction of their own.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqla_queue._binds import AnyBind, on_connection, tables_for
from sqla_queue.admin import check_job_ids
from sqla_queue.checks import check_row_limit
from sqla_queue.conversation import Flow, Step, run_flow
from sqla_queue.models.tables import NodeState, QueueTables
from sqla_queue.statements.workflow_listing import (
    SHOWN_STATES,
    WorkflowListingParams,
    node_workflow_statement,
    workflow_listing_statement,
)
from sqla_queue.workflows.admin import WorkflowStatus, header_dict, status_flow, workflow_state

__all__ = [
    "SHOWN_STATES",
    "NodeOf",
    "WorkflowSummary",
    "list_workflows",
    "read_workflow",
    "workflow_of_job",
    "workflow_state",
]


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow as a listing shows it: its row and its nodes counted by shown state."""

    id: int
    name: str
    about: tuple[str, str] | None
    created_at: dt.datetime
    cancelled_at: dt.datetime | None
    #: How many nodes it has.
    nodes: int
    #: Per word of :data:`SHOWN_STATES`, the nodes showing it (only the words with some).
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The workflow's state (see :func:`workflow_state`)."""
        return workflow_state(self.cancelled_at is not None, self.counts)

    def as_dict(self) -> dict[str, Any]:
        """The summary as plain JSON-ready values (the CLI's ``--json``)."""
        return {
            **header_dict(self),
            "nodes": self.nodes,
            "counts": dict(self.counts),
        }


def listing_flow(
    tables: QueueTables, *, limit: int, before: int | None = None
) -> Flow[list[WorkflowSummary]]:
    """Read the ``limit`` most recent workflows (below id ``before`` if given)."""
    params: WorkflowListingParams = {"limit": limit}
    if before is not None:
        params["before"] = before
    statement = workflow_listing_statement(tables, before=before is not None)
    rows = yield Step(statement, params)
    summaries = []
    for row in rows:
        values = row._mapping
        counts = {s: int(values[s]) for s in SHOWN_STATES if values[s]}
        about = (row.about_table, row.about_key) if row.about_key is not None else None
        summaries.append(
            WorkflowSummary(
                id=row.id,
                name=row.name,
                about=about,
                created_at=row.created_at,
                cancelled_at=row.cancelled_at,
                nodes=int(row.nodes),
                counts=counts,
            )
        )
    return summaries


def list_workflows(
    bind: AnyBind, tables: QueueTables, *, limit: int = 20, before: int | None = None
) -> Any:
    """The ``limit`` most recent workflows, newest first, as :class:`WorkflowSummary`
    (a coroutine of the list for an async ``bind``); ``before`` lists those with a
    smaller id (the next page after the last id shown)."""
    limit = check_row_limit("limit", limit)
    if before is not None:
        before = _one_id(before)

    def read(connection: Any) -> Any:
        flow = listing_flow(tables_for(tables, connection), limit=limit, before=before)
        return run_flow(connection, flow)

    return on_connection(bind, read)


def read_workflow(bind: AnyBind, tables: QueueTables, workflow_id: int) -> Any:
    """The :class:`~sqla_queue.workflows.WorkflowStatus` of ``workflow_id`` read in
    ``bind``'s transaction (``queue.workflow_status`` opens a connection of its own; a
    page that reads other things too reads it here). A coroutine for an async ``bind``.

    Raises :class:`~sqla_queue.errors.WorkflowNotFoundError` if it does not exist.
    """
    wanted = _one_id(workflow_id)

    def read(connection: Any) -> Any:
        flow: Flow[WorkflowStatus] = status_flow(tables_for(tables, connection), wanted)
        return run_flow(connection, flow)

    return on_connection(bind, read)


@dataclass(frozen=True)
class NodeOf:
    """The workflow a job belongs to, the job's node name in it and the node's state."""

    workflow_id: int
    name: str
    #: The node's :class:`~sqla_queue.models.tables.NodeState` value.
    state: str = NodeState.RELEASED
    #: For a held node: the failed parent to requeue to resume it.
    failed_parent: int | None = None

    def resume_hint(self, app: str = "APP") -> str | None:
        """How to resume a held node, in a sentence that names the command; else None."""
        if self.state != NodeState.HELD or self.failed_parent is None:
            return None
        parent = self.failed_parent
        return (
            f"held: its parent job {parent} did not succeed; fix the cause, then requeue "
            f"job {parent} to resume it (sqla-queue requeue {app} {parent}, or "
            "queue.requeue, or Requeue on that job's page)"
        )


def _node_flow(tables: QueueTables, job_id: int) -> Flow[NodeOf | None]:
    rows = yield Step(node_workflow_statement(tables), {"job_id": job_id})
    if not rows:
        return None
    row = rows[0]
    parent = None if row.failed_parent is None else int(row.failed_parent)
    return NodeOf(int(row.workflow_id), str(row.name), str(row.state), parent)


def workflow_of_job(bind: AnyBind, tables: QueueTables, job_id: int) -> Any:
    """The :class:`NodeOf` job ``job_id`` (``None`` if it is no workflow's node; a
    coroutine of it for an async ``bind``)."""
    wanted = _one_id(job_id)

    def read(connection: Any) -> Any:
        return run_flow(connection, _node_flow(tables_for(tables, connection), wanted))

    return on_connection(bind, read)


def _one_id(value: object) -> int:
    """A workflow or job id: a whole number from 1 to the bigint maximum (else raise)."""
    return check_job_ids([value])[0]  # type: ignore[list-item]
