"""Reading and steering workflows: status, cancel, and the resume of a requeued node."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    and_,
    any_,
    bindparam,
    exists,
    func,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import NodeState, QueueTables
from sqla_queue.statements._common import CANCELLED, QUEUED, state_literal
from sqla_queue.statements.workflows import cancel_node_jobs

__all__ = [
    "cancel_nodes_statement",
    "cancel_undecided_statement",
    "cancel_workflow_statement",
    "lock_ruled_out_statement",
    "lock_undecided_statement",
    "lock_workflows_of_statement",
    "released_queued_statement",
    "resume_statement",
    "rival_workflows_statement",
    "unique_keys_of_statement",
    "workflow_edges_statement",
    "workflow_nodes_statement",
    "workflow_row_statement",
]

_UNDECIDED = [state_literal(s) for s in NodeState.UNDECIDED]


def _workflow_id() -> Any:
    return bindparam("wf", type_=BigInteger)


def workflow_row_statement(tables: QueueTables) -> Select[Any]:
    """The row of workflow ``workflow_id``."""
    w = tables.workflows
    return select(
        w.c.id, w.c.name, w.c.about_table, w.c.about_key, w.c.created_at, w.c.cancelled_at
    ).where(w.c.id == _workflow_id())


def workflow_nodes_statement(tables: QueueTables) -> Select[Any]:
    """Each node of ``workflow_id`` with its job's task, status and attempts, by job id.

    The job may have been pruned from the history: its columns are then NULL.
    """
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    return (
        select(
            nodes.c.name,
            nodes.c.job_id,
            nodes.c.state,
            nodes.c.policy,
            nodes.c.quorum,
            nodes.c.on_parent_failure,
            jobs.c.task,
            jobs.c.status,
            jobs.c.attempts,
            jobs.c.finished_at,
        )
        .select_from(nodes.outerjoin(jobs, jobs.c.id == nodes.c.job_id))
        .where(nodes.c.workflow_id == _workflow_id())
        .order_by(nodes.c.job_id)
    )


def workflow_edges_statement(tables: QueueTables) -> Select[Any]:
    """``(child_id, parent_id, outcome)`` of every edge of ``workflow_id``."""
    edges = tables.workflow_edges
    nodes = tables.workflow_nodes
    return (
        select(edges.c.child_id, edges.c.parent_id, edges.c.outcome)
        .select_from(edges.join(nodes, nodes.c.job_id == edges.c.child_id))
        .where(nodes.c.workflow_id == _workflow_id())
        .order_by(edges.c.child_id, edges.c.parent_id)
    )


def cancel_workflow_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Mark workflow ``wf`` cancelled; its id if it exists.

    Its row stays locked until the transaction ends: a write into the workflow (an
    expansion) and a requeue of one of its nodes wait, and then see it cancelled. The
    caller then cancels the undecided nodes in a statement of its own
    (:func:`cancel_undecided_statement`), whose snapshot sees what a requeue that held the
    row before committed.
    """
    w = tables.workflows
    return (
        update(w)
        .where(w.c.id == _workflow_id())
        .values(cancelled_at=func.coalesce(w.c.cancelled_at, func.now()))
        .returning(w.c.id)
    )


def lock_undecided_statement(tables: QueueTables) -> Select[Any]:
    """Lock the undecided nodes of workflow ``wf`` in id order; their ids.

    The order in which a release locks the nodes it decides
    (:func:`~sqla_queue.statements.release.lock_nodes_statement`): a cancel of the
    workflow and a completion that releases its nodes never wait for each other in a
    circle over them. Run before :func:`cancel_undecided_statement`.
    """
    nodes = tables.workflow_nodes
    return (
        select(nodes.c.job_id)
        .where(nodes.c.workflow_id == _workflow_id(), nodes.c.state.in_(_UNDECIDED))
        .order_by(nodes.c.job_id)
        .with_for_update(of=nodes)
    )


def cancel_undecided_statement(tables: QueueTables) -> Select[Any]:
    """Cancel the undecided nodes of workflow ``wf`` and their jobs; the jobs' ids."""
    nodes = tables.workflow_nodes
    dropped = (
        update(nodes)
        .where(nodes.c.workflow_id == _workflow_id(), nodes.c.state.in_(_UNDECIDED))
        .values(state=state_literal(NodeState.CANCELLED))
        .returning(nodes.c.job_id)
        .cte("dropped")
    )
    ended = cancel_node_jobs(tables, dropped, "WorkflowCancelled", "the workflow was cancelled")
    return select(ended.c.id)


