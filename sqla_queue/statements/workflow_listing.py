"""Listing workflows for people: the most recent ones with their nodes counted by state,
and the workflow a job belongs to.

:func:`workflow_listing_statement` is what ``sqla-queue workflows`` and the dashboard's
workflow list run (through :func:`sqla_queue.workflows.listing.list_workflows`). It walks
the workflows' primary key newest first, stops at ``limit`` rows, and counts each one's
nodes through the ``(workflow_id, name)`` index and the jobs' primary key: the cost is the
nodes of the workflows shown, whatever the size of the tables. No row is locked.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from sqlalchemy import BigInteger, Select, bindparam, case, func, select, true

from sqla_queue.models.tables import JobStatus, NodeState, QueueTables
from sqla_queue.statements._common import state_literal

__all__ = [
    "SHOWN_STATES",
    "WorkflowListingParams",
    "node_workflow_statement",
    "workflow_listing_statement",
]

#: Every word a node shows as (``NodeStatus.shown_state``): waiting for its parents,
#: held for an operator, its job's status once released, or ``pruned`` once its job row
#: left the history. Each is a column of :func:`workflow_listing_statement`.
SHOWN_STATES = (
    NodeState.BLOCKED,
    NodeState.HELD,
    JobStatus.QUEUED,
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    "pruned",
)


class WorkflowListingParams(TypedDict):
    """Parameters of :func:`workflow_listing_statement`."""

    #: How many workflows to list at most.
    limit: int
    #: Only workflows with a smaller id (``bigint``), with ``before=True``.
    before: NotRequired[int]


def _shown_state(tables: QueueTables) -> Any:
    """A node's one word, as ``NodeStatus.shown_state`` says it, computed by the database."""
    nodes = tables.workflow_nodes
    undecided = [state_literal(s) for s in NodeState.UNDECIDED]
    return case(
        (nodes.c.state.in_(undecided), nodes.c.state),
        else_=func.coalesce(tables.jobs.c.status, state_literal("pruned")),
    )


def workflow_listing_statement(tables: QueueTables, *, before: bool = False) -> Select[Any]:
    """The ``limit`` most recent workflows (by id, newest first), below ``before`` if
    built with it, each with its row's columns, ``nodes`` (how many) and one count per
    word of :data:`SHOWN_STATES` (``blocked``, ``held``, ``queued``, ...).

    Parameters: :class:`WorkflowListingParams`. How it reads: a backward walk of the
    workflows' primary key cut at ``limit``, then, per workflow, its nodes through the
    ``(workflow_id, name)`` index joined to their jobs by primary key (a pruned job
    counts as ``pruned``).
    """
    w = tables.workflows
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    recent = select(
        w.c.id, w.c.name, w.c.about_table, w.c.about_key, w.c.created_at, w.c.cancelled_at
    )
    if before:
        recent = recent.where(w.c.id < bindparam("before", type_=BigInteger))
    page = recent.order_by(w.c.id.desc()).limit(bindparam("limit")).subquery("recent")
    shown = _shown_state(tables)
    counts = (
        select(
            func.count().label("nodes"),
            *(func.count().filter(shown == state_literal(s)).label(s) for s in SHOWN_STATES),
        )
        .select_from(nodes.outerjoin(jobs, jobs.c.id == nodes.c.job_id))
        .where(nodes.c.workflow_id == page.c.id)
        .lateral("counts")
    )
    return select(page, counts).select_from(page.join(counts, true())).order_by(page.c.id.desc())


def node_workflow_statement(tables: QueueTables) -> Select[Any]:
    """``(workflow_id, name, state, failed_parent)`` of the node whose job is ``job_id``
    (``bigint``), by the nodes' primary key: no row for a job outside every workflow.

    ``failed_parent`` is, for a ``held`` node, the parent whose failure holds it (the
    lowest id of those that did not succeed): the job to requeue to resume it.
    """
    nodes = tables.workflow_nodes
    edges = tables.workflow_edges
    failed = (
        select(func.min(edges.c.parent_id))
        .where(
            edges.c.child_id == nodes.c.job_id,
            edges.c.outcome != state_literal(JobStatus.SUCCEEDED),
        )
        .scalar_subquery()
    )
    held = nodes.c.state == state_literal(NodeState.HELD)
    return select(
        nodes.c.workflow_id,
        nodes.c.name,
        nodes.c.state,
        case((held, failed), else_=None).label("failed_parent"),
    ).where(nodes.c.job_id == bindparam("job_id", type_=BigInteger))
