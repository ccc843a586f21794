"""The release of a workflow's nodes, in the transaction that finished their parents.

Three statements, run by :func:`sqla_queue.workflows.advance.advance_flow` after any
statement that ends jobs (a completion, a cancel), before that transaction commits:

1. :func:`advance_statement` writes each ended job's outcome (and its result, or its last
   error) on the edges to its dependents, then decides at once every dependent that has
   only this parent. A dependent with several parents is a *candidate* unless another of
   its parents has not ended and is not ending now; the statement says so by locking one
   such parent's edge ``FOR SHARE SKIP LOCKED``: an edge that another transaction is
   marking is locked, and skipped, and an edge this statement locks cannot be marked by
   its parent until this transaction ends. So the parent whose transaction ends last
   always finds no such edge, and is a candidate.
2. :func:`lock_nodes_statement` locks the candidates, in id order (two transactions that
   share candidates never wait for each other in a circle). The probe of step 1 never takes
   as evidence the edge of a node this transaction may lock here: it would hold a share
   lock that the node's decider needs to mark that edge, while it waits for that node.
3. :func:`decide_statement`, a new statement and so a new snapshot taken after the locks
   were granted, counts each candidate's parents as committed by then, and decides.

Only candidates take a lock on the node: the ten thousand parents of a callback finish
without waiting for each other, and only the last few (those that find every other
parent ending or ended) serialize on the callback's row. The same node is released at
most once (the release is an update of ``state`` from blocked or held, which a second
decision finds done), and never stranded: the last parent to commit decides it.

A transaction whose cascade runs several rounds locks the nodes of a later round after
those of an earlier one; two cascades that cross can still wait for each other. PostgreSQL
detects it and rolls one back whole, and its worker retries the flush (the outcomes stay
buffered): a delay, never a half-advanced graph.

A decision releases a node (writes its execution, ``pending`` or ``waiting`` behind its
``queue_id`` like an enqueue, and wakes the workers), cancels it (its job ends
``cancelled``, and its own dependents are advanced in turn: the statements return the
ids), or holds it (a parent failed under ``on_parent_failure="hold"``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    CTE,
    BigInteger,
    CompoundSelect,
    Select,
    Text,
    all_,
    and_,
    any_,
    bindparam,
    case,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import JobStatus, NodeState, ParentFailure, ParentPolicy, QueueTables
from sqla_queue.statements._common import (
    ONE,
    QUEUED,
    SUCCEEDED,
    due_at,
    state_literal,
)
from sqla_queue.statements.workflows import cancel_node_jobs, node_runs

__all__ = [
    "AdvanceParams",
    "Verdict",
    "advance_statement",
    "decide_statement",
    "lock_nodes_statement",
    "verdict",
]


class AdvanceParams(TypedDict):
    """Parameters of the three release statements: the job ids (bigint[])."""

    ids: list[int]


class Verdict:
    """What a decision does to a node; the first column of the statements' rows.

    ``candidate`` rows come from :func:`advance_statement` only: nodes to lock and decide.
    ``cancelled`` rows are jobs that this decision ended, whose dependents the caller
    advances next. ``released`` rows are for the caller's count.
    """

    RELEASE = "release"
    CANCEL = "cancel"
    HOLD = "hold"
    CANDIDATE = "candidate"
    RELEASED = "released"
    CANCELLED = "cancelled"


_UNDECIDED = [state_literal(s) for s in NodeState.UNDECIDED]


def verdict(
    nodes: Any,
    open_parents: ColumnElement[Any],
    succeeded: ColumnElement[Any],
    failed: ColumnElement[Any],
) -> ColumnElement[Any]:
    """The SQL ``CASE`` that decides a node from its parents' counts, or NULL to wait.

    ``open_parents`` have not ended; ``failed`` ended failed or cancelled. It reads the
    node's ``policy``, ``quorum`` and ``on_parent_failure`` from ``nodes`` (the table or
    an alias of it).
    """
    on_failure = case(
        (nodes.c.on_parent_failure == state_literal(ParentFailure.HOLD), _v(Verdict.HOLD)),
        else_=_v(Verdict.CANCEL),
    )
    return case(
        (
            nodes.c.policy == state_literal(ParentPolicy.ALL_FINISHED),
            case((open_parents == 0, _v(Verdict.RELEASE)), else_=null()),
        ),
        (
            nodes.c.policy == state_literal(ParentPolicy.QUORUM),
            case(
                (succeeded >= nodes.c.quorum, _v(Verdict.RELEASE)),
                (succeeded + open_parents < nodes.c.quorum, on_failure),
                else_=null(),
            ),
        ),
        (failed > 0, on_failure),
        (open_parents == 0, _v(Verdict.RELEASE)),
        else_=null(),
    )


def _v(value: str) -> ColumnElement[str]:
    return literal_column(f"'{value}'", Text)


def _ids() -> Any:
    return bindparam("ids", type_=ARRAY(BigInteger))


def advance_statement(tables: QueueTables, *, notify: bool) -> CompoundSelect[Any]:
    """Write the outcomes of the ended jobs ``ids`` on their edges and decide what it can.

    Parameters: :class:`AdvanceParams`. Ids whose job has not ended, or whose edges carry
    their outcome already, change nothing: the statement may be run twice for one job.
    Returns ``(verdict, id)`` rows: ``candidate`` for each node to lock and decide,
    ``released`` and ``cancelled`` for the nodes decided here (see :class:`Verdict`).
    """
    jobs = tables.jobs
    edges = tables.workflow_edges
    nodes = tables.workflow_nodes
    ended = (
        select(
            jobs.c.id,
            jobs.c.status,
            case(
                (jobs.c.status == SUCCEEDED, jobs.c.result),
                # "->" written out: renders alike on every SQLAlchemy release.
                else_=jobs.c.errors.op("->")(literal_column("-1")),
            ).label("result"),
        )
        .where(
            jobs.c.id == any_(_ids()),
            jobs.c.status.in_([state_literal(s) for s in JobStatus.FINAL]),
        )
        .cte("ended_jobs")
        .prefix_with("MATERIALIZED")
    )
    marked = (
        update(edges)
        .where(edges.c.parent_id == ended.c.id, edges.c.outcome.is_(None))
        .values(outcome=ended.c.status, result=ended.c.result)
        .returning(edges.c.child_id, edges.c.parent_id, edges.c.outcome)
        .cte("marked")
    )
    touched = (
        select(
            marked.c.child_id,
            func.count().filter(marked.c.outcome == SUCCEEDED).label("succeeded"),
            func.count().filter(marked.c.outcome != SUCCEEDED).label("failed"),
        )
        .group_by(marked.c.child_id)
        .cte("touched")
    )
    # Another parent that has not ended, and is not ending in another transaction now
    # (its edge would be locked): proof that this transaction is not the last.
    other = edges.alias("other")
    # The last open sibling, by id: jobs are claimed in about id order, so it is the one
    # least likely to be ending right now in another worker's batch (whose marking would
    # then wait for this transaction's share lock), and the entries it passes over are
    # live ones (the ended siblings' entries, dead until a vacuum, lie at the low end).
    pending_other = (
        select(other.c.parent_id)
        .where(
            other.c.child_id == touched.c.child_id,
            other.c.outcome.is_(None),
            other.c.parent_id != all_(_ids()),
            # Not a node this transaction may decide and then lock: a share lock on its
            # edge, held while this transaction waits for that node's lock, is what the
            # node's decider waits for when it marks the edge (a deadlock).
            other.c.parent_id.not_in(select(touched.c.child_id)),
        )
        .order_by(other.c.parent_id.desc())
        .limit(ONE)
        # FOR SHARE: it conflicts with the marking of an edge (an UPDATE of its outcome),
        # in both directions. KEY SHARE would not.
        .with_for_update(of=other, read=True, skip_locked=True)
        .scalar_subquery()
    )
    single = nodes.c.parents == 1
    decided_here = (
        select(
            nodes.c.job_id,
            verdict(nodes, literal(0), touched.c.succeeded, touched.c.failed).label("verdict"),
        )
        .select_from(touched.join(nodes, nodes.c.job_id == touched.c.child_id))
        .where(single, nodes.c.state.in_(_UNDECIDED))
        .cte("decided_here")
    )
    # A failure decides a node under all_succeeded at once (cancel or hold), and a
    # quorum node is counted by every parent: both go to the locked decision.
    must_count = or_(
        nodes.c.policy == state_literal(ParentPolicy.QUORUM),
        and_(nodes.c.policy == state_literal(ParentPolicy.ALL_SUCCEEDED), touched.c.failed > 0),
    )
    candidates = (
        select(_v(Verdict.CANDIDATE).label("verdict"), nodes.c.job_id.label("id"))
        .select_from(touched.join(nodes, nodes.c.job_id == touched.c.child_id))
        .where(
            ~single,
            nodes.c.state.in_(_UNDECIDED),
            or_(must_count, pending_other.is_(None)),
        )
    )
    effects = _apply(tables, decided_here, notify=notify)
    return union_all(candidates, *effects)


def lock_nodes_statement(tables: QueueTables) -> Select[Any]:
    """Lock the nodes ``ids`` (:class:`AdvanceParams`) in id order, for their decision."""
    nodes = tables.workflow_nodes
    return (
        select(nodes.c.job_id)
        .where(nodes.c.job_id == any_(_ids()))
        .order_by(nodes.c.job_id)
        .with_for_update(of=nodes)
    )


def decide_statement(tables: QueueTables, *, notify: bool) -> CompoundSelect[Any]:
    """Decide the locked candidates ``ids`` from their parents' outcomes as committed now.

    Parameters: :class:`AdvanceParams`. Run after :func:`lock_nodes_statement`, in its
    own statement (its snapshot then sees every parent that committed before the locks
    were granted). Returns ``(verdict, id)`` rows for the nodes released and cancelled.
    """
    nodes = tables.workflow_nodes
    edges = tables.workflow_edges

    def parents(where: ColumnElement[bool]) -> Any:
        return select(edges.c.parent_id).where(edges.c.child_id == nodes.c.job_id, where)

    def count(where: ColumnElement[bool]) -> ColumnElement[Any]:
        return (
            select(func.count())
            .select_from(edges)
            .where(edges.c.child_id == nodes.c.job_id, where)
            .scalar_subquery()
        )

    open_edge = edges.c.outcome.is_(None)
    # As failed_ix says it: an outcome that is not NULL and not a success.
    failed_edge = edges.c.outcome != SUCCEEDED
    # A quorum counts its parents; the other policies only ask whether one is still open
    # and whether one failed: a probe of open_ix and of failed_ix each, one entry away
    # whatever the fan-in.
    quorum = nodes.c.policy == state_literal(ParentPolicy.QUORUM)

    def measured(where: ColumnElement[bool]) -> ColumnElement[Any]:
        return case((quorum, count(where)), else_=case((exists(parents(where)), 1), else_=0))

    succeeded = case((quorum, count(edges.c.outcome == SUCCEEDED)), else_=0)
    decided = (
        select(
            nodes.c.job_id,
            verdict(nodes, measured(open_edge), succeeded, measured(failed_edge)).label("verdict"),
        )
        .where(nodes.c.job_id == any_(_ids()), nodes.c.state.in_(_UNDECIDED))
        .cte("decided")
    )
    return union_all(*_apply(tables, decided, notify=notify))


def _apply(tables: QueueTables, decided: CTE, *, notify: bool) -> list[Select[Any]]:
    """The writes of ``decided`` (``job_id``, ``verdict``), as the selects of their rows."""
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    undecided = nodes.c.state.in_(_UNDECIDED)

    def moved(to: str, verdict_: str, *where: ColumnElement[bool]) -> Any:
        return (
            update(nodes)
            .where(
                nodes.c.job_id == decided.c.job_id,
                decided.c.verdict == _v(verdict_),
                *where,
            )
            .values(state=state_literal(to))
        )

    released = (
        moved(NodeState.RELEASED, Verdict.RELEASE, undecided)
        .returning(nodes.c.job_id, nodes.c.delay, nodes.c.run_at)
        .cte("released")
    )
    due = due_at(released.c.run_at, released.c.delay)
    ready = (
        update(jobs)
        .where(jobs.c.id == released.c.job_id, jobs.c.status == QUEUED)
        .values(scheduled_at=due)
        .returning(jobs.c.id, jobs.c.task, jobs.c.priority, jobs.c.queue_id, jobs.c.scheduled_at)
        .cte("ready")
    )
    written = node_runs(tables, ready, "written")
    dropped = (
        moved(NodeState.CANCELLED, Verdict.CANCEL, undecided)
        .returning(nodes.c.job_id)
        .cte("dropped")
    )
    ended = cancel_node_jobs(
        tables,
        dropped,
        "ParentOutcome",
        "a parent this workflow node needed did not succeed",
    )
    held = (
        moved(NodeState.HELD, Verdict.HOLD, nodes.c.state == state_literal(NodeState.BLOCKED))
        .returning(nodes.c.job_id)
        .cte("held")
    )
    released_rows = select(_v(Verdict.RELEASED), written.c.id)
    if notify:
        wake = select(
            func.pg_notify(literal(tables.notify_channel, Text), literal("", Text)).label("n")
        ).cte("wake")
        # Joined to the one-row "wake", pg_notify runs once, and only when a node was
        # released: as the enqueue does.
        released_rows = released_rows.select_from(written.join(wake, true()))
    return [
        released_rows,
        select(_v(Verdict.CANCELLED), ended.c.id),
        select(_v(Verdict.HOLD), held.c.job_id).where(literal_column("false")),
    ]