def released_queued_statement(tables: QueueTables) -> Select[Any]:
    """The jobs of ``workflow_id``'s released nodes that have not ended, by id."""
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    return (
        select(nodes.c.job_id)
        .select_from(nodes.join(jobs, jobs.c.id == nodes.c.job_id))
        .where(
            nodes.c.workflow_id == _workflow_id(),
            nodes.c.state == state_literal(NodeState.RELEASED),
            jobs.c.status == QUEUED,
        )
        .order_by(nodes.c.job_id)
    )


def cancel_nodes_statement(tables: QueueTables) -> Select[Any]:
    """Cancel the undecided nodes among the jobs ``ids`` (bigint[]); the ids it cancelled.

    For ``queue.cancel`` of a node that waits for its parents: it has no execution, so
    the job cancel alone would not reach it.
    """
    nodes = tables.workflow_nodes
    dropped = (
        update(nodes)
        .where(
            nodes.c.job_id == any_(bindparam("ids", type_=ARRAY(BigInteger))),
            nodes.c.state.in_(_UNDECIDED),
        )
        .values(state=state_literal(NodeState.CANCELLED))
        .returning(nodes.c.job_id)
        .cte("dropped")
    )
    ended = cancel_node_jobs(
        tables, dropped, "WorkflowCancelled", "cancelled while it waited for its parents"
    )
    return select(ended.c.id)


def _ruled_out(tables: QueueTables) -> Any:
    """A recursive CTE of the descendants of the jobs ``ids`` (bigint[]) that their
    failure ruled out: their children, and down through the nodes cancelled without
    running."""
    edges = tables.workflow_edges
    nodes = tables.workflow_nodes
    seed = select(edges.c.child_id.label("id")).where(
        edges.c.parent_id == any_(bindparam("ids", type_=ARRAY(BigInteger)))
    )
    down = seed.cte("down", recursive=True)
    step = (
        select(edges.c.child_id)
        .select_from(edges.join(down, edges.c.parent_id == down.c.id))
        .join(nodes, nodes.c.job_id == down.c.id)
        .where(nodes.c.state == state_literal(NodeState.CANCELLED))
    )
    return down.union(step)


def lock_ruled_out_statement(tables: QueueTables) -> Select[Any]:
    """Lock, in id order, the nodes :func:`resume_statement` may reopen for the requeued
    jobs ``ids``: the order in which a release locks nodes, so the two never wait for each
    other in a circle."""
    nodes = tables.workflow_nodes
    down = _ruled_out(tables)
    return (
        select(nodes.c.job_id)
        .where(nodes.c.job_id.in_(select(down.c.id)))
        .order_by(nodes.c.job_id)
        .with_for_update(of=nodes)
    )


def resume_statement(tables: QueueTables) -> Select[Any]:
    """Reopen the workflow past the requeued jobs ``ids`` (bigint[]).

    The dependents that the requeued nodes' failure ruled out (cancelled or held, never
    run) wait for them again, down the graph: their jobs are queued again, and the edges
    into them lose their outcome. A dependent that ran keeps its edge as it was (a
    requeued node that then expands hands over only the edges still open). Nodes of a
    cancelled workflow are left alone (the caller refuses those); the caller locks the
    nodes first (:func:`lock_ruled_out_statement`). Returns the nodes reopened.
    """
    edges = tables.workflow_edges
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    ids = bindparam("ids", type_=ARRAY(BigInteger))
    down = _ruled_out(tables)
    reopened = (
        update(nodes)
        .where(
            nodes.c.job_id.in_(select(down.c.id)),
            nodes.c.state.in_([*_UNDECIDED, state_literal(NodeState.CANCELLED)]),
        )
        .values(state=state_literal(NodeState.BLOCKED))
        .returning(nodes.c.job_id)
        .cte("reopened")
    )
    requeued = (
        update(jobs)
        .where(jobs.c.id == reopened.c.job_id, jobs.c.status == CANCELLED)
        .values(status=QUEUED, finished_at=None)
        .returning(jobs.c.id)
        .cte("requeued")
    )
    cleared = (
        update(edges)
        .where(
            edges.c.child_id.in_(select(reopened.c.job_id)),
            (edges.c.parent_id == any_(ids)) | edges.c.parent_id.in_(select(reopened.c.job_id)),
            edges.c.outcome.is_not(None),
        )
        .values(outcome=None, result=None)
        .returning(edges.c.child_id)
        .cte("cleared")
    )
    return select(reopened.c.job_id).add_cte(requeued, cleared)


