"""Writing a workflow: its row, its nodes' jobs, the nodes, their edges, and its roots' runs.

One statement writes a whole graph (:func:`write_nodes_statement`), whatever its size, from
one JSON parameter, as the enqueue does: every node's job, its node row and its edges, and
the executions of the nodes without parents (the roots). A node with parents gets a job
row and no execution: it lives outside every index the claim walks until its last parent
releases it (:mod:`sqla_queue.statements.release`). An expansion (``ctx.expand``) writes its
nodes into an existing workflow through the same statement, then hands the expanding job's
dependents to the expansion's last nodes (:func:`hand_over_statement`).

The rest serves the features around it: one live workflow per row and name
(:func:`live_workflow_statement` under :func:`workflow_lock_statement`), status, cancel and
the resume of a requeued node.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    Integer,
    Select,
    Text,
    all_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import NodeState, QueueTables
from sqla_queue.statements._common import (
    CANCELLED,
    QUEUED,
    due_at,
    notify_waiters,
    state_literal,
)
from sqla_queue.statements.enqueue import keyed_rows

__all__ = [
    "NODE_ROW_FIELDS",
    "NodeRow",
    "WriteParams",
    "cancel_node_jobs",
    "hand_over_statement",
    "live_workflow_statement",
    "node_runs",
    "node_statement",
    "parent_results_statement",
    "unique_workflow_key",
    "workflow_lock_statement",
    "write_nodes_statement",
]


class _OptionalNodeFields(TypedDict, total=False):
    about_table: str
    about_key: str


class NodeRow(_OptionalNodeFields):
    """One JSON object of the ``nodes`` parameter: one node of a workflow to write."""

    #: The node's place in its call (0, 1, ...): ``after`` refers to nodes by it.
    seq: int
    name: str
    task: str
    payload: dict[str, Any]
    priority: int
    queue_id: str | None
    max_attempts: int
    #: When it may run: an ISO timestamp, or seconds after it is released.
    run_at: str | None
    delay: float | None
    #: Its parents among the nodes of this call, by ``seq``.
    after: list[int]
    #: Its parents among the jobs already written (an expansion's expanding job).
    after_jobs: list[int]
    policy: str
    quorum: int | None
    on_parent_failure: str


#: The SQL type of each node field, in the record definition of ``nodes``.
_NODE_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("seq", Integer),
    ("name", Text),
    ("task", Text),
    ("payload", JSONB),
    ("priority", Integer),
    ("queue_id", Text),
    ("max_attempts", Integer),
    ("run_at", DateTime(timezone=True)),
    ("delay", Double),
    ("after", JSONB),
    ("after_jobs", JSONB),
    ("policy", Text),
    ("quorum", Integer),
    ("on_parent_failure", Text),
    ("about_table", Text),
    ("about_key", Text),
)

#: Keys of each JSON object in the ``nodes`` parameter.
NODE_ROW_FIELDS = tuple(name for name, _ in _NODE_COLUMNS)


class WriteParams(TypedDict, total=False):
    """Parameters of :func:`write_nodes_statement`."""

    #: JSON text: a list of :class:`NodeRow` objects.
    nodes: str
    #: A new workflow's name and linked row (``new=True``).
    name: str
    about_table: str | None
    about_key: str | None
    #: The existing workflow the nodes join (``new=False``); not named ``workflow_id``,
    #: which SQLAlchemy would take for a value of the column of that name.
    wf: int


def write_nodes_statement(tables: QueueTables, *, new: bool, notify: bool) -> Select[Any]:
    """Write the nodes of ``nodes`` into a new workflow (``new``) or into the workflow ``wf``.

    Parameters: :class:`WriteParams`. Returns ``(workflow_id, job_id, seq)`` for each node,
    in ``seq`` order. The jobs' ids follow ``seq`` (the insert reads the rows in that
    order), which is how each node finds its parents' ids. A node with no parents is
    written ``released`` with its execution; the others ``blocked``, with none. With
    ``notify``, the statement wakes the workers when it wrote an execution.

    Into an existing workflow, nothing is written when it was cancelled; the statement
    holds its row ``FOR SHARE`` meanwhile, so a cancel waits for the nodes and then
    finds them.
    """
    jobs = tables.jobs
    nodes = tables.workflow_nodes
    edges = tables.workflow_edges
    workflows = tables.workflows
    parsed = (
        func.jsonb_to_recordset(cast(bindparam("nodes", type_=Text), JSONB))
        .table_valued(*(column(name, type_) for name, type_ in _NODE_COLUMNS))
        .render_derived(name="r", with_types=True)
    )
    # Parsed once: the rows are read twice (jobs, then nodes and edges), and a large
    # workflow's JSON is megabytes.
    source = select(parsed).cte("source").prefix_with("MATERIALIZED")
    if new:
        workflow = (
            insert(workflows)
            .values(
                name=bindparam("name", type_=Text),
                about_table=bindparam("about_table", type_=Text),
                about_key=bindparam("about_key", type_=Text),
            )
            .returning(workflows.c.id)
            .cte("workflow")
        )
    else:
        workflow = (
            select(workflows.c.id)
            .where(
                workflows.c.id == bindparam("wf", type_=BigInteger),
                workflows.c.cancelled_at.is_(None),
            )
            .with_for_update(of=workflows, read=True)
            .cte("workflow")
        )
    parents = func.jsonb_array_length(source.c.after) + func.jsonb_array_length(source.c.after_jobs)
    is_root = parents == 0
    due = due_at(source.c.run_at, source.c.delay)
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
                "about_table",
                "about_key",
            ],
            select(
                source.c.task,
                source.c.payload,
                source.c.priority,
                source.c.queue_id,
                source.c.max_attempts,
                case((is_root, due), else_=func.now()),
                source.c.about_table,
                source.c.about_key,
            )
            .where(exists(select(workflow.c.id)))
            .order_by(source.c.seq),
        )
        .returning(jobs.c.id, jobs.c.task, jobs.c.priority, jobs.c.queue_id, jobs.c.scheduled_at)
        .cte("new_jobs")
    )
    numbered = select(
        new_jobs.c.id,
        (func.row_number().over(order_by=new_jobs.c.id) - 1).label("seq"),
    ).cte("numbered")
    placed = (
        select(numbered.c.id, source)
        .select_from(source.join(numbered, numbered.c.seq == source.c.seq))
        .cte("placed")
    )
    placed_parents = func.jsonb_array_length(placed.c.after) + func.jsonb_array_length(
        placed.c.after_jobs
    )
    placed_root = placed_parents == 0
    new_nodes = (
        insert(nodes)
        .from_select(
            [
                "job_id",
                "workflow_id",
                "name",
                "parents",
                "policy",
                "quorum",
                "on_parent_failure",
                "state",
                "delay",
                "run_at",
            ],
            select(
                placed.c.id,
                workflow.c.id,
                placed.c.name,
                placed_parents,
                placed.c.policy,
                placed.c.quorum,
                placed.c.on_parent_failure,
                case(
                    (placed_root, state_literal(NodeState.RELEASED)),
                    else_=state_literal(NodeState.BLOCKED),
                ),
                case((placed_root, null()), else_=placed.c.delay),
                case((placed_root, null()), else_=placed.c.run_at),
            ).select_from(placed.join(workflow, true())),
        )
        .returning(nodes.c.job_id)
        .cte("new_nodes")
    )
    among = func.jsonb_array_elements_text(placed.c.after).table_valued("value").alias("among")
    parent = numbered.alias("parent")
    earlier = func.jsonb_array_elements_text(placed.c.after_jobs).table_valued("value")
    earlier = earlier.alias("earlier")
    new_edges = (
        insert(edges)
        .from_select(
            ["child_id", "parent_id"],
            select(placed.c.id, parent.c.id)
            .select_from(
                placed.join(among, true()).join(
                    parent, parent.c.seq == cast(among.c.value, BigInteger)
                )
            )
            .union_all(
                select(placed.c.id, cast(earlier.c.value, BigInteger)).select_from(
                    placed.join(earlier, true())
                )
            ),
        )
        .returning(edges.c.child_id)
        .cte("new_edges")
    )
    roots = (
        select(
            new_jobs.c.id,
            new_jobs.c.task,
            new_jobs.c.priority,
            new_jobs.c.queue_id,
            new_jobs.c.scheduled_at,
        )
        .select_from(new_jobs.join(placed, placed.c.id == new_jobs.c.id))
        .where(placed_root)
        .cte("roots")
    )
    runs = node_runs(tables, roots, "runs")
    written = (
        select(workflow.c.id.label("workflow_id"), numbered.c.id.label("job_id"), numbered.c.seq)
        .select_from(numbered.join(workflow, true()))
        .add_cte(new_nodes, new_edges)
    )
    counted = select(func.count()).select_from(runs).scalar_subquery()
    wake: ColumnElement[Any] = counted
    if notify:
        wake = case(
            (
                counted > 0,
                func.pg_notify(literal(tables.notify_channel, Text), literal("", Text)),
            ),
            else_=null(),
        )
    return written.add_columns(wake.label("woke")).order_by(numbered.c.seq)


def hand_over_statement(tables: QueueTables) -> Select[Any]:
    """Give the dependents of ``expander`` to ``sinks`` instead (an expansion).

    Parameters: ``expander`` (bigint), ``sinks`` (bigint[], not empty) and ``fresh`` (the
    expansion's new jobs, bigint[]: their edges from the expander stay). Each open edge
    from the expanding job to a dependent becomes one edge from each sink, and the
    dependent's count of parents grows to match, so it waits for the expansion's end.
    Returns the dependents moved.
    """
    edges = tables.workflow_edges
    nodes = tables.workflow_nodes
    sinks = bindparam("sinks", type_=ARRAY(BigInteger))
    moved = (
        edges.delete()
        .where(
            edges.c.parent_id == bindparam("expander", type_=BigInteger),
            edges.c.outcome.is_(None),
            edges.c.child_id != all_(bindparam("fresh", type_=ARRAY(BigInteger))),
        )
        .returning(edges.c.child_id)
        .cte("moved")
    )
    sink = func.unnest(sinks).table_valued("value").render_derived(name="sink")
    added = (
        insert(edges)
        .from_select(
            ["child_id", "parent_id"],
            select(moved.c.child_id, sink.c.value).select_from(moved.join(sink, true())),
        )
        .returning(edges.c.child_id)
        .cte("added")
    )
    recounted = (
        update(nodes)
        .where(nodes.c.job_id.in_(select(moved.c.child_id)))
        .values(parents=nodes.c.parents + func.cardinality(sinks) - 1)
        .returning(nodes.c.job_id)
        .cte("recounted")
    )
    return select(recounted.c.job_id).add_cte(added)


def unique_workflow_key(
    tables: QueueTables, name: str, about_table: str | None, about_key: str | None
) -> str:
    """The ``key`` of :func:`workflow_lock_statement` for workflows of ``name`` about one row
    (in the queue's translated schema): the one a unique enqueue and a requeue both take."""
    return json.dumps([tables.effective_schema, tables.prefix, name, about_table, about_key])


def workflow_lock_statement() -> Select[Any]:
    """Take the transaction's advisory lock on ``key`` (text): one unique workflow's check
    and write at a time, per row and name. Released at commit or rollback."""
    key = func.hashtextextended(bindparam("key", type_=Text), literal(0, BigInteger))
    return select(func.pg_advisory_xact_lock(key).label("locked"))


def live_workflow_statement(tables: QueueTables) -> Select[Any]:
    """The live workflow of ``name`` about (``about_table``, ``about_key``), if any.

    Live: not cancelled, with a node still undecided or a job not ended. Returns its id.
    """
    workflows = tables.workflows
    nodes = tables.workflow_nodes
    jobs = tables.jobs
    unfinished = exists(
        select(nodes.c.job_id)
        .select_from(nodes.join(jobs, jobs.c.id == nodes.c.job_id))
        .where(
            nodes.c.workflow_id == workflows.c.id,
            or_(
                nodes.c.state.in_([state_literal(s) for s in NodeState.UNDECIDED]),
                jobs.c.status == QUEUED,
            ),
        )
    )
    return (
        select(workflows.c.id)
        .where(
            workflows.c.about_table == bindparam("about_table", type_=Text),
            workflows.c.about_key == bindparam("about_key", type_=Text),
            workflows.c.name == bindparam("name", type_=Text),
            workflows.c.cancelled_at.is_(None),
            unfinished,
        )
        .order_by(workflows.c.id.desc())
        .limit(1)
    )


def node_statement(tables: QueueTables) -> Select[Any]:
    """The workflow and name of the node of job ``job_id`` (bigint), if it is one."""
    nodes = tables.workflow_nodes
    return select(nodes.c.workflow_id, nodes.c.name).where(
        nodes.c.job_id == bindparam("job_id", type_=BigInteger)
    )


def parent_results_statement(tables: QueueTables) -> Select[Any]:
    """``(name, outcome, result)`` of each parent of job ``job_id`` (bigint), in the order
    the parents were written."""
    edges = tables.workflow_edges
    parent = tables.workflow_nodes.alias("parent")
    return (
        select(parent.c.name, edges.c.outcome, edges.c.result)
        .select_from(edges.join(parent, parent.c.job_id == edges.c.parent_id))
        .where(edges.c.child_id == bindparam("job_id", type_=BigInteger))
        .order_by(edges.c.parent_id)
    )


def node_runs(tables: QueueTables, ready: Any, name: str) -> Any:
    """The executions of the nodes ``ready`` (a CTE of their jobs' ``id``, ``task``,
    ``priority``, ``queue_id`` and ``scheduled_at``), written as an enqueue writes them
    (``waiting`` behind a busy ``queue_id``) and marked as nodes'; a CTE ``name`` of their
    ids."""
    ex = tables.executions
    rows = keyed_rows(tables, ready).subquery("rows")
    return (
        insert(ex)
        .from_select(
            ["id", "task", "priority", "queue_id", "state", "execute_at", "workflow"],
            select(*rows.c, true()),
        )
        .returning(ex.c.id)
        .cte(name)
    )


def cancel_node_jobs(tables: QueueTables, dropped: Any, error: str, reason: str) -> Any:
    """End ``cancelled`` the queued jobs of the nodes ``dropped`` (a CTE with ``job_id``),
    their error history telling why (an entry of ``type`` ``error`` and ``message``
    ``reason``); a CTE ``ended`` of their ids. A caller awaiting one of them is told, as
    by a completion."""
    jobs = tables.jobs
    # The shape of every error entry (logic.outcomes.plain_error_entry): type, message, at.
    entry = func.jsonb_build_object(
        literal("type", Text),
        literal(error, Text),
        literal("message", Text),
        literal(reason, Text),
        literal("at", Text),
        func.now(),
    )
    return (
        update(jobs)
        .where(jobs.c.id == dropped.c.job_id, jobs.c.status == QUEUED)
        .values(
            status=CANCELLED,
            finished_at=func.now(),
            errors=jobs.c.errors.op("||")(func.jsonb_build_array(entry)),
        )
        .returning(jobs.c.id, notify_waiters(tables))
        .cte("ended")
    )
