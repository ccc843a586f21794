"""What a prune removes beyond the finished jobs themselves: their leftovers in every table.

:func:`~sqla_queue.statements.prune_statement` (plain history) and the partition drops of
:mod:`sqla_queue.history` delete old finished jobs together with the unique keys they hold
and their durable steps and signals. Two kinds of rows outlive their jobs' rows all the
same, and :func:`prune_leftovers_statement` removes them, under the same age rule, in every
history layout:

* the committed steps and the signals of a job whose row is gone. With
  ``history="none"`` a succeeded durable job's row is deleted by its completion, and its
  steps and signals stay behind; a table switched between layouts may hold more. The
  job's row is gone, so its age is that of its newest step or signal: they go once that
  is older than the prune's age (the job finished after its last step).
* a workflow, its nodes and its edges (which hold copies of the parents' results), once
  none of its jobs has a row any more: every job of the workflow finished and was pruned
  (or dropped with its partition). A workflow with one job left (queued, running, or a
  failed one kept for inspection) keeps every row. Its jobs finished before the age, so
  the workflow is at least that old too; its ``created_at`` is checked all the same.

The statement runs after the prune of the jobs, in its transaction, so it sees what that
prune removed. It returns one row: how many rows left each table.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import Double, Select, Table, bindparam, exists, func, select, union_all
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import seconds

__all__ = [
    "LEFTOVER_TABLES",
    "LeftoversParams",
    "prune_leftovers_statement",
]

#: The table roles whose counts :func:`prune_leftovers_statement` returns, in its columns'
#: order (each column is named after its role).
LEFTOVER_TABLES = ("job_steps", "job_signals", "workflows", "workflow_nodes", "workflow_edges")


class LeftoversParams(TypedDict):
    """Parameters of :func:`prune_leftovers_statement`."""

    #: The prune's age, in seconds: leftovers younger than this stay.
    older_than: float


def _count(cte: CTE) -> Any:
    return select(func.count()).select_from(cte).scalar_subquery()


def prune_leftovers_statement(tables: QueueTables) -> Select[Any]:
    """Delete the steps, signals and workflow rows whose jobs were pruned (see the module).

    Parameters: :class:`LeftoversParams`. Returns one row, a count per table role of
    :data:`LEFTOVER_TABLES`.
    """
    jobs = tables.jobs
    steps = tables.job_steps
    signals = tables.job_signals
    workflows = tables.workflows
    nodes = tables.workflow_nodes
    edges = tables.workflow_edges
    cutoff = func.now() - seconds(bindparam("older_than", type_=Double))

    # A job's marks: when each of its steps committed and each of its signals came.
    marks = union_all(
        select(steps.c.job_id, steps.c.committed_at.label("at")),
        select(signals.c.job_id, signals.c.sent_at.label("at")),
    ).subquery("marks")
    stale = (
        select(marks.c.job_id)
        .group_by(marks.c.job_id)
        .having(
            func.max(marks.c.at) < cutoff,
            ~exists(select(jobs.c.id).where(jobs.c.id == marks.c.job_id)),
        )
        .cte("stale")
    )
    steps_gone = (_deleting(steps, steps.c.job_id.in_(select(stale.c.job_id)), steps.c.job_id)).cte(
        "steps_gone"
    )
    signals_gone = (
        _deleting(signals, signals.c.job_id.in_(select(stale.c.job_id)), signals.c.job_id)
    ).cte("signals_gone")

    # A workflow none of whose jobs has a row: each one finished and was pruned.
    recorded = (
        select(nodes.c.job_id)
        .join(jobs, jobs.c.id == nodes.c.job_id)
        .where(nodes.c.workflow_id == workflows.c.id)
    )
    finished = select(workflows.c.id).where(workflows.c.created_at < cutoff, ~exists(recorded))
    ended = finished.cte("ended")
    their_nodes = select(nodes.c.job_id).where(nodes.c.workflow_id.in_(select(ended.c.id)))
    edges_gone = (_deleting(edges, edges.c.child_id.in_(their_nodes), edges.c.child_id)).cte(
        "edges_gone"
    )
    nodes_gone = (
        _deleting(nodes, nodes.c.workflow_id.in_(select(ended.c.id)), nodes.c.job_id)
    ).cte("nodes_gone")
    workflows_gone = (
        _deleting(workflows, workflows.c.id.in_(select(ended.c.id)), workflows.c.id)
    ).cte("workflows_gone")
    return select(
        _count(steps_gone).label("job_steps"),
        _count(signals_gone).label("job_signals"),
        _count(workflows_gone).label("workflows"),
        _count(nodes_gone).label("workflow_nodes"),
        _count(edges_gone).label("workflow_edges"),
    )


def _deleting(
    table: Table, condition: ColumnElement[bool], returned: ColumnElement[Any]
) -> ReturningDelete[Any]:
    """``DELETE FROM table WHERE condition RETURNING returned``."""
    return table.delete().where(condition).returning(returned)