def lock_workflows_of_statement(tables: QueueTables) -> Select[Any]:
    """``(job_id, cancelled, state, name, status, workflow_id)`` of the nodes among the jobs
    ``ids`` (bigint[]), their workflows' rows locked ``FOR SHARE``: a requeue and a cancel
    of the workflow take turns, and the one that comes second sees what the first did.
    ``name`` is the node's, ``status`` its job's (NULL once pruned)."""
    nodes = tables.workflow_nodes
    w = tables.workflows
    jobs = tables.jobs
    return (
        select(
            nodes.c.job_id,
            w.c.cancelled_at.is_not(None).label("cancelled"),
            nodes.c.state,
            nodes.c.name,
            jobs.c.status,
            w.c.id.label("workflow_id"),
        )
        .select_from(
            nodes.join(w, w.c.id == nodes.c.workflow_id).outerjoin(
                jobs, jobs.c.id == nodes.c.job_id
            )
        )
        .where(nodes.c.job_id == any_(bindparam("ids", type_=ARRAY(BigInteger))))
        .order_by(w.c.id, nodes.c.job_id)
        .with_for_update(of=w, read=True)
    )


def _live(tables: QueueTables, workflow: Any) -> ColumnElement[bool]:
    """Whether ``workflow`` (the table or an alias) is live: not cancelled, with a node
    undecided or a job not ended (as :func:`~sqla_queue.statements.workflows.
    live_workflow_statement` reads it)."""
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    unfinished = exists(
        select(nodes.c.job_id)
        .select_from(nodes.join(jobs, jobs.c.id == nodes.c.job_id))
        .where(
            nodes.c.workflow_id == workflow.c.id,
            or_(nodes.c.state.in_(_UNDECIDED), jobs.c.status == QUEUED),
        )
    )
    return and_(workflow.c.cancelled_at.is_(None), unfinished)


def unique_keys_of_statement(tables: QueueTables) -> Select[Any]:
    """``(id, name, about_table, about_key)`` of the workflows ``wfs`` (bigint[]) that are
    about a row and not live: a requeue of one of their nodes makes them live again, which
    the rule of one live workflow per row and name must allow. In id order."""
    w = tables.workflows
    return (
        select(w.c.id, w.c.name, w.c.about_table, w.c.about_key)
        .where(
            w.c.id == any_(bindparam("wfs", type_=ARRAY(BigInteger))),
            w.c.about_key.is_not(None),
            not_(_live(tables, w)),
        )
        .order_by(w.c.id)
    )


def rival_workflows_statement(tables: QueueTables) -> Select[Any]:
    """``(workflow_id, rival)`` for each workflow of ``wfs`` (bigint[]) that another live
    workflow of its name about its row stands in for: ``rival`` is the newest such one.

    Run under the unique workflows' advisory locks of those rows and names
    (:func:`~sqla_queue.statements.workflows.workflow_lock_statement`), in a statement of
    its own: it sees a unique enqueue that held the lock before.
    """
    w = tables.workflows
    other = w.alias("other")
    rival = (
        select(other.c.id)
        .where(
            other.c.name == w.c.name,
            other.c.about_table == w.c.about_table,
            other.c.about_key == w.c.about_key,
            other.c.id != w.c.id,
            _live(tables, other),
        )
        .order_by(other.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    found = select(w.c.id.label("workflow_id"), rival.label("rival")).where(
        w.c.id == any_(bindparam("wfs", type_=ARRAY(BigInteger))),
        w.c.about_key.is_not(None),
    )
    inner = found.subquery("found")
    return select(inner.c.workflow_id, inner.c.rival).where(inner.c.rival.is_not(None))
